"""`rerank`: a cross-encoder's score of each (query, passage) pair, its logit through the
activation its directory names (`CrossEncoder(DIR).predict`); one text file of query<TAB>passage
lines into JSON lines or float32 [N] .npy, or a corpus of (--query_column, --text_column) rows
into Parquet shards (`inference.bulk`) with the column

    score           float32, the cross-encoder's logit through the activation the model's
                    directory names (metadata `activation`), as `CrossEncoder.predict`
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from bert_jax import paths
from bert_jax.inference import batches, heads, loading
from bert_jax.inference.commands import base


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The corpus flags (--text_column: the passage), then --query_column."""
    base.add_corpus_arguments(
        parser,
        max_seq_length_help=" pair; default: the directory's, else the model's longest",
        text_help=" (the passage)",
    )
    parser.add_argument("--query_column", help="each row's query (needed with an --output folder)")


def run(args: argparse.Namespace) -> None:
    """Writes each --input line's (query<TAB>passage) score to --output: a JSON line
    {"query", "text", "score"} (.jsonl), or float32 [N] (.npy)."""
    if args.query_column:
        raise ValueError(
            f"--query_column is for tables; {args.input} is one text file: a query, a tab and "
            "its passage on each line"
        )
    ce = loading.load_cross_encoder(args.model)
    heads.cross_encoder(ce.config, ce.head)  # one output, before reading the input
    queries, passages = batches.read_texts(args.input)
    if passages is None:
        line = next(i for i, q in enumerate(queries, start=1) if "\t" not in q)
        raise ValueError(
            f"{args.input}: line {line} has no tab; rerank reads a query, a tab and its "
            "passage on every line"
        )
    rows = heads.predict(
        ce.config,
        ce.params,
        ce.head,
        ce.tokenizer,
        queries,
        passages,
        batch_size=args.batch_size,
        max_seq_length=min(ce.pair_length(args.max_seq_length), ce.config.max_sequence_length),
        pack=args.pack,
        activation=ce.activation,
        dtype=args.dtype,
    )
    scores = np.array([row["score"] for row in rows], np.float32)
    if args.output.endswith(".npy"):
        paths.write_bytes_whole(args.output, base.npy_bytes(scores))
    else:
        lines = (
            json.dumps({"query": query, "text": text, "score": float(score)}) + "\n"
            for query, text, score in zip(queries, passages, scores)
        )
        paths.write_text_whole(args.output, "".join(lines))
    print(f"wrote {len(scores)} scores to {args.output}")


def load(model: str, options: Mapping[str, Any], max_seq_length: int | None) -> base.Rows:
    """The cross-encoder at `model` (one output); each pair's `score`, the activation in each
    shard's metadata."""
    ce = loading.load_cross_encoder(model)
    step = heads.classifier_step(heads.cross_encoder(ce.config, ce.head, options.get("dtype")))

    def columns(logits: np.ndarray) -> dict[str, pa.Array]:
        return {"score": pa.array(heads.scores(logits, ce.activation))}

    return base.Rows(
        ce.config,
        ce.params,
        ce.tokenizer,
        step,
        ce.pair_length(max_seq_length),
        columns,
        (ce.config.num_labels,),
        metadata={"activation": ce.activation},
    )


def _check(options: Mapping[str, Any]) -> None:
    """A table's pairs need the query's column."""
    if not options.get("query_column"):
        raise ValueError("rerank needs --query_column (and --text_column, the passage)")


COMMAND = base.Command(
    "rerank",
    "scores of (query, passage) pairs with a cross-encoder",
    add_arguments,
    run,
    base.BulkForm(
        ("query_column", "dtype"),
        load,
        file_suffixes=(".npy", ".jsonl"),
        text_columns=lambda text_column, options: (options["query_column"], text_column),
        check=_check,
    ),
)
