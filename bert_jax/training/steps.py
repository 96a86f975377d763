"""Pure training and evaluation steps, for every objective (the protocol of
`bert_jax.training.objective`: a batch is split as `Objective.couples_rows` says).

Nothing here is jitted: `training.experiment.compile_train_step` compiles the train step once,
with explicit shardings and buffer donation; the evaluation and prediction steps are jitted by
the `Experiment` that runs them.

float16 runs train with dynamic loss scaling (`DynamicLossScale`, optax's and apex's rule, written
here): the loss is multiplied by a scale before the backward pass, so that small float16
gradients do not flush to zero, and the gradients are divided by it in float32. A step whose
gradients (or loss) are not finite, as seen over the whole global batch, is skipped: parameters
and optimizer state stay as they were and the scale halves; after `period` finite steps in a row
the scale doubles. The scale lives in `ScaledTrainState.loss_scale` (checkpointed with the
state); float32 and bfloat16 runs keep the plain `TrainState` and compute exactly as without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from bert_jax.models import hash_rng
from bert_jax.models.params import init_params
from bert_jax.training.objective import Batch, CoupledObjective, Objective, apply_model

PyTree = Any


@flax.struct.dataclass
class LossScaleState:
    """scale: float32 scalar, what the next step multiplies its loss by; good_steps: int32
    scalar, finite steps in a row since the scale last changed."""

    scale: jax.Array
    good_steps: jax.Array


@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
    """How the loss scale of a float16 run moves (static: hashable, closed over by the step).

    Attributes:
      init_scale: the first step's scale (`RuntimeConfig.loss_scale_init`).
      period: finite steps in a row after which the scale doubles
        (`RuntimeConfig.loss_scale_period`).
      min_scale: the scale never halves below this (1: no scaling).
      max_scale: the scale never doubles above this.
    """

    init_scale: float = 2.0**15
    period: int = 2000
    min_scale: float = 1.0
    max_scale: float = 2.0**24

    def init(self) -> LossScaleState:
        """The state of the first step."""
        return LossScaleState(jnp.float32(self.init_scale), jnp.zeros([], jnp.int32))

    def update(self, state: LossScaleState, finite: jax.Array) -> LossScaleState:
        """The state after a step whose gradients were `finite` (bool scalar) or not: halved
        after an overflow, doubled after `period` finite steps in a row, else kept."""
        good_steps = jnp.where(finite, state.good_steps + 1, 0)
        grow = good_steps >= self.period
        scale = jnp.where(grow, state.scale * 2, state.scale)
        scale = jnp.where(finite, scale, state.scale / 2)
        scale = jnp.clip(scale, self.min_scale, self.max_scale).astype(jnp.float32)
        return LossScaleState(scale, jnp.where(grow, 0, good_steps).astype(jnp.int32))


@flax.struct.dataclass
class TrainState:
    """step: int32 scalar (train steps done, skipped float16 steps included); params and
    opt_state: pytrees; rng: the run's base PRNG key, folded with the step for each step's
    dropout."""

    step: jax.Array
    params: PyTree
    opt_state: PyTree
    rng: jax.Array


@flax.struct.dataclass
class ScaledTrainState(TrainState):
    """A float16 run's TrainState: plus loss_scale, its `LossScaleState` (checkpointed with the
    rest). A class of its own rather than an optional field, because Orbax restores a tree only
    into the same structure: float32 and bfloat16 runs keep restoring checkpoints written before
    loss scaling existed."""

    loss_scale: LossScaleState


def init_train_state(
    rng: jax.Array,
    *,
    model: nn.Module,
    tx,
    params: PyTree | None = None,
    loss_scale: DynamicLossScale | None = None,
):
    """A fresh TrainState (parameters boxed with their logical axes unless `params` is given);
    a ScaledTrainState holding `loss_scale`'s first state when that is given (float16 runs).

    Run it under `jax.eval_shape` to get the abstract state whose boxes give the shardings, then
    under `jax.jit(..., out_shardings=...)` (unboxed with `nn.unbox`) to create it sharded.
    """
    init_rng, run_rng = jax.random.split(rng)
    if params is None:
        params = init_params(model, init_rng)
    fields = dict(step=jnp.zeros([], jnp.int32), params=params, opt_state=tx.init(params))
    if loss_scale is None:
        return TrainState(**fields, rng=run_rng)
    return ScaledTrainState(**fields, rng=run_rng, loss_scale=loss_scale.init())


def split_microbatches(batch: Batch, k: int) -> Batch:
    """[B, ...] -> [k, B/k, ...] with micro-batch i = rows i, i+k, i+2k, ...: strided, so that
    every device keeps an equal share of each micro-batch under a batch-sharded layout."""

    def split(x):
        if x.shape[0] % k:
            raise ValueError(f"batch of {x.shape[0]} rows does not split into {k} micro-batches")
        return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

    return jax.tree_util.tree_map(split, batch)


def loss_and_grads(
    params,
    batch,
    rng,
    *,
    model,
    objective: Objective,
    num_microbatches: int = 1,
    loss_scale: jax.Array | None = None,
):
    """The batch's objective, its gradient and the metric sums, over `num_microbatches` parts.

    Counts come from the whole batch, so the result does not depend on `num_microbatches`. With
    `loss_scale` (float32 scalar), the backward pass starts from loss x loss_scale and the summed
    gradients are divided by it in float32 (an overflow stays inf or nan); the loss returned is
    unscaled. An objective whose rows couple (`Objective.couples_rows`: in-batch negatives)
    takes its micro-batches as GradCache's chunks (`grad_cache_loss_and_grads`).
    """
    if objective.couples_rows and num_microbatches > 1:
        return grad_cache_loss_and_grads(
            params,
            batch,
            rng,
            model=model,
            objective=objective,
            num_chunks=num_microbatches,
            loss_scale=loss_scale,
        )
    counts = objective.counts(batch)

    def part_loss(p, part, part_rng):
        sums = objective.sums(model, p, part, part_rng, False)
        loss = objective.loss(sums, counts)
        return (loss if loss_scale is None else loss * loss_scale), (loss, sums)

    grad_fn = jax.value_and_grad(part_loss, has_aux=True)
    if num_microbatches == 1:
        (_, (loss, sums)), grads = grad_fn(params, batch, rng)
    else:
        parts = split_microbatches(batch, num_microbatches)

        def body(carry, xs):
            acc_loss, acc_grads, acc_sums = carry
            part, i = xs
            (_, (part_loss_value, s)), g = grad_fn(params, part, jax.random.fold_in(rng, i))
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
    if loss_scale is not None:
        grads = jax.tree_util.tree_map(
            lambda g: (g.astype(jnp.float32) / loss_scale).astype(g.dtype), grads
        )
    return loss, grads, {**sums, **counts}


def merge_microbatches(parts: PyTree) -> PyTree:
    """The inverse of `split_microbatches`: [k, B/k, ...] -> [B, ...] in the batch's row order."""

    def merge(x):
        return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])

    return jax.tree_util.tree_map(merge, parts)


def chunked_embeddings(
    params, batch: Batch, rng, *, model, objective: CoupledObjective, num_chunks: int
) -> jax.Array:
    """The row outputs of a batch whose rows couple (`CoupledObjective.row_outputs`: a
    contrastive batch [B, T, L]'s embeddings [B, T, E]; of packed rows [R, L], their slots'
    [R, S, E]), computed `num_chunks` chunks of rows at a time (`split_microbatches`' rows),
    chunk i's dropout drawn from `fold_in(rng, i)` (None: dropout off). Differentiating through
    it is the uncached batch that `grad_cache_loss_and_grads` equals (its activations all kept
    at once)."""
    chunks = split_microbatches(batch, num_chunks)

    def one(xs):
        chunk, i = xs
        chunk_rng = None if rng is None else jax.random.fold_in(rng, i)
        return objective.row_outputs(model, params, chunk, chunk_rng, rng is None)

    return merge_microbatches(jax.lax.map(one, (chunks, jnp.arange(num_chunks))))


def grad_cache_loss_and_grads(
    params,
    batch: Batch,
    rng,
    *,
    model,
    objective: CoupledObjective,
    num_chunks: int,
    loss_scale: jax.Array | None = None,
):
    """GradCache (Gao et al. 2021): the loss of a whole batch whose rows couple (the contrastive
    loss) and its gradient, with the activations of one chunk of rows in memory at a time, so a
    batch of thousands of texts trains where one chunk fits.

    1. The embeddings of every chunk, no activations kept (`chunked_embeddings`).
    2. The loss of the whole batch and its gradient with respect to the embeddings [B, T, E]
       (packed rows: to their slots' [R, S, E], chunks being chunks of rows):
       every anchor still sees every document of the global batch.
    3. Per chunk: the forward pass again (the same dropout key as in 1, so the same masks) and
       its vector-Jacobian product with that chunk's embedding gradient, added up.

    The result equals differentiating through `chunked_embeddings` (the uncached batch) up to
    float rounding. Returns (loss, grads, metric sums and counts) as `loss_and_grads` does."""
    counts = objective.counts(batch)
    embeddings = jax.lax.stop_gradient(
        chunked_embeddings(
            params, batch, rng, model=model, objective=objective, num_chunks=num_chunks
        )
    )

    def embedding_loss(e):
        sums = objective.batch_sums(e, batch)
        loss = objective.loss(sums, counts)
        return (loss if loss_scale is None else loss * loss_scale), (loss, sums)

    (_, (loss, sums)), cached = jax.value_and_grad(embedding_loss, has_aux=True)(embeddings)

    def body(acc, xs):
        chunk, i, chunk_grad = xs
        chunk_rng = jax.random.fold_in(rng, i)
        _, vjp = jax.vjp(lambda p: objective.row_outputs(model, p, chunk, chunk_rng, False), params)
        return jax.tree_util.tree_map(jnp.add, acc, vjp(chunk_grad)[0]), None

    xs = (
        split_microbatches(batch, num_chunks),
        jnp.arange(num_chunks),
        split_microbatches(cached, num_chunks),
    )
    grads, _ = jax.lax.scan(body, jax.tree_util.tree_map(jnp.zeros_like, params), xs)
    if loss_scale is not None:
        grads = jax.tree_util.tree_map(
            lambda g: (g.astype(jnp.float32) / loss_scale).astype(g.dtype), grads
        )
    return loss, grads, {**sums, **counts}


def all_finite(tree: PyTree) -> jax.Array:
    """Whether every element of every array in `tree` is finite: a bool scalar. On global
    (sharded) arrays it reduces over all shards, so every device gets the same answer."""
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def step_rng(rng: jax.Array, step: jax.Array, runtime=None) -> jax.Array:
    """The dropout key of a step: the run's key (`TrainState.rng`, a threefry key) folded with
    the step; with `runtime.dropout_rng == "rbg"` an RngBitGenerator key drawn from it (four
    32-bit words), whose bits cost a fraction of threefry's on accelerators; with "hash" the
    same words as a `models.hash_rng` key, whose bits are a counter hash (a fraction of
    threefry's cost on CPUs). A function of (rng, step) alone: a resumed run draws the masks of
    an uninterrupted one."""
    rng = jax.random.fold_in(rng, step)
    if runtime is None or runtime.dropout_rng == "threefry":
        return rng
    if runtime.dropout_rng == "hash":
        return hash_rng.hash_key(rng)
    return jax.random.wrap_key_data(jax.random.bits(rng, (4,), jnp.uint32), impl="rbg")


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    model: nn.Module,
    tx: optax.GradientTransformation,
    objective: Objective,
    num_microbatches: int = 1,
    schedule: Callable[[jax.Array], jax.Array] | None = None,
    loss_scale: DynamicLossScale | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update. Returns the new state and metric sums (plus loss, grad_norm, lr).

    Dropout uses `step_rng(state.rng, state.step)` (and the micro-batch index), so a resumed run
    draws the same masks as an uninterrupted one.

    With `loss_scale` (float16 runs; `state` is a `ScaledTrainState`) the gradients are
    computed scaled (see the module docstring), and a step whose loss or gradients are not finite
    is skipped: params and opt_state are returned unchanged (the optimizer's own count and the
    learning-rate schedule inside it do not advance), while `step` advances, so that the step
    stays the number of batches consumed (the data position and the dropout keys move on). The
    metrics then add `loss_scale` (the scale this step used) and `skipped_steps` (1.0 for a
    skipped step, else 0.0); a skipped step reports loss and grad_norm 0 (`reduce_metrics`
    averages them over the applied steps).
    """
    rng = step_rng(state.rng, state.step, getattr(model, "runtime", None))
    loss, grads, sums = loss_and_grads(
        state.params,
        batch,
        rng,
        model=model,
        objective=objective.at_step(state.step),
        num_microbatches=num_microbatches,
        loss_scale=None if loss_scale is None else state.loss_scale.scale,
    )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(sums)
    metrics["loss"] = loss
    metrics["grad_norm"] = optax.global_norm(grads)
    if schedule is not None:
        metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    if loss_scale is None:
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics
    return _update_if_finite(state, params, opt_state, metrics, loss, grads, loss_scale)


def _update_if_finite(
    state: ScaledTrainState,
    params: PyTree,
    opt_state: PyTree,
    metrics: dict[str, jax.Array],
    loss: jax.Array,
    grads: PyTree,
    loss_scale: DynamicLossScale,
) -> tuple[ScaledTrainState, dict[str, jax.Array]]:
    """float16's end of `train_step`: the new `params` and `opt_state` where the loss and
    gradients are finite, else `state`'s (loss and grad_norm then 0); the step advances either
    way, the loss scale follows (`DynamicLossScale.update`), and the metrics add `loss_scale` and
    `skipped_steps`."""
    finite = jnp.isfinite(loss) & all_finite(grads)

    def keep_if_skipped(new, old):
        return jnp.where(finite, new, old)

    params = jax.tree_util.tree_map(keep_if_skipped, params, state.params)
    opt_state = jax.tree_util.tree_map(keep_if_skipped, opt_state, state.opt_state)
    for key in ("loss", "grad_norm"):
        metrics[key] = jnp.where(finite, metrics[key], 0.0)
    metrics["loss_scale"] = state.loss_scale.scale
    metrics["skipped_steps"] = 1.0 - finite.astype(jnp.float32)
    new_state = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        loss_scale=loss_scale.update(state.loss_scale, finite),
    )
    return new_state, metrics


def eval_step(
    params: PyTree,
    batch: Batch,
    *,
    model: nn.Module,
    objective: Objective,
    num_microbatches: int = 1,
) -> dict[str, Any]:
    """Metric sums and counts of one evaluation batch (dropout off), over `num_microbatches`
    parts as the train step takes them (the same rows a chip at a time, so an evaluation fits
    wherever the training step does); the sums do not depend on the split."""
    counts = objective.counts(batch)
    if objective.couples_rows:  # the loss couples every row: chunks compute their outputs
        outputs = chunked_embeddings(
            params, batch, None, model=model, objective=objective, num_chunks=num_microbatches
        )
        sums = objective.batch_sums(outputs, batch)
    elif num_microbatches == 1:
        sums = objective.sums(model, params, batch, None, True)
    else:
        parts = split_microbatches(batch, num_microbatches)

        def body(acc, part):
            s = objective.sums(model, params, part, None, True)
            return jax.tree_util.tree_map(jnp.add, acc, s), None

        first = jax.tree_util.tree_map(lambda x: x[0], parts)
        abstract = jax.eval_shape(lambda: objective.sums(model, params, first, None, True))
        init = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), abstract)
        sums, _ = jax.lax.scan(body, init, parts)
    return {**sums, **counts, "loss": objective.loss(sums, counts)}


def embed_step(params: PyTree, batch: Batch, *, model: nn.Module, objective) -> jax.Array:
    """Sentence embeddings float32 [B, E] of texts [B, L] (dropout off), pooled as the
    contrastive `objective` pools them."""
    return objective.embed(model, params, batch, None, True)


def predict_step(params: PyTree, batch: Batch, *, model: nn.Module, **extra) -> Any:
    """The model's outputs for a batch (dropout off), e.g. for writing predictions."""
    return apply_model(model, params, batch, None, True, **extra)
