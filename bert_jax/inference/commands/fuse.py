"""`fuse`: reciprocal rank fusion of two or more runs of `search` (`retrieval.fusion`): each
document's score is the sum over the runs of 1 / (--k + its rank there), ranks from 1, a run
without it adding nothing; with --qrels, the fused run scored as `search` scores its own.

    python -m bert_jax.inference fuse --runs bm25.jsonl dense.jsonl --output fused.jsonl \\
        --top_k 100 --queries dev.jsonl --qrels dev_qrels.jsonl

In:
  --runs      two or more files `search` writes (.jsonl or .parquet, one row a query:
              `query_id`, `ids` best first; their scores are not read), each of the same
              queries. Every document of a run's list counts. Ids are matched as text.
  --queries   with --qrels: the queries of the runs (as `search` reads them), for qrels that
              name queries by text; their ids must be the runs' query ids.
  --qrels     as `search`'s: nDCG@10, MRR@10 and Recall@100 of the whole fused lists.
Out (--output): as `search`'s, the queries in the first run's order, each with its --top_k
best documents (fewer where the runs hold fewer) and their fused scores; with --qrels, OUTPUT's
name with `.metrics.json` for its suffix. Equal fused scores rank by the better rank in the
first run (a document it lacks after those it holds), then in the second, and so on.
"""

from __future__ import annotations

import argparse
import sys

from bert_jax.data import tables
from bert_jax.inference.commands import base, search
from bert_jax.retrieval import fusion


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--runs, --output, --k, --top_k, --queries, --qrels."""
    add = parser.add_argument
    add("--runs", nargs="+", required=True, help="two or more runs of `search` (.jsonl, .parquet)")
    add("--output", required=True, help="NAME.jsonl or NAME.parquet: each query's fused top k")
    add("--k", type=int, default=fusion.DEFAULT_K, help="the constant added to each rank")
    add("--top_k", type=int, default=10, help="documents written per query")
    add("--queries", help="the runs' queries (with --qrels): ids and texts, as search reads them")
    add("--qrels", help="relevance rows: nDCG@10, MRR@10, Recall@100 into NAME.metrics.json")


def _check(args: argparse.Namespace) -> None:
    """The flags' own mistakes, before any file is read (ValueError naming the flag)."""
    if len(args.runs) < 2:
        raise ValueError(f"--runs: give two or more runs to fuse, got {len(args.runs)}")
    if args.k < 1:
        raise ValueError(f"--k must be at least 1, got {args.k}")
    if args.top_k < 1:
        raise ValueError(f"--top_k must be at least 1, got {args.top_k}")
    if not args.output.endswith(search.OUTPUT_SUFFIXES):
        suffixes = " or ".join(search.OUTPUT_SUFFIXES)
        raise ValueError(f"--output must end in {suffixes}: {args.output}")
    if (args.qrels is None) != (args.queries is None):
        raise ValueError("--qrels and --queries go together: the qrels name the queries")
    search.check_output_apart(
        args, runs=",".join(args.runs), queries=args.queries, qrels=args.qrels
    )


def read_run(path: str) -> dict[str, tuple]:
    """{query id as text: (the query id as read, its ids best first)} of one run file, in its
    order; ValueError naming the file and row."""
    path = search.one_file("--runs", path)
    if not path.lower().endswith(search.OUTPUT_SUFFIXES):
        raise ValueError(f"--runs {path}: not a run of `search` (.jsonl or .parquet)")
    found = tables.column_names(path)
    if not {"query_id", "ids"} <= set(found):
        raise ValueError(f"--runs {path}: no columns 'query_id' and 'ids'; the columns are {found}")
    run = {}
    for row, values in tables.iter_rows(path, ["query_id", "ids"]):
        query, ids = values["query_id"], values["ids"]
        if query is None or not isinstance(ids, list) or None in ids:
            raise ValueError(f"--runs {path}: row {row} has no query_id or a null in its ids")
        if str(query) in run:
            raise ValueError(f"--runs {path}: the query {query!r} has several rows")
        if len({str(i) for i in ids}) < len(ids):
            raise ValueError(f"--runs {path}: row {row} names a document twice")
        run[str(query)] = (query, ids)
    if not run:
        raise ValueError(f"--runs {path} holds no query")
    return run


def _missing(keys, others, lacking: str, source: str) -> None:
    """ValueError: `lacking` (whose query ids are `others`) lacks some of the query ids `keys`
    of `source`, named."""
    missing = [k for k in keys if k not in others]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" * (len(missing) > 5))
        raise ValueError(f"{lacking} lacks {len(missing)} query id(s) of {source}: {shown}")


def _relevant(args, fused: dict) -> tuple[list[str], list[set[str]]] | None:
    """With --qrels: the queries' ids (as text) and each one's relevant ids (`search`'s
    `relevant_sets`), the runs' queries checked against --queries; None without."""
    if args.qrels is None:
        return None
    queries, texts = search.read_queries(args.queries)
    keys = [str(q) for q in queries]
    _missing(keys, fused, f"--runs {args.runs[0]}", f"--queries {args.queries}")
    _missing(fused, set(keys), f"--queries {args.queries}", f"--runs {args.runs[0]}")
    relevant, warnings = search.relevant_sets(search.read_qrels(args.qrels), queries, texts, None)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return keys, relevant


def _fused(rankings: list[list], k: int) -> tuple[list, list[float]]:
    """`fusion.reciprocal_rank_fusion` of one query's rankings, ids matched as text (`3` and
    `"3"` are one document, written as the first run naming it spells it)."""
    spelled = {}
    for ranking in rankings:
        for doc in ranking:
            spelled.setdefault(str(doc), doc)
    ids, scores = fusion.reciprocal_rank_fusion([[str(d) for d in r] for r in rankings], k)
    return [spelled[d] for d in ids], scores


def run(args: argparse.Namespace) -> None:
    """Fuses --runs into --output (and, with --qrels, scores the fused run)."""
    _check(args)
    runs = [read_run(path) for path in args.runs]
    first = f"--runs {args.runs[0]}"
    for path, other in zip(args.runs[1:], runs[1:]):
        _missing(runs[0], other, f"--runs {path}", first)
        _missing(other, runs[0], first, f"--runs {path}")
    fused = {key: _fused([r[key][1] for r in runs], args.k) for key in runs[0]}
    judged = _relevant(args, fused)  # every input read before anything is written
    ids = [fused[key][0][: args.top_k] for key in runs[0]]
    scores = [fused[key][1][: args.top_k] for key in runs[0]]
    query_ids = [query for query, _ in runs[0].values()]
    search.write_results(args.output, query_ids, ids, scores)
    print(f"wrote the fused top {args.top_k} of {len(runs)} runs for {len(fused)} queries to "
          f"{args.output}")  # fmt: skip
    if judged is not None:
        keys, relevant = judged
        ranked = [[str(d) for d in fused[key][0]] for key in keys]
        settings = {"runs": args.runs, "k": args.k, "queries": args.queries, "qrels": args.qrels}
        search.report(args.output, relevant, ranked, settings)


COMMAND = base.Command(
    "fuse",
    "reciprocal rank fusion of runs of `search`; with --qrels nDCG@10, MRR@10, Recall@100",
    add_arguments,
    run,
)
