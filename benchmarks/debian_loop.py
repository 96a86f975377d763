"""The retrieval loop closed on Debian package search, every stage a project command, every
first stage scored on the dev queries against the whole corpus.

    python benchmarks/debian_loop.py --data data/debian_packages --out runs/debian_loop
    python benchmarks/debian_loop.py --data tests/testdata/debian_slice --out /tmp/loop --tiny
    python benchmarks/debian_loop.py --data data/debian_packages --out runs/x --dry_run

`--data` is the set's folder (`python -m bert_jax.retrieval.debian_packages` rebuilds it from a
Debian release; docs/inference.md): train.jsonl (query, positive), dev.jsonl, dev_qrels.jsonl,
corpus.jsonl. Each stage runs in a process of its own (`sys.executable`), its output in
`<out>/logs/<stage>.log`, its wall time recorded (start-up and compiles included):

  bm25      `inference search --index bm25`: the lexical baseline
  minilm    `inference search --model sentence-transformers/all-MiniLM-L6-v2`, untrained
  stage0    `train.py --config=configs/embed.py:init=minilm` on the first `--pairs` training
            pairs, in-batch negatives only; then searched as above
  mine      `python -m bert_jax.embed.mine` with stage 0's model: `--negatives` hard negatives a
            pair among the training positives (`--mine_flags`; docs/mining.md)
  mine_rerank  the same for the reranker's rows, on the first `--rerank_pairs` training pairs
  stage1    the embedding job again from all-MiniLM-L6-v2 on the mined pairs, `--seeds` seeds;
            each seed's model searched
  splade    `train.py --config=configs/embed.py:init=minilm,model=splade` on stage 0's pairs
            (all-MiniLM-L6-v2 with a new masked-LM head, in-batch negatives, FLOPS
            regularization); then `search --index sparse`, each vector's `--max_active_dims`
            largest weights kept (as `SparseEncoder.encode(max_active_dims=...)`)
  fusion    `inference fuse` (reciprocal rank fusion, k 60) of BM25 and the best dense run
  rerank    `train.py --config=configs/rerank.py:init=minilm` on mine_rerank's rows (the
            listwise loss: the positive among its negatives) from the best dense run's model
            (`--rerank_init stage1`; `minilm`: all-MiniLM-L6-v2); then `inference search` of the
            best dense model with `--rerank` over its top `--top_k`

Scores are nDCG@10, MRR@10 and Recall@100 as sentence-transformers' InformationRetrievalEvaluator
(the search command's `--qrels`); differences are paired over the dev queries, with their standard
error (stage 1 against stage 0 averaged over seeds: each query's mean over the seeds). Prints one
JSON line per stage, then a markdown table with the CPU's model name; writes everything to
`<out>/debian_loop.json`. It tunes nothing. The processes are pinned to `--threads` cores.

Each finished stage is recorded in `<out>/progress.json` (the settings, each stage's wall time):
`--resume` continues a stopped run from the first stage not finished (the same settings only;
a stopped training stage resumes from its own checkpoints); `--overwrite` starts it again.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import retrieval_loop  # noqa: E402  (run_stage, cpu_model)
from bert_jax.checkpoints import hub  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# all-MiniLM-L6-v2 from its installed package (as configs/embed.py:init=minilm starts from it),
# so that the loop reads no Hugging Face cache; its Hub id where the package is absent.
MINILM = str(
    hub.installed_dir("sentence-transformers/all-MiniLM-L6-v2")
    or "sentence-transformers/all-MiniLM-L6-v2"
)
MINE_FLAGS = "--relative_margin 0.05 --range_max 100"
SET_FILES = ("train.jsonl", "dev.jsonl", "dev_qrels.jsonl", "corpus.jsonl")
OWNED = ("data", "runs", "search", "logs", "mined.jsonl", "mined_rerank.jsonl", "debian_loop.json",
         "progress.json")  # fmt: skip
PROGRESS = "progress.json"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--data", required=True, help="the set's folder (train, dev, dev_qrels, corpus .jsonl)")
    add("--out", required=True, help="a folder for the runs, searches and results")
    add("--pairs", type=int, default=4096, help="training pairs (the first N; 0: all)")
    add("--dev", type=int, default=0, help="dev queries (the first N; 0: all 2,000)")
    add("--negatives", type=int, default=3, help="hard negatives per pair (K)")
    add("--seeds", type=int, default=3, help="stage 1's seeds (0, 1, ...)")
    add("--epochs", type=int, default=1, help="epochs of every training stage")
    add("--batch", type=int, default=64, help="pairs a step of the embedding stages")
    add("--max_seq_length", type=int, default=128, help="tokens a text keeps in training")
    add("--rerank_pairs", type=int, default=8192, help="pairs mined for the reranker (0: all)")
    add("--rerank_init", choices=("stage1", "minilm"), default="stage1",
        help="the reranker's start: the best dense run's model, or all-MiniLM-L6-v2")  # fmt: skip
    add("--rerank_batch", type=int, default=16, help="mined rows a step of the reranker")
    add("--rerank_seq", type=int, default=256, help="tokens a (query, document) pair keeps")
    add("--mine_flags", default=MINE_FLAGS, help="mining's selection flags (docs/mining.md)")
    add("--top_k", type=int, default=20, help="first-stage documents the reranker reorders")
    add("--max_active_dims", type=int, default=256,
        help="weights a SPLADE vector keeps in its search (0: all)")  # fmt: skip
    add("--threads", type=int, default=2, help="cores the stages are pinned to")
    add("--tiny", action="store_true", help="64 pairs, 2 seeds, batch 16, 32 tokens")
    add("--dry_run", action="store_true", help="print the commands only")
    add("--overwrite", action="store_true", help="replace an earlier run in --out")
    add("--resume", action="store_true", help="continue a stopped run in --out (same settings)")
    args = parser.parse_args(argv)
    if args.max_active_dims < 0:
        parser.error(f"--max_active_dims {args.max_active_dims}: a count of weights, or 0 for all")
    if args.tiny:
        args.pairs, args.seeds, args.batch, args.max_seq_length = 64, 2, 16, 32
        args.rerank_pairs = 64
        args.rerank_batch, args.rerank_seq, args.top_k = 8, 64, 10
    return args


def _paths(out: str, data: str) -> dict[str, str]:
    j = lambda *p: os.path.join(out, *p)  # noqa: E731
    return {
        "train": j("data", "train.jsonl"),
        "train_rerank": j("data", "train_rerank.jsonl"),
        "dev": j("data", "dev.jsonl"),
        "qrels": os.path.join(data, "dev_qrels.jsonl"),
        "corpus": os.path.join(data, "corpus.jsonl"),
        "mined": j("mined.jsonl"),
        "mined_rerank": j("mined_rerank.jsonl"),
        "runs": j("runs"),
        "search": j("search"),
        "logs": j("logs"),
    }


def commands(args, p: dict[str, str]) -> dict[str, list[str]]:
    """Each stage's command line (run from the repository root), in order."""
    py = sys.executable

    def search(name: str, *flags: str, top_k: int = 100) -> list[str]:
        return [py, "-m", "bert_jax.inference", "search", "--queries", p["dev"],
                "--corpus", p["corpus"], "--qrels", p["qrels"], "--top_k", str(top_k),
                "--output", os.path.join(p["search"], f"{name}.jsonl"), *flags]  # fmt: skip

    def embed(workdir: str, train_file: str, seeds: str, variant="init=minilm") -> list[str]:
        return [py, "train.py", f"--config=configs/embed.py:{variant}", f"--workdir={workdir}",
                f"--config.embed.train_file={train_file}", f"--config.embed.seeds={seeds}",
                f"--config.embed.max_seq_length={args.max_seq_length}",
                f"--config.embed.num_epochs={args.epochs}",
                f"--config.global_batch_size={args.batch}"]  # fmt: skip

    stage0 = os.path.join(p["runs"], "stage0")

    def mine(pairs: str, out: str) -> list[str]:
        return [py, "-m", "bert_jax.embed.mine", "--model", os.path.join(stage0, "hf"),
                "--pairs", pairs, "--output", out, "--num_negatives", str(args.negatives),
                *shlex.split(args.mine_flags)]  # fmt: skip

    cmds = {
        "bm25": search("bm25", "--index", "bm25"),
        "minilm": search("minilm", "--model", MINILM),
        "stage0": embed(stage0, p["train"], "0"),
        "search_stage0": search("stage0", "--model", os.path.join(stage0, "hf")),
        "mine": mine(p["train"], p["mined"]),
        "mine_rerank": mine(p["train_rerank"], p["mined_rerank"]),
        "stage1": embed(os.path.join(p["runs"], "stage1"), p["mined"],
                        ",".join(map(str, range(args.seeds)))),
    }  # fmt: skip
    for seed in range(args.seeds):
        model = os.path.join(stage1_dir(p, args.seeds, seed), "hf")
        cmds[f"search_stage1_seed{seed}"] = search(f"stage1_seed{seed}", "--model", model)
    splade = os.path.join(p["runs"], "splade")
    cmds["splade"] = embed(splade, p["train"], "0", "init=minilm,model=splade")
    active = ["--max_active_dims", str(args.max_active_dims)] if args.max_active_dims else []
    cmds["search_splade"] = search(
        "splade", "--index", "sparse", "--model", os.path.join(splade, "hf"), *active
    )
    return cmds


def stage2_command(args, p: dict[str, str], best_model: str) -> list[str]:
    """The reranker's training (stage 2) from `best_model` (`--rerank_init stage1`) or
    all-MiniLM-L6-v2, on mine_rerank's rows."""
    start = best_model if args.rerank_init == "stage1" else MINILM
    return [sys.executable, "train.py", "--config=configs/rerank.py:init=minilm",
            f"--workdir={os.path.join(p['runs'], 'stage2')}", f"--config.init_from={start}",
            f"--config.rerank.train_file={p['mined_rerank']}", "--config.rerank.loss=listwise",
            f"--config.rerank.max_seq_length={args.rerank_seq}",
            f"--config.rerank.num_epochs={args.epochs}",
            f"--config.global_batch_size={args.rerank_batch}"]  # fmt: skip


def stage1_dir(p: dict[str, str], seeds: int, seed: int) -> str:
    """Stage 1's run folder of `seed` (the workdir itself when one seed is trained)."""
    workdir = os.path.join(p["runs"], "stage1")
    return workdir if seeds == 1 else os.path.join(workdir, f"seed_{seed}")


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_jsonl(rows: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def cut(args, p: dict[str, str]) -> tuple[int, int]:
    """The loop's training pairs and dev queries (each split's first N); their counts.
    FileNotFoundError naming a file the set lacks."""
    missing = [f for f in SET_FILES if not os.path.isfile(os.path.join(args.data, f))]
    if missing:
        raise FileNotFoundError(
            f"--data {args.data} lacks {missing}: give the set's folder (python -m "
            "bert_jax.retrieval.debian_packages builds it)"
        )
    train = _read_jsonl(os.path.join(args.data, "train.jsonl"))
    dev = _read_jsonl(os.path.join(args.data, "dev.jsonl"))
    _write_jsonl(train[: args.rerank_pairs or None], p["train_rerank"])
    train, dev = train[: args.pairs or None], dev[: args.dev or None]
    _write_jsonl(train, p["train"])
    _write_jsonl([{"query": r["query"]} for r in dev], p["dev"])
    return len(train), len(dev)


def per_query(p: dict[str, str], name: str) -> np.ndarray:
    """float [Q, 2]: each dev query's nDCG@10 and MRR@10 in search run `name` (its output's
    ids against the qrels; binary relevance, as the evaluator scores them)."""
    relevant: dict[str, set[str]] = {}
    for row in _read_jsonl(p["qrels"]):
        relevant.setdefault(row["query"], set()).add(str(row["id"]))
    queries = [r["query"] for r in _read_jsonl(p["dev"])]
    rows = _read_jsonl(os.path.join(p["search"], f"{name}.jsonl"))
    out = np.zeros((len(rows), 2))
    for i, row in enumerate(rows):
        docs = relevant.get(queries[int(row["query_id"])], set())
        hits = [r for r, d in enumerate(row["ids"][:10]) if str(d) in docs]
        ideal = sum(1 / np.log2(r + 2) for r in range(min(len(docs), 10)))
        if hits:
            out[i] = sum(1 / np.log2(r + 2) for r in hits) / ideal, 1 / (hits[0] + 1)
    return out


def paired(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """b - a per query (`per_query`'s columns): the mean and its standard error over queries."""
    d = b - a
    se = d.std(axis=0, ddof=1) / np.sqrt(len(d))
    return {"ndcg@10": float(d[:, 0].mean()), "ndcg@10_se": float(se[0]),
            "mrr@10": float(d[:, 1].mean()), "mrr@10_se": float(se[1])}  # fmt: skip


def metrics(p: dict[str, str], name: str) -> dict[str, float]:
    with open(os.path.join(p["search"], f"{name}.metrics.json"), encoding="utf-8") as f:
        m = json.load(f)
    return {k: m[k] for k in ("ndcg@10", "mrr@10", "recall@100")}


def fuse_command(p: dict[str, str], best: str) -> list[str]:
    runs = [os.path.join(p["search"], f"{n}.jsonl") for n in ("bm25", best)]
    return [sys.executable, "-m", "bert_jax.inference", "fuse", "--runs", *runs, "--top_k", "100",
            "--output", os.path.join(p["search"], "fusion.jsonl"), "--queries", p["dev"],
            "--qrels", p["qrels"]]  # fmt: skip


def rerank_command(args, p: dict[str, str], best_model: str) -> list[str]:
    stage2 = os.path.join(p["runs"], "stage2", "hf")
    return [sys.executable, "-m", "bert_jax.inference", "search", "--queries", p["dev"],
            "--corpus", p["corpus"], "--qrels", p["qrels"], "--top_k", str(args.top_k),
            "--output", os.path.join(p["search"], "rerank.jsonl"), "--model", best_model,
            "--rerank", stage2, "--rerank_top", str(args.top_k)]  # fmt: skip


def table(rows: list[dict]) -> str:
    f = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    lines = [
        "| stage | nDCG@10 | MRR@10 | Recall@100 | nDCG@10, paired | wall s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        d = r.get("paired")
        diff = f"{d['ndcg@10']:+.4f} +- {d['ndcg@10_se']:.4f} ({d['against']})" if d else ""
        wall = "-" if r.get("wall_s") is None else f"{r['wall_s']:.0f}"
        lines.append(f"| {r['stage']} | {f(r.get('ndcg@10'))} | {f(r.get('mrr@10'))} | "
                     f"{f(r.get('recall@100'))} | {diff} | {wall} |")  # fmt: skip
    return "\n".join(lines)


def _prepare(args, out: str, settings: dict) -> tuple[int | None, dict[str, float]]:
    """Checks --out: an earlier run is replaced only with --overwrite, continued only with
    --resume (of the same settings). Returns (an exit status where it must stop, the stages
    already finished: name -> wall seconds)."""
    earlier = [n for n in OWNED if os.path.exists(os.path.join(out, n))]
    if earlier and args.resume:
        try:
            with open(os.path.join(out, PROGRESS), encoding="utf-8") as f:
                progress = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"error: --resume: {out} holds no readable {PROGRESS} ({e})", file=sys.stderr)
            return 1, {}
        changed = {k: (progress["settings"].get(k), v) for k, v in settings.items()
                   if progress["settings"].get(k) != v}  # fmt: skip
        if changed:
            said = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            print(f"error: --resume: the run in {out} has other settings ({said}); "
                  "--overwrite starts again", file=sys.stderr)  # fmt: skip
            return 1, {}
        return None, dict(progress["done"])
    if earlier and not args.overwrite:
        print(f"error: {out} holds an earlier run ({', '.join(earlier)}); --overwrite replaces "
              "it, --resume continues it", file=sys.stderr)  # fmt: skip
        return 1, {}
    for name in earlier:
        target = os.path.join(out, name)
        shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
    return None, {}


def _record(out: str, settings: dict, done: dict[str, float]) -> None:
    """`<out>/progress.json`: the settings and the finished stages' wall times, written whole."""
    path = os.path.join(out, PROGRESS)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"settings": settings, "done": done}, f, indent=2)
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    p = _paths(out, os.path.abspath(args.data))
    cmds = commands(args, p)
    settings = {
        k: v for k, v in vars(args).items() if k not in ("dry_run", "overwrite", "resume", "out")
    }
    settings["data"] = os.path.abspath(args.data)  # however it is spelled
    if args.dry_run:
        print(json.dumps(settings))
        for name, cmd in cmds.items():
            print(f"{name}: cd {shlex.quote(ROOT)} && {shlex.join(cmd)}")
        print(f"fusion: {shlex.join(fuse_command(p, '<best dense run>'))}")
        print(f"stage2: {shlex.join(stage2_command(args, p, '<best dense model>'))}")
        print(f"rerank: {shlex.join(rerank_command(args, p, '<best dense model>'))}")
        return 0
    status, done = _prepare(args, out, settings)
    if status is not None:
        return status
    try:
        num_train, num_dev = cut(args, p)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for folder in ("logs", "search", "runs"):
        os.makedirs(p[folder], exist_ok=True)
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
    print(json.dumps({**settings, "train_pairs": num_train, "dev_queries": num_dev}), flush=True)
    if done:
        print(f"resuming: {', '.join(done)} finished", flush=True)
    rows = run_stages(args, p, cmds, done, lambda: _record(out, settings, done))
    record = {"settings": settings, "cpu": retrieval_loop.cpu_model(), "stages": rows}
    with open(os.path.join(out, "debian_loop.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    print(f"\n{num_dev} dev queries against {sum(1 for _ in open(p['corpus']))} documents; "
          f"{record['cpu']}, {args.threads} threads\n" + table(rows))  # fmt: skip
    return 0


def run_stages(args, p: dict[str, str], cmds: dict[str, list[str]], done=None, record=None):
    """Runs every stage in order, but those `done` holds (name -> wall seconds: each finished
    one is added, then `record()` called); a row for each scored one (module docstring)."""
    rows, walls, scores, done = [], {}, {}, {} if done is None else done

    def run(name: str, cmd: list[str]) -> None:
        if name not in done:
            done[name] = retrieval_loop.run_stage(name, cmd, p["logs"])
            if record is not None:
                record()
        walls[name] = done[name]
        if name.startswith("search_") or name in ("bm25", "minilm", "fusion", "rerank"):
            scores[name.removeprefix("search_")] = per_query(p, name.removeprefix("search_"))

    def row(stage: str, name: str, wall: float | None, against: str | None, **values) -> None:
        r = {"stage": stage, "run": name, **(values or metrics(p, name)), "wall_s": wall}
        if against is not None:
            r["paired"] = {**paired(scores[against], scores[name]), "against": against}
        print(json.dumps(r), flush=True)
        rows.append(r)

    for name, cmd in cmds.items():
        run(name, cmd)
    row("BM25 (bm25s)", "bm25", walls["bm25"], None)
    row("all-MiniLM-L6-v2, untrained", "minilm", walls["minilm"], "bm25")
    row("stage 0: trained, in-batch negatives", "stage0", walls["stage0"], "minilm")
    seeds = [f"stage1_seed{s}" for s in range(args.seeds)]
    for seed, name in enumerate(seeds):
        row(f"stage 1: + mined negatives, seed {seed}", name, walls["stage1"], "stage0")
    scores["stage1"] = np.mean([scores[s] for s in seeds], axis=0)
    keys = ("ndcg@10", "mrr@10", "recall@100")
    mean = {k: float(np.mean([r[k] for r in rows[-args.seeds :]])) for k in keys}
    row(f"stage 1, mean of {args.seeds} seeds", "stage1", None, "stage0", **mean)
    active = f"{args.max_active_dims} weights a vector" if args.max_active_dims else "all weights"
    row(f"SPLADE from all-MiniLM-L6-v2, in-batch negatives ({active})", "splade", walls["splade"],
        "bm25")  # fmt: skip
    best = max(["minilm", "stage0", *seeds], key=lambda n: scores[n][:, 0].mean())
    run("fusion", fuse_command(p, best))
    row(f"fusion: BM25 + {best} (RRF, k 60)", "fusion", walls["fusion"], best)
    models = {"minilm": MINILM, "stage0": os.path.join(p["runs"], "stage0", "hf")}
    models.update(
        {n: os.path.join(stage1_dir(p, args.seeds, s), "hf") for s, n in enumerate(seeds)}
    )
    run("stage2", stage2_command(args, p, models[best]))
    run("rerank", rerank_command(args, p, models[best]))
    wall = walls["stage2"] + walls["rerank"]
    row(f"reranker over {best}'s top {args.top_k}", "rerank", wall, best)
    return rows


if __name__ == "__main__":
    sys.exit(main())
