"""The reranker's objective: a cross-encoder's one logit per (query, passage) pair, trained
pointwise (binary cross-entropy), listwise (a positive among its negatives) or by margin-MSE
distillation (`rerank_objective`). Its loss is a sum over groups: rows do not couple.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bert_jax import batch_layout, losses
from bert_jax.models.family import Role
from bert_jax.training.objective import MODEL_INPUTS, RowwiseObjective, apply_model, unpack_slots

# The reranker's losses (`rerank_objective`) and the listwise loss's activations.
RERANK_LOSSES = ("bce", "listwise", "margin_mse")
RERANK_ACTIVATIONS = ("sigmoid", "identity")


def pair_logits(
    model, params, batch, rng, deterministic: bool, packed_shape: tuple[int, int] | None = None
) -> jax.Array:
    """float32 [B, G]: the head's one logit for each pair of a [B, G, L] batch, or of the same
    pairs packed several to a row (`bert_jax.retrieval.packing`, packed_shape (B, G)): each slot
    classified at its own [CLS] ([R, S, 1]) and put back in its group's place."""
    if "text_index" in batch:
        if packed_shape is None:
            raise ValueError("a packed batch needs the objective's packed_shape=(B, G)")
        logits = apply_model(model, params, batch, rng, deterministic).logits  # [R, S, 1]
        return unpack_slots(logits[..., 0].astype(jnp.float32), batch["text_index"], packed_shape)
    b, g, length = batch["input_ids"].shape
    flat = {k: batch[k].reshape(b * g, length) for k in MODEL_INPUTS if k in batch}
    logits = apply_model(model, params, flat, rng, deterministic).logits  # [B G, 1]
    return logits[:, 0].astype(jnp.float32).reshape(b, g)


def rerank_objective(
    loss: str = "bce",
    scale: float = 10.0,
    activation: str = "sigmoid",
    packed_shape: tuple[int, int] | None = None,
) -> RowwiseObjective:
    """The reranker's objective (`bert_jax.rerank`): a one-output sequence-classification head
    scores each (query, passage) pair of a [B, G, L] batch (G = 1 pointwise; listwise the
    positive, then its negatives), trained by `loss`:

        bce         pointwise binary cross-entropy on the logit against `labels` [B]
        listwise    the positive's softmax cross-entropy among its group; `scale` and
                    `activation` are its (`losses.listwise_softmax_loss`)
        margin_mse  distillation: the margins s(q, p) - s(q, n) against `teacher_scores` [B, G]

    Batch (`batch_layout.rerank_layout`): input_ids, token_type_ids, attention_mask int32
    [B, G, L], example_weights float32 [B], and labels or teacher_scores; or, with
    `packed_shape` (B, G), the pairs packed several to a row (`bert_jax.retrieval.packing`, its
    `keep`: the [B] keys as they are), the same loss.
    Metrics: rerank_loss, rerank_accuracy (bce: the logit's sign right; listwise: the positive
    first)."""
    if loss not in RERANK_LOSSES:
        raise ValueError(f"rerank_objective: loss={loss!r}; expected one of {RERANK_LOSSES}")
    if activation not in RERANK_ACTIVATIONS:
        raise ValueError(
            f"rerank_objective: activation={activation!r}; expected one of {RERANK_ACTIVATIONS}"
        )

    def weights(batch):
        return batch["example_weights"].astype(jnp.float32)

    def sums(model, params, batch, rng, deterministic):
        logits = pair_logits(model, params, batch, rng, deterministic, packed_shape)
        if loss == "bce":
            out = losses.binary_cross_entropy(logits[:, 0], batch["labels"], weights(batch))
        elif loss == "listwise":
            out = losses.listwise_softmax_loss(
                logits, weights(batch), scale=scale, activation=activation
            )
        else:
            out = losses.margin_mse_loss(logits, batch["teacher_scores"], weights(batch))
        result = {"rerank_loss_sum": out["loss_sum"]}
        if "correct_sum" in out:
            result["rerank_correct_sum"] = out["correct_sum"]
        return result

    group = None if packed_shape is None else packed_shape[1]

    def counts(batch):
        size = group if "text_index" in batch else batch["input_ids"].shape[1]
        margins = size - 1 if loss == "margin_mse" else 1
        return {"rerank_count": jnp.sum(weights(batch)) * margins}

    layout = batch_layout.rerank_layout(loss, packed=packed_shape is not None)
    name = f"rerank_{loss}"
    return RowwiseObjective(
        name, Role.SEQUENCE_CLASSIFICATION, sums, counts, {"rerank": 1.0}, layout=layout
    )
