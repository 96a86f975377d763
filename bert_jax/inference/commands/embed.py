"""`embed`: sentence embeddings of the encoder of any checkpoint (`encoder.embed`), pooled,
normalized and truncated as a sentence-transformers directory says unless the flags say
otherwise; one text file into float32 [N, E] .npy, or a corpus into Parquet shards
(`inference.bulk`) with the column

    embedding       float32 [E] (list<float32>[E]); [P][E] with --layers

A directory's prompts (config_sentence_transformers.json) are put before each text as
`SentenceTransformer.encode` puts them: `--prompt_name NAME`'s, else `--prompt TEXT`, else its
`default_prompt_name`'s. `--truncate_dim D` keeps the first D dimensions (after normalization,
as `encode(truncate_dim=D)`): E is D.

`--sparse`: SPLADE vectors of a checkpoint with a masked-LM head (a SparseEncoder directory's
default): float32 [N, V], one weight per vocabulary entry (mostly 0), written dense, as
`SparseEncoder(DIR).encode(texts).to_dense()` gives them; in Parquet, the same in `embedding`
(list<float32>[V]). `search --index sparse` searches them as sparse matrices.
`--max_active_dims K` keeps each vector's K largest weights (the rest 0), as
`encode(max_active_dims=K)` does; default: the SparseEncoder directory's (its
config_sentence_transformers.json), else all.

`--task query` / `--task document` embed as `encode_query` / `encode_document` do: the task's
prompt and, for an inference-free SparseEncoder, its route (queries: a weight per token,
`encoder.StaticQueries`, in the one-file form only).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from absl import logging

from bert_jax import paths
from bert_jax.inference import batches, encoder
from bert_jax.inference.commands import base
from bert_jax.models.pooling import POOLINGS

TASKS = ("query", "document")  # sentence-transformers' encode_query / encode_document


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--pooling, --normalize, --layers, then the corpus flags."""
    parser.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=None,
        help="default: a sentence-transformers directory's, else cls",
    )
    parser.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unit-length embeddings; default: a sentence-transformers directory's, else no",
    )
    parser.add_argument(
        "--layers", default="", help="comma-separated hidden-state indices, e.g. -1,-2"
    )
    parser.add_argument(
        "--prompt_name",
        help="the sentence-transformers directory's prompt of that name (its "
        "config_sentence_transformers.json) before each text; default: its default_prompt_name's",
    )
    parser.add_argument("--prompt", help="this text before each text (in place of --prompt_name)")
    parser.add_argument(
        "--task",
        choices=TASKS,
        help="embed the texts as queries or as documents, as encode_query / encode_document do: "
        "the task's prompt and, for an inference-free SparseEncoder, its route",
    )
    parser.add_argument(
        "--truncate_dim",
        type=int,
        help="keep the embeddings' first N dimensions (Matryoshka), as encode(truncate_dim=N)",
    )
    parser.add_argument(
        "--sparse",
        action="store_true",
        help="SPLADE vectors [N, V] of the masked-LM head's logits (a SparseEncoder's default)",
    )
    base.add_max_active_dims(parser)
    base.add_corpus_arguments(
        parser, max_seq_length_help="; default: a sentence-transformers directory's, else 128"
    )


def _layers(text: str) -> tuple[int, ...] | None:
    """--layers "-1,-2" -> (-1, -2); "" -> None (the last layer alone)."""
    return tuple(int(x) for x in text.split(",")) if text else None


def pooling_flag(args: argparse.Namespace) -> str | None:
    """The pooling the flags ask for: "splade" with --sparse (ValueError with --pooling too),
    else --pooling (None: the directory's)."""
    if getattr(args, "sparse", False):
        if args.pooling is not None:
            raise ValueError("--sparse pools the masked-LM logits; give it without --pooling")
        return "splade"
    return args.pooling


def run(args: argparse.Namespace) -> None:
    """Writes the --input lines' float32 [N, E] (or [N, len(layers), E]; with --sparse
    [N, V]) embeddings."""
    model = encoder.load_for_embedding(
        args.model,  # any head's encoder
        pooling=pooling_flag(args),
        normalize=args.normalize,
        max_seq_length=args.max_seq_length,
        prompt_name=args.prompt_name,
        prompt=args.prompt,
        truncate_dim=args.truncate_dim,
        max_active_dims=args.max_active_dims,
    )
    if args.task:
        model = model.for_task(args.task, args.prompt_name, args.prompt)
    for warning in model.warnings:
        print(f"warning: {args.model}: {warning}", file=sys.stderr)
    texts, _ = batches.read_texts(args.input)
    emb = model.embed(
        texts,
        layers=_layers(args.layers),
        batch_size=args.batch_size,
        pack=args.pack,
        dtype=args.dtype,
    )
    paths.write_bytes_whole(args.output, base.npy_bytes(emb))
    print(f"wrote {emb.shape} embeddings to {args.output}")


def fixed_lists(values: np.ndarray) -> pa.Array:
    """float32 [N, d1, ...] -> a FixedSizeList array of N rows (nested for more axes)."""
    flat = pa.array(values.reshape(-1))
    for size in reversed(values.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def load(model: str, options: Mapping[str, Any], max_seq_length: int | None) -> base.Rows:
    """The encoder of `model`'s checkpoint, pooling as `options` say (else as its
    sentence-transformers directory does); each row's `embedding`."""
    loaded = encoder.load_for_embedding(
        model,
        pooling=options.get("pooling"),
        normalize=options.get("normalize"),
        max_seq_length=max_seq_length,
        prompt_name=options.get("prompt_name"),
        prompt=options.get("prompt"),
        truncate_dim=options.get("truncate_dim"),
        max_active_dims=options.get("max_active_dims"),
    )
    if options.get("task"):
        loaded = loaded.for_task(options["task"], options.get("prompt_name"), options.get("prompt"))
    if loaded.static_route():
        raise ValueError(
            f"{model} is an inference-free SparseEncoder, whose queries are a lookup of token "
            "weights, not a model over a corpus: embed them into .npy (a text file) or let "
            "`search` embed them; a corpus is embedded as documents (--task document)"
        )
    config, used = loaded.config, loaded.options
    for warning in loaded.warnings:
        logging.warning("%s: %s", model, warning)
    layers = options.get("layers")
    step, params = encoder.embedder(
        config,
        loaded.params,
        pooling=used.pooling,
        normalize=used.normalize,
        layers=layers,
        dtype=options.get("dtype"),
        truncate_dim=used.truncate_dim,
    )

    def columns(out: np.ndarray) -> dict[str, pa.Array]:
        emb = out if layers is not None else out[:, 0]  # [N, P, E] or [N, E]
        if layers is None:
            emb = encoder.keep_max_active_dims(emb, used.pooling, used.max_active_dims)
        return {"embedding": fixed_lists(np.asarray(emb, np.float32))}

    width = config.vocab_size if used.pooling == "splade" else config.hidden_size
    return base.Rows(
        config,
        params,
        loaded.tokenizer,
        step,
        used.max_seq_length,
        columns,
        (len(layers or [0]), used.truncate_dim or width),
        used={
            "pooling": used.pooling,
            "normalize": used.normalize,
            "prompt": used.prompt,
            "max_active_dims": used.max_active_dims,
        },
        prompt=used.prompt,
    )


COMMAND = base.Command(
    "embed",
    "embeddings of a text file into .npy",
    add_arguments,
    run,
    base.BulkForm(
        (
            "pooling",
            "normalize",
            "layers",
            "dtype",
            "prompt_name",
            "prompt",
            "truncate_dim",
            "task",
            "max_active_dims",
        ),
        load,
        file_suffixes=(".npy",),
        from_args=lambda args: {
            "pooling": pooling_flag(args),
            "normalize": args.normalize,
            "layers": _layers(args.layers),
            "dtype": args.dtype,
            "prompt_name": args.prompt_name,
            "prompt": args.prompt,
            "truncate_dim": args.truncate_dim,
            "task": args.task,
            "max_active_dims": args.max_active_dims,
        },
    ),
)
