"""Retrieval scores as the field reports them for embedders: each query's relevant documents among
the whole corpus, ranked by cosine similarity.

    scores = retrieval_scores(query_emb, corpus_emb, relevant=[{0}, {1, 7}, ...])
    scores["ndcg@10"], scores["mrr@10"], scores["recall@1"], scores["recall@10"]

The numbers equal sentence-transformers' `InformationRetrievalEvaluator` (cosine scores, binary
relevance) on the same embeddings, its conventions included: documents of equal score rank by
corpus position (its ascending corpus id); a query without relevant documents is left out of
every mean; MRR@k is the mean reciprocal rank of the first relevant document in the top k (0 when
none is); Recall@k is the share of a query's relevant documents in its top k; nDCG@k divides the
DCG of the top k (gain 1 for a relevant document at rank r, discounted by log2(r + 1)) by that of
the ideal ranking (of min(10, its relevant documents) hits). Host numpy: a dev set of thousands
of pairs takes well under a second. `ranked_scores` scores lists ranked elsewhere (a search's
top k, `python -m bert_jax.inference search --qrels`) the same way, Recall@100 among them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

K = 10  # nDCG@10, MRR@10 and Recall@10, the field's figures (and Recall@1)
# Queries scored at once: [chunk, N] float32 scores and their ranks stay small.
_QUERY_CHUNK = 512


def unit(x: np.ndarray) -> np.ndarray:
    """float32 rows divided by max(norm, 1e-12), as sentence-transformers' `cos_sim` does."""
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def cosine_scores(queries: np.ndarray, corpus: np.ndarray) -> np.ndarray:
    """float32 [Q, N] cosine similarities of [Q, E] queries with [N, E] documents, computed as
    sentence-transformers' `cos_sim` does (each row divided by max(norm, 1e-12), then a product).

    The product is summed in float64, then rounded: equal documents score exactly alike, as the
    evaluator's torch product gives them (a float32 BLAS product may give equal rows scores an
    ulp apart, by their position in its blocks, on some CPUs, which reorders ties)."""
    q, c = unit(queries).astype(np.float64), unit(corpus).astype(np.float64)
    return (q @ c.T).astype(np.float32)


def dot_scores(queries: np.ndarray, corpus: np.ndarray) -> np.ndarray:
    """float32 [Q, N] dot products of [Q, E] queries with [N, E] documents, summed in float64
    (as `cosine_scores`, so that equal documents score alike)."""
    return (np.asarray(queries, np.float64) @ np.asarray(corpus, np.float64).T).astype(np.float32)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """int [Q, min(k, N)]: each row's k best columns by descending score, equal scores in
    ascending column order (the evaluator's order)."""
    k = min(k, scores.shape[1])
    # A stable sort of the negated scores keeps equal scores in column order.
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def retrieval_scores(
    query_embeddings: np.ndarray,
    corpus_embeddings: np.ndarray,
    relevant: Sequence[set[int]],
    similarity: str = "cosine",
) -> dict[str, float]:
    """nDCG@k, MRR@k and Recall@k of ranking the corpus for each query by cosine similarity
    (`similarity="dot"`: by dot product, SPLADE's vectors').

    Args:
      query_embeddings: float [Q, E], one row per query (e.g. the dev anchors).
      corpus_embeddings: float [N, E], one row per document (e.g. the dev positives, then any
        further corpus).
      relevant: Q sets of row indices into the corpus: the documents relevant to each query.

    Returns:
      {"ndcg@10", "mrr@10", "recall@1", "recall@10"}: Python floats in [0, 1], means over the
      queries with a relevant document.

    Raises:
      ValueError: shapes that do not match, a relevant index outside the corpus, or no query
        with a relevant document.
    """
    queries = np.asarray(query_embeddings)
    corpus = np.asarray(corpus_embeddings)
    if queries.ndim != 2 or corpus.ndim != 2 or queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"embeddings must be [Q, E] and [N, E]; got {queries.shape} and {corpus.shape}"
        )
    if len(relevant) != len(queries):
        raise ValueError(f"{len(relevant)} relevant sets for {len(queries)} queries")
    num_docs = corpus.shape[0]
    for i, docs in enumerate(relevant):
        bad = sorted(d for d in docs if not 0 <= d < num_docs)
        if bad:
            raise ValueError(
                f"query {i}: relevant documents {bad[:5]} outside the corpus of {num_docs}"
            )
    score_fn = {"cosine": cosine_scores, "dot": dot_scores}[similarity]
    kept = [i for i, docs in enumerate(relevant) if docs]  # the evaluator drops the others
    if not kept:
        raise ValueError("no query has a relevant document")
    hits = np.zeros((len(kept), min(K, num_docs)), bool)  # [Q', k]: ranked doc relevant?
    for start in range(0, len(kept), _QUERY_CHUNK):
        rows = kept[start : start + _QUERY_CHUNK]
        ranked = top_k(score_fn(queries[rows], corpus), K)
        for j, (row, docs) in enumerate(zip(rows, ranked)):
            hits[start + j] = [int(d) in relevant[row] for d in docs]
    num_relevant = np.array([len(relevant[i]) for i in kept], np.float64)  # [Q']
    return ranked_scores(hits, num_relevant, recall_at=(1, K))


def ranked_scores(
    hits: np.ndarray, num_relevant: np.ndarray, recall_at: Sequence[int] = (1, K)
) -> dict[str, float]:
    """nDCG@10, MRR@10 and Recall@k of ranked lists, as the evaluator scores its top hits.

    Args:
      hits: bool [Q, R]: whether query q's document at rank r (from 0) is relevant; R, the
        documents retrieved, at least max(10, recall_at) where the corpus holds that many.
      num_relevant: [Q] counts >= 1: each query's relevant documents, retrieved or not (the
        denominators of recall and the ideal DCG).
      recall_at: the k of each Recall@k.

    Returns:
      {"ndcg@10", "mrr@10", "recall@<k>" for each k}: Python floats in [0, 1], means over the Q
      queries.
    """
    hits = np.asarray(hits, bool)
    num_relevant = np.asarray(num_relevant, np.float64)
    top = hits[:, :K]  # [Q, min(R, 10)]
    discount = 1.0 / np.log2(np.arange(K) + 2.0)  # rank r (from 0): 1 / log2(r + 2)
    dcg = (top * discount[: top.shape[1]]).sum(1)
    ideal = np.cumsum(discount)[np.minimum(num_relevant, K).astype(int) - 1]
    found = top.any(1)
    reciprocal_rank = np.where(found, 1.0 / (top.argmax(1) + 1.0), 0.0)  # of the first hit
    scores = {
        "ndcg@10": float(np.mean(dcg / ideal)),
        "mrr@10": float(np.mean(reciprocal_rank)),
    }
    for k in recall_at:
        scores[f"recall@{k}"] = float(np.mean(hits[:, :k].sum(1) / num_relevant))
    return scores
