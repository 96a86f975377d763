"""Training pairs for sentence embeddings: files with the columns sentence-transformers names
(`anchor`, `positive`, and optional hard negatives), read and featurized.

Files (`read_pairs`, through `retrieval.records`): CSV (standard quoting) or TSV (tab-separated,
no quoting) with a header, or JSONL (one object a line). Columns: `anchor` and `positive` (texts;
or by the names other data sets give them, `query` / `question` and `passage` / `answer` /
`document`: the first of `ANCHOR_COLUMNS` and of `POSITIVE_COLUMNS` present), and hard negatives
in a column `negative` and/or columns `negative_1`, `negative_2`, ... (in that order); in JSONL
`negative` may also be a list of texts. A file that names none of these columns is read by
position, as sentence-transformers reads a data set: the first column the anchor, the second
the positive, each further one a hard negative (logged, naming the columns). Every row has as
many hard negatives as the first one (a batch is one array). Other columns are ignored. A
missing column (one of the two named, the other not), an empty or non-text value, a row with
another number of negatives raise ValueError naming the file, line and column.

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
import os
from collections.abc import Sequence

import numpy as np
from absl import logging

from bert_jax import tokenization
from bert_jax.data import sentence_features
from bert_jax.retrieval import records

# The names a pair's two texts go by in the data sets people have: the first present is read.
ANCHOR_COLUMNS = ("anchor", "query", "question")
POSITIVE_COLUMNS = ("positive", "passage", "answer", "document")


def pair_columns(columns: Sequence[str], where: str) -> tuple[str, str]:
    """(anchor column, positive column) of a file or record with `columns`: the first of
    ANCHOR_COLUMNS and of POSITIVE_COLUMNS present; ValueError naming what is missing and the
    columns there are."""
    anchor = records.first_column(columns, ANCHOR_COLUMNS)
    positive = records.first_column(columns, POSITIVE_COLUMNS)
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


def by_position(columns: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """(anchor, positive, hard-negative columns) of `columns` read by position, as
    sentence-transformers reads a data set's columns: where none of them is named as a pair's
    text or a hard negative and there are at least two; else None (read by name)."""
    named = {*ANCHOR_COLUMNS, *POSITIVE_COLUMNS}
    if len(columns) < 2 or any(
        c in named or records.negative_order(c) is not None for c in columns
    ):
        return None
    return columns[0], columns[1], list(columns[2:])


def _log_by_position(path: str, columns: tuple[str, str, list[str]]) -> None:
    anchor, positive, negatives = columns
    logging.warning(
        "%s: no column is named as a pair's text (%s / %s); read by position, as "
        "sentence-transformers reads a data set: anchor %r, positive %r, hard negatives %s",
        path, "/".join(ANCHOR_COLUMNS), "/".join(POSITIVE_COLUMNS), anchor, positive, negatives,
    )  # fmt: skip


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


def pair_of(record: dict, where: str) -> tuple[str, str, tuple[str, ...]]:
    """(anchor, positive, hard negatives) of one record (`records.records`), by name or by
    position (`by_position`); in JSONL the column `negative` may hold a list of texts."""
    positional = by_position(list(record))
    if positional is None:
        anchor_column, positive_column = pair_columns(list(record), where)
        negative_columns = records.negative_columns(list(record))
    else:
        anchor_column, positive_column, negative_columns = positional
    negatives = []
    for column in negative_columns:
        negatives += records.texts(record[column], where, column, lists=column == "negative")
    anchor = records.text(record[anchor_column], where, anchor_column)
    positive = records.text(record[positive_column], where, positive_column)
    return anchor, positive, tuple(negatives)


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
    anchors, positives, negatives = [], [], []

    def check_header(header):
        if by_position(header) is None:
            pair_columns(header, f"{path}: the header")

    rows = records.records(path, check_header=check_header, max_rows=max_examples)
    for where, record in rows:
        if not anchors and (positional := by_position(list(record))):
            _log_by_position(path, positional)
        anchor, positive, negs = pair_of(record, where)
        first = len(negatives[0]) if negatives else None
        records.check_count(len(negs), first, where, "hard negative(s)")
        anchors.append(anchor)
        positives.append(positive)
        negatives.append(negs)
    pairs = Pairs(anchors, positives, negatives, path)
    logging.info("%s: %d pairs, %d hard negative(s) each", path, len(pairs), pairs.num_negatives)
    return pairs


def text_features(
    tokenizer: tokenization.SubwordTokenizer, texts: Sequence[str], max_seq_length: int
) -> dict[str, np.ndarray]:
    """[CLS] text [SEP] rows: input_ids, token_type_ids, attention_mask int32 [N, L] and
    example_weights float32 [N] (ones)."""
    features, _ = sentence_features.encode_texts(tokenizer, list(texts), None, max_seq_length)
    features["example_weights"] = np.ones(len(texts), np.float32)
    return features


def featurize_pairs(
    pairs: Pairs, tokenizer: tokenization.SubwordTokenizer, max_seq_length: int
) -> dict[str, np.ndarray]:
    """The features of `pairs` (keys and shapes in the module docstring); logs the truncation."""
    columns = [pairs.anchors, pairs.positives]
    columns += [[negs[k] for negs in pairs.negatives] for k in range(pairs.num_negatives)]
    encoded, stats = sentence_features.encode_texts(
        tokenizer, [t for column in columns for t in column], None, max_seq_length
    )
    stats.log("texts")
    n, t = len(pairs), len(columns)
    features = {
        k: np.ascontiguousarray(v.reshape(t, n, -1).swapaxes(0, 1)) for k, v in encoded.items()
    }
    features["example_weights"] = np.ones(n, np.float32)
    return features
