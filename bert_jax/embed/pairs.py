"""Training pairs for sentence embeddings: files with the columns sentence-transformers names
(`anchor`, `positive`, and optional hard negatives), read and featurized.

Files (`read_pairs`): CSV (standard quoting) or TSV (tab-separated, no quoting) with a header, or
JSONL (one object a line). Columns: `anchor` and `positive` (texts; or by the names other data
sets give them, `query` / `question` and `passage` / `answer` / `document`: the first of
`ANCHOR_COLUMNS` and of `POSITIVE_COLUMNS` present), and hard negatives in a
column `negative` and/or columns `negative_1`, `negative_2`, ... (in that order); in JSONL
`negative` may also be a list of texts. Every row has as many hard negatives as the first one
(a batch is one array). Other columns are ignored. A missing column, an empty or non-text value,
a row with another number of negatives raise ValueError naming the file, line and column.

Features (`featurize_pairs`), one row per pair, T = 2 + hard negatives per pair, each text
encoded alone as [CLS] text [SEP] (truncated to L):

    input_ids, token_type_ids, attention_mask   int32   [N, T, L]   text 0 the anchor, 1 the
                                                                    positive, 2.. the negatives
    example_weights                             float32 [N]         1.0

`text_features` encodes single texts the same way ([N, L]), for embedding an evaluation's
queries and corpus.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Sequence

import numpy as np
from absl import logging

from bert_jax import tokenization
from bert_jax.data import text_io

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
_NEGATIVE = re.compile(r"negative(?:_(\d+))?$")
# The names a pair's two texts go by in the data sets people have: the first present is read.
ANCHOR_COLUMNS = ("anchor", "query", "question")
POSITIVE_COLUMNS = ("positive", "passage", "answer", "document")


def pair_columns(columns: Sequence[str], where: str) -> tuple[str, str]:
    """(anchor column, positive column) of a file or record with `columns`: the first of
    ANCHOR_COLUMNS and of POSITIVE_COLUMNS present; ValueError naming what is missing and the
    columns there are."""
    anchor = next((c for c in ANCHOR_COLUMNS if c in columns), None)
    positive = next((c for c in POSITIVE_COLUMNS if c in columns), None)
    if anchor is None or positive is None:
        missing = [
            " or ".join(repr(c) for c in names)
            for names, found in ((ANCHOR_COLUMNS, anchor), (POSITIVE_COLUMNS, positive))
            if found is None
        ]
        raise ValueError(
            f"{where}: missing column {' and '.join(missing)}; it has {sorted(columns)}"
        )
    return anchor, positive


@dataclasses.dataclass(frozen=True)
class Pairs:
    """The pairs of one file, in file order.

    Attributes:
      anchors, positives: N texts each (positive i answers anchor i).
      negatives: N tuples of the same length K, each anchor's hard negatives (K may be 0).
      path: the file read.
    """

    anchors: list[str]
    positives: list[str]
    negatives: list[tuple[str, ...]]
    path: str

    @property
    def num_negatives(self) -> int:
        """K, the hard negatives of every pair."""
        return len(self.negatives[0]) if self.negatives else 0

    def __len__(self) -> int:
        return len(self.anchors)


def format_of(path: str, formats: dict[str, str] = FORMATS, kind: str = "pairs") -> str:
    """The format of a `kind` file by its extension (`formats`: extension -> name; "csv", "tsv"
    or "jsonl" by default); ValueError naming the known ones."""
    fmt = formats.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise ValueError(f"{path}: unknown {kind} format; expected one of {sorted(formats)}")
    return fmt


def _negative_order(name: str) -> int | None:
    """The place of a hard-negative column ("negative" 0, "negative_3" 3), None for others."""
    match = _NEGATIVE.match(name)
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) else 0


def _text(value, where: str, column: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: column {column!r} holds {value!r:.60}, not a text")
    if not value.strip():
        raise ValueError(f"{where}: column {column!r} is empty")
    return value


def _jsonl_rows(path: str, f) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    for line, raw in enumerate(f, start=1):
        if not raw.strip():
            continue
        where = f"{path}:{line}"
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not a JSON object: {e}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {record!r:.40}")
        anchor_column, positive_column = pair_columns(list(record), where)
        negatives = []
        for column in sorted(
            (c for c in record if _negative_order(c) is not None), key=_negative_order
        ):
            values = record[column]
            if isinstance(values, list) and column == "negative":
                negatives += [_text(v, where, f"{column}[{i}]") for i, v in enumerate(values)]
            else:
                negatives.append(_text(values, where, column))
        anchor = _text(record[anchor_column], where, anchor_column)
        positive = _text(record[positive_column], where, positive_column)
        yield where, anchor, positive, tuple(negatives)


def _table_rows(path: str, f, tsv: bool) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    rows = text_io.csv_rows(f, path, tsv=tsv)
    _, header = next(rows, (0, None))
    if header is None:
        raise ValueError(f"{path} is empty")
    anchor, positive = pair_columns(header, f"{path}: the header")
    negatives = sorted((c for c in header if _negative_order(c) is not None), key=_negative_order)
    index = {c: header.index(c) for c in (anchor, positive, *negatives)}
    for line, row in rows:
        if not row or not any(field.strip() for field in row):
            continue
        where = f"{path}:{line}"
        if len(row) != len(header):
            raise ValueError(f"{where}: {len(row)} field(s), but the header has {len(header)}")
        texts = {c: _text(row[i], where, c) for c, i in index.items()}
        yield where, texts[anchor], texts[positive], tuple(texts[c] for c in negatives)


def read_pairs(path: str | os.PathLike, max_examples: int = 0) -> Pairs:
    """Reads a pairs file (see the module docstring).

    Args:
      path: a .csv, .tsv or .jsonl file.
      max_examples: keep the first this many pairs (0: all).

    Raises:
      FileNotFoundError: no such file.
      ValueError: a bad row or column, naming the file, line and column; a file of no pairs.
    """
    path = os.fspath(path)
    fmt = format_of(path)
    anchors, positives, negatives = [], [], []
    with text_io.open_text(path) as f:
        rows = _jsonl_rows(path, f) if fmt == "jsonl" else _table_rows(path, f, fmt == "tsv")
        for where, anchor, positive, negs in rows:
            if negatives and len(negs) != len(negatives[0]):
                raise ValueError(
                    f"{where}: {len(negs)} hard negative(s), but the first row has "
                    f"{len(negatives[0])}: every row needs as many (a batch is one array)"
                )
            anchors.append(anchor)
            positives.append(positive)
            negatives.append(negs)
            if max_examples and len(anchors) == max_examples:
                break
    if not anchors:
        raise ValueError(f"{path} holds no pairs")
    pairs = Pairs(anchors, positives, negatives, path)
    logging.info("%s: %d pairs, %d hard negative(s) each", path, len(pairs), pairs.num_negatives)
    return pairs


def text_features(
    tokenizer: tokenization.SubwordTokenizer, texts: Sequence[str], max_seq_length: int
) -> dict[str, np.ndarray]:
    """[CLS] text [SEP] rows: input_ids, token_type_ids, attention_mask int32 [N, L] and
    example_weights float32 [N] (ones)."""
    features, _ = text_io.encode_texts(tokenizer, list(texts), None, max_seq_length)
    features["example_weights"] = np.ones(len(texts), np.float32)
    return features


def featurize_pairs(
    pairs: Pairs, tokenizer: tokenization.SubwordTokenizer, max_seq_length: int
) -> dict[str, np.ndarray]:
    """The features of `pairs` (keys and shapes in the module docstring); logs the truncation."""
    columns = [pairs.anchors, pairs.positives]
    columns += [[negs[k] for negs in pairs.negatives] for k in range(pairs.num_negatives)]
    encoded, stats = text_io.encode_texts(
        tokenizer, [t for column in columns for t in column], None, max_seq_length
    )
    stats.log("texts")
    n, t = len(pairs), len(columns)
    features = {
        k: np.ascontiguousarray(v.reshape(t, n, -1).swapaxes(0, 1)) for k, v in encoded.items()
    }
    features["example_weights"] = np.ones(n, np.float32)
    return features
