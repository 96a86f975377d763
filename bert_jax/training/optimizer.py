"""Optimizers and learning-rate schedules for BERT, built from optax.

    schedule = make_schedule("bert", 1e-4, warmup_steps=10_000, total_steps=1_000_000)
    tx = make_optimizer("adamw", schedule, weight_decay=0.01, clip_norm=1.0)

* AdamW as google-research/bert's `AdamWeightDecayOptimizer`: beta1 0.9, beta2 0.999, eps 1e-6,
  decoupled weight decay 0.01, and no bias correction (`bias_correction=False`, the original's
  choice; True gives optax's / PyTorch's Adam).
* LAMB (You et al. 2019) for large batches, with the same weight-decay exclusions and one trust
  ratio per weight matrix of each layer, also when the layers are stacked (`scan_layers`).
* Weight decay skips LayerNorm parameters and every bias, as the original's
  `exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]` (and ModernBERT's norms).
* StableAdamW (ModernBERT's): AdamW with per-tensor update clipping, `scale_by_adam`.
* Schedules: google-research/bert's ("bert": linear decay over all the steps, the warmup
  overriding the first ones), Hugging Face's ("linear": linear decay from the end of warmup),
  cosine, warmup-stable-decay (WSD), or constant. All take and return steps as optimizer updates.

Leaf module: knows nothing of the model beyond parameter names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from flax.core.meta import AxisMetadata

from bert_jax.models.families import FAMILIES

PyTree = Any
SCHEDULES = ("bert", "linear", "cosine", "wsd", "constant")
OPTIMIZERS = ("adamw", "stable_adamw", "lamb", "sgd")


def make_schedule(
    kind: str,
    peak_learning_rate: float,
    warmup_steps: int,
    total_steps: int,
    *,
    end_learning_rate: float = 0.0,
    decay_fraction: float = 0.1,
) -> optax.Schedule:
    """A learning-rate schedule: linear warmup from 0 to the peak over `warmup_steps`, then

    * "bert": google-research/bert's `optimization.create_optimizer`: polynomial decay (power 1)
      from the peak at step 0 to `end_learning_rate` at `total_steps`, and while
      step < warmup_steps the warmup's peak * step / warmup_steps instead. After warmup the rate
      is peak * (1 - step / total_steps): lower than "linear"'s at the same step.
    * "linear": Hugging Face's `get_linear_schedule_with_warmup`: linear decay from the peak at
      the end of warmup to `end_learning_rate` at `total_steps`;
    * "cosine": cosine decay to `end_learning_rate` at `total_steps`;
    * "wsd": constant at the peak, then linear decay to `end_learning_rate` over the last
      `decay_fraction` of the steps (warmup-stable-decay);
    * "constant": the peak after warmup.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; expected one of {SCHEDULES}")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} must be in [0, total_steps={total_steps}]")
    if peak_learning_rate <= 0:
        raise ValueError(f"peak learning rate must be positive, got {peak_learning_rate}")
    warmup = optax.linear_schedule(0.0, peak_learning_rate, max(warmup_steps, 1))
    rest = max(total_steps - warmup_steps, 1)
    if kind == "bert":
        decay = optax.linear_schedule(peak_learning_rate, end_learning_rate, max(total_steps, 1))
        if warmup_steps == 0:
            return decay
        return lambda step: jnp.where(step < warmup_steps, warmup(step), decay(step))
    if kind == "linear":
        after = optax.linear_schedule(peak_learning_rate, end_learning_rate, rest)
    elif kind == "cosine":
        alpha = end_learning_rate / peak_learning_rate
        after = optax.cosine_decay_schedule(peak_learning_rate, rest, alpha=alpha)
    elif kind == "wsd":
        decay_steps = max(int(round(decay_fraction * total_steps)), 1)
        stable = max(rest - decay_steps, 0)
        after = optax.join_schedules(
            [
                optax.constant_schedule(peak_learning_rate),
                optax.linear_schedule(peak_learning_rate, end_learning_rate, decay_steps),
            ],
            [stable],
        )
    else:
        after = optax.constant_schedule(peak_learning_rate)
    if warmup_steps == 0:
        return after
    return optax.join_schedules([warmup, after], [warmup_steps])


def _is_norm(name: str) -> bool:
    """A normalization layer's module name: BERT's "LayerNorm" (TF: "layer_norm"), ModernBERT's
    "norm", "attn_norm", "mlp_norm", "final_norm"."""
    return "LayerNorm" in name or "layer_norm" in name or name == "norm" or name.endswith("_norm")


def weight_decay_mask(params: PyTree) -> PyTree:
    """True for parameters that get weight decay: everything but normalization layers and biases.

    Works on plain or boxed (logical-axis) trees and on stacked (scanned) layers.
    """
    flat = traverse_util.flatten_dict(params)
    mask = {}
    for path, leaf in flat.items():
        decay = not (path[-1] == "bias" or any(_is_norm(p) for p in path))
        # Keep logical-axis boxes so the mask has the tree structure of the parameters.
        mask[path] = leaf.replace_boxed(decay) if isinstance(leaf, AxisMetadata) else decay
    return traverse_util.unflatten_dict(mask)


class _AdamState(NamedTuple):
    count: jax.Array
    mu: PyTree
    nu: PyTree


def scale_by_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    *,
    bias_correction: bool = False,
    update_clipping: bool = False,
    mu_dtype=None,
) -> optax.GradientTransformation:
    """Adam's update direction m / (sqrt(v) + eps), with or without bias correction.

    google-research/bert's AdamWeightDecayOptimizer has none; optax's `scale_by_adam` always has
    it. With `bias_correction=True` this equals `optax.scale_by_adam`.

    `update_clipping=True` is StableAdamW's (Wortsman et al. 2023, the ModernBERT recipe): each
    tensor's update is divided by max(1, RMS), RMS = sqrt(mean(g^2 / max(v, eps^2))) over the
    tensor with this step's gradient g and second moment v (bias-corrected): Adafactor's update
    clipping, which takes the place of gradient clipping.
    """

    def init_fn(params):
        mu = jax.tree_util.tree_map(lambda p: jnp.zeros_like(p, dtype=mu_dtype or p.dtype), params)
        nu = jax.tree_util.tree_map(jnp.zeros_like, params)
        return _AdamState(jnp.zeros([], jnp.int32), mu, nu)

    def update_fn(updates, state, params=None):
        del params
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        count = optax.safe_increment(state.count)
        if bias_correction:
            c1 = 1 - b1 ** count.astype(jnp.float32)
            c2 = 1 - b2 ** count.astype(jnp.float32)
        else:
            c1 = c2 = jnp.float32(1.0)
        out = jax.tree_util.tree_map(
            lambda m, v: ((m / c1) / (jnp.sqrt(v / c2) + eps)).astype(m.dtype), mu, nu
        )
        if update_clipping:

            def clip(u, g, v):
                ratio = jnp.square(g.astype(jnp.float32)) / jnp.maximum(v / c2, eps * eps)
                return u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(ratio))).astype(u.dtype)

            out = jax.tree_util.tree_map(clip, out, updates, nu)
        mu = jax.tree_util.tree_map(lambda m: m.astype(mu_dtype) if mu_dtype else m, mu)
        return out, _AdamState(count, mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)


# The stacked layer's name of every family that scans its layers (BERT's `encoder/layer`).
_SCANNED_LAYERS = frozenset(f.scanned_layer for f in FAMILIES.values() if f.scanned_layer)


def _is_stacked_layer(path) -> bool:
    """Whether a parameter path lies in the stacked layer of a scanned model (`scan_layers`):
    a key that is a family's stacked layer's name, not followed by a layer's index (EuroBERT
    stacks `model/layers`, where NomicBERT's unstacked layers are `layers/<i>`)."""
    keys = [str(getattr(k, "key", k)) for k in path]
    return any(
        key in _SCANNED_LAYERS and not (i + 1 < len(keys) and keys[i + 1].isdigit())
        for i, key in enumerate(keys)
    )


def scale_by_layerwise_trust_ratio(eps: float = 0.0) -> optax.GradientTransformation:
    """LAMB's trust ratio ||param|| / ||update||, once per parameter of each layer.

    Equals `optax.scale_by_trust_ratio` on unstacked parameters. Under `scan_layers` a layer's
    weights are slices [i] of one stacked array `encoder/layer/...` [n, ...]; there the norms are
    taken per slice, so that every layer keeps its own ratio, as it does unstacked (optax's one
    norm over the whole stack would give all layers one ratio).
    """

    def norm(x, axes):
        return jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=axes, keepdims=True))

    def scale(path, update, param):
        axes = tuple(range(1, update.ndim)) if _is_stacked_layer(path) else None
        param_norm, update_norm = norm(param, axes), norm(update, axes)
        ratio = param_norm / (update_norm + eps)
        ratio = jnp.where((param_norm == 0.0) | (update_norm == 0.0), 1.0, ratio)
        return update * ratio.astype(update.dtype)

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("the LAMB trust ratio needs the parameters")
        return jax.tree_util.tree_map_with_path(scale, updates, params), state

    return optax.GradientTransformation(lambda params: optax.ScaleByTrustRatioState(), update_fn)


# Parameters below the first layer (ELECTRA's depth 0): word, position and type tables, the
# embeddings' projection and DeBERTa's relative-position table.
_EMBEDDINGS = frozenset({"embeddings", "embeddings_project", "rel_embeddings"})


def scale_by_layer_depth(decay: float) -> optax.GradientTransformation:
    """ELECTRA's layer-wise learning-rate decay (Clark et al. 2020; google-research/electra's
    `_get_layer_lrs`): each update times decay^(n + 2 - depth), depth 0 for the embeddings,
    i + 1 for layer i of n and n + 2 (the full rate) for everything else, the task's head
    among them. Applied after the learning rate, so the weight decay scales with it, as in
    ELECTRA. Layers are found by name (`layer_3`, `layers_3`) or, stacked under `scan_layers`,
    by their leading [n] axis (one factor per slice).
    """
    from bert_jax.models.conversion import LAYER_INDEX_RE

    def keys(path):
        return [str(getattr(k, "key", k)) for k in path]

    def depth_of(path):
        names = keys(path)
        if _EMBEDDINGS & set(names):
            return 0
        found = LAYER_INDEX_RE.search("/" + "/".join(names) + "/")
        return None if found is None else int(found.group(1)) + 1

    def update_fn(updates, state, params=None):
        del params
        leaves = jax.tree_util.tree_leaves_with_path(updates)
        stacked = [u.shape[0] for p, u in leaves if _is_stacked_layer(p)]
        indexed = [depth_of(p) for p, _ in leaves if not _is_stacked_layer(p)]
        n = max([*stacked, *(d for d in indexed if d)], default=0)

        def scale(path, u):
            if _is_stacked_layer(path):
                factors = decay ** (n + 1 - jnp.arange(u.shape[0], dtype=jnp.float32))
                return u * factors.reshape(-1, *([1] * (u.ndim - 1))).astype(u.dtype)
            depth = depth_of(path)
            return u if depth is None else u * jnp.asarray(decay ** (n + 2 - depth), u.dtype)

        return jax.tree_util.tree_map_with_path(scale, updates), state

    if not 0 < decay <= 1:
        raise ValueError(f"layerwise_lr_decay={decay}: expected a factor in (0, 1]")
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def scale_by_name(factors: Mapping[str, float]) -> optax.GradientTransformation:
    """Each update of a top-level parameter named in `factors` times its factor (applied after
    the learning rate, with the weight decay: that parameter's own learning rate, on the same
    schedule, as a parameter group of its own in torch)."""

    def scale(path, update):
        return update * factors.get(str(getattr(path[0], "key", path[0])), 1.0)

    def update_fn(updates, state, params=None):
        del params
        return jax.tree_util.tree_map_with_path(scale, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def make_optimizer(
    name: str,
    learning_rate: float | optax.Schedule,
    *,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    clip_norm: float | None = 1.0,
    bias_correction: bool = False,
    layerwise_lr_decay: float = 1.0,
    factors: Mapping[str, float] | None = None,
) -> optax.GradientTransformation:
    """The full update: global-norm clipping, then AdamW / LAMB / SGD with masked weight decay,
    then (below 1) ELECTRA's layer-wise learning-rate decay (`scale_by_layer_depth`), then the
    learning-rate factors of named parameters (`scale_by_name`).

    Args:
      name: "adamw", "stable_adamw" (AdamW with StableAdamW's per-tensor update clipping;
        `scale_by_adam`), "lamb" or "sgd" (momentum-free; for tests and ablations).
      learning_rate: a float or a schedule of the optimizer step.
      weight_decay: decoupled weight decay, skipping LayerNorm parameters and biases.
      b1, b2, eps: Adam/LAMB moments and epsilon (BERT: 0.9, 0.999, 1e-6).
      clip_norm: clip the gradient to this global norm first; None or 0 turns clipping off.
      bias_correction: AdamW / StableAdamW only; False as the original BERT optimizer.
      layerwise_lr_decay: each layer's rate this much below the one above it (ELECTRA's 0.8 for
        base, 0.9 for large); 1: one rate.
      factors: top-level parameter name -> its learning rate over `learning_rate`'s.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")
    parts = []
    if clip_norm:
        parts.append(optax.clip_by_global_norm(clip_norm))
    if name in ("adamw", "stable_adamw"):
        clipping = name == "stable_adamw"
        parts += [
            scale_by_adam(b1, b2, eps, bias_correction=bias_correction, update_clipping=clipping),
            optax.add_decayed_weights(weight_decay, mask=weight_decay_mask),
            optax.scale_by_learning_rate(learning_rate),
        ]
    elif name == "lamb":
        parts += [
            optax.scale_by_adam(b1, b2, eps),
            optax.add_decayed_weights(weight_decay, mask=weight_decay_mask),
            scale_by_layerwise_trust_ratio(),
            optax.scale_by_learning_rate(learning_rate),
        ]
    else:
        parts += [
            optax.add_decayed_weights(weight_decay, mask=weight_decay_mask),
            optax.scale_by_learning_rate(learning_rate),
        ]
    if layerwise_lr_decay != 1.0:
        parts.append(scale_by_layer_depth(layerwise_lr_decay))
    if factors:
        parts.append(scale_by_name(factors))
    return optax.chain(*parts)


def from_config(
    o, num_train_steps: int, factors: Mapping[str, float] | None = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(tx, schedule) from an experiment's `optimizer` config block (`factors`: as
    `make_optimizer`'s, the objective's).

    `o.warmup_steps = -1` takes `o.warmup_fraction` (default 0.1) of `num_train_steps` as warmup.
    """
    warmup = o.warmup_steps
    if warmup < 0:
        warmup = int(round(o.get("warmup_fraction", 0.1) * num_train_steps))
    schedule = make_schedule(
        o.schedule,
        o.peak_learning_rate,
        min(warmup, num_train_steps),
        num_train_steps,
        end_learning_rate=o.end_learning_rate,
        decay_fraction=o.decay_fraction,
    )
    tx = make_optimizer(
        o.name,
        schedule,
        weight_decay=o.weight_decay,
        b1=o.b1,
        b2=o.b2,
        eps=o.eps,
        clip_norm=o.clip_norm,
        bias_correction=o.bias_correction,
        layerwise_lr_decay=o.get("layerwise_lr_decay", 1.0),
        factors=factors,
    )
    return tx, schedule
