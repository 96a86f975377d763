"""Rotary position embeddings (RoPE, rotate-half pairing) and transformers' `rope_parameters`.

A query or key head [D] is split into its first D' = int(D x partial_rotary_factor) dims, which
rotate, and the rest, which pass unchanged. Pair i of the rotated part (dims i and i + D'/2) turns
by the angle position x inv_freq[i]; cos and sin are then scaled by the variant's attention
factor (1 but for yarn). Scores q.k depend only on the distance between two positions, so a packed
row's positions may restart per sequence or not.

The inverse frequencies of each `rope_type` are transformers' (`modeling_rope_utils.py`,
`ROPE_INIT_FUNCTIONS`, and the models' `compute_default_rope_parameters`), computed with the same
float32 operations:

  default   inv_freq[i] = 1 / theta^(2i / D')
  linear    default / factor (positions interpolated)
  dynamic   NTK-aware: theta grown to theta (factor s / m - (factor - 1))^(D' / (D' - 2)) for
            rows longer than m = max_position_embeddings, s = the batch's largest position + 1
            (as transformers' first forward at that length; its cache across calls is state
            that an encoder does not keep)
  yarn      interpolation and extrapolation blended along a ramp of dims (beta_fast,
            beta_slow), with an attention factor (0.1 ln(factor) + 1 unless given)
  llama3    low frequencies / factor, high ones kept, a smooth blend between them

Dimension legend: B batch, L length, H heads, D head size, D' rotated dims (D' <= D).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
# The keys each type reads besides rope_type, rope_theta and partial_rotary_factor (transformers'
# `RopeParameters`): those it needs, then those it may take.
_NEEDS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
}
_MAY = {"yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")}


@dataclasses.dataclass(frozen=True)
class RopeParameters:
    """One layer's rotary variant: transformers' `rope_parameters` dict as a frozen record.

    Attributes:
      rope_type: one of `ROPE_TYPES`.
      rope_theta: the base of the frequencies.
      partial_rotary_factor: the fraction of each head's dims that rotate (D' / D).
      factor: the context extension (linear, dynamic, yarn, llama3).
      original_max_position_embeddings: the pretraining length (yarn, llama3).
      attention_factor: yarn's cos/sin scale; None: derived from factor (and mscale).
      beta_fast / beta_slow: yarn's ramp bounds in rotations; None: 32 / 1.
      mscale / mscale_all_dim: yarn's attention factor terms (DeepSeek's); None: unused.
      low_freq_factor / high_freq_factor: llama3's wavelength bounds.
      truncate: yarn rounds its ramp bounds to whole dims (transformers' default).
    """

    rope_type: str = "default"
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_type={self.rope_type!r} is not implemented; bert_jax has {ROPE_TYPES}"
            )
        missing = [k for k in _NEEDS[self.rope_type] if getattr(self, k) is None]
        if missing:
            raise ValueError(f"rope_type={self.rope_type!r} needs {missing} in rope_parameters")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(
                f"partial_rotary_factor={self.partial_rotary_factor}: must be in (0, 1]"
            )

    @classmethod
    def from_hf(
        cls, rope: Mapping[str, Any] | None, rope_theta: float | None = None
    ) -> RopeParameters:
        """The record of a config.json's `rope_parameters` (transformers 5), or of the older
        `rope_scaling` dict (`type` for `rope_type`) with `rope_theta` beside it; None: default
        RoPE of `rope_theta`. An unknown key raises naming the known ones."""
        d = dict(rope or {})
        if "type" in d:  # the older spelling of rope_type
            d.setdefault("rope_type", d.pop("type"))
        if rope_theta is not None:
            d.setdefault("rope_theta", rope_theta)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"rope_parameters has keys {unknown} bert_jax does not read: {names}")
        return cls(**d)

    def to_hf(self) -> dict[str, Any]:
        """transformers' `rope_parameters` dict: the type, the theta and every key set."""
        out = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in out and value != f.default:
                out[f.name] = value
        return out

    def rotated_dims(self, head_dim: int) -> int:
        """D', the dims of a head that rotate (transformers' `int(head_dim * factor)`)."""
        return int(head_dim * self.partial_rotary_factor)


def _default_inv_freq(theta, dim: int) -> Array:
    """1 / theta^(2i / dim), float32 [dim/2] (theta may be traced: dynamic)."""
    return 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))


def _yarn(rope: RopeParameters, dim: int, max_positions: int) -> tuple[Array, float]:
    """transformers' `_compute_yarn_parameters`: the blended frequencies and attention factor."""
    base, factor = rope.rope_theta, rope.factor
    original = rope.original_max_position_embeddings
    if factor is None:
        factor = max_positions / original

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rope.attention_factor
    if attention is None:
        if rope.mscale and rope.mscale_all_dim:
            attention = float(mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim))
        else:
            attention = mscale(factor)
    beta_fast, beta_slow = rope.beta_fast or 32, rope.beta_slow or 1

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no singularity
    pos_freqs = base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # the share of the unscaled frequency, per pair
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
        1.0 / pos_freqs
    ) * extrapolation
    return inv_freq, attention


def _llama3(rope: RopeParameters, dim: int) -> Array:
    """transformers' `_compute_llama3_parameters`: long wavelengths / factor, a smooth blend."""
    inv_freq = _default_inv_freq(rope.rope_theta, dim)
    factor, old = rope.factor, rope.original_max_position_embeddings
    low, high = rope.low_freq_factor, rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return jnp.where(medium, smoothed, scaled)


def inverse_frequencies(
    rope: RopeParameters, head_dim: int, max_position_embeddings: int, seq_len=None
) -> tuple[Array, float]:
    """The rotation speed of each rotated pair, as transformers' `ROPE_INIT_FUNCTIONS`.

    Args:
      rope: the variant.
      head_dim: D.
      max_position_embeddings: the model's length (dynamic grows theta past it; yarn derives
        its factor from it when none is given).
      seq_len: dynamic only: the batch's largest position + 1 (an int or an int array); None
        or at most max_position_embeddings: the unscaled frequencies.

    Returns:
      (inv_freq float32 [D'/2] in radians per position, the cos/sin scale: 1.0 but for yarn).
    """
    dim = rope.rotated_dims(head_dim)
    kind = rope.rope_type
    if kind == "yarn":
        return _yarn(rope, dim, max_position_embeddings)
    if kind == "llama3":
        return _llama3(rope, dim), 1.0
    theta = rope.rope_theta
    if kind == "dynamic":
        length = max_position_embeddings if seq_len is None else seq_len
        length = jnp.maximum(length, max_position_embeddings).astype(jnp.float32)
        growth = rope.factor * length / max_position_embeddings - (rope.factor - 1)
        theta = theta * growth ** (dim / (dim - 2))
    inv_freq = _default_inv_freq(theta, dim)
    return (inv_freq / rope.factor if kind == "linear" else inv_freq), 1.0


def cos_sin(positions: Array, inv_freq: Array, scale: float = 1.0) -> tuple[Array, Array]:
    """The rotation of every position: positions [B, L] int, inv_freq [D'/2] float32 ->
    (cos, sin) float32 [B, L, D'] (each pair's angle twice, rotate-half order), times `scale`."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, L, D'/2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [B, L, D']
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos, sin


def apply_rotary(x: Array, cos: Array, sin: Array) -> Array:
    """Queries or keys rotated: x [B, L, H, D], cos and sin [B, L, D'] (`cos_sin`) -> [B, L, H,
    D] in x's dtype, rotated in float32; dims past D' pass unchanged (partial rotary)."""
    rotated = cos.shape[-1]
    xf = x.astype(jnp.float32)
    xr, rest = xf[..., :rotated], xf[..., rotated:]
    half = jnp.concatenate([-xr[..., rotated // 2 :], xr[..., : rotated // 2]], axis=-1)
    out = xr * cos[:, :, None, :] + half * sin[:, :, None, :]
    if rest.shape[-1]:
        out = jnp.concatenate([out, rest], axis=-1)
    return out.astype(x.dtype)


def rope_cos_sin(
    rope: RopeParameters, positions: Array, head_dim: int, max_position_embeddings: int
) -> tuple[Array, Array]:
    """(cos, sin) float32 [B, L, D'] of `rope` at positions [B, L] int: the frequencies
    (`inverse_frequencies`; dynamic reads the batch's largest position) and their scale."""
    seq_len = jnp.max(positions) + 1 if rope.rope_type == "dynamic" else None
    inv_freq, scale = inverse_frequencies(rope, head_dim, max_position_embeddings, seq_len)
    return cos_sin(positions, inv_freq, scale)


def rotary(x: Array, positions: Array, theta: float) -> Array:
    """Default RoPE of base `theta` on every dim: x [B, L, H, D] (D even), positions [B, L] int
    -> [B, L, H, D] in x's dtype, rotated in float32 (ModernBERT's global and local layers)."""
    cos, sin = cos_sin(positions, _default_inv_freq(theta, x.shape[-1]))
    return apply_rotary(x, cos, sin)
