"""Dev retrieval, as the field measures embedders: each dev anchor is a query, the dev positives
and hard negatives (each distinct text once) are the corpus, and the query's positive is its one
relevant document; nDCG@10, MRR@10, Recall@1 and Recall@10 by cosine similarity (a SPLADE
model's: dot product; `bert_jax.retrieval.metrics.retrieval_scores`, as sentence-transformers'
InformationRetrievalEvaluator computes them).

    dev = retrieval_set(pairs, tokenizer, max_seq_length)
    scores = score(exp, params, dev, batch_size)     # {"ndcg@10": ..., "mrr@10": ..., ...}
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_jax import tokenization
from bert_jax.inference import batches
from bert_jax.retrieval import metrics as retrieval
from bert_jax.retrieval.pairs import Pairs, text_features
from bert_jax.training import experiment


@dataclasses.dataclass(frozen=True)
class RetrievalSet:
    """Queries, a corpus and which documents answer each query.

    Attributes:
      queries: text features [Q, L] (`pairs.text_features`).
      corpus: text features [C, L].
      relevant: Q sets of corpus row indices.
    """

    queries: dict[str, np.ndarray]
    corpus: dict[str, np.ndarray]
    relevant: list[set[int]]


def retrieval_set(
    pairs: Pairs, tokenizer: tokenization.SubwordTokenizer, max_seq_length: int
) -> RetrievalSet:
    """The retrieval task of dev pairs: anchors as queries, every distinct positive and hard
    negative text as the corpus, anchor i's positive relevant to it."""
    index: dict[str, int] = {}
    for text in [*pairs.positives, *(t for negs in pairs.negatives for t in negs)]:
        index.setdefault(text, len(index))
    relevant = [{index[p]} for p in pairs.positives]
    return RetrievalSet(
        text_features(tokenizer, pairs.anchors, max_seq_length),
        text_features(tokenizer, list(index), max_seq_length),
        relevant,
    )


def embed_texts(
    exp: experiment.Experiment,
    params,
    features,
    batch_size: int,
    max_segments: int = 0,
    queries: bool = False,
) -> np.ndarray:
    """Sentence embeddings float32 [N, E] of text features [N, L] (`Experiment.embed_fn`; as
    queries are embedded with `queries`), in batches of about `batch_size` texts over every
    data-parallel device and host: packed several to a row with `max_segments` > 0
    (`inference.batches.run_batched`), else rows of similar length."""
    return batches.run_on_mesh(
        exp.mesh,
        exp.embed_fn(queries),
        params,
        features,
        batch_size,
        "embed.eval_batch_size",
        max_segments=max_segments,
    )


def score(
    exp: experiment.Experiment, params, dev: RetrievalSet, batch_size: int, max_segments: int = 0
):
    """The retrieval metrics of the model `params` on `dev` ({"ndcg@10", "mrr@10", "recall@1",
    "recall@10"}: floats), its texts packed with `max_segments` > 0 (`embed_texts`);
    FloatingPointError on a NaN embedding."""
    queries = embed_texts(exp, params, dev.queries, batch_size, max_segments, queries=True)
    corpus = embed_texts(exp, params, dev.corpus, batch_size, max_segments)
    if not (np.isfinite(queries).all() and np.isfinite(corpus).all()):
        raise FloatingPointError("the dev embeddings hold NaN or inf; stopping")
    similarity = exp.objective.similarity  # SPLADE's vectors: "dot"
    found = retrieval.retrieval_scores(queries, corpus, dev.relevant, similarity=similarity)
    return {k: float(v) for k, v in found.items()}
