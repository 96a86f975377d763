"""Objectives: how each kind of head is trained, as pure functions of (model, params, batch).

An *objective* runs its head and returns sums and counts over the (global) batch, never means, so
that metrics average right across devices, hosts and micro-batches: the loss of a batch is
`objective.loss(sums, counts)` with counts taken from the whole batch, which makes k micro-batches
of b rows give exactly the gradient of one batch of k*b rows (`bert_jax.training.steps`).

Batches (host numpy, then global arrays): model inputs `input_ids`, `token_type_ids`,
`attention_mask` [B, L] (and for packed rows `segment_ids`, `position_ids` [B, L] and
`cls_positions` [B, S]) plus each objective's targets, listed beside it in `OBJECTIVES`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import batch_layout, losses
from bert_jax.models.family import Role
from bert_jax.models.pooling import SENTENCE_POOLINGS, check_pooling, pool, pool_segments

Batch = Mapping[str, jax.Array]
MODEL_INPUTS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "position_ids",
    "segment_ids",
    "cls_positions",
)


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


@dataclasses.dataclass(frozen=True)
class Objective:
    """How one kind of head is trained.

    Attributes:
      name: the objective's name (a key of `OBJECTIVES`).
      role: the role of the model it trains (`Role.PRETRAINING`); each family trains its class
        of that role (`Family.head_for`: "BertForPreTraining"), and a family without one fails
        naming the roles it has.
      sums: (model, params, batch, rng, deterministic) -> dict of float32 sums, whose keys ending
        in "_loss_sum" enter the loss, divided by the count of the same prefix.
      counts: batch -> dict of the denominators ({prefix}_count) over the whole batch.
      loss_weights: prefix -> weight in the loss (mean over each prefix, then summed).
      build_model: (experiment config, model config, RuntimeConfig, head class) -> the module
        it trains; None: the head class on the model config (one model). Replaced-token
        detection's builds its generator and discriminator (`models.rtd`).
    """

    name: str
    role: Role
    sums: Callable[..., dict[str, jax.Array]]
    counts: Callable[[Batch], dict[str, jax.Array]]
    loss_weights: Mapping[str, float]
    build_model: Callable[..., nn.Module] | None = None

    def loss(self, sums: Mapping[str, jax.Array], counts: Mapping[str, jax.Array]) -> jax.Array:
        """The scalar loss: the weighted sum over prefixes of sums / counts."""
        total = jnp.float32(0.0)
        for prefix, weight in self.loss_weights.items():
            total += weight * sums[f"{prefix}_loss_sum"] / jnp.maximum(counts[f"{prefix}_count"], 1)
        return total


def _nsp_weights(batch):
    if "next_sentence_weights" in batch:
        return batch["next_sentence_weights"].astype(jnp.float32)
    return jnp.ones(batch["next_sentence_labels"].shape, jnp.float32)


def _pretraining_sums(model, params, batch, rng, deterministic, nsp=True):
    out = apply_model(
        model, params, batch, rng, deterministic, masked_positions=batch["masked_lm_positions"]
    )
    logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
    nsp_logits = out.seq_relationship_logits if nsp else None
    sums = losses.pretraining_losses(
        logits,
        batch["masked_lm_ids"],
        batch["masked_lm_weights"],
        nsp_logits,
        batch.get("next_sentence_labels") if nsp else None,
        _nsp_weights(batch) if nsp else None,
    )
    sums.pop("mlm_count", None)
    sums.pop("nsp_count", None)
    return sums


def pretraining_objective(nsp: bool = True) -> Objective:
    """MLM (+ NSP): a head of Role.PRETRAINING (Role.MASKED_LM when `nsp=False`).

    Batch: `bert_jax.batch_layout.PRETRAINING_BATCH` (packed: `PACKED_PRETRAINING_BATCH`); the
    targets are masked_lm_positions, masked_lm_ids, masked_lm_weights [B, P] and
    next_sentence_labels [B] (or [B, S] packed, with next_sentence_weights [B, S]).
    """

    def counts(batch):
        c = {"mlm_count": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))}
        if nsp:
            c["nsp_count"] = jnp.sum(_nsp_weights(batch))
        return c

    def sums(model, params, batch, rng, deterministic):
        return _pretraining_sums(model, params, batch, rng, deterministic, nsp=nsp)

    weights = {"mlm": 1.0, "nsp": 1.0} if nsp else {"mlm": 1.0}
    name, role = ("pretraining", Role.PRETRAINING) if nsp else ("mlm", Role.MASKED_LM)
    return Objective(name, role, sums, counts, weights)


def rtd_objective(discriminator_weight: float = 50.0) -> Objective:
    """Replaced-token detection (ELECTRA): the generator's MLM loss over the masked positions
    plus `discriminator_weight` (ELECTRA's lambda, 50) times the discriminator's mean per-token
    binary loss over every real token. Trains a `models.rtd.ReplacedTokenDetection` built from
    the experiment config's `rtd` block (`build_model`); its class of Role.REPLACED_TOKEN_DETECTION
    is the run's head (ElectraForPreTraining), the export's discriminator.

    Batch: the MLM pretraining batch (`batch_layout.PRETRAINING_BATCH` or its packed layout):
    masked_lm_positions, masked_lm_ids, masked_lm_weights [B, P]; next-sentence labels, if
    any, are not read. Metrics: mlm_* (the generator), rtd_accuracy, rtd_auc (of "replaced"
    over real tokens) and rtd_replaced_share (the share of real tokens replaced).
    """

    def counts(batch):
        return {
            "mlm_count": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "rtd_count": jnp.sum(batch["attention_mask"].astype(jnp.float32)),
        }

    def sums(model, params, batch, rng, deterministic):
        rng = jax.random.PRNGKey(0) if rng is None else rng  # evaluation: the same samples
        dropout, sample = jax.random.split(rng)
        out = apply_model(
            model,
            params,
            batch,
            dropout,
            deterministic,
            rngs={"sample": sample},
            masked_positions=batch["masked_lm_positions"],
            masked_lm_ids=batch["masked_lm_ids"],
            masked_lm_weights=batch["masked_lm_weights"],
        )
        mlm = losses.weighted_cross_entropy(
            out.generator_logits, batch["masked_lm_ids"], batch["masked_lm_weights"]
        )
        return {
            "mlm_loss_sum": mlm["loss_sum"],
            "mlm_correct_sum": mlm["correct_sum"],
            **losses.replaced_token_losses(
                out.discriminator_logits, out.replaced, batch["attention_mask"]
            ),
        }

    def build_model(config, model_config, runtime, head_class):
        from bert_jax.models import rtd

        del head_class  # the discriminator's, which the pair builds itself
        settings = config.rtd
        return rtd.ReplacedTokenDetection(
            model_config,
            runtime,
            generator=rtd.generator_config(
                model_config, settings.generator_width, settings.generator_depth
            ),
            sharing=settings.embedding_sharing,
            temperature=settings.temperature,
        )

    weights = {"mlm": 1.0, "rtd": float(discriminator_weight)}
    return Objective("rtd", Role.REPLACED_TOKEN_DETECTION, sums, counts, weights, build_model)


def _example_weights(batch, shape):
    if "example_weights" in batch:
        return batch["example_weights"].astype(jnp.float32)
    return jnp.ones(shape, jnp.float32)


def _classification_sums(model, params, batch, rng, deterministic):
    logits = apply_model(model, params, batch, rng, deterministic).logits
    out = losses.weighted_cross_entropy(
        logits, batch["labels"], _example_weights(batch, batch["labels"].shape)
    )
    return {"cls_loss_sum": out["loss_sum"], "cls_correct_sum": out["correct_sum"]}


def _regression_sums(model, params, batch, rng, deterministic):
    preds = apply_model(model, params, batch, rng, deterministic).logits[..., 0]
    out = losses.mean_squared_error(
        preds, batch["labels"], _example_weights(batch, batch["labels"].shape)
    )
    return {"reg_loss_sum": out["loss_sum"]}


def _token_sums(model, params, batch, rng, deterministic):
    logits = apply_model(model, params, batch, rng, deterministic).logits
    out = losses.weighted_cross_entropy(logits, batch["labels"], _token_weights(batch))
    return {"tok_loss_sum": out["loss_sum"], "tok_correct_sum": out["correct_sum"]}


def _token_weights(batch):
    w = batch["label_weights"].astype(jnp.float32)
    if "example_weights" in batch and batch["example_weights"].ndim == 1:
        w = w * batch["example_weights"].astype(jnp.float32)[:, None]
    return w


def _qa_sums(model, params, batch, rng, deterministic):
    out = apply_model(model, params, batch, rng, deterministic)
    w = _example_weights(batch, batch["start_positions"].shape)
    start = losses.weighted_cross_entropy(out.start_logits, batch["start_positions"], w)
    end = losses.weighted_cross_entropy(out.end_logits, batch["end_positions"], w)
    return {
        "qa_loss_sum": 0.5 * (start["loss_sum"] + end["loss_sum"]),
        "qa_start_correct_sum": start["correct_sum"],
        "qa_end_correct_sum": end["correct_sum"],
    }


def _count_of(prefix, weights_fn):
    return lambda batch: {f"{prefix}_count": jnp.sum(weights_fn(batch))}


OBJECTIVES: dict[str, Objective] = {
    "pretraining": pretraining_objective(nsp=True),
    "mlm": pretraining_objective(nsp=False),
    # Replaced-token detection (generator + discriminator); targets: the MLM ones.
    "rtd": rtd_objective(),
    # Targets: labels [B] int32 (or [B, S] packed), example_weights [B] (or [B, S]).
    "classification": Objective(
        "classification",
        Role.SEQUENCE_CLASSIFICATION,
        _classification_sums,
        _count_of("cls", lambda b: _example_weights(b, b["labels"].shape)),
        {"cls": 1.0},
    ),
    # Targets: labels [B] float32 (or [B, S] packed), example_weights.
    "regression": Objective(
        "regression",
        Role.SEQUENCE_CLASSIFICATION,
        _regression_sums,
        _count_of("reg", lambda b: _example_weights(b, b["labels"].shape)),
        {"reg": 1.0},
    ),
    # Targets: labels [B, L] int32, label_weights [B, L] (first sub-tokens), example_weights [B].
    "token_classification": Objective(
        "token_classification",
        Role.TOKEN_CLASSIFICATION,
        _token_sums,
        _count_of("tok", _token_weights),
        {"tok": 1.0},
    ),
    # Targets: start_positions, end_positions [B] int32, example_weights [B].
    "question_answering": Objective(
        "question_answering",
        Role.QUESTION_ANSWERING,
        _qa_sums,
        _count_of("qa", lambda b: _example_weights(b, b["start_positions"].shape)),
        {"qa": 1.0},
    ),
    # Inputs [B, C, L]; targets: labels [B] int32, example_weights [B].
    "multiple_choice": Objective(
        "multiple_choice",
        Role.MULTIPLE_CHOICE,
        _classification_sums,
        _count_of("cls", lambda b: _example_weights(b, b["labels"].shape)),
        {"cls": 1.0},
    ),
}


# --------------------------------------------------------------------------------------------
# Contrastive: sentence embeddings trained with in-batch negatives
# --------------------------------------------------------------------------------------------
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContrastiveObjective(Objective):
    """An embedding model (the encoder, pooled) trained with in-batch negatives
    (`losses.in_batch_negatives_loss`), its settings fixed when it is made
    (`contrastive_objective`).

    Batch: input_ids, token_type_ids, attention_mask int32 [B, T, L]: text 0 of each row is the
    anchor, text 1 its positive, texts 2.. its hard negatives (T = 2 + negatives per row). Or the
    same texts packed several to a row (`bert_jax.retrieval.packing`: [R, L] rows with segment_ids,
    position_ids, and cls_positions, text_index [R, S]), for an objective made with
    `packed_shape=(B, T)`: each text is pooled from its own tokens (`embed` -> [R, S, E]) and put
    back in its pair's place (`texts` -> [B, T, E]), so the loss is the unpacked batch's.

    Its loss couples every row of the batch, so it is not a sum over rows: k micro-batches are
    GradCache's chunks (`steps.loss_and_grads`), never separate losses. `embed` and
    `embedding_sums` are the two halves GradCache calls apart.

    Attributes:
      pooling: "mean" or "cls" (`pool`).
      scale, symmetric, dims: as `losses.in_batch_negatives_loss` takes them.
      packed_shape: (B, T), the pairs of a packed batch and the texts of each; None: batches
        are [B, T, L] only.
    """

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


def contrastive_objective(
    pooling: str = "mean",
    scale: float = 20.0,
    symmetric: bool = False,
    dims: tuple[int, ...] = (),
    packed_shape: tuple[int, int] | None = None,
) -> ContrastiveObjective:
    """The contrastive objective with these settings (see `ContrastiveObjective`)."""
    check_pooling(pooling, SENTENCE_POOLINGS)

    def sums(model, params, batch, rng, deterministic):
        embeddings = objective.embed(model, params, batch, rng, deterministic)
        return objective.embedding_sums(objective.texts(embeddings, batch))

    def counts(batch):
        if "text_index" in batch:
            return {"mnrl_count": jnp.float32(objective.packed_shape[0])}
        return {"mnrl_count": jnp.float32(batch["input_ids"].shape[0])}

    objective = ContrastiveObjective(
        name="contrastive",
        role=Role.ENCODER,
        sums=sums,
        counts=counts,
        loss_weights={"mnrl": 1.0},
        pooling=pooling,
        scale=float(scale),
        symmetric=bool(symmetric),
        dims=tuple(int(d) for d in dims),
        packed_shape=None if packed_shape is None else tuple(int(n) for n in packed_shape),
    )
    return objective


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
) -> Objective:
    """The reranker's objective (`bert_jax.rerank`): a one-output sequence-classification head
    scores each (query, passage) pair of a [B, G, L] batch (G = 1 pointwise; listwise the
    positive, then its negatives), trained by `loss`:

        bce         pointwise binary cross-entropy on the logit against `labels` [B]
        listwise    the positive's softmax cross-entropy among its group; `scale` and
                    `activation` are its (`losses.listwise_softmax_loss`)
        margin_mse  distillation: the margins s(q, p) - s(q, n) against `teacher_scores` [B, G]

    Batch: input_ids, token_type_ids, attention_mask int32 [B, G, L], example_weights float32
    [B], and labels or teacher_scores; or, with `packed_shape` (B, G), the pairs packed several
    to a row (`bert_jax.retrieval.packing`, its `keep`: the [B] keys as they are), the same loss.
    Metrics: rerank_loss, rerank_accuracy (bce: the logit's sign right; listwise: the positive
    first)."""
    if loss not in RERANK_LOSSES:
        raise ValueError(f"rerank.loss={loss!r}; expected one of {RERANK_LOSSES}")
    if activation not in RERANK_ACTIVATIONS:
        raise ValueError(f"rerank.activation={activation!r}; expected one of {RERANK_ACTIVATIONS}")

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

    name = f"rerank_{loss}"
    return Objective(name, Role.SEQUENCE_CLASSIFICATION, sums, counts, {"rerank": 1.0})


def example_batch(
    name: str, rows: int, length: int, num_choices: int = 0
) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of a padded (unpacked) fine-tuning batch for objective `name`
    (`batch_layout.finetune_layout`): what `--mode=compile` lowers the step with.

    Args:
      rows: B; length: L; num_choices: C of a multiple-choice batch ([B, C, L] inputs).
    """
    layout = batch_layout.finetune_layout(name)
    return batch_layout.abstract_batch(layout, B=rows, L=length, C=num_choices)


def get_objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; known: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


def summarize(sums: Mapping[str, Any]) -> dict[str, float]:
    """Host-side: turns accumulated sums and counts into means and accuracies.

    {prefix}_loss_sum / {prefix}_count -> {prefix}_loss; {prefix}_correct_sum -> {prefix}_accuracy;
    {stem}_share_sum -> {stem}_share (a share of the prefix's count);
    {prefix}_score_hist ([2, bins] counts, `losses.score_histogram`) -> {prefix}_auc. Other keys
    (loss, grad_norm, learning_rate) pass through.
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
            auc = auc_from_histogram(np.asarray(value))
            if auc is not None:
                out[key[: -len("_score_hist")] + "_auc"] = auc
    return out


def auc_from_histogram(hist: np.ndarray) -> float | None:
    """The area under the ROC curve from binned scores [2, bins] (row 0: negatives, row 1:
    positives): the chance that a positive scores above a negative, ties counted half (0.5 for
    a classifier that ignores its input); None without both classes."""
    negatives, positives = np.asarray(hist, np.float64)
    pairs = negatives.sum() * positives.sum()
    if pairs <= 0:
        return None
    below = np.cumsum(negatives) - negatives  # negatives in lower bins
    return float(np.sum(positives * (below + 0.5 * negatives)) / pairs)
