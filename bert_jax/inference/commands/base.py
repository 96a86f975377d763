"""What an inference command is: its flags, its one-file runner and, for a command that runs
over a corpus, its bulk row function (`BulkForm`); and the flags and checks commands share.

A command is one module of `bert_jax.inference.commands` exposing one `Command`, listed in that
package's registry (`COMMANDS`). `python -m bert_jax.inference` builds its parser from the
registry and runs the command named; `inference.bulk` runs any command with a `BulkForm` over a
corpus of shards and names none.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from bert_jax.inference import loading
from bert_jax.models.families import EncoderConfig

PyTree = Any
# The one-file form reads one text file: these inputs are tables, which want an output folder.
TABLE_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".csv", ".tsv")


class Rows(NamedTuple):
    """A command's model, loaded for bulk inference: what it runs on each batch of rows and the
    columns it writes of their outputs.

    Attributes:
      config, params, tokenizer: the checkpoint (params on the host; `bulk` places them).
      step: `step(params, batch)` -> float32 [B, ...] for input_ids, token_type_ids,
        attention_mask int32 [B, L]; of packed rows (`batches.pack_texts`), [R, S, ...], one
        output a text slot.
      max_seq_length: the tokens a row keeps (clipped to the model's positions by `bulk`).
      columns: `columns(outputs [N, ...])` -> the command's output columns of those N rows, by
        name (after the id columns `bulk` writes).
      row_shape: one row's output shape, [...] (the outputs of an input without rows).
      used: the settings as used where the job left them unset (recorded: a rerun that spells
        out the defaults is the same job).
      metadata: more of each shard's metadata (after the settings, the input and its
        fingerprint).
      prompt: put before each row's (first) text (an embedder's prompt; "" none).
    """

    config: EncoderConfig
    params: PyTree
    tokenizer: Any
    step: Callable
    max_seq_length: int
    columns: Callable[[np.ndarray], dict[str, pa.Array]]
    row_shape: tuple[int, ...]
    used: Mapping[str, Any] = {}
    metadata: Mapping[str, Any] = {}
    prompt: str = ""


def one_text(text_column: str, options: Mapping[str, Any]) -> tuple[str, None]:
    """A row's texts: its --text_column alone."""
    return text_column, None


def no_check(options: Mapping[str, Any]) -> None:
    """Every setting is optional."""


@dataclasses.dataclass(frozen=True)
class BulkForm:
    """How a command runs over a corpus (`inference.bulk`) and which one-file outputs it writes.

    Attributes:
      settings: its own settings that change what a row holds, as `bulk.Job.options` keys: a
        rerun must keep them (recorded in OUT/_job.json and each shard, in this order).
      load: `load(model, options, max_seq_length)` -> `Rows`: the checkpoint at `model` as this
        command runs it, with the job's `options` and --max_seq_length (None: its default);
        raises ValueError for a model or setting it cannot take.
      file_suffixes: the --output suffixes of its one-file form (else --output is a folder).
      from_args: the settings from the parsed flags; None: each flag's value as given.
      text_columns: `text_columns(text_column, options)` -> the columns of a row's first and
        second text (None: one text a row).
      check: raises ValueError for a missing or bad setting, before anything is loaded.
    """

    settings: tuple[str, ...]
    load: Callable[[str, Mapping[str, Any], int | None], Rows]
    file_suffixes: tuple[str, ...]
    from_args: Callable[[argparse.Namespace], dict] | None = None
    text_columns: Callable[[str, Mapping[str, Any]], tuple[str, str | None]] = one_text
    check: Callable[[Mapping[str, Any]], None] = no_check

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        """The job's settings (`settings`) from the parsed flags."""
        if self.from_args is not None:
            return self.from_args(args)
        return {name: getattr(args, name) for name in self.settings}


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand of `python -m bert_jax.inference`.

    Attributes:
      name: the subcommand ("embed").
      help: its line in the command's help.
      add_arguments: `add_arguments(parser)` adds its flags to its own subparser.
      run: `run(args)` runs its one-file form (a command without `bulk`: the command).
      bulk: its form over a corpus of shards (an --output folder), or None.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]
    bulk: BulkForm | None = None


def add_model(parser: argparse.ArgumentParser) -> None:
    """--model: the checkpoint every command reads."""
    parser.add_argument("--model", required=True, help="checkpoint or run directory")


def dtype_flag(value: str) -> str | None:
    """--dtype's value: None for float32 (the default, recorded as if left unset), else
    "bfloat16" (`loading.DTYPES`); argparse's error naming the choices for another."""
    if value not in loading.DTYPES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(loading.DTYPES)}")
    return None if value == "float32" else value


def add_dtype(parser: argparse.ArgumentParser) -> None:
    """--dtype: the compute dtype of the model (`loading.runtime`)."""
    parser.add_argument(
        "--dtype",
        type=dtype_flag,
        default=None,
        metavar="{float32,bfloat16}",
        help="float32 (the default: exact), or bfloat16 matmuls for GPUs and TPUs "
        "(docs/inference.md: what it costs)",
    )


def add_max_active_dims(parser: argparse.ArgumentParser) -> None:
    """--max_active_dims: a SPLADE vector's largest weights kept (`embed --sparse`, `search
    --index sparse`; `encoder.keep_max_active_dims`)."""
    parser.add_argument(
        "--max_active_dims",
        type=int,
        help="SPLADE: keep each vector's N largest weights, as encode(max_active_dims=N); "
        "default: the SparseEncoder directory's, else all",
    )


def add_corpus_arguments(
    parser: argparse.ArgumentParser,
    *,
    max_seq_length: int | None = None,
    max_seq_length_help: str = "",
    text_help: str = "",
) -> None:
    """--model, --output, --input and the flags of a run over a corpus (batching, columns,
    packing, processes, the compilation cache), with the command's --max_seq_length default
    and the end of its help and --text_column's."""
    add_model(parser)
    parser.add_argument("--output", required=True)
    parser.add_argument(
        "--input",
        required=True,
        help="a glob, folder or file of Parquet/Arrow/JSONL/CSV/text rows (local or gs://); "
        "with --output *.npy / *.jsonl: one UTF-8 text file, one text (rerank: a query, a "
        "tab, a passage) a line",
    )
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--max_seq_length",
        type=int,
        default=max_seq_length,
        help="tokens kept per text" + max_seq_length_help,
    )
    parser.add_argument("--text_column", default="text", help="the text of each row" + text_help)
    parser.add_argument("--id_column", help="copied to the output rows (default: file and row)")
    parser.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="texts several to a row, each read from its own tokens (the same outputs "
        "within float32 rounding, from fewer padding tokens); --no-pack: one a row",
    )
    add_dtype(parser)
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    parser.add_argument("--coordinator_address", help="host:port of process 0 (multi-process)")
    parser.add_argument("--num_processes", type=int, help="processes in a multi-process run")
    parser.add_argument("--process_id", type=int, help="this process's index in the run")
    parser.add_argument(
        "--compilation_cache_dir",
        default="auto",
        help="persistent XLA compilation cache, as train.py's: 'auto', a directory, or 'off'",
    )


def is_single_file(args: argparse.Namespace, suffixes: tuple[str, ...]) -> bool:
    """The one-text-file form: --output ends in one of `suffixes` (else it is a folder).

    Raises:
      ValueError: a one-file --output from a table --input (Parquet, JSONL, ...).
    """
    if not args.output.endswith(suffixes):
        return False
    if args.input.lower().endswith(TABLE_SUFFIXES):
        raise ValueError(
            f"--output {args.output} writes one file from one text file; for {args.input} give "
            "an output folder (Parquet shards)"
        )
    return True


def npy_bytes(array: np.ndarray) -> bytes:
    """`array` as the bytes of a .npy file (`np.save`'s), to be written whole to a path or URL."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()
