"""The contrastive objective: sentence embeddings trained with in-batch negatives.

    objective = contrastive_objective("mean", scale=20.0, packed_shape=(B, T))

Its loss couples every row of the batch (every anchor's negatives are every other row's
documents), so it declares `couples_rows` and computes its loss from every row's embeddings at
once (`row_outputs`, `batch_sums`): the steps embed a batch a chunk of rows at a time (GradCache,
`steps.grad_cache_loss_and_grads`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import batch_layout, losses
from bert_jax.models.family import Role
from bert_jax.models.pooling import SENTENCE_POOLINGS, check_pooling, pool, pool_segments
from bert_jax.training.objective import (
    MODEL_INPUTS,
    Batch,
    apply_model,
    unpack_slots,
    weighted_loss,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContrastiveObjective:
    """An embedding model (the encoder, pooled) trained with in-batch negatives
    (`losses.in_batch_negatives_loss`), its settings fixed when it is made
    (`contrastive_objective`).

    Batch (`batch_layout.contrastive_layout`): input_ids, token_type_ids, attention_mask int32
    [B, T, L]: text 0 of each row is the anchor, text 1 its positive, texts 2.. its hard
    negatives (T = 2 + negatives per row). Or the same texts packed several to a row
    (`bert_jax.retrieval.packing`: [R, L] rows with segment_ids, position_ids, and
    cls_positions, text_index [R, S]), for an objective made with `packed_shape=(B, T)`: each
    text is pooled from its own tokens (`embed` -> [R, S, E]) and put back in its pair's place
    (`texts` -> [B, T, E]), so the loss is the unpacked batch's.

    Its loss couples every row of the batch, so it is not a sum over rows: k micro-batches are
    GradCache's chunks (`steps.loss_and_grads`), never separate losses. `row_outputs` (`embed`)
    and `batch_sums` are the two halves GradCache calls apart.

    Attributes:
      pooling: "mean" or "cls" (`models.pooling.pool`).
      scale, symmetric, dims: as `losses.in_batch_negatives_loss` takes them.
      packed_shape: (B, T), the pairs of a packed batch and the texts of each; None: batches
        are [B, T, L] only.
    """

    couples_rows: ClassVar[bool] = True
    name: ClassVar[str] = "contrastive"
    role: ClassVar[Role] = Role.ENCODER
    build_model: ClassVar[Callable[..., nn.Module] | None] = None
    loss_weights: ClassVar[Mapping[str, float]] = {"mnrl": 1.0}
    similarity: ClassVar[str] = "cosine"  # how its embeddings are compared (dev retrieval)
    # Packed batches hold the anchors beside the rows (`batch_layout.ANCHORS`): they run through
    # no model (an inference-free SPLADE model's).
    anchors_apart: ClassVar[bool] = False

    pooling: str = "mean"
    scale: float = 20.0
    symmetric: bool = False
    dims: tuple[int, ...] = ()
    packed_shape: tuple[int, int] | None = None

    def embed(self, model, params, batch: Batch, rng, deterministic: bool) -> jax.Array:
        """float32 [..., E] embeddings of texts [..., L] (any leading axes); of packed rows
        [R, L], the embeddings [R, S, E] of their slots (an empty slot's, which `texts` drops,
        is meaningless)."""
        if "segment_ids" in batch:
            inputs = {k: batch[k] for k in MODEL_INPUTS[:5]}
            hidden = apply_model(model, params, inputs, rng, deterministic).last_hidden_state
            return pool_segments(hidden, batch["segment_ids"], batch["cls_positions"], self.pooling)
        lead, length = batch["input_ids"].shape[:-1], batch["input_ids"].shape[-1]
        flat = {k: batch[k].reshape(-1, length) for k in MODEL_INPUTS[:3] if k in batch}
        hidden = apply_model(model, params, flat, rng, deterministic).last_hidden_state
        pooled = pool(hidden, flat["attention_mask"], self.pooling)
        return pooled.reshape(*lead, pooled.shape[-1])

    def texts(self, embeddings: jax.Array, batch: Batch) -> jax.Array:
        """The embeddings [B, T, E] of the batch's pairs from what `embed` gave for the whole
        batch: a packed batch's slots [R, S, E] put in their texts' places (`text_index`), an
        unpacked batch's [B, T, E] as they are."""
        if "text_index" not in batch:
            return embeddings
        if self.packed_shape is None:
            raise ValueError("a packed batch needs the objective's packed_shape=(B, T)")
        return unpack_slots(embeddings, batch["text_index"], self.packed_shape)

    def embedding_sums(self, embeddings: jax.Array) -> dict[str, jax.Array]:
        """The loss sums of the embeddings [B, T, E] of a whole batch (text 0 anchors, text 1
        positives, the rest hard negatives)."""
        documents = jnp.swapaxes(embeddings[:, 1:], 0, 1)  # positives first: [T - 1, B, E]
        out = losses.in_batch_negatives_loss(
            embeddings[:, 0],
            documents.reshape(-1, embeddings.shape[-1]),
            scale=self.scale,
            symmetric=self.symmetric,
            dims=self.dims,
        )
        return {"mnrl_loss_sum": out["loss_sum"], "mnrl_correct_sum": out["correct_sum"]}

    # ---- The objective protocol (`training.objective.CoupledObjective`) ----
    def row_outputs(self, model, params, batch: Batch, rng, deterministic: bool) -> jax.Array:
        """The rows' embeddings (`embed`)."""
        return self.embed(model, params, batch, rng, deterministic)

    def batch_sums(self, outputs: jax.Array, batch: Batch) -> dict[str, jax.Array]:
        """The loss sums of the whole batch from its rows' embeddings."""
        return self.embedding_sums(self.texts(outputs, batch))

    def sums(self, model, params, batch: Batch, rng, deterministic: bool) -> dict[str, jax.Array]:
        """The loss sums of the batch, embedded at once."""
        return self.batch_sums(self.row_outputs(model, params, batch, rng, deterministic), batch)

    def counts(self, batch: Batch) -> dict[str, jax.Array]:
        """The anchors of the batch (B; of a packed batch, `packed_shape`'s)."""
        if "text_index" in batch:
            return {"mnrl_count": jnp.float32(self.packed_shape[0])}
        return {"mnrl_count": jnp.float32(batch["input_ids"].shape[0])}

    def loss(self, sums: Mapping[str, jax.Array], counts: Mapping[str, jax.Array]) -> jax.Array:
        """The mean in-batch negatives loss over the anchors."""
        return weighted_loss(self.loss_weights, sums, counts)

    def at_step(self, step: jax.Array) -> ContrastiveObjective:
        """Itself: its loss is the same at every step."""
        return self

    def for_queries(self) -> ContrastiveObjective:
        """The objective whose `embed` embeds queries: itself (queries run as documents do)."""
        return self

    def example_batch(self, **sizes: int) -> dict[str, jax.ShapeDtypeStruct]:
        """A batch of B pairs of T texts of L tokens, packed into R rows of S slots where the
        objective takes packed batches (`batch_layout.contrastive_layout`)."""
        packed = self.packed_shape is not None
        layout = batch_layout.contrastive_layout(packed, self.anchors_apart)
        return batch_layout.abstract_batch(layout, **sizes)


def contrastive_objective(
    pooling: str = "mean",
    scale: float = 20.0,
    symmetric: bool = False,
    dims: tuple[int, ...] = (),
    packed_shape: tuple[int, int] | None = None,
) -> ContrastiveObjective:
    """The contrastive objective with these settings (see `ContrastiveObjective`)."""
    check_pooling(pooling, SENTENCE_POOLINGS)
    return ContrastiveObjective(
        pooling=pooling,
        scale=float(scale),
        symmetric=bool(symmetric),
        dims=tuple(int(d) for d in dims),
        packed_shape=None if packed_shape is None else tuple(int(n) for n in packed_shape),
    )
