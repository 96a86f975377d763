"""Pure training and evaluation steps, for every objective (`bert_jax.objectives`).

Nothing here is jitted: `bert_jax.loop.compile_train_step` compiles the train step once, with
explicit shardings and buffer donation; the evaluation and prediction steps are jitted by the
`Experiment` that runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from bert_jax.model import init_params
from bert_jax.objectives import Batch, Objective, apply_model

PyTree = Any


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


def split_microbatches(batch: Batch, k: int) -> Batch:
    """[B, ...] -> [k, B/k, ...] with micro-batch i = rows i, i+k, i+2k, ...: strided, so that
    every device keeps an equal share of each micro-batch under a batch-sharded layout."""

    def split(x):
        if x.shape[0] % k:
            raise ValueError(f"batch of {x.shape[0]} rows does not split into {k} micro-batches")
        return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

    return jax.tree_util.tree_map(split, batch)


def loss_and_grads(params, batch, rng, *, model, objective: Objective, num_microbatches: int = 1):
    """The batch's objective, its gradient and the metric sums, over `num_microbatches` parts.

    Counts come from the whole batch, so the result does not depend on `num_microbatches`.
    """
    counts = objective.counts(batch)

    def part_loss(p, part, part_rng):
        sums = objective.sums(model, p, part, part_rng, False)
        return objective.loss(sums, counts), sums

    grad_fn = jax.value_and_grad(part_loss, has_aux=True)
    if num_microbatches == 1:
        (loss, sums), grads = grad_fn(params, batch, rng)
    else:
        parts = split_microbatches(batch, num_microbatches)

        def body(carry, xs):
            acc_loss, acc_grads, acc_sums = carry
            part, i = xs
            (part_loss_value, s), g = grad_fn(params, part, jax.random.fold_in(rng, i))
            acc_grads = jax.tree_util.tree_map(jnp.add, acc_grads, g)
            acc_sums = jax.tree_util.tree_map(jnp.add, acc_sums, s)
            return (acc_loss + part_loss_value, acc_grads, acc_sums), None

        first = jax.tree_util.tree_map(lambda x: x[0], parts)
        abstract_sums = jax.eval_shape(lambda: objective.sums(model, params, first, rng, False))
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
    objective: Objective,
    num_microbatches: int = 1,
    schedule: Callable[[jax.Array], jax.Array] | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update. Returns the new state and metric sums (plus loss, grad_norm, lr).

    Dropout uses `fold_in(state.rng, state.step)` (and the micro-batch index), so a resumed run
    draws the same masks as an uninterrupted one.
    """
    rng = jax.random.fold_in(state.rng, state.step)
    loss, grads, sums = loss_and_grads(
        state.params,
        batch,
        rng,
        model=model,
        objective=objective,
        num_microbatches=num_microbatches,
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


def eval_step(
    params: PyTree, batch: Batch, *, model: nn.Module, objective: Objective
) -> dict[str, Any]:
    """Metric sums and counts of one evaluation batch (dropout off)."""
    sums = objective.sums(model, params, batch, None, True)
    counts = objective.counts(batch)
    return {**sums, **counts, "loss": objective.loss(sums, counts)}


def predict_step(params: PyTree, batch: Batch, *, model: nn.Module, **extra) -> Any:
    """The model's outputs for a batch (dropout off), e.g. for writing predictions."""
    return apply_model(model, params, batch, None, True, **extra)
