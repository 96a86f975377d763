"""What `--dtype bfloat16` costs against float32 at inference: all-MiniLM-L6-v2's embeddings of
Debian package search, and the search they give, both dtypes in one run.

    python benchmarks/inference_dtype.py --data ../shared/data/debian_packages \\
        --queries 500 --documents 5000

The first `--queries` dev queries are searched (cosine, exact) among a corpus of their own
documents and the corpus's first documents in name order, `--documents` in all. Prints one JSON
line: the cosine of each text's bfloat16 embedding with its float32 one (min, mean), the share of
each query's float32 top 10 the bfloat16 search keeps, and each dtype's nDCG@10 and MRR@10
(`retrieval.metrics`, as sentence-transformers' evaluator), with their paired difference. On a
CPU bfloat16 is emulated (XLA converts around float32 dots): the figures are its rounding, not
its speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bert_jax.inference import encoder  # noqa: E402
from bert_jax.retrieval import metrics  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def slice_of(data: str, num_queries: int, num_documents: int):
    """(query texts [Q], document texts [N], each query's document's row [Q])."""
    qrels = _jsonl(os.path.join(data, "dev_qrels.jsonl"))[:num_queries]
    corpus = {r["id"]: r["text"] for r in _jsonl(os.path.join(data, "corpus.jsonl"))}
    ids = [r["id"] for r in qrels]
    ids += [i for i in corpus if i not in set(ids)][: max(num_documents - len(ids), 0)]
    row = {i: n for n, i in enumerate(ids)}
    return (
        [r["query"] for r in qrels],
        [corpus[i] for i in ids],
        np.array([row[r["id"]] for r in qrels]),
    )


def per_query(top: np.ndarray, answer: np.ndarray) -> np.ndarray:
    """[Q, 2]: nDCG@10 and MRR@10 of one relevant document a query (`top`: [Q, 10] rows)."""
    hit = top == answer[:, None]
    rank = np.where(hit.any(1), hit.argmax(1) + 1, 0)
    return np.stack(
        [
            np.where(rank > 0, 1 / np.log2(np.maximum(rank, 1) + 1), 0),
            np.where(rank > 0, 1 / np.maximum(rank, 1), 0),
        ],
        1,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the Debian package search set's folder")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--documents", type=int, default=5000)
    args = parser.parse_args(argv)
    queries, documents, answer = slice_of(args.data, args.queries, args.documents)
    model = encoder.load_for_embedding(MODEL)
    out, seconds = {}, {}
    for dtype in ("float32", "bfloat16"):
        start = time.perf_counter()
        q = model.embed(queries, dtype=dtype, progress=False)
        d = model.embed(documents, dtype=dtype, progress=False)
        seconds[dtype] = round(time.perf_counter() - start, 1)
        top = metrics.top_k(metrics.cosine_scores(q, d), 10)
        out[dtype] = (q, d, top, per_query(top, answer))
    (q32, d32, top32, s32), (q16, d16, top16, s16) = out["float32"], out["bfloat16"]
    both = np.concatenate([q32, d32]), np.concatenate([q16, d16])
    cosine = (metrics.unit(both[0]) * metrics.unit(both[1])).sum(-1)
    kept = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top32, top16)])
    diff = s16 - s32
    se = diff.std(0, ddof=1) / np.sqrt(len(diff))
    record = {"queries": len(queries), "documents": len(documents), "model": MODEL}
    record.update(cosine_min=float(cosine.min()), cosine_mean=float(cosine.mean()), top10_kept=kept)
    for k, name in enumerate(("ndcg@10", "mrr@10")):
        record[f"{name}_float32"], record[f"{name}_bfloat16"] = s32[:, k].mean(), s16[:, k].mean()
        record[f"{name}_diff"], record[f"{name}_diff_se"] = diff[:, k].mean(), se[k]
    record = {k: round(float(v), 6) if isinstance(v, (float, np.floating)) else v
              for k, v in record.items()}  # fmt: skip
    record["seconds"] = seconds
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
