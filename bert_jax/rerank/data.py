"""Reranker training and dev rows: files with sentence-transformers' column names, read and
featurized as (query, passage) pairs.

Files (`read_rows`, through `retrieval.records`, as the embedding job's pairs): JSONL, CSV, TSV or
Parquet with a header, in one of two layouts told by the
columns (docs/rerank.md, "Data"): pointwise (`query`, `passage`, a float `label`) or listwise
(`query`, `positive`, hard negatives in `negative` and/or `negative_1`, ...; teacher scores in
`positive_score` and `<negative column>_score`). Other columns are ignored; a bad value raises
ValueError naming the file, line (Parquet: row) and column.

Features (`featurize`), one row per file row, G candidates each (pointwise 1; listwise the
positive then the negatives), each pair laid out as the tokenizer's family lays out a sentence
pair, truncated longest-first to L:

    input_ids, token_type_ids, attention_mask   int32   [N, G, L]
    labels                                      float32 [N]       pointwise only
    teacher_scores                              float32 [N, G]    listwise files with scores
    example_weights                             float32 [N]       1.0

`dev_queries` turns dev rows into reranking queries: a pointwise file's rows grouped by query
(candidates in file order, relevant where label > 0), a listwise row one query (its positive,
then its negatives).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np
from absl import logging

from bert_jax import tokenization
from bert_jax.data import sentence_features
from bert_jax.retrieval import pairs, records
from bert_jax.retrieval.records import negative_columns, number, text

# The query's column is the embedding job's anchor (the first of these present); a pointwise
# row's passage one of the positive's names (`retrieval.pairs`) but `positive`, which marks a
# listwise row.
QUERY_COLUMNS = pairs.ANCHOR_COLUMNS
PASSAGE_COLUMNS = tuple(c for c in pairs.POSITIVE_COLUMNS if c != "positive")
FORMATS = records.PARQUET_FORMATS
SCORE_SUFFIX = "_score"


@dataclasses.dataclass(frozen=True)
class RerankRows:
    """The rows of one file, in file order.

    Attributes:
      queries: N texts.
      candidates: N tuples of G texts (pointwise: the passage; listwise: the positive, then
        the negatives).
      labels: float32 [N] of a pointwise file, else None.
      teacher_scores: float32 [N, G] of a listwise file with score columns, else None.
      path: the file read.
    """

    queries: list[str]
    candidates: list[tuple[str, ...]]
    labels: np.ndarray | None
    teacher_scores: np.ndarray | None
    path: str

    @property
    def layout(self) -> str:
        """ "pointwise" or "listwise"."""
        return "pointwise" if self.labels is not None else "listwise"

    @property
    def group_size(self) -> int:
        """G, the candidates of every row."""
        return len(self.candidates[0])

    def __len__(self) -> int:
        return len(self.queries)


def _first(record: dict, names: Sequence[str], where: str) -> str:
    """The first of `names` the record has; ValueError naming them and the record's columns."""
    column = records.first_column(list(record), names)
    if column is None:
        raise ValueError(
            f"{where}: no column {' or '.join(map(repr, names))}; it has {sorted(record)}"
        )
    return column


def _listwise(record: dict, where: str) -> tuple[tuple[str, ...], list[float] | None]:
    """(positive, negatives...) of a listwise record and their teacher scores (None: none)."""
    texts = [text(record["positive"], where, "positive")]
    scores = [record["positive_score"]] if "positive_score" in record else None
    for column in negative_columns(list(record)):
        score = record.get(column + SCORE_SUFFIX)
        texts += records.texts(record[column], where, column)
        if scores is not None:
            if score is None:
                raise ValueError(
                    f"{where}: column {column + SCORE_SUFFIX!r} is missing (positive_score "
                    "is given: every candidate needs its teacher score)"
                )
            scores += score if isinstance(score, list) else [score]
    if scores is not None:
        if len(scores) != len(texts):
            raise ValueError(f"{where}: {len(scores)} teacher score(s) for {len(texts)} candidates")
        scores = [number(s, where, "teacher score") for s in scores]
    return tuple(texts), scores


def read_rows(path: str | os.PathLike, max_examples: int = 0) -> RerankRows:
    """Reads a reranking file (see the module docstring).

    Args:
      path: a .jsonl, .csv, .tsv or .parquet file.
      max_examples: keep the first this many rows (0: all).

    Raises:
      FileNotFoundError: no such file.
      ValueError: a bad row or column, naming the file, line and column; rows of both layouts;
        a file of no rows.
    """
    path = os.fspath(path)
    queries, candidates, labels, scores = [], [], [], []
    layout = None
    for where, record in records.records(path, FORMATS, "rows", max_rows=max_examples):
        query_column = _first(record, QUERY_COLUMNS, where)
        kind = "pointwise" if "label" in record else "listwise"
        if layout is not None and kind != layout:
            raise ValueError(
                f"{where}: a {kind} row (columns {sorted(record)}) in a {layout} file: every "
                "row has a `label` (pointwise) or none (listwise: positive and negatives)"
            )
        layout = kind
        query = text(record[query_column], where, query_column)
        if kind == "pointwise":
            column = _first(record, PASSAGE_COLUMNS, where)
            texts, row_scores = (text(record[column], where, column),), None
            labels.append(number(record["label"], where, "label"))
        else:
            _first(record, ("positive",), where)
            texts, row_scores = _listwise(record, where)
            first = len(candidates[0]) - 1 if candidates else None
            records.check_count(len(texts) - 1, first, where, "negative(s)")
            if candidates and (row_scores is None) != (not scores):
                raise ValueError(f"{where}: teacher scores (positive_score, ...) in some rows only")
            if row_scores is not None:
                scores.append(row_scores)
        queries.append(query)
        candidates.append(texts)
    rows = RerankRows(
        queries,
        candidates,
        np.asarray(labels, np.float32) if layout == "pointwise" else None,
        np.asarray(scores, np.float32) if scores else None,
        path,
    )
    logging.info("%s: %d %s rows of %d candidate(s)", path, len(rows), layout, rows.group_size)
    return rows


def pair_features(
    tokenizer: tokenization.SubwordTokenizer,
    queries: Sequence[str],
    passages: Sequence[str],
    max_seq_length: int,
) -> dict[str, np.ndarray]:
    """(query, passage) pairs as the family lays out a sentence pair: input_ids,
    token_type_ids, attention_mask int32 [N, L]; logs the truncation."""
    features, stats = sentence_features.encode_texts(
        tokenizer, list(queries), list(passages), max_seq_length
    )
    stats.log("pairs")
    return features


def featurize(
    rows: RerankRows, tokenizer: tokenization.SubwordTokenizer, max_seq_length: int
) -> dict[str, np.ndarray]:
    """The training features of `rows` (keys and shapes in the module docstring)."""
    n, g = len(rows), rows.group_size
    flat = pair_features(
        tokenizer,
        [q for q in rows.queries for _ in range(g)],
        [t for texts in rows.candidates for t in texts],
        max_seq_length,
    )
    features = {k: v.reshape(n, g, -1) for k, v in flat.items()}
    if rows.labels is not None:
        features["labels"] = rows.labels
    if rows.teacher_scores is not None:
        features["teacher_scores"] = rows.teacher_scores
    features["example_weights"] = np.ones(n, np.float32)
    return features


@dataclasses.dataclass(frozen=True)
class DevQuery:
    """One query to rerank: its candidates in the first stage's order (the file's) and which
    are relevant (bool, one per candidate)."""

    query: str
    candidates: tuple[str, ...]
    relevant: tuple[bool, ...]


def dev_queries(rows: RerankRows) -> list[DevQuery]:
    """The reranking queries of dev rows (see the module docstring)."""
    if rows.labels is None:
        return [
            DevQuery(q, texts, (True,) + (False,) * (len(texts) - 1))
            for q, texts in zip(rows.queries, rows.candidates)
        ]
    grouped: dict[str, tuple[list[str], list[bool]]] = {}
    for query, (passage,), label in zip(rows.queries, rows.candidates, rows.labels):
        texts, relevant = grouped.setdefault(query, ([], []))
        texts.append(passage)
        relevant.append(bool(label > 0))
    return [DevQuery(q, tuple(t), tuple(r)) for q, (t, r) in grouped.items()]


def loss_for_rows(loss: str, rows: RerankRows) -> str:
    """`rerank.loss`, with "auto" made the loss that reads `rows`' layout: "bce" for pointwise
    rows (query, passage, label), "listwise" for a positive among its negatives (margin-MSE is
    never guessed: teacher scores are a choice)."""
    if loss != "auto":
        return loss
    return "bce" if rows.layout == "pointwise" else "listwise"


def check_rows(loss: str, layout: str, group_size: int, has_teacher_scores: bool, path: str):
    """Refuses training rows the loss cannot read, naming the file and what it needs."""
    if loss == "bce" and layout != "pointwise":
        raise ValueError(
            f"{path}: rerank.loss=bce reads pointwise rows (query, passage, label); this file "
            "is listwise: use rerank.loss=listwise (or margin_mse with teacher scores)"
        )
    if loss != "bce" and (layout != "listwise" or group_size < 2):
        raise ValueError(
            f"{path}: rerank.loss={loss} reads listwise rows (query, positive, negative...) "
            "with at least one negative"
        )
    if loss == "margin_mse" and not has_teacher_scores:
        raise ValueError(
            f"{path}: rerank.loss=margin_mse needs teacher scores: columns positive_score and "
            "negative_score (or negative_<i>_score)"
        )
