"""The objectives of every head, by name: how each kind of head is trained.

    objective = get_objective("classification")      # OBJECTIVES: the heads' objectives

Objectives made with settings live beside their own code: `training.contrastive` (sentence
embeddings) and `training.reranking` (cross-encoders).

Each declares the protocol of `training.objective` (loss and metrics as sums and counts, the
batch it trains on, whether its rows couple across the batch); the heads' objectives are sums
over rows (`RowwiseObjective`). Batches (host numpy, then global arrays): model inputs
`input_ids`, `token_type_ids`, `attention_mask` [B, L] (and for packed rows `segment_ids`,
`position_ids` [B, L] and `cls_positions` [B, S]) plus each objective's targets, as
`bert_jax.batch_layout` declares them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from bert_jax import batch_layout, losses
from bert_jax.models.family import Role
from bert_jax.training.objective import Objective, RowwiseObjective, apply_model


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


def pretraining_objective(nsp: bool = True) -> RowwiseObjective:
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
    layout = batch_layout.PRETRAINING_BATCH  # or its packed layout, PACKED_PRETRAINING_BATCH
    return RowwiseObjective(name, role, sums, counts, weights, layout=layout)


def rtd_objective(
    discriminator_weight: float = 50.0, settings: Mapping[str, Any] | None = None
) -> RowwiseObjective:
    """Replaced-token detection (ELECTRA): the generator's MLM loss over the masked positions
    plus `discriminator_weight` (ELECTRA's lambda, 50) times the discriminator's mean per-token
    binary loss over every real token. Trains a `models.rtd.ReplacedTokenDetection` built from
    `settings` (`build_model`: generator_width, generator_depth, embedding_sharing and
    temperature, the pretraining job's block of them); its class of
    Role.REPLACED_TOKEN_DETECTION is the run's head (ElectraForPreTraining), the export's
    discriminator. Without `settings` (OBJECTIVES' entry) the objective computes its loss but
    builds no model.

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

        # The experiment config is not read (the settings came in above); the head class is
        # the discriminator's, which the pair builds itself.
        del config, head_class
        if settings is None:
            raise ValueError(
                "the replaced-token detection objective builds its model from its settings: "
                "rtd_objective(weight, settings) (the pretraining job passes its rtd block)"
            )
        return rtd.ReplacedTokenDetection(
            model_config,
            runtime,
            generator=rtd.generator_config(
                model_config, settings["generator_width"], settings["generator_depth"]
            ),
            sharing=settings["embedding_sharing"],
            temperature=settings["temperature"],
        )

    weights = {"mlm": 1.0, "rtd": float(discriminator_weight)}
    role = Role.REPLACED_TOKEN_DETECTION
    layout = batch_layout.PRETRAINING_BATCH
    return RowwiseObjective("rtd", role, sums, counts, weights, build_model, layout)


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


def _finetuning(name, role, sums, counts, loss_weights) -> RowwiseObjective:
    """A fine-tuning head's objective, on the padded batch `batch_layout.finetune_layout`."""
    layout = batch_layout.finetune_layout(name)
    return RowwiseObjective(name, role, sums, counts, loss_weights, layout=layout)


def _count_of(prefix, weights_fn):
    return lambda batch: {f"{prefix}_count": jnp.sum(weights_fn(batch))}


OBJECTIVES: dict[str, Objective] = {
    "pretraining": pretraining_objective(nsp=True),
    "mlm": pretraining_objective(nsp=False),
    # Replaced-token detection (generator + discriminator); targets: the MLM ones. The
    # fine-tuning heads' batches (targets, and packed [B, S] labels): `batch_layout`.
    "rtd": rtd_objective(),
    "classification": _finetuning(
        "classification",
        Role.SEQUENCE_CLASSIFICATION,
        _classification_sums,
        _count_of("cls", lambda b: _example_weights(b, b["labels"].shape)),
        {"cls": 1.0},
    ),
    "regression": _finetuning(
        "regression",
        Role.SEQUENCE_CLASSIFICATION,
        _regression_sums,
        _count_of("reg", lambda b: _example_weights(b, b["labels"].shape)),
        {"reg": 1.0},
    ),
    "token_classification": _finetuning(
        "token_classification",
        Role.TOKEN_CLASSIFICATION,
        _token_sums,
        _count_of("tok", _token_weights),
        {"tok": 1.0},
    ),
    "question_answering": _finetuning(
        "question_answering",
        Role.QUESTION_ANSWERING,
        _qa_sums,
        _count_of("qa", lambda b: _example_weights(b, b["start_positions"].shape)),
        {"qa": 1.0},
    ),
    "multiple_choice": _finetuning(
        "multiple_choice",
        Role.MULTIPLE_CHOICE,
        _classification_sums,
        _count_of("cls", lambda b: _example_weights(b, b["labels"].shape)),
        {"cls": 1.0},
    ),
}


def example_batch(
    name: str, rows: int, length: int, num_choices: int = 0
) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of a padded (unpacked) fine-tuning batch for objective `name`
    (`batch_layout.finetune_layout`): what `--mode=compile` lowers the step with.

    Args:
      rows: B; length: L; num_choices: C of a multiple-choice batch ([B, C, L] inputs).
    """
    batch_layout.finetune_layout(name)  # a fine-tuning objective, or the error naming it
    return get_objective(name).example_batch(B=rows, L=length, C=num_choices)


def get_objective(name: str) -> RowwiseObjective:
    """The objective of the head `name` (a key of `OBJECTIVES`); ValueError naming the known."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; known: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]
