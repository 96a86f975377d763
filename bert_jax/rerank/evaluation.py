"""Dev reranking, as sentence-transformers' CrossEncoderRerankingEvaluator measures a reranker:
each dev query's candidates (in the first stage's order, the file's) scored by the model and
reranked; nDCG@10 and MRR@10 of the reranked order, and of the file's order as the baseline
(`base_ndcg@10`, `base_mrr@10`).

    dev = dev_set(data.dev_queries(rows), tokenizer, max_seq_length)
    scores = score(exp, params, dev, batch_size)   # {"ndcg@10", "mrr@10", "base_ndcg@10", ...}

The numbers equal the evaluator's given its `documents` (the file's order) and positives, its
conventions included: the candidates it reranks are the positives first, then the others in
file order (`always_rerank_positives`), ranked by descending score as `np.argsort(scores)[::-1]`
orders them; a query without a relevant candidate counts 0 in every mean (it is not left out,
unlike retrieval's `retrieval.metrics`); MRR@k is the reciprocal rank of the first relevant
candidate in the top k (0 when none is); nDCG@k is the DCG of the top k (gain 1 for a relevant
candidate at rank r, discounted by log2(r + 1)) over that of the ideal order. Equal scores are
ordered as above, where the evaluator's nDCG (sklearn's `ndcg_score`) averages over ties: only
exactly equal scores can differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bert_jax import tokenization
from bert_jax.inference import batches
from bert_jax.rerank.data import DevQuery, pair_features
from bert_jax.retrieval import metrics as retrieval
from bert_jax.training import experiment

K = retrieval.K  # nDCG@10 and MRR@10, the field's figures


def ranking_metrics(
    relevant: Sequence[bool], scores: np.ndarray, k: int = K
) -> tuple[float, float]:
    """(nDCG@k, MRR@k) of ranking candidates by descending `scores` (float [C]); `relevant`:
    C flags. (0, 0) where none is relevant."""
    relevant = np.asarray(relevant, bool)
    if not relevant.any():
        return 0.0, 0.0
    ranking = np.argsort(np.asarray(scores))[::-1][:k]  # the evaluator's order, ties included
    hits = relevant[ranking]
    discount = 1.0 / np.log2(np.arange(len(hits)) + 2.0)  # rank r (from 0): 1 / log2(r + 2)
    ideal = discount[: min(int(relevant.sum()), k)].sum()
    mrr = 1.0 / (hits.argmax() + 1.0) if hits.any() else 0.0
    return float((hits * discount).sum() / ideal), float(mrr)


@dataclasses.dataclass(frozen=True)
class DevSet:
    """Queries to rerank, their candidates in the evaluator's order and their pair features.

    Attributes:
      queries: the dev queries (`data.dev_queries`), candidates in the file's order.
      features: the (query, candidate) pairs of every query, positives first, then the others
        in file order: input_ids, token_type_ids, attention_mask int32 [P, L] and
        example_weights float32 [P].
      offsets: int [Q + 1], query i's pairs are rows offsets[i]:offsets[i + 1].
    """

    queries: list[DevQuery]
    features: dict[str, np.ndarray]
    offsets: np.ndarray


def reranked_order(query: DevQuery) -> tuple[list[str], list[bool]]:
    """The evaluator's candidates of `query`: its positives, then the others in file order."""
    first = [t for t, r in zip(query.candidates, query.relevant) if r]
    rest = [t for t, r in zip(query.candidates, query.relevant) if not r and t not in first]
    return first + rest, [True] * len(first) + [False] * len(rest)


def dev_set(
    queries: list[DevQuery], tokenizer: tokenization.SubwordTokenizer, max_seq_length: int
) -> DevSet:
    """The pairs to score for `queries` (a query without a relevant candidate has none)."""
    left, right, offsets = [], [], [0]
    for q in queries:
        texts = reranked_order(q)[0] if any(q.relevant) else []
        left += [q.query] * len(texts)
        right += texts
        offsets.append(len(left))
    if not left:
        raise ValueError("no dev query has a relevant candidate")
    features = pair_features(tokenizer, left, right, max_seq_length)
    features["example_weights"] = np.ones(len(left), np.float32)  # batching's fillers: 0
    return DevSet(queries, features, np.array(offsets))


def rerank_scores(queries: Sequence[DevQuery], pair_scores: np.ndarray, offsets) -> dict:
    """nDCG@10 and MRR@10 of the reranked and of the file's order, means over every query.

    Args:
      queries: Q queries.
      pair_scores: float [P], the scores of every query's pairs in `reranked_order`.
      offsets: int [Q + 1], query i's scores are pair_scores[offsets[i]:offsets[i + 1]].

    Returns:
      {"ndcg@10", "mrr@10", "base_ndcg@10", "base_mrr@10"}: Python floats in [0, 1].
    """
    reranked, base = [], []
    for i, q in enumerate(queries):
        relevant = reranked_order(q)[1] if any(q.relevant) else []
        reranked.append(ranking_metrics(relevant, pair_scores[offsets[i] : offsets[i + 1]]))
        file_order = -np.arange(len(q.candidates), dtype=np.float64)  # the first stage's ranks
        base.append(ranking_metrics(q.relevant, file_order))
    reranked, base = np.asarray(reranked), np.asarray(base)
    return {
        f"ndcg@{K}": float(reranked[:, 0].mean()),
        f"mrr@{K}": float(reranked[:, 1].mean()),
        f"base_ndcg@{K}": float(base[:, 0].mean()),
        f"base_mrr@{K}": float(base[:, 1].mean()),
    }


def pair_logits(
    exp: experiment.Experiment,
    params,
    features,
    batch_size: int,
    max_segments: int = batches.MAX_SEGMENTS,
) -> np.ndarray:
    """The relevance logits float32 [N] of pair features [N, L] (with example_weights [N]:
    `Experiment.predict_fn`), in batches of about `batch_size` pairs over every data-parallel
    device and host (`inference.batches.run_on_mesh`): packed several to a row, or one a row
    with `max_segments=0`."""
    predict = exp.predict_fn()
    logits = batches.run_on_mesh(
        exp.mesh,
        lambda p, batch: predict(p, batch).logits[..., 0],  # [B] or, packed, [R, S]
        params,
        features,
        batch_size,
        "rerank.eval_batch_size",
        max_segments=max_segments,
    )
    return np.asarray(logits, np.float32)


def score(exp: experiment.Experiment, params, dev: DevSet, batch_size: int) -> dict[str, float]:
    """The reranking metrics of the model `params` on `dev` (`rerank_scores`);
    FloatingPointError on a NaN score."""
    logits = pair_logits(exp, params, dev.features, batch_size)
    if not np.isfinite(logits).all():
        raise FloatingPointError("the dev scores hold NaN or inf; stopping")
    return rerank_scores(dev.queries, logits, dev.offsets)
