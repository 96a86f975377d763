"""What an objective is: the protocol every objective declares, and what they share.

An *objective* trains one kind of head. It runs the model and returns sums and counts over the
(global) batch, never means, so that metrics average right across devices, hosts and
micro-batches: the loss of a batch is `objective.loss(sums, counts)` with counts taken from the
whole batch (`summarize` turns accumulated sums into the metrics a run reports).

Whether rows couple across the batch decides how the steps split a batch
(`bert_jax.training.steps`):

* rows apart (`couples_rows=False`: every head's loss, the reranker's): the loss is a sum over
  rows, so k micro-batches of b rows are k separate sums that give exactly the gradient of one
  batch of k*b rows;
* rows coupled (`couples_rows=True`: in-batch negatives, where every row's documents are every
  other row's negatives): the loss is not a sum over rows. The steps compute each chunk's
  `row_outputs` apart and the loss of the whole batch from them (`batch_sums`): GradCache's
  chunks, never separate losses.

The objectives themselves: `training.objectives` (the heads' and the registry),
`training.contrastive` (in-batch negatives), `training.reranking` (the cross-encoder's losses).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import batch_layout, losses
from bert_jax.models.family import Role

Batch = Mapping[str, jax.Array]
MODEL_INPUTS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "position_ids",
    "segment_ids",
    "cls_positions",
)


@runtime_checkable
class Objective(Protocol):
    """How one kind of head is trained: what every objective declares.

    Attributes:
      name: the objective's name ("pretraining", "contrastive", "rerank_bce", ...).
      role: the role of the model it trains (`Role.PRETRAINING`); each family trains its class
        of that role (`Family.head_for`), and a family without one fails naming its roles.
      couples_rows: whether the loss couples the rows of a batch (see the module docstring).
      anchors_apart: whether a packed batch of groups of texts (`retrieval.packing`) holds each
        group's text 0 beside the rows, [B, L], not in them: anchors that run through no model
        (an inference-free SPLADE model's queries). `training.seed_run.group_batches` reads it.
      build_model: (experiment config, model config, RuntimeConfig, head class) -> the module
        it trains; None: the head class on the model config (one model).
    """

    name: str
    role: Role
    couples_rows: bool
    anchors_apart: bool
    build_model: Callable[..., nn.Module] | None

    def sums(self, model, params, batch: Batch, rng, deterministic: bool) -> dict[str, jax.Array]:
        """float32 sums over the batch; keys ending in "_loss_sum" enter the loss."""

    def counts(self, batch: Batch) -> dict[str, jax.Array]:
        """The denominators ({prefix}_count) over the whole batch."""

    def loss(self, sums: Mapping[str, jax.Array], counts: Mapping[str, jax.Array]) -> jax.Array:
        """The scalar loss of the batch from its sums and counts."""

    def example_batch(self, **sizes: int) -> dict[str, jax.ShapeDtypeStruct]:
        """The shapes and dtypes of a batch it trains on, with the axes' sizes
        (`batch_layout`'s letters): what `--mode=compile` lowers the step with."""

    def at_step(self, step: jax.Array) -> Objective:
        """The objective as it trains the update `step` (int32 scalar, 0 first; traced): itself,
        or one whose loss weights follow a schedule (SPLADE's FLOPS warmup)."""


class CoupledObjective(Objective, Protocol):
    """An objective whose rows couple (`couples_rows=True`): its loss is computed from every
    row's outputs at once, which the steps compute a chunk of rows at a time."""

    def row_outputs(self, model, params, batch: Batch, rng, deterministic: bool) -> jax.Array:
        """The outputs of the batch's rows [rows, ...] (e.g. embeddings), row by row."""

    def batch_sums(self, outputs: jax.Array, batch: Batch) -> dict[str, jax.Array]:
        """The loss sums of the whole batch from all its rows' `row_outputs`."""


def apply_model(
    model: nn.Module, params, batch: Batch, rng, deterministic: bool, rngs=None, **extra
):
    """The model's outputs for the batch's model inputs (`MODEL_INPUTS` present in `batch`, less
    token_type_ids for a family without token types); dropout draws from `rng` unless
    `deterministic`, and the model's other random streams from `rngs` (name -> key)."""
    rngs = {**({} if deterministic else {"dropout": rng}), **(rngs or {})} or None
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if not getattr(model, "token_types", True):
        inputs.pop("token_type_ids", None)
    return model.apply(
        {"params": params}, **inputs, **extra, deterministic=deterministic, rngs=rngs
    )


def weighted_loss(
    loss_weights: Mapping[str, float],
    sums: Mapping[str, jax.Array],
    counts: Mapping[str, jax.Array],
) -> jax.Array:
    """The scalar loss: the weighted sum over prefixes of {prefix}_loss_sum / {prefix}_count."""
    total = jnp.float32(0.0)
    for prefix, weight in loss_weights.items():
        total += weight * sums[f"{prefix}_loss_sum"] / jnp.maximum(counts[f"{prefix}_count"], 1)
    return total


@dataclasses.dataclass(frozen=True)
class RowwiseObjective:
    """An objective whose loss is a sum over rows (`couples_rows=False`), made of functions.

    Attributes:
      name, role, build_model: as `Objective` has them.
      sums: (model, params, batch, rng, deterministic) -> dict of float32 sums, whose keys ending
        in "_loss_sum" enter the loss, divided by the count of the same prefix.
      counts: batch -> dict of the denominators ({prefix}_count) over the whole batch.
      loss_weights: prefix -> weight in the loss (mean over each prefix, then summed).
      layout: the batch it trains on (`batch_layout`), for `example_batch`; None: none declared
        (its job lowers the step with a batch of its own data's shapes).
    """

    couples_rows: ClassVar[bool] = False
    anchors_apart: ClassVar[bool] = False  # every text of a group in the rows

    name: str
    role: Role
    sums: Callable[..., dict[str, jax.Array]]
    counts: Callable[[Batch], dict[str, jax.Array]]
    loss_weights: Mapping[str, float]
    build_model: Callable[..., nn.Module] | None = None
    layout: Mapping[str, batch_layout.Field] | None = None

    def loss(self, sums: Mapping[str, jax.Array], counts: Mapping[str, jax.Array]) -> jax.Array:
        """The scalar loss: the weighted sum over prefixes of sums / counts."""
        return weighted_loss(self.loss_weights, sums, counts)

    def at_step(self, step: jax.Array) -> RowwiseObjective:
        """Itself: its loss weights are the same at every step."""
        return self

    def example_batch(self, **sizes: int) -> dict[str, jax.ShapeDtypeStruct]:
        """`layout`'s shapes with the axes' sizes (`batch_layout.abstract_batch`)."""
        if self.layout is None:
            raise ValueError(f"the objective {self.name!r} declares no batch layout")
        return batch_layout.abstract_batch(dict(self.layout), **sizes)


def unpack_slots(values: jax.Array, text_index: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """A packed batch's per-slot values [R, S, ...] put in their texts' places: [B, T, ...]
    from text_index int32 [R, S] (text b * T + t, -1 an empty slot, dropped) and shape (B, T)
    (`bert_jax.retrieval.packing`)."""
    b, t = shape
    index = text_index.reshape(-1)
    rest = values.shape[2:]
    out = jnp.zeros((b * t, *rest), values.dtype)
    out = out.at[jnp.where(index < 0, b * t, index)].set(
        values.reshape(-1, *rest), mode="drop", unique_indices=True
    )
    return out.reshape(b, t, *rest)


def summarize(sums: Mapping[str, Any]) -> dict[str, float]:
    """Host-side: turns accumulated sums and counts into means and accuracies.

    {prefix}_loss_sum / {prefix}_count -> {prefix}_loss; {prefix}_correct_sum -> {prefix}_accuracy;
    {stem}_share_sum -> {stem}_share (a share of the prefix's count);
    {prefix}_score_hist ([2, bins] counts, `losses.score_histogram`) -> {prefix}_auc
    (`losses.auc_from_histogram`). Other keys (loss, grad_norm, learning_rate) pass through.
    """
    out = {}
    for key, value in sums.items():
        if key.endswith(("_loss_sum", "_correct_sum", "_share_sum", "_count", "_score_hist")):
            continue
        out[key] = float(value)
    for key, value in sums.items():
        for suffix, name in (
            ("_loss_sum", "_loss"),
            ("_correct_sum", "_accuracy"),
            ("_share_sum", "_share"),
        ):
            if key.endswith(suffix):
                stem = key[: -len(suffix)]
                prefix = stem.split("_")[0]
                count = float(sums.get(f"{prefix}_count", 0.0))
                if count > 0:
                    out[stem + name] = float(value) / count
        if key.endswith("_score_hist"):
            auc = losses.auc_from_histogram(value)
            if auc is not None:
                out[key[: -len("_score_hist")] + "_auc"] = auc
    return out
