"""The feed-forward layer by kind (`MLP_KINDS`): gated (SwiGLU with silu, GeGLU with gelu: the
activation is the config's name) with separate or fused projections, or a plain two-layer one.

  gated        down(act(gate(x)) * up(x)): transformers' `LlamaMLP` (gate_proj, up_proj,
               down_proj), EuroBERT's, GTE's
  fused_gated  the gate and the up projection as one kernel [E, 2, F], its first half
               activated: ModernBERT's `Wi` [2F, E] (`act(input) * gate`), Wo
  dense        down(act(up(x)))

Dimension legend: B batch, L length, E hidden size, F intermediate size.
"""

from __future__ import annotations

import flax.linen as nn

from bert_jax.activations import ACTIVATIONS
from bert_jax.models.config import EncoderConfig, RuntimeConfig
from bert_jax.models.layers import Dropout, constrain, dense

MLP_KINDS = ("gated", "fused_gated", "dense")
# Each kind's parameter names, in the order of its projections (transformers' Llama's, and
# ModernBERT's for the fused kind); a family with other names passes its own.
MLP_NAMES = {
    "gated": ("gate_proj", "up_proj", "down_proj"),
    "fused_gated": ("Wi", "Wo"),
    "dense": ("up_proj", "down_proj"),
}


class FeedForward(nn.Module):
    """The feed-forward layer of `kind`: x [B, L, E] -> [B, L, E].

    Attributes:
      config: reads hidden_size, intermediate_size (F) and initializer_range.
      kind: one of `MLP_KINDS`.
      activation: the name of the activation (`bert_jax.activations.ACTIVATIONS`): "silu"
        makes a gated layer SwiGLU, "gelu" GeGLU.
      use_bias: whether the projections have biases (Llama's `mlp_bias`).
      dropout: dropout on the activated [B, L, F] (ModernBERT's `mlp_dropout`).
      names: the projections' parameter names; None: `MLP_NAMES[kind]`.
      out_stddev: the output projection's initializer stddev; None: initializer_range.
      out_bias: whether the output projection has a bias; None: `use_bias` (GTE's gate and up
        projections have none, its down projection one).
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    kind: str = "gated"
    activation: str = "silu"
    use_bias: bool = False
    dropout: float = 0.0
    names: tuple[str, ...] | None = None
    out_stddev: float | None = None
    out_bias: bool | None = None  # last: the others are passed by position

    @nn.compact
    def __call__(self, x, *, deterministic: bool = True):
        cfg, rt = self.config, self.runtime
        if self.kind not in MLP_KINDS:
            raise ValueError(f"MLP kind {self.kind!r} is unknown; expected one of {MLP_KINDS}")
        names = self.names or MLP_NAMES[self.kind]
        if len(names) != len(MLP_NAMES[self.kind]):
            raise ValueError(f"a {self.kind} MLP names {len(MLP_NAMES[self.kind])} projections")
        act = ACTIVATIONS[self.activation]
        width = cfg.intermediate_size

        def project(features, out_axes, name):
            return dense(cfg, rt, features, ("embed",), out_axes, name, use_bias=self.use_bias)(x)

        if self.kind == "gated":
            h = act(project(width, ("mlp",), names[0])) * project(width, ("mlp",), names[1])
        elif self.kind == "fused_gated":
            both = project((2, width), (None, "mlp"), names[0])  # [B, L, 2, F]
            h = act(both[..., 0, :]) * both[..., 1, :]
        else:
            h = act(project(width, ("mlp",), names[0]))
        h = constrain(h, "act_batch", "act_len", "act_mlp")  # [B, L, F]
        h = Dropout(self.dropout)(h, deterministic=deterministic)
        out = dense(
            cfg, rt, cfg.hidden_size, ("mlp",), ("embed",), names[-1],
            use_bias=self.use_bias if self.out_bias is None else self.out_bias,
            stddev=self.out_stddev,
        )  # fmt: skip
        return out(h)
