"""Hard negatives mined by a model, as sentence-transformers' `mine_hard_negatives` mines them
(its "n-tuple" output): for each anchor, the corpus texts the model ranks close to it that are not
its positives.

    from bert_jax.embed import mine as command, mining
    _, embed_fn = command.text_embedders("model_dir")      # texts -> [N, E]
    mined = mining.mine(pairs.read_pairs("train.jsonl"), embed_fn, mining.MiningOptions())
    command.write_mined(mined, "mined.jsonl")   # anchor, positive, negative_1 .. negative_K

The command, files in and out, and the differences from sentence-transformers: docs/mining.md.

Dimensions: Q queries (the distinct anchors), N corpus texts, E embedding width, k candidates
per query, K = `num_negatives`. The steps:

1. Texts: the queries are the distinct anchors, in first appearance, each with its distinct
   positives; the corpus is the extra corpus (if any), then the positives, each text once.
2. Search (`retrieval.search`: on the devices, or by faiss on the host): each query's
   k = range_max + (the most texts any query excludes) corpus texts of highest cosine
   similarity, exactly.
3. Rescoring (optional, with a filter): a cross-encoder's scores of each query with its
   candidates and positives replace the cosine similarities.
4. Selection (`select`): the query's positives, its own text (unless `exclude_anchor=False`) and
   the candidates that fail a filter are set aside: absolute_margin keeps a score <= p - margin,
   relative_margin a score <= p - |p| * margin (p: the lowest score of the query's positives),
   max_score a score <= max_score, min_score a score >= min_score. Of the rest, ranked by score,
   ranks range_min .. range_max - 1 are kept and K taken ("top", or "random": seeded, then
   ranked). A query with fewer than K is dropped, with all its pairs.
5. Rows: one per (anchor, distinct positive), grouped by anchor in first appearance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from absl import logging

from bert_jax.retrieval import metrics
from bert_jax.retrieval import pairs as pairs_lib
from bert_jax.retrieval import search as search_lib

STRATEGIES = ("top", "random")


@dataclasses.dataclass(frozen=True)
class MiningOptions:
    """What `select` keeps (module docstring; each field is the command's flag of that name).

    Attributes:
      num_negatives: K, negatives per anchor (>= 1).
      range_min, range_max: the ranks kept among the candidates that pass the filters, range_min
        .. range_max - 1; range_max None: sentence-transformers' default, range_min + K + the most
        positives of an anchor, or with a margin or max_score range_min + 10 K + that.
      max_score, min_score, absolute_margin, relative_margin: the filters; None: off.
      sampling_strategy: "top" (the best K) or "random" (K at random, seeded by `seed`).
      exclude_anchor: never take the anchor's own text as its negative.
      rescore: the candidates and positives are rescored by a cross-encoder (`mine`'s
        `rescore_fn`) before the filters, which it needs: one of the margins or scores.
    """

    num_negatives: int = 3
    range_min: int = 0
    range_max: int | None = None
    max_score: float | None = None
    min_score: float | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    sampling_strategy: str = "top"
    seed: int = 0
    exclude_anchor: bool = True
    rescore: bool = False

    def window_end(self, max_positives: int) -> int:
        """range_max, or its default for anchors of at most `max_positives` positives; checks
        the options (ValueError naming the flag)."""
        if self.num_negatives < 1:
            raise ValueError(f"--num_negatives must be at least 1, got {self.num_negatives}")
        if self.range_min < 0:
            raise ValueError(f"--range_min must be >= 0, got {self.range_min}")
        if self.sampling_strategy not in STRATEGIES:
            raise ValueError(
                f"--sampling_strategy must be one of {STRATEGIES}, got {self.sampling_strategy!r}"
            )
        filters = (self.absolute_margin, self.relative_margin, self.max_score, self.min_score)
        if self.rescore and all(v is None for v in filters):
            raise ValueError(
                "--cross_encoder rescores the candidates for a filter: give --absolute_margin, "
                "--relative_margin, --max_score or --min_score (on the cross-encoder's scores)"
            )
        end = self.range_max
        if end is None:
            filtered = filters[:3] + ((self.min_score,) if self.rescore else ())
            many = 10 if any(v is not None for v in filtered) else 1
            end = self.range_min + many * self.num_negatives + max_positives
        if self.range_min >= end:
            raise ValueError(
                f"--range_min ({self.range_min}) must be smaller than --range_max ({end})"
            )
        if self.num_negatives > end - self.range_min:
            raise ValueError(
                f"--num_negatives {self.num_negatives} does not fit in ranks {self.range_min}.."
                f"{end - 1} (--range_min, --range_max)"
            )
        return end


class Selection(NamedTuple):
    """Each query's negatives (`select`).

    Attributes:
      indices: int32 [Q, K] corpus rows, best first; -1 in a row not found.
      scores: float32 [Q, K] their cosine similarities; -inf in a row not found.
      found: bool [Q], whether the query has K negatives.
      skipped: {filter name: candidates it set aside}.
    """

    indices: np.ndarray
    scores: np.ndarray
    found: np.ndarray
    skipped: dict[str, int]


def select(
    candidates: search_lib.Candidates,
    excluded: Sequence[Sequence[int]],
    positive_scores: np.ndarray,
    options: MiningOptions,
    range_max: int,
) -> Selection:
    """Picks each query's negatives among its candidates (module docstring, step 4).

    Args:
      candidates: scores float32 [Q, k] descending and indices int32 [Q, k] (`retrieval.search`).
      excluded: Q lists of corpus rows never taken (the positives, the anchor's own text).
      positive_scores: float32 [Q], the lowest score of each query's positives (the margins').
      options: the filters, ranks, K and strategy; range_max: `options.window_end(...)`.
    """
    scores = np.array(candidates.scores, np.float32)  # [Q, k], a copy to mark
    indices = np.asarray(candidates.indices)
    num_queries, k = scores.shape[0], options.num_negatives
    for q in range(num_queries):
        scores[q, np.isin(indices[q], excluded[q])] = -np.inf
    p = np.asarray(positive_scores, np.float32)[:, None]  # [Q, 1]
    skipped = {}

    def set_aside(name: str, out: np.ndarray) -> None:
        out &= np.isfinite(scores)  # [Q, k]; count each candidate once, by its first filter
        skipped[name] = int(out.sum())
        scores[out] = -np.inf

    # float32 thresholds, compared as sentence-transformers' torch code compares them.
    o = options
    if o.absolute_margin is not None:
        set_aside("absolute_margin", scores + np.float32(o.absolute_margin) > p)
    if o.relative_margin is not None:
        set_aside("relative_margin", scores > p - np.abs(p) * np.float32(o.relative_margin))
    if o.max_score is not None:
        set_aside("max_score", scores > np.float32(o.max_score))
    if o.min_score is not None:
        set_aside("min_score", scores < np.float32(o.min_score))
    # The survivors ranked (a stable sort keeps equal scores in corpus order), then the window.
    order = np.argsort(-scores, axis=1, kind="stable")[:, options.range_min : range_max]
    window_scores = np.take_along_axis(scores, order, axis=1)
    window = np.take_along_axis(indices, order, axis=1)
    if window.shape[1] < k:  # a corpus smaller than the window: the missing ranks are -inf
        pad = ((0, 0), (0, k - window.shape[1]))
        window_scores = np.pad(window_scores, pad, constant_values=-np.inf)
        window = np.pad(window, pad, constant_values=-1)
    num_valid = np.isfinite(window_scores).sum(axis=1)  # [Q]; the valid ranks come first
    found = num_valid >= k
    picks = np.broadcast_to(np.arange(k), (num_queries, k)).copy()  # [Q, K] window positions
    if options.sampling_strategy == "random":
        rng = np.random.default_rng(options.seed)
        for q in np.flatnonzero(found):
            picks[q] = np.sort(rng.choice(num_valid[q], size=k, replace=False))
    chosen = np.where(found[:, None], np.take_along_axis(window, picks, axis=1), -1)
    chosen_scores = np.where(
        found[:, None], np.take_along_axis(window_scores, picks, axis=1), -np.inf
    )
    return Selection(chosen.astype(np.int32), chosen_scores.astype(np.float32), found, skipped)


def _rescored(candidates, positives, queries, texts, rescore_fn):
    """(Candidates with the cross-encoder's [Q, k] scores, the same indices; [Q] arrays of its
    scores of each query's positives), all pairs scored in one call."""
    num_queries, k = candidates.indices.shape
    left = [queries[q] for q in range(num_queries) for _ in range(k)]
    right = [texts[i] for i in candidates.indices.reshape(-1)]
    for q, rows in enumerate(positives):
        left += [queries[q]] * len(rows)
        right += [texts[i] for i in rows]
    scores = np.asarray(rescore_fn(left, right), np.float32).reshape(-1)
    if scores.shape != (len(left),):
        raise ValueError(f"rescore_fn gave {scores.shape[0]} scores for {len(left)} pairs")
    ends = np.cumsum([num_queries * k] + [len(rows) for rows in positives])
    pair_scores = np.split(scores, ends[:-1])[1:]  # each query's positives
    return search_lib.Candidates(
        scores[: ends[0]].reshape(num_queries, k), candidates.indices
    ), pair_scores


@dataclasses.dataclass(frozen=True)
class Mined:
    """The mined rows (`mine`), R of them, and what was dropped.

    Attributes:
      anchors, positives: R texts each; negatives: R tuples of K texts, best first.
      positive_scores: float32 [R]; negative_scores: float32 [R, K] (cosine similarities, or
        the cross-encoder's scores where it rescored them).
      num_anchors: the distinct anchors; num_dropped: those with fewer than K negatives;
      num_pairs_dropped: their (anchor, positive) pairs.
      skipped: {filter name: candidates it set aside}.
    """

    anchors: list[str]
    positives: list[str]
    negatives: list[tuple[str, ...]]
    positive_scores: np.ndarray
    negative_scores: np.ndarray
    num_anchors: int
    num_dropped: int
    num_pairs_dropped: int
    skipped: dict[str, int]


def mine(
    pairs: pairs_lib.Pairs,
    embed_fn: Callable[[list[str]], np.ndarray],
    options: MiningOptions,
    corpus: Sequence[str] | None = None,
    rescore_fn: Callable[[list[str], list[str]], np.ndarray] | None = None,
    search_fn: Callable[[np.ndarray, np.ndarray, int], search_lib.Candidates] = search_lib.search,
    query_embed_fn: Callable[[list[str]], np.ndarray] | None = None,
) -> Mined:
    """Hard negatives for `pairs` (module docstring); the pairs' own negatives are not read.

    Args:
      pairs: the (anchor, positive) pairs.
      embed_fn: texts -> float [len(texts), E] embeddings of the candidates (and of the
        anchors, without `query_embed_fn`; `mine.text_embedders`).
      options: what to keep.
      corpus: further candidate texts (None: the positives alone).
      rescore_fn: (queries, passages) -> float [len(queries)] scores of each pair, a
        cross-encoder's (`mine.pair_scorer`), given exactly when `options.rescore`; the
        filters, ranks and the scores written are then its.
      search_fn: (queries [Q, E], corpus [N, E], k) -> Candidates: `retrieval.search.search`
        (exact, on the devices) or `search_faiss` (exact, on the host's cores, for a corpus
        beyond the devices' memory).
      query_embed_fn: the anchors' embedder where it is not `embed_fn` (a query prompt).
    """
    if options.rescore != (rescore_fn is not None):
        raise ValueError("options.rescore is set exactly when a rescore_fn is given")
    index = _index_pairs(pairs, corpus, options.exclude_anchor)
    range_max = options.window_end(int(max(n for n in index.num_pairs)))
    query_emb, doc_emb = _embed_texts(embed_fn, index.queries, index.texts, query_embed_fn)
    k = min(range_max + int(index.num_pairs.max()), len(index.texts))
    candidates = search_fn(query_emb, doc_emb, k)
    pair_scores = [doc_emb[rows] @ query_emb[q] for q, rows in enumerate(index.positives)]
    if rescore_fn is not None:
        candidates, pair_scores = _rescored(
            candidates, index.positives, index.queries, index.texts, rescore_fn
        )
    lowest = np.array([s.min() for s in pair_scores], np.float32)  # [Q]
    chosen = select(candidates, index.excluded, lowest, options, range_max)
    return _mined(index, pair_scores, chosen, options.num_negatives)


class _PairIndex(NamedTuple):
    """The pairs by row: queries [Q] (distinct anchors), texts [N] (the corpus, then the
    positives not in it), each query's positive rows and excluded rows (its positives, and its
    own text where the anchor is excluded), and num_pairs int64 [Q] (its pairs, repeats counted
    as sentence-transformers counts them, plus one for an excluded anchor)."""

    queries: list[str]
    texts: list[str]
    positives: list[list[int]]
    excluded: list[list[int]]
    num_pairs: np.ndarray


def _index_pairs(
    pairs: pairs_lib.Pairs, corpus: Sequence[str] | None, exclude_anchor: bool
) -> _PairIndex:
    """The rows of the queries, the candidate texts and each query's positives (`_PairIndex`)."""
    queries = list(dict.fromkeys(pairs.anchors))
    query_row = {text: i for i, text in enumerate(queries)}
    texts = list(dict.fromkeys([*(corpus or ()), *pairs.positives]))
    corpus_row = {text: i for i, text in enumerate(texts)}
    positives: list[list[int]] = [[] for _ in queries]
    num_pairs = np.zeros(len(queries), np.int64)  # sentence-transformers counts repeated pairs
    for anchor, positive in zip(pairs.anchors, pairs.positives):
        q, row = query_row[anchor], corpus_row[positive]
        num_pairs[q] += 1
        if row not in positives[q]:
            positives[q].append(row)
    excluded = [list(rows) for rows in positives]
    if exclude_anchor:
        for q, text in enumerate(queries):
            if text in corpus_row and corpus_row[text] not in excluded[q]:
                excluded[q].append(corpus_row[text])
                num_pairs[q] += 1  # one more candidate to search past
    return _PairIndex(queries, texts, positives, excluded, num_pairs)


def _embed_texts(
    embed_fn: Callable[[list[str]], np.ndarray],
    queries: list[str],
    texts: list[str],
    query_embed_fn: Callable[[list[str]], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Unit embeddings of the queries [Q, E] and the corpus texts [N, E], a text that is both
    embedded once where one embedder serves both sides."""
    if query_embed_fn not in (None, embed_fn):
        return metrics.unit(query_embed_fn(queries)), metrics.unit(embed_fn(texts))
    embedded = list(dict.fromkeys([*texts, *queries]))
    embeddings = metrics.unit(embed_fn(embedded))  # [T, E]: the corpus texts lead
    row_of = {text: i for i, text in enumerate(embedded)}
    return embeddings[[row_of[text] for text in queries]], embeddings[: len(texts)]


def _mined(index: _PairIndex, pair_scores, chosen, num_negatives: int) -> Mined:
    """The mined rows of the queries `chosen` found negatives for (each of their pairs, with its
    score and the negatives'), the dropped ones counted and logged."""
    anchors, kept, negatives, positive_scores, negative_scores = [], [], [], [], []
    for q in np.flatnonzero(chosen.found):
        for row, score in zip(index.positives[q], pair_scores[q]):
            anchors.append(index.queries[q])
            kept.append(index.texts[row])
            negatives.append(tuple(index.texts[i] for i in chosen.indices[q]))
            positive_scores.append(score)
            negative_scores.append(chosen.scores[q])
    num_dropped = int((~chosen.found).sum())
    pairs_dropped = sum(len(index.positives[q]) for q in np.flatnonzero(~chosen.found))
    for name, count in chosen.skipped.items():
        logging.info("%s set aside %d candidate negatives", name, count)
    if num_dropped:
        logging.warning(
            "%d of %d anchors (%d pairs) dropped: fewer than %d negatives passed the filters "
            "(consider --range_max, --range_min, the margins, --max_score, --min_score)",
            *(num_dropped, len(index.queries), pairs_dropped, num_negatives),
        )
    return Mined(
        anchors,
        kept,
        negatives,
        np.asarray(positive_scores, np.float32).reshape(-1),
        np.asarray(negative_scores, np.float32).reshape(-1, num_negatives),
        len(index.queries),
        num_dropped,
        pairs_dropped,
        chosen.skipped,
    )
