"""What `--max_active_dims` costs a SPLADE model's search: each query's and document's K
largest weights kept (`inference.encoder.keep_max_active_dims`, as
`SparseEncoder.encode(max_active_dims=K)`), against all of them, on Debian package search.

    python benchmarks/sparse_active_dims.py --model runs/debian_loop/runs/splade/hf \\
        --data ../shared/data/debian_packages --queries 2000 --documents 6000 --dims 32,64,128,256,0

The first `--queries` dev queries are searched (dot product, exact) among a corpus of their own
documents and the corpus's first documents, `--documents` in all (`inference_dtype.slice_of`);
the vectors are embedded once, as `search --index sparse` embeds them (the query task's and the
document task's prompts), then cut to each K of `--dims` (0: all). Prints one JSON line a K: the
mean active dimensions of a query and of a document, nDCG@10 and MRR@10 (one relevant document a
query), and nDCG@10's difference from all weights, paired over the queries with its standard
error; then one line of the full vectors' active dimensions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.inference_dtype import per_query, slice_of  # noqa: E402
from bert_jax.inference import encoder  # noqa: E402
from bert_jax.retrieval import metrics  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a SparseEncoder directory")
    parser.add_argument("--data", required=True, help="the set's folder (dev_qrels, corpus)")
    parser.add_argument("--queries", type=int, default=500, help="dev queries searched")
    parser.add_argument("--documents", type=int, default=5000, help="documents searched")
    parser.add_argument("--dims", default="64,128,256,0", help="each K (0: all weights)")
    parser.add_argument("--batch_size", type=int, default=64, help="texts a batch")
    args = parser.parse_args(argv)
    try:
        args.dims = [int(k) for k in args.dims.split(",")]
    except ValueError:
        parser.error(f"--dims {args.dims!r}: comma-separated counts, e.g. 64,128,0")
    if not args.dims or min(args.dims) < 0:
        parser.error(f"--dims {args.dims}: counts of 1 or more, or 0 for all")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    queries, documents, answer = slice_of(args.data, args.queries, args.documents)
    model = encoder.load_for_embedding(args.model)
    if model.options.pooling != "splade":
        print(f"error: --model {args.model} is not a SPLADE model", file=sys.stderr)
        return 1
    q = model.for_task("query").embed(queries, batch_size=args.batch_size)
    d = model.for_task("document").embed(documents, batch_size=args.batch_size)
    full = per_query(metrics.top_k(q @ d.T, 10), answer)
    for k in args.dims:
        qk = encoder.keep_max_active_dims(q, "splade", k or None)
        dk = encoder.keep_max_active_dims(d, "splade", k or None)
        scores = per_query(metrics.top_k(qk @ dk.T, 10), answer)
        diff = scores[:, 0] - full[:, 0]
        row = {
            "max_active_dims": k or None,
            "query_active_dims": float((qk != 0).sum(1).mean()),
            "document_active_dims": float((dk != 0).sum(1).mean()),
            "ndcg@10": float(scores[:, 0].mean()),
            "mrr@10": float(scores[:, 1].mean()),
            "ndcg@10_vs_all": float(diff.mean()),
            "ndcg@10_vs_all_se": float(diff.std(ddof=1) / np.sqrt(len(diff))),
        }
        print(json.dumps(row), flush=True)
    plan = {"queries": len(queries), "documents": len(documents), "vocabulary": q.shape[1]}
    print(json.dumps({**plan, "model": args.model}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
