"""Pure training and evaluation steps for pretraining and fine-tuning.

Nothing here is jitted: `train.py` compiles the steps once, with explicit shardings and buffer
donation, e.g.

    step_fn = jax.jit(functools.partial(train_step, model=model, tx=tx, task=task,
                                        num_microbatches=k, schedule=schedule),
                      in_shardings=(state_shardings, batch_shardings),
                      out_shardings=(state_shardings, replicated), donate_argnums=0)

A *task* says which head runs and how its loss is formed. Every task returns sums and counts over
the (global) batch, never means, so that metrics average right across devices, hosts and
micro-batches: the loss of a batch is `objective(sums, counts)` with counts taken from the whole
batch, which makes k micro-batches of b rows give exactly the gradient of one batch of k*b rows.

Batches (host numpy, then global arrays): model inputs `input_ids`, `token_type_ids`,
`attention_mask` [B, L] (and for packed rows `segment_ids`, `position_ids` [B, L] and
`cls_positions` [B, S]) plus each task's targets, listed in its docstring.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from bert_jax import losses
from bert_jax.model import init_params

PyTree = Any
Batch = Mapping[str, jax.Array]
MODEL_INPUTS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "position_ids",
    "segment_ids",
    "cls_positions",
)


@flax.struct.dataclass
class TrainState:
    """step: int32 scalar (optimizer updates done); params and opt_state: pytrees; rng: the run's
    base PRNG key, folded with the step for each step's dropout."""

    step: jax.Array
    params: PyTree
    opt_state: PyTree
    rng: jax.Array


def init_train_state(rng: jax.Array, *, model: nn.Module, tx, params: PyTree | None = None):
    """A fresh TrainState (parameters boxed with their logical axes unless `params` is given).

    Run it under `jax.eval_shape` to get the abstract state whose boxes give the shardings, then
    under `jax.jit(..., out_shardings=...)` (unboxed with `nn.unbox`) to create it sharded.
    """
    init_rng, run_rng = jax.random.split(rng)
    if params is None:
        params = init_params(model, init_rng)
    return TrainState(
        step=jnp.zeros([], jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=run_rng,
    )


def _model_inputs(batch: Batch, model: nn.Module) -> dict[str, jax.Array]:
    """The batch's model inputs that `model` takes (packed token-level batches carry
    cls_positions, which only pooled heads use)."""
    accepted = inspect.signature(type(model).__call__).parameters
    return {k: batch[k] for k in MODEL_INPUTS if k in batch and k in accepted}


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Task:
    """How one kind of head is trained.

    Attributes:
      name: task kind.
      sums: (model, params, batch, rng, deterministic) -> dict of float32 sums, whose keys ending
        in "_loss_sum" enter the objective, divided by the count of the same prefix.
      counts: batch -> dict of the denominators ({prefix}_count) over the whole batch.
      loss_weights: prefix -> weight in the objective (mean over each prefix, then summed).
    """

    name: str
    sums: Callable[..., dict[str, jax.Array]]
    counts: Callable[[Batch], dict[str, jax.Array]]
    loss_weights: Mapping[str, float]

    def objective(self, sums: Mapping[str, jax.Array], counts: Mapping[str, jax.Array]):
        total = jnp.float32(0.0)
        for prefix, weight in self.loss_weights.items():
            total += weight * sums[f"{prefix}_loss_sum"] / jnp.maximum(counts[f"{prefix}_count"], 1)
        return total


def _apply(model, params, batch, rng, deterministic, **extra):
    rngs = None if deterministic else {"dropout": rng}
    return model.apply(
        {"params": params},
        **_model_inputs(batch, model),
        **extra,
        deterministic=deterministic,
        rngs=rngs,
    )


def _nsp_weights(batch):
    if "next_sentence_weights" in batch:
        return batch["next_sentence_weights"].astype(jnp.float32)
    return jnp.ones(batch["next_sentence_labels"].shape, jnp.float32)


def _pretraining_sums(model, params, batch, rng, deterministic, nsp=True):
    out = _apply(
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


def pretraining_task(nsp: bool = True) -> Task:
    """MLM (+ NSP): model BertForPreTraining (or BertForMaskedLM when `nsp=False`).

    Targets: masked_lm_positions, masked_lm_ids [B, P] int32, masked_lm_weights [B, P] float32,
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
    return Task("pretraining" if nsp else "mlm", sums, counts, weights)


def _example_weights(batch, shape):
    if "example_weights" in batch:
        return batch["example_weights"].astype(jnp.float32)
    return jnp.ones(shape, jnp.float32)


def _classification_sums(model, params, batch, rng, deterministic):
    logits = _apply(model, params, batch, rng, deterministic).logits
    out = losses.weighted_cross_entropy(
        logits, batch["labels"], _example_weights(batch, batch["labels"].shape)
    )
    return {"cls_loss_sum": out["loss_sum"], "cls_correct_sum": out["correct_sum"]}


def _regression_sums(model, params, batch, rng, deterministic):
    preds = _apply(model, params, batch, rng, deterministic).logits[..., 0]
    out = losses.mean_squared_error(
        preds, batch["labels"], _example_weights(batch, batch["labels"].shape)
    )
    return {"reg_loss_sum": out["loss_sum"]}


def _token_sums(model, params, batch, rng, deterministic):
    logits = _apply(model, params, batch, rng, deterministic).logits
    out = losses.weighted_cross_entropy(logits, batch["labels"], _token_weights(batch))
    return {"tok_loss_sum": out["loss_sum"], "tok_correct_sum": out["correct_sum"]}


def _token_weights(batch):
    w = batch["label_weights"].astype(jnp.float32)
    if "example_weights" in batch and batch["example_weights"].ndim == 1:
        w = w * batch["example_weights"].astype(jnp.float32)[:, None]
    return w


def _qa_sums(model, params, batch, rng, deterministic):
    out = _apply(model, params, batch, rng, deterministic)
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


TASKS: dict[str, Task] = {
    "pretraining": pretraining_task(nsp=True),
    "mlm": pretraining_task(nsp=False),
    # Targets: labels [B] int32 (or [B, S] packed), example_weights [B] (or [B, S]).
    "classification": Task(
        "classification",
        _classification_sums,
        _count_of("cls", lambda b: _example_weights(b, b["labels"].shape)),
        {"cls": 1.0},
    ),
    # Targets: labels [B] float32 (or [B, S] packed), example_weights.
    "regression": Task(
        "regression",
        _regression_sums,
        _count_of("reg", lambda b: _example_weights(b, b["labels"].shape)),
        {"reg": 1.0},
    ),
    # Targets: labels [B, L] int32, label_weights [B, L] (first sub-tokens), example_weights [B].
    "token_classification": Task(
        "token_classification", _token_sums, _count_of("tok", _token_weights), {"tok": 1.0}
    ),
    # Targets: start_positions, end_positions [B] int32, example_weights [B].
    "question_answering": Task(
        "question_answering",
        _qa_sums,
        _count_of("qa", lambda b: _example_weights(b, b["start_positions"].shape)),
        {"qa": 1.0},
    ),
    # Inputs [B, C, L]; targets: labels [B] int32, example_weights [B].
    "multiple_choice": Task(
        "multiple_choice",
        _classification_sums,
        _count_of("cls", lambda b: _example_weights(b, b["labels"].shape)),
        {"cls": 1.0},
    ),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name]


# --------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------
def _split_microbatches(batch: Batch, k: int) -> Batch:
    """[B, ...] -> [k, B/k, ...] with micro-batch i = rows i, i+k, i+2k, ...: strided, so that
    every device keeps an equal share of each micro-batch under a batch-sharded layout."""

    def split(x):
        if x.shape[0] % k:
            raise ValueError(f"batch of {x.shape[0]} rows does not split into {k} micro-batches")
        return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

    return jax.tree_util.tree_map(split, batch)


def loss_and_grads(params, batch, rng, *, model, task: Task, num_microbatches: int = 1):
    """The batch's objective, its gradient and the metric sums, over `num_microbatches` parts.

    Counts come from the whole batch, so the result does not depend on `num_microbatches`.
    """
    counts = task.counts(batch)

    def part_loss(p, part, part_rng):
        sums = task.sums(model, p, part, part_rng, False)
        return task.objective(sums, counts), sums

    grad_fn = jax.value_and_grad(part_loss, has_aux=True)
    if num_microbatches == 1:
        (loss, sums), grads = grad_fn(params, batch, rng)
    else:
        parts = _split_microbatches(batch, num_microbatches)

        def body(carry, xs):
            acc_loss, acc_grads, acc_sums = carry
            part, i = xs
            (part_loss_value, s), g = grad_fn(params, part, jax.random.fold_in(rng, i))
            acc_grads = jax.tree_util.tree_map(jnp.add, acc_grads, g)
            acc_sums = jax.tree_util.tree_map(jnp.add, acc_sums, s)
            return (acc_loss + part_loss_value, acc_grads, acc_sums), None

        first = jax.tree_util.tree_map(lambda x: x[0], parts)
        abstract_sums = jax.eval_shape(lambda: task.sums(model, params, first, rng, False))
        init = (
            jnp.float32(0.0),
            jax.tree_util.tree_map(jnp.zeros_like, params),
            jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), abstract_sums),
        )
        (loss, grads, sums), _ = jax.lax.scan(body, init, (parts, jnp.arange(num_microbatches)))
    return loss, grads, {**sums, **counts}


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    model: nn.Module,
    tx: optax.GradientTransformation,
    task: Task,
    num_microbatches: int = 1,
    schedule: Callable[[jax.Array], jax.Array] | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update. Returns the new state and metric sums (plus loss, grad_norm, lr).

    Dropout uses `fold_in(state.rng, state.step)` (and the micro-batch index), so a resumed run
    draws the same masks as an uninterrupted one.
    """
    rng = jax.random.fold_in(state.rng, state.step)
    loss, grads, sums = loss_and_grads(
        state.params, batch, rng, model=model, task=task, num_microbatches=num_microbatches
    )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(sums)
    metrics["loss"] = loss
    metrics["grad_norm"] = optax.global_norm(grads)
    if schedule is not None:
        metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def eval_step(params: PyTree, batch: Batch, *, model: nn.Module, task: Task) -> dict[str, Any]:
    """Metric sums and counts of one evaluation batch (dropout off)."""
    sums = task.sums(model, params, batch, None, True)
    counts = task.counts(batch)
    return {**sums, **counts, "loss": task.objective(sums, counts)}


def predict_step(params: PyTree, batch: Batch, *, model: nn.Module, **extra) -> Any:
    """The model's outputs for a batch (dropout off), e.g. for writing predictions."""
    return _apply(model, params, batch, None, True, **extra)


def summarize(sums: Mapping[str, float]) -> dict[str, float]:
    """Host-side: turns accumulated sums and counts into means and accuracies.

    {prefix}_loss_sum / {prefix}_count -> {prefix}_loss; {prefix}_correct_sum -> {prefix}_accuracy.
    Other keys (loss, grad_norm, learning_rate) pass through.
    """
    out = {}
    for key, value in sums.items():
        if key.endswith("_loss_sum") or key.endswith("_correct_sum") or key.endswith("_count"):
            continue
        out[key] = float(value)
    for key, value in sums.items():
        for suffix, name in (("_loss_sum", "_loss"), ("_correct_sum", "_accuracy")):
            if key.endswith(suffix):
                stem = key[: -len(suffix)]
                prefix = stem.split("_")[0]
                count = float(sums.get(f"{prefix}_count", 0.0))
                if count > 0:
                    out[stem + name] = float(value) / count
    return out
