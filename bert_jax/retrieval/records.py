"""Row files with sentence-transformers' column names, read one way for every retrieval layout.

    for where, record in records("train.jsonl", FORMATS, "pairs"):   # where: "path:line"
        text(record["anchor"], where, "anchor")

Formats by extension (`format_of`): JSONL (one object a line; `.jsonl`, `.ndjson`, `.json`),
CSV (standard quoting) and TSV (no quoting) with a header, and Parquet where the caller's formats
name it (`PARQUET_FORMATS`). Blank lines and rows are skipped; a line that is not a JSON object,
a CSV row of another length than its header, an empty file raise ValueError naming the file and
line (Parquet: "path: row r"). Records are {column: value}: JSONL's and Parquet's values as
stored (lists and numbers too), CSV's as strings.

The columns: a text is read with `text` (a non-empty string), a number with `number`; hard
negatives sit in a column `negative` and/or `negative_1`, `negative_2`, ... (`negative_columns`,
in that order); a role's column is the first of its names present (`first_column`). The pairs of
the embedding job (`retrieval.pairs`) and the reranker's rows (`bert_jax.rerank.data`) read
through these.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from bert_jax.data import tables, text_io

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
PARQUET_FORMATS = {**FORMATS, ".parquet": "parquet"}
_NEGATIVE = re.compile(r"negative(?:_(\d+))?$")


def format_of(path: str, formats: dict[str, str] = FORMATS, kind: str = "pairs") -> str:
    """The format of a `kind` file by its extension (`formats`: extension -> name; "csv", "tsv"
    or "jsonl" by default); ValueError naming the known ones."""
    fmt = formats.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise ValueError(f"{path}: unknown {kind} format; expected one of {sorted(formats)}")
    return fmt


def records(
    path: str,
    formats: dict[str, str] = FORMATS,
    kind: str = "pairs",
    check_header: Callable[[list[str]], object] | None = None,
    max_rows: int = 0,
) -> Iterator[tuple[str, dict]]:
    """(where: "path:line" or "path: row r", {column: value}) of each non-blank row of `path`.

    Args:
      path: a file of one of `formats` (see `format_of`).
      kind: what a row is, in the errors ("pairs", "rows").
      check_header: called with a CSV/TSV file's header before its first row (to refuse a file
        that lacks a column once, naming the header).
      max_rows: the first this many rows (0: all).

    Raises:
      FileNotFoundError: no such file. ValueError: see the module docstring; a file of no rows
        ("path holds no {kind}").
    """
    count = 0
    for row in _records(path, formats, kind, check_header):
        yield row
        count += 1
        if count == max_rows:
            return
    if not count:
        raise ValueError(f"{path} holds no {kind}")


def _records(path, formats, kind, check_header) -> Iterator[tuple[str, dict]]:
    """`records` of the whole file."""
    fmt = format_of(path, formats, kind)
    if fmt == "parquet":
        if not os.path.isfile(path) and "://" not in path:
            raise FileNotFoundError(f"no such file: {path}")
        text_io.note_read(path)
        for row, record in tables.iter_rows(path, tables.column_names(path)):
            yield f"{path}: row {row + 1}", record
        return
    with text_io.open_text(path) as f:
        if fmt == "jsonl":
            yield from _json_records(path, f)
            return
        rows = text_io.csv_rows(f, path, tsv=fmt == "tsv")
        _, header = next(rows, (0, None))
        if header is None:
            raise ValueError(f"{path} is empty")
        if check_header is not None:
            check_header(header)
        for line, row in rows:
            if not row or not any(field.strip() for field in row):
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{path}:{line}: {len(row)} field(s), but the header has {len(header)}"
                )
            yield f"{path}:{line}", dict(zip(header, row))


def _json_records(path: str, f) -> Iterator[tuple[str, dict]]:
    """The objects of a JSONL file's non-blank lines."""
    for line, raw in enumerate(f, start=1):
        if not raw.strip():
            continue
        yield f"{path}:{line}", tables.json_object(raw, f"{path}:{line}")


def texts(value, where: str, column: str, lists: bool = True) -> list[str]:
    """The texts of a column's `value`: each item of a list (JSONL, Parquet; named
    `column[i]`) where `lists`, else the one text."""
    if lists and isinstance(value, list):
        return [text(v, where, f"{column}[{i}]") for i, v in enumerate(value)]
    return [text(value, where, column)]


def text(value, where: str, column: str) -> str:
    """`value` as a text; ValueError naming the place and column where it is none or empty."""
    if not isinstance(value, str):
        raise ValueError(f"{where}: column {column!r} holds {value!r:.60}, not a text")
    if not value.strip():
        raise ValueError(f"{where}: column {column!r} is empty")
    return value


def number(value, where: str, column: str) -> float:
    """`value` as a finite float; ValueError naming the place and column where it is not one."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: column {column!r} holds {value!r}, not a number")
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: column {column!r} holds {value!r:.60}, not a number") from None
    if not np.isfinite(result):
        raise ValueError(f"{where}: column {column!r} holds {value!r}, not a finite number")
    return result


def check_count(count: int, first: int | None, where: str, noun: str) -> None:
    """Refuses a row of `count` `noun` ("hard negative(s)") where the first row had `first`
    (None: this row is the first): a batch is one array."""
    if first is not None and count != first:
        raise ValueError(
            f"{where}: {count} {noun}, but the first row has {first}: every row needs as many "
            "(a batch is one array)"
        )


def negative_order(name: str) -> int | None:
    """The place of a hard-negative column ("negative" 0, "negative_3" 3), None for others."""
    match = _NEGATIVE.match(name)
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) else 0


def negative_columns(columns: Sequence[str]) -> list[str]:
    """The hard-negative columns among `columns`, in their order (`negative_order`)."""
    return sorted((c for c in columns if negative_order(c) is not None), key=negative_order)


def first_column(columns: Sequence[str], names: Sequence[str]) -> str | None:
    """The first of `names` among `columns`, or None."""
    return next((c for c in names if c in columns), None)
