"""Losses and accuracies as (sum, count) pairs, so that they average right across devices and hosts.

Every function returns sums over the examples it is given and the matching denominators; divide
only after summing over the whole global batch. All math is float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def weighted_cross_entropy(logits: Array, labels: Array, weights: Array | None = None):
    """Softmax cross-entropy and accuracy.

    Args:
      logits: [..., K] float.
      labels: [...] int in [0, K).
      weights: [...] float, 0 for padded slots; ones when omitted.

    Returns:
      dict with loss_sum, correct_sum and count (sum of weights), float32 scalars.
    """
    logits = logits.astype(jnp.float32)
    if weights is None:
        weights = jnp.ones(labels.shape, jnp.float32)
    weights = weights.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return dict(
        loss_sum=jnp.sum(nll * weights),
        correct_sum=jnp.sum(correct * weights),
        count=jnp.sum(weights),
    )


def mean_squared_error(predictions: Array, targets: Array, weights: Array | None = None):
    """Squared error for regression heads (num_labels == 1).

    Args:
      predictions: [B] or [B, 1] float.
      targets: [B] float.
      weights: [B] float; ones when omitted.

    Returns:
      dict with loss_sum and count.
    """
    predictions = predictions.reshape(targets.shape).astype(jnp.float32)
    if weights is None:
        weights = jnp.ones(targets.shape, jnp.float32)
    weights = weights.astype(jnp.float32)
    err = (predictions - targets.astype(jnp.float32)) ** 2
    return dict(loss_sum=jnp.sum(err * weights), count=jnp.sum(weights))


# NSP's AUC is counted in bins of P(random next), so that it adds up over batches and hosts like
# every other metric sum; pairs in one bin count as ties (half), which errs toward 0.5.
NSP_SCORE_BINS = 256


def score_histogram(logits: Array, labels: Array, weights: Array | None = None) -> Array:
    """Weighted counts of a binary classifier's P(label 1), by bin: float32 [2, NSP_SCORE_BINS],
    row 0 for examples of label 0 and row 1 for label 1 (`objectives.summarize` turns them into
    the AUC).

    Args:
      logits: [..., 2] logits.
      labels: [...] int, 0 or 1.
      weights: [...] float; ones when omitted.
    """
    p = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)[..., 1].reshape(-1)
    bins = jnp.clip((p * NSP_SCORE_BINS).astype(jnp.int32), 0, NSP_SCORE_BINS - 1)
    w = jnp.ones_like(p) if weights is None else weights.reshape(-1).astype(jnp.float32)
    rows = labels.reshape(-1).astype(jnp.int32)
    return jnp.zeros((2, NSP_SCORE_BINS), jnp.float32).at[rows, bins].add(w)


def pretraining_losses(
    prediction_logits: Array,
    masked_lm_ids: Array,
    masked_lm_weights: Array,
    seq_relationship_logits: Array | None,
    next_sentence_labels: Array | None,
    next_sentence_weights: Array | None = None,
):
    """MLM and NSP terms of BERT's pretraining loss, as sums and counts.

    The original's loss is mean MLM cross-entropy over real predictions plus mean NSP
    cross-entropy over sequences: `mlm_loss_sum / mlm_count + nsp_loss_sum / nsp_count`.

    Args:
      prediction_logits: [B, P, V] logits at the masked positions.
      masked_lm_ids: [B, P] int original ids there.
      masked_lm_weights: [B, P] float, 1 real prediction, 0 padded slot.
      seq_relationship_logits: [B, 2] (or [B, S, 2] packed), or None for MLM-only training.
      next_sentence_labels: [B] (or [B, S]) int, 0 = real next, 1 = random.
      next_sentence_weights: [B] (or [B, S]) float; ones when omitted.

    Returns:
      dict with mlm_loss_sum, mlm_correct_sum, mlm_count and, with NSP, nsp_loss_sum,
      nsp_correct_sum, nsp_count and nsp_score_hist (`score_histogram`: the AUC).
    """
    mlm = weighted_cross_entropy(prediction_logits, masked_lm_ids, masked_lm_weights)
    out = {f"mlm_{k}": v for k, v in mlm.items()}
    if seq_relationship_logits is not None:
        nsp = weighted_cross_entropy(
            seq_relationship_logits, next_sentence_labels, next_sentence_weights
        )
        out.update({f"nsp_{k}": v for k, v in nsp.items()})
        out["nsp_score_hist"] = score_histogram(
            seq_relationship_logits, next_sentence_labels, next_sentence_weights
        )
    return out
