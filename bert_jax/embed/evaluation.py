"""Dev retrieval, as the field measures embedders: each dev anchor is a query, the dev positives
and hard negatives (each distinct text once) are the corpus, and the query's positive is its one
relevant document; nDCG@10, MRR@10, Recall@1 and Recall@10 by cosine similarity
(`bert_jax.embed.retrieval.retrieval_scores`, as sentence-transformers'
InformationRetrievalEvaluator computes them).

    dev = retrieval_set(pairs, tokenizer, max_seq_length)
    scores = score(exp, params, dev, batch_size)     # {"ndcg@10": ..., "mrr@10": ..., ...}
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import tokenization
from bert_jax.data import batching
from bert_jax.embed import retrieval
from bert_jax.embed.pairs import Pairs, text_features
from bert_jax.inference import batches
from bert_jax.parallel import sharding
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
    exp: experiment.Experiment, params, features, batch_size: int, max_segments: int = 0
) -> np.ndarray:
    """Sentence embeddings float32 [N, E] of text features [N, L] (`Experiment.embed_fn`), in
    batches of about `batch_size` texts over every data-parallel device and host: packed
    several to a row with `max_segments` > 0 (`inference.batches.run_batched`), else rows of
    similar length."""
    return batched_outputs(
        exp,
        exp.embed_fn(),
        params,
        features,
        batch_size,
        "embed.eval_batch_size",
        max_segments=max_segments,
    )


def batched_outputs(
    exp: experiment.Experiment,
    apply_fn,
    params,
    features,
    batch_size: int,
    setting: str,
    *,
    max_segments: int = 0,
) -> np.ndarray:
    """`apply_fn(params, global batch)`'s outputs [N, ...] for feature rows [N, L], in batches
    of `batch_size` rows of similar length over every data-parallel device and host (each host
    feeds its rows; the outputs are gathered), or of packed rows holding about `batch_size`
    texts with `max_segments` > 0 (`apply_fn` then gives [R, S, ...]). `setting` names the
    batch size where it does not split over the data-parallel devices. A batch's
    `example_weights` are not passed."""
    shards = sharding.data_parallel_size(exp.mesh)
    if batch_size % shards:
        raise ValueError(
            f"{setting}={batch_size} does not split over the {shards} data-parallel devices"
        )

    def apply(params, batch):
        rows = sharding.host_batch_rows(exp.mesh, len(batch["input_ids"]))
        local = {k: v[rows] for k, v in batch.items()}
        out = apply_fn(params, sharding.global_batch_from_local(local, exp.mesh))
        return jax.device_get(multihost_utils.process_allgather(out, tiled=True))

    with jax.set_mesh(exp.mesh):
        return batches.run_batched(
            apply,
            params,
            features,
            batch_size=batch_size,
            buckets=batching.length_buckets(features["input_ids"].shape[-1]),
            progress=False,
            desc=setting,
            max_segments=max_segments,
            row_multiple=shards,
        )


def score(
    exp: experiment.Experiment, params, dev: RetrievalSet, batch_size: int, max_segments: int = 0
):
    """The retrieval metrics of the model `params` on `dev` ({"ndcg@10", "mrr@10", "recall@1",
    "recall@10"}: floats), its texts packed with `max_segments` > 0 (`embed_texts`);
    FloatingPointError on a NaN embedding."""
    queries = embed_texts(exp, params, dev.queries, batch_size, max_segments)
    corpus = embed_texts(exp, params, dev.corpus, batch_size, max_segments)
    if not (np.isfinite(queries).all() and np.isfinite(corpus).all()):
        raise FloatingPointError("the dev embeddings hold NaN or inf; stopping")
    return {
        k: float(v) for k, v in retrieval.retrieval_scores(queries, corpus, dev.relevant).items()
    }
