"""BM25 over a corpus of texts by the bm25s library, with its defaults: its tokenizer (lower
case, words of two or more word characters, English stopwords removed, no stemming) and its
`BM25()`, Lucene's variant: a document d's score is the sum over the query's words t of
idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)), tf the count of t in d, |d| its words,
idf(t) = ln(1 + (N - n_t + 0.5) / (n_t + 0.5)) for n_t of the N documents holding t; k1 = 1.5,
b = 0.75.

    from bert_jax.retrieval import lexical
    candidates = lexical.search_bm25(query_texts, corpus_texts, k=10)  # search.Candidates

Dimensions: Q queries, N corpus texts, k candidates per query, C queries a chunk. bm25s is
imported when `search_bm25` runs (the `retrieval` extra; it uses JAX's top_k where installed:
here only its scores are read, the top k are ours).
"""

from __future__ import annotations

import logging

import numpy as np

from bert_jax.retrieval import metrics
from bert_jax.retrieval.search import Candidates

STOPWORDS = "en"  # bm25s's English list, as its documentation's examples tokenize


def bm25s_module():
    """The bm25s module; ImportError saying how to install it."""
    try:
        import bm25s
    except ImportError as e:
        raise ImportError(
            "a BM25 index needs bm25s: pip install bm25s (or the project's `retrieval` extra)"
        ) from e
    # bm25s sets its logger to DEBUG: its notes on how it builds the index would print.
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def search_bm25(queries: list[str], corpus: list[str], k: int, chunk: int = 256) -> Candidates:
    """Each query's k best corpus texts by BM25 (bm25s's defaults, module docstring): scores
    float32 [Q, min(k, N)] descending, indices int32 into `corpus`, equal scores in ascending
    corpus row order (a query of no indexed word scores 0 everywhere: the first k rows)."""
    bm25s = bm25s_module()
    index = bm25s.BM25()
    index.index(bm25s.tokenize(corpus, stopwords=STOPWORDS, show_progress=False),
                show_progress=False)  # fmt: skip
    words = bm25s.tokenize(queries, stopwords=STOPWORDS, return_ids=False, show_progress=False)
    scores, indices = [], []
    for start in range(0, len(queries), chunk):
        rows = np.stack(
            [
                index.get_scores_from_ids(index.get_tokens_ids(w))
                for w in words[start : start + chunk]
            ]
        ).astype(np.float32)  # [C, N]
        top = metrics.top_k(rows, k)  # equal scores in ascending row order
        indices.append(top.astype(np.int32))
        scores.append(np.take_along_axis(rows, top, axis=1))
    return Candidates(np.concatenate(scores), np.concatenate(indices))
