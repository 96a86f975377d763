"""The SPLADE objective: sparse text vectors over the vocabulary, trained with in-batch (and
mined hard) negatives and FLOPS regularization.

    objective = splade_objective(query_weight=5e-5, document_weight=3e-5, packed_shape=(B, T))

Dimensions: B pairs, T texts a pair (anchor, positive, hard negatives), L tokens, V vocabulary,
R packed rows, S slots a row.

The model is the family's masked-LM head (`Role.MASKED_LM`); a text's vector is the maximum
over its real tokens of log(1 + relu(logits)) (`models.pooling.splade_pool`). The loss is
sentence-transformers' SpladeLoss around SparseMultipleNegativesRankingLoss, on the whole
global batch as the contrastive objective computes it (`training.contrastive`: the same batches,
packing, GradCache chunks and mesh):

    loss = mnrl + ramp(step) * (query_weight * flops(anchors) + document_weight * flops(documents))

mnrl: the in-batch negatives softmax over dot products x `scale` (1, as
SparseMultipleNegativesRankingLoss); flops(X) = sum_v (mean_n X[n, v])^2 (`losses.flops_loss`,
FlopsLoss) over the batch's anchors [B, V] and over its documents [(T - 1) B, V] (positives and
hard negatives together, as SpladeLoss concatenates them). ramp(step) warms the regularizers
up as SparseEncoderTrainer does by default (its SpladeRegularizerWeightSchedulerCallback):
(step / W)^2 ("quadratic") or step / W ("linear") before update W, 1 from then on, W being a
third of the run's updates; always 1 with W = 0.

An inference-free SPLADE model (`InferenceFreeObjective`) takes its anchors' vectors from a
weight per vocabulary entry instead (sentence-transformers' `SparseStaticEmbedding`), trained
at its own learning rate; its documents' as above. Its anchors run through no model: a packed
batch holds them beside its rows (`batch_layout.ANCHORS`), a padded one's text 0 skips it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from bert_jax import batch_layout, losses
from bert_jax.models.family import Role
from bert_jax.models.inference_free import QUERY_WEIGHT as QUERY_WEIGHT_PARAM
from bert_jax.models.inference_free import InferenceFreeSplade
from bert_jax.models.pooling import splade_pool, splade_pool_segments, token_presence
from bert_jax.training.contrastive import ContrastiveObjective
from bert_jax.training.objective import MODEL_INPUTS, Batch, apply_model, weighted_loss

# sentence-transformers' SPLADE recipes (SpladeLoss around SparseMultipleNegativesRankingLoss).
QUERY_WEIGHT, DOCUMENT_WEIGHT, SCALE = 5e-5, 3e-5, 1.0
# SpladeRegularizerWeightSchedulerCallback's scheduler types, and "none" for no warmup.
RAMPS = ("quadratic", "linear", "none")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpladeObjective(ContrastiveObjective):
    """A SPLADE model (the masked-LM head, `splade_pool`ed) trained with in-batch negatives
    scored by dot product and FLOPS regularization of queries and documents.

    Batches as `ContrastiveObjective` takes them ([B, T, L], or packed rows with
    `packed_shape=(B, T)`); `embed` gives float32 [..., V] vectors ([R, S, V] of packed rows).

    Attributes:
      scale: the dot products are multiplied by this before the softmax (1).
      symmetric, packed_shape: as `ContrastiveObjective`'s (its pooling and dims are not read).
      query_weight, document_weight: the FLOPS terms' weights (SpladeLoss's
        query_regularizer_weight, document_regularizer_weight); 0 turns one off.
      warmup_steps: the updates over which both weights rise from 0 (0: none; see the module
        docstring); ramp: "quadratic" or "linear", how they rise ("none": no warmup).
      ramp_factor: the weights' factor at the update being trained (1.0; `at_step` sets it).
    """

    name: ClassVar[str] = "splade"
    role: ClassVar[Role] = Role.MASKED_LM
    similarity: ClassVar[str] = "dot"

    pooling: str = "splade"
    scale: float = SCALE
    query_weight: float = QUERY_WEIGHT
    document_weight: float = DOCUMENT_WEIGHT
    warmup_steps: int = 0
    ramp: str = "quadratic"
    ramp_factor: Any = 1.0  # float, or a traced float32 scalar inside a train step

    def at_step(self, step: jax.Array) -> SpladeObjective:
        """The objective whose FLOPS weights are ramp(step) x theirs (itself without warmup)."""
        if not self.warmup_steps:
            return self
        ratio = jnp.minimum(jnp.asarray(step, jnp.float32) / self.warmup_steps, 1.0)
        return dataclasses.replace(
            self, ramp_factor=ratio**2 if self.ramp == "quadratic" else ratio
        )

    def embed(self, model, params, batch: Batch, rng, deterministic: bool) -> jax.Array:
        """float32 [..., V] SPLADE vectors of texts [..., L] (any leading axes); of packed rows
        [R, L], the vectors [R, S, V] of their slots (an empty slot's is 0)."""
        if "segment_ids" in batch:
            inputs = {k: batch[k] for k in MODEL_INPUTS[:5] if k in batch}
            logits = apply_model(model, params, inputs, rng, deterministic).logits  # [R, L, V]
            return splade_pool_segments(
                logits, batch["segment_ids"], batch["cls_positions"].shape[1]
            )
        lead, length = batch["input_ids"].shape[:-1], batch["input_ids"].shape[-1]
        flat = {k: batch[k].reshape(-1, length) for k in MODEL_INPUTS[:3] if k in batch}
        logits = apply_model(model, params, flat, rng, deterministic).logits  # [N, L, V]
        pooled = splade_pool(logits, flat["attention_mask"])
        return pooled.reshape(*lead, pooled.shape[-1])

    def embedding_sums(self, embeddings: jax.Array) -> dict[str, jax.Array]:
        """The loss sums of the vectors [B, T, V] of a whole batch (text 0 anchors, text 1
        positives, the rest hard negatives): each term's value x B (its count), and the share
        of the vocabulary active (> 0) in an anchor and in a document, x B."""
        num_pairs, vocab = embeddings.shape[0], embeddings.shape[-1]
        anchors = embeddings[:, 0]
        documents = jnp.swapaxes(embeddings[:, 1:], 0, 1).reshape(-1, vocab)  # positives first
        out = losses.in_batch_negatives_loss(
            anchors, documents, scale=self.scale, symmetric=self.symmetric, similarity="dot"
        )
        active = lambda x: jnp.mean((x > 0).astype(jnp.float32)) * num_pairs  # noqa: E731
        return {
            "mnrl_loss_sum": out["loss_sum"],
            "mnrl_correct_sum": out["correct_sum"],
            "qflops_loss_sum": losses.flops_loss(anchors) * num_pairs,
            "dflops_loss_sum": losses.flops_loss(documents) * num_pairs,
            "mnrl_query_active_share_sum": active(anchors),
            "mnrl_document_active_share_sum": active(documents),
        }

    def counts(self, batch: Batch) -> dict[str, jax.Array]:
        """The anchors of the batch, the count of every term."""
        count = super().counts(batch)["mnrl_count"]
        return {"mnrl_count": count, "qflops_count": count, "dflops_count": count}

    def loss(self, sums: Mapping[str, jax.Array], counts: Mapping[str, jax.Array]) -> jax.Array:
        """mnrl + ramp_factor x (query_weight x flops(anchors) + document_weight x
        flops(documents))."""
        r = self.ramp_factor
        weights = {"mnrl": 1.0, "qflops": r * self.query_weight, "dflops": r * self.document_weight}
        return weighted_loss(weights, sums, counts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class InferenceFreeObjective(SpladeObjective):
    """SPLADE whose queries (the anchors) need no model: a query's vector is a trained weight
    of each vocabulary entry among its tokens (`models.inference_free.InferenceFreeSplade`'s
    query_weight, times `token_presence`), the documents' the masked LM's; the loss is
    `SpladeObjective`'s. Only the documents run through the masked LM: a packed batch's
    anchors come beside its rows (anchor_ids, anchor_mask [B, L]: `anchors_apart`), and its
    `row_outputs` are then {"documents": [R, S, V], "anchors": [B, V]}; a padded batch's text 0
    is left out of the model's batch.

    Attributes:
      query_learning_rate_factor: the query weights' learning rate over the optimizer's (both
        on its schedule), as sentence-transformers' `learning_rate_mapping` gives the
        `SparseStaticEmbedding` its own rate.
      route: "document": `embed` gives documents' vectors (a training batch's anchors aside);
        "query" (`for_queries`): every text's query vector.
    """

    name: ClassVar[str] = "inference_free_splade"
    anchors_apart: ClassVar[bool] = True  # packed batches hold the anchors beside the rows

    query_learning_rate_factor: float = 1.0
    route: str = "document"

    @staticmethod
    def build_model(config, model_config, runtime, model_class) -> InferenceFreeSplade:
        """The masked LM and the query weights (`Experiment.build`'s hook)."""
        del config, model_class
        return InferenceFreeSplade(model_config, runtime)

    @property
    def learning_rate_factors(self) -> dict[str, float]:
        """The parameters (top-level names) whose updates the optimizer scales."""
        return {QUERY_WEIGHT_PARAM: self.query_learning_rate_factor}

    def for_queries(self) -> InferenceFreeObjective:
        """This objective embedding every text as a query (dev retrieval's queries)."""
        return dataclasses.replace(self, route="query")

    def embed(self, model, params, batch: Batch, rng, deterministic: bool) -> jax.Array:
        """As `SpladeObjective.embed`, but the anchors' vectors (text 0 of a pair) and, with
        route "query", every text's are query vectors."""
        if self.route == "query":
            return self.query_vectors(params, batch)
        if batch["input_ids"].ndim == 3:  # [B, T, L] pairs: text 0 is the anchor
            anchors = self.query_vectors(params, {k: v[:, :1] for k, v in batch.items()})
            rest = {k: v[:, 1:] for k, v in batch.items()}
            documents = super().embed(model, params, rest, rng, deterministic)
            return jnp.concatenate([anchors, documents], axis=1)
        documents = super().embed(model, params, batch, rng, deterministic)
        if "text_index" in batch:  # packed pairs: an anchor is text b * T + 0
            index = batch["text_index"]
            anchors = (index >= 0) & (index % self.packed_shape[1] == 0)  # [R, S]
        else:  # texts, each a document
            return documents
        return jnp.where(anchors[..., None], self.query_vectors(params, batch), documents)

    def row_outputs(self, model, params, batch: Batch, rng, deterministic: bool):
        """The batch's vectors: of a packed batch whose anchors are apart, {"documents": its
        slots' [R, S, V] (every slot a document: `SpladeObjective.embed`), "anchors": its
        anchors' query vectors [B, V]}; else `embed`'s."""
        if "anchor_ids" not in batch:
            return self.embed(model, params, batch, rng, deterministic)
        rows = {k: v for k, v in batch.items() if k not in batch_layout.ANCHORS}
        anchors = {"input_ids": batch["anchor_ids"], "attention_mask": batch["anchor_mask"]}
        return {
            "documents": super().embed(model, params, rows, rng, deterministic),
            "anchors": self.query_vectors(params, anchors),
        }

    def batch_sums(self, outputs, batch: Batch) -> dict[str, jax.Array]:
        """The loss sums of the whole batch from its `row_outputs`."""
        if not isinstance(outputs, Mapping):
            return super().batch_sums(outputs, batch)
        texts = self.texts(outputs["documents"], batch)  # [B, T, V], the anchors' places 0
        return self.embedding_sums(texts.at[:, 0].set(outputs["anchors"]))

    def query_vectors(self, params, batch: Batch) -> jax.Array:
        """float32 [..., V] query vectors of texts [..., L] (of packed rows: [R, S, V])."""
        weight = params[QUERY_WEIGHT_PARAM]
        vocab = weight.shape[0]
        if "segment_ids" in batch:
            slots = batch["cls_positions"].shape[1]
            return token_presence(batch["input_ids"], batch["segment_ids"], vocab, slots) * weight
        lead, length = batch["input_ids"].shape[:-1], batch["input_ids"].shape[-1]
        ids = batch["input_ids"].reshape(-1, length)
        presence = token_presence(ids, batch["attention_mask"].reshape(-1, length), vocab)
        return (presence[:, 0] * weight).reshape(*lead, vocab)


def splade_objective(
    query_weight: float = QUERY_WEIGHT,
    document_weight: float = DOCUMENT_WEIGHT,
    scale: float = SCALE,
    symmetric: bool = False,
    packed_shape: tuple[int, int] | None = None,
    warmup_steps: int = 0,
    ramp: str = "quadratic",
    query_learning_rate_factor: float | None = None,
) -> SpladeObjective:
    """The SPLADE objective with these settings (see `SpladeObjective`; ramp "none" sets no
    warmup whatever warmup_steps says); with `query_learning_rate_factor`, the inference-free
    one (`InferenceFreeObjective`). ValueError naming a negative weight or warmup, an unknown
    ramp or a factor that is not > 0."""
    for name, weight in (("query_weight", query_weight), ("document_weight", document_weight)):
        if not weight >= 0:
            raise ValueError(f"{name}={weight!r}; expected a number >= 0")
    if ramp not in RAMPS or not warmup_steps >= 0:
        raise ValueError(f"ramp={ramp!r}, warmup_steps={warmup_steps!r}: expected {RAMPS}, >= 0")
    kind, extra = SpladeObjective, {}
    if query_learning_rate_factor is not None:
        if not query_learning_rate_factor > 0:
            raise ValueError(f"query_learning_rate_factor={query_learning_rate_factor!r}: > 0")
        kind = InferenceFreeObjective
        extra = {"query_learning_rate_factor": float(query_learning_rate_factor)}
    return kind(
        **extra,
        query_weight=float(query_weight),
        document_weight=float(document_weight),
        scale=float(scale),
        symmetric=bool(symmetric),
        packed_shape=None if packed_shape is None else tuple(int(n) for n in packed_shape),
        warmup_steps=0 if ramp == "none" else int(warmup_steps),
        ramp=ramp,
    )
