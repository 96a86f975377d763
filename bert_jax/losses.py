"""Losses and accuracies as (sum, count) pairs, so that they average right across devices and hosts.

Every function returns sums over the examples it is given and the matching denominators; divide
only after summing over the whole global batch. All math is float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

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
    row 0 for examples of label 0 and row 1 for label 1 (`auc_from_histogram` turns them into
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


def sigmoid_cross_entropy(logits: Array, labels: Array) -> Array:
    """Elementwise binary cross-entropy of float `labels` in [0, 1] under sigmoid(`logits`), in
    the stable form max(x, 0) - x y + log(1 + exp(-|x|)) (torch's BCEWithLogitsLoss)."""
    return jnp.maximum(logits, 0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))


def replaced_token_losses(logits: Array, replaced: Array, weights: Array) -> dict[str, Array]:
    """The discriminator's term of replaced-token detection, as sums: per-token binary
    cross-entropy of "replaced" (ELECTRA's loss, averaged over the real tokens by the caller).

    Args:
      logits: [B, L] float "replaced" logits.
      replaced: [B, L] bool, the tokens that differ from the original text.
      weights: [B, L] float, 1 at real tokens, 0 at padding.

    Returns:
      dict with rtd_loss_sum, rtd_correct_sum (a logit's sign right), rtd_replaced_share_sum
      (the replaced tokens) and rtd_score_hist (`score_histogram`: the AUC of "replaced").
    """
    logits, w = logits.astype(jnp.float32), weights.astype(jnp.float32)
    labels = replaced.astype(jnp.float32)
    bce = sigmoid_cross_entropy(logits, labels)
    return {
        "rtd_loss_sum": jnp.sum(bce * w),
        "rtd_correct_sum": jnp.sum(((logits > 0) == replaced) * w),
        "rtd_replaced_share_sum": jnp.sum(labels * w),
        # softmax([0, x])[1] = sigmoid(x): the histogram of P(replaced)
        "rtd_score_hist": score_histogram(
            jnp.stack([jnp.zeros_like(logits), logits], -1), replaced, w
        ),
    }


def in_batch_negatives_loss(
    anchors: Array,
    documents: Array,
    *,
    scale: float = 20.0,
    symmetric: bool = False,
    dims: tuple[int, ...] = (),
    similarity: str = "cosine",
):
    """The in-batch negatives softmax loss (InfoNCE; sentence-transformers'
    MultipleNegativesRankingLoss): anchor i's positive is document i, every other document of
    the batch (the other anchors' positives, every hard negative) is a negative.

    Call it on the whole global batch (global arrays under jit on the mesh): the negatives of
    each anchor are then those of every device and host, and the mean is over every anchor.

    Args:
      anchors: [B, E] float embeddings.
      documents: [D, E] float embeddings, D >= B: the B positives (row i is anchor i's) first,
        then any hard negatives.
      scale: the cosine similarities are multiplied by this before the softmax (20: the
        temperature 0.05 of sentence-transformers' default).
      symmetric: also the loss of each positive choosing its anchor among the B anchors
        (MultipleNegativesSymmetricRankingLoss); the two losses are averaged.
      dims: Matryoshka prefix sizes: the loss on the first d embedding dimensions for each d,
        added up (sentence-transformers' MatryoshkaLoss, weights 1); () is the full size only.
      similarity: "cosine", or "dot" (the plain dot product: SPLADE's vectors, as
        sentence-transformers' SparseMultipleNegativesRankingLoss scores them, scale 1).

    Returns:
      dict with loss_sum (B x the loss: the mean over anchors, summed over `dims`), correct_sum
      (anchors whose positive scores highest, on the first of `dims`) and count (B), float32.
    """
    num_anchors = anchors.shape[0]
    labels = jnp.arange(num_anchors)
    total, correct = jnp.float32(0.0), None
    for dim in dims or (anchors.shape[-1],):
        a = anchors[:, :dim].astype(jnp.float32)
        d = documents[:, :dim].astype(jnp.float32)
        if similarity == "cosine":
            a, d = _unit(a), _unit(d)
        scores = scale * (a @ d.T)  # [B, D]
        forward = weighted_cross_entropy(scores, labels)
        loss = forward["loss_sum"]
        if symmetric:  # positive j chooses among the anchors
            backward = weighted_cross_entropy(scores[:, :num_anchors].T, labels)
            loss = 0.5 * (loss + backward["loss_sum"])
        total += loss
        correct = forward["correct_sum"] if correct is None else correct
    return dict(loss_sum=total, correct_sum=correct, count=jnp.float32(num_anchors))


def flops_loss(embeddings: Array) -> Array:
    """The FLOPS regularizer of sparse vectors (sentence-transformers' FlopsLoss, no
    threshold): the sum over the vocabulary of the squared mean activation, which is small
    when few entries are nonzero in few texts (a sparse index's work per query).

    Args:
      embeddings: [N, V] float vectors (>= 0) of N texts of a batch (its queries, or its
        documents).

    Returns:
      float32 scalar: sum_v (mean_n embeddings[n, v])^2.
    """
    return jnp.sum(jnp.mean(embeddings.astype(jnp.float32), axis=0) ** 2)


def _unit(x: Array) -> Array:
    """Rows scaled to unit length (a zero row stays zero), as torch's F.normalize (eps 1e-12)."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# ---- Rerankers (cross-encoders): one relevance logit per (query, passage) pair ----
def binary_cross_entropy(logits: Array, labels: Array, weights: Array | None = None):
    """Pointwise binary cross-entropy on a relevance logit (sentence-transformers'
    BinaryCrossEntropyLoss: `BCEWithLogitsLoss`, its mean = loss_sum / count).

    Args:
      logits: [B] float, one logit per pair.
      labels: [B] float in [0, 1]: 0/1 relevance, or a soft score.
      weights: [B] float, 0 for padded rows; ones when omitted.

    Returns:
      dict with loss_sum, correct_sum (the logit's sign agrees with label >= 0.5) and count,
      float32 scalars.
    """
    x = logits.astype(jnp.float32)
    y = labels.astype(jnp.float32)
    w = jnp.ones(y.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
    bce = sigmoid_cross_entropy(x, y)
    correct = ((x > 0) == (y >= 0.5)).astype(jnp.float32)
    return dict(loss_sum=jnp.sum(bce * w), correct_sum=jnp.sum(correct * w), count=jnp.sum(w))


def listwise_softmax_loss(
    logits: Array,
    weights: Array | None = None,
    *,
    scale: float = 10.0,
    activation: str = "sigmoid",
):
    """The positive's softmax cross-entropy among its group (sentence-transformers' cross-encoder
    MultipleNegativesRankingLoss with `num_negatives=0`: the row's own hard negatives only):
    each group's logits go through `activation`, are multiplied by `scale`, and the positive
    (column 0) is the softmax's target.

    Args:
      logits: [B, G] float: column 0 the positive's logit, 1.. its G - 1 negatives'.
      weights: [B] float, 0 for padded rows; ones when omitted.
      scale: the multiplier before the softmax (10: sentence-transformers' default).
      activation: "sigmoid" (the default there) or "identity".

    Returns:
      dict with loss_sum, correct_sum (the positive scores highest) and count.
    """
    x = logits.astype(jnp.float32)
    if activation == "sigmoid":
        x = jax.nn.sigmoid(x)
    elif activation != "identity":
        raise ValueError(f"activation={activation!r}; expected 'sigmoid' or 'identity'")
    labels = jnp.zeros(x.shape[:1], jnp.int32)
    return weighted_cross_entropy(scale * x, labels, weights)


def margin_mse_loss(logits: Array, teacher_scores: Array, weights: Array | None = None):
    """Margin-MSE distillation (sentence-transformers' cross-encoder MarginMSELoss): the squared
    difference between the student's margins s(q, p) - s(q, n_k) and the teacher's t_p - t_k,
    averaged over every (row, negative) as `nn.MSELoss` does.

    Args:
      logits: [B, G] float, the student's logits: column 0 the positive, 1.. the negatives.
      teacher_scores: [B, G] float, the teacher's scores in the same columns.
      weights: [B] float, 0 for padded rows; ones when omitted.

    Returns:
      dict with loss_sum (over B x (G - 1) margins) and count (the weighted margins).
    """
    s = logits.astype(jnp.float32)
    t = teacher_scores.astype(jnp.float32)
    err = ((s[:, :1] - s[:, 1:]) - (t[:, :1] - t[:, 1:])) ** 2  # [B, G - 1]
    w = jnp.ones(s.shape[:1], jnp.float32) if weights is None else weights.astype(jnp.float32)
    return dict(loss_sum=jnp.sum(err * w[:, None]), count=jnp.sum(w) * err.shape[1])


def auc_from_histogram(hist) -> float | None:
    """The area under the ROC curve from binned scores [2, bins] (`score_histogram`; row 0:
    negatives, row 1: positives), host-side: the chance that a positive scores above a negative,
    ties counted half (0.5 for a classifier that ignores its input); None without both classes."""
    negatives, positives = np.asarray(hist, np.float64)
    pairs = negatives.sum() * positives.sum()
    if pairs <= 0:
        return None
    below = np.cumsum(negatives) - negatives  # negatives in lower bins
    return float(np.sum(positives * (below + 0.5 * negatives)) / pairs)
