"""Normalization over the hidden axis by kind: LayerNorm (`layers.layer_norm`) or RMSNorm, as a
config names it (`NORMS`), so that a layer stack is parametrized by the kind.

RMSNorm is transformers' `LlamaRMSNorm` (T5's LayerNorm): x / sqrt(mean(x^2) + eps) in float32,
cast back to the compute dtype, times a learned `scale` [E] (transformers' `weight`); no mean
subtracted, no bias.

Dimension legend: E hidden size.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.config import RuntimeConfig
from bert_jax.models.layers import layer_norm

NORMS = ("layer_norm", "rms_norm")


class RMSNorm(nn.Module):
    """x [..., E] -> scale * (x / sqrt(mean(x^2, E) + eps)) [..., E] in `dtype`.

    The statistics run in float32 whatever the input's dtype (as LlamaRMSNorm's); `scale` [E]
    starts at ones, on the `embed` axis.

    Attributes:
      epsilon: added to the mean square (transformers' `rms_norm_eps`).
      dtype / param_dtype: compute / storage dtypes.
    """

    epsilon: float = 1e-6
    dtype: Any = "float32"
    param_dtype: Any = "float32"

    @nn.compact
    def __call__(self, x):
        scale = self.param(
            "scale",
            nn.with_logical_partitioning(jax.nn.initializers.ones, ("embed",)),
            (x.shape[-1],),
            self.param_dtype,
        )
        xf = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)  # [..., 1] float32
        normed = (xf * jax.lax.rsqrt(variance + self.epsilon)).astype(self.dtype)
        return scale.astype(self.dtype) * normed


def make_norm(
    kind: str, rt: RuntimeConfig, epsilon: float, name: str, use_bias: bool = True
) -> nn.Module:
    """The norm of `kind` ("layer_norm": with a bias under `use_bias`; "rms_norm": none) named
    `name`, in the run's dtypes: [..., E] -> [..., E]."""
    if kind == "rms_norm":
        return RMSNorm(epsilon, dtype=rt.dtype, param_dtype=rt.param_dtype, name=name)
    if kind == "layer_norm":
        return layer_norm(rt, epsilon, name, use_bias=use_bias)
    raise ValueError(f"norm kind {kind!r} is unknown; expected one of {NORMS}")
