"""`predict`: a fine-tuned sequence classifier's labels and probabilities (`heads.predict`),
or a regression's score; one text file into JSON lines, or a corpus into Parquet shards
(`inference.bulk`) with the columns

    label           string, the most probable label
    probabilities   struct of one float32 field per label, named by the label
                    (`{"neg": 0.1, "pos": 0.9}` per row, as the JSONL form writes it; fields
                    in the order of the metadata's `label_names`); a regression writes
                    `score`, float32, instead of both
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from bert_jax import paths
from bert_jax.inference import batches, encoder, heads, loading
from bert_jax.inference.commands import base


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The corpus flags (128 tokens a text by default), then --text_pair_column."""
    base.add_corpus_arguments(parser, max_seq_length=128)
    parser.add_argument("--text_pair_column", help="each row's second text (a pair classifier)")


def run(args: argparse.Namespace) -> None:
    """Writes a JSON line per --input line, its text and prediction, to --output."""
    config, params, name, tokenizer = loading.load(args.model)
    texts, texts_b = batches.read_texts(args.input)
    rows = heads.predict(
        config,
        params,
        name,
        tokenizer,
        texts,
        texts_b,
        batch_size=args.batch_size,
        max_seq_length=args.max_seq_length,
        pack=args.pack,
        dtype=args.dtype,
    )
    lines = (json.dumps({"text": text, **row}) + "\n" for text, row in zip(texts, rows))
    paths.write_text_whole(args.output, "".join(lines))
    print(f"wrote {len(rows)} predictions to {args.output}")


def named_fields(values: np.ndarray, names: Sequence[str]) -> pa.StructArray:
    """float32 [N, K] -> a struct array of N rows, one float32 field per name (K names): a
    file that says which probability is which label."""
    fields = [pa.array(np.ascontiguousarray(values[:, k])) for k in range(len(names))]
    return pa.StructArray.from_arrays(fields, names=list(names))


def load(model: str, options: Mapping[str, Any], max_seq_length: int | None) -> base.Rows:
    """The sequence classifier at `model`; each row's `label` and `probabilities` (a
    regression's `score`), the label names in each shard's metadata."""
    config, params, head, tokenizer = loading.load(model)
    names = heads.label_names(config)

    def columns(logits: np.ndarray) -> dict[str, pa.Array]:
        if config.num_labels == 1:  # a regression: the logit
            return {"score": pa.array(heads.scores(logits))}
        probs = heads.probabilities(logits)
        return {
            "label": pa.array([names[i] for i in probs.argmax(-1)], pa.string()),
            "probabilities": named_fields(probs, names),
        }

    return base.Rows(
        config,
        params,
        tokenizer,
        heads.classifier_step(heads.classifier(config, head, dtype=options.get("dtype"))),
        max_seq_length or encoder.EmbeddingOptions().max_seq_length,
        columns,
        (len(names),),
        metadata={"label_names": list(names)},
    )


COMMAND = base.Command(
    "predict",
    "labels of a text file with a fine-tuned classifier",
    add_arguments,
    run,
    base.BulkForm(
        ("text_pair_column", "dtype"),
        load,
        file_suffixes=(".jsonl",),
        text_columns=lambda text_column, options: (text_column, options.get("text_pair_column")),
    ),
)
