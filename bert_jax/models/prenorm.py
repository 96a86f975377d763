"""Grouped-query attention with rotary positions, and the pre-norm layer stack built on it:
x + attention(norm(x)), then + mlp(norm(.)), n times (Llama's layer, EuroBERT's), or with
`post_norm` the same sub-layers normed after each residual sum: norm(x + attention(x)), then
norm(. + mlp(.)) (NomicBERT's and GTE's layers, `post_attention_layernorm` and
`post_mlp_layernorm`).

The stack is parametrized by the norm's kind (`norms.NORMS`: RMSNorm or LayerNorm) and the
feed-forward layer's (`mlp.MLP_KINDS`: gated, fused gated, dense); its parameter names are
transformers' Llama's (`layer_3/input_layernorm`, `self_attn/q_proj`, `post_attention_layernorm`,
`mlp/gate_proj`), so a family on it converts by a rename and a transpose.

Its config reads, besides `EncoderConfig`'s shared fields (hidden_size, num_attention_heads,
initializer_range, attention_probs_dropout_prob): num_hidden_layers, intermediate_size,
num_key_value_heads (K), hidden_act, norm_eps, hidden_dropout_prob, attention_bias, mlp_bias,
max_position_embeddings and `rope` (a `rotary.RopeParameters`, or None for no rotary positions),
as fields or properties (a family maps its own config.json names onto them); and where a family
has them, `mlp_out_bias` (the MLP's down projection's bias alone; absent: `mlp_bias`) and
`mlp_dropout` (dropout on the MLP's activated [B, L, F]; absent: none), GTE's.

Grouped-query attention: K key/value heads, each shared by H / K query heads (transformers'
`repeat_kv`: query head h reads key/value head h // (H / K)). The keys and values are repeated to
H heads before the kernel, so every kernel of `models.attention` takes them (xla, fused_xla,
cudnn, splash) at the cost of the repeat; K = H is plain multi-head attention.

The post-norm rotary families (NomicBERT, GTE, Jina-v3) take the stack whole: their encoder
(`PostNormRotaryModel`) and their config's reading and checks (`RotaryPostLNConfig`).

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.attention import AttentionMask, layer_attend
from bert_jax.models.config import LAYER_SIZES, EncoderConfig, PostLNConfig, RuntimeConfig
from bert_jax.models.encoder import EncoderModel, LearnedEmbeddings
from bert_jax.models.layers import (
    LAYER_NAME,
    SCANNED_LAYER,
    Dropout,
    Pooler,
    constrain,
    dense,
    run_layers,
)
from bert_jax.models.mlp import FeedForward
from bert_jax.models.norms import make_norm
from bert_jax.models.rotary import RopeParameters, apply_rotary, rope_cos_sin

Array = jax.Array


def check_heads(cfg: EncoderConfig) -> None:
    """Raises naming the fields when the K key/value heads do not divide the H query heads."""
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads <= 0:
        raise ValueError(f"num_key_value_heads={kv_heads!r}: must be a positive integer")
    if heads % kv_heads:
        raise ValueError(
            f"num_key_value_heads={kv_heads} must divide num_attention_heads={heads} (each "
            "key/value head serves a whole group of query heads)"
        )


def rotary_angles(cfg: EncoderConfig, positions: Array) -> tuple[Array, Array] | None:
    """(cos, sin) float32 [B, L, D'] of the config's `rope` at positions [B, L] int, computed
    once per forward for every layer; None without rotary positions."""
    if cfg.rope is None:
        return None
    return rope_cos_sin(cfg.rope, positions, cfg.head_dim, cfg.max_position_embeddings)


class GroupedQueryAttention(nn.Module):
    """`self_attn`: q_proj [E, H, D], k_proj and v_proj [E, K, D], rotary positions on q and k,
    attention through `models.attention.attend` (k and v repeated to H heads), o_proj.

    `__call__(x [B, L, E], mask, angles (cos, sin) or None)` -> (out [B, L, E], probabilities
    [B, H, L, L] float32 or None).
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask: AttentionMask, angles, *, deterministic, output_attentions):
        cfg, rt = self.config, self.runtime
        check_heads(cfg)
        heads, kv_heads, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

        def project(n, name):
            return dense(
                cfg, rt, (n, head_dim), ("embed",), ("heads", "kv"), name,
                use_bias=cfg.attention_bias,
            )(x)  # fmt: skip

        q = project(heads, "q_proj")  # [B, L, H, D]
        k, v = project(kv_heads, "k_proj"), project(kv_heads, "v_proj")  # [B, L, K, D]
        if angles is not None:
            q, k = apply_rotary(q, *angles), apply_rotary(k, *angles)
        groups = heads // kv_heads
        if groups > 1:  # key/value head j serves query heads j * groups ... (j + 1) * groups - 1
            k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)  # [B, L, H, D]
        q, k, v = (constrain(t, "act_batch", "act_len", "act_heads", None) for t in (q, k, v))
        context, probs = layer_attend(
            self, q, k, v, mask, deterministic=deterministic, output_attentions=output_attentions
        )
        out = dense(
            cfg, rt, cfg.hidden_size, ("heads", "kv"), ("embed",), "o_proj",
            use_bias=cfg.attention_bias,
        )(context)  # fmt: skip
        return out, probs


class PreNormKinds(nn.Module):
    """What a pre-norm layer and its stack are made of, the attributes both take: the config
    and runtime, the norms' kind (`norms.NORMS`), the feed-forward layers' kind
    (`mlp.MLP_KINDS`) and projections' names (None: the kind's, `mlp.MLP_NAMES`), and
    `post_norm` (each sub-layer normed after its residual sum)."""

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    norm: str = "rms_norm"
    mlp: str = "gated"
    post_norm: bool = False
    mlp_names: tuple[str, ...] | None = None


class PreNormLayer(PreNormKinds):
    """One pre-norm layer: x + attn(norm(x)), then + mlp(norm(.)), each sub-layer's output
    dropped out (`hidden_dropout_prob`); with `post_norm`, norm(x + attn(x)), then
    norm(. + mlp(.)) (the norms `post_attention_layernorm`, `post_mlp_layernorm`). The kinds:
    `PreNormKinds`.

    `__call__(x [B, L, E], mask, angles) -> (x', (x' or None, probs or None))`, the (carry,
    output) shape `nn.scan` wants; the run mode and the kinds live in attributes.
    """

    deterministic: bool = True
    output_hidden_states: bool = False
    output_attentions: bool = False

    @nn.compact
    def __call__(self, x, mask, angles):
        cfg, rt, det = self.config, self.runtime, self.deterministic
        drop = Dropout(cfg.hidden_dropout_prob)

        def norm(name):
            return make_norm(self.norm, rt, cfg.norm_eps, name)

        pre = not self.post_norm
        h = norm("input_layernorm")(x) if pre else x
        a, probs = GroupedQueryAttention(cfg, rt, name="self_attn")(
            h, mask, angles, deterministic=det, output_attentions=self.output_attentions
        )
        x = x + drop(a, deterministic=det)
        h = norm("post_attention_layernorm")(x)  # post-norm: the residual stream itself
        x = x if pre else h
        x = x + drop(self._feed_forward()(h, deterministic=det), deterministic=det)
        if not pre:
            x = norm("post_mlp_layernorm")(x)
        y = constrain(x, "act_batch", "act_len", "act_embed")
        return y, (y if self.output_hidden_states else None, probs)

    def _feed_forward(self) -> FeedForward:
        """`mlp` of the layer's kind and names (called inside `__call__`'s scope): the
        config's `mlp_bias`, and where it has them `mlp_out_bias` and `mlp_dropout`."""
        cfg = self.config
        return FeedForward(
            cfg, self.runtime, self.mlp, cfg.hidden_act, cfg.mlp_bias, names=self.mlp_names,
            out_bias=getattr(cfg, "mlp_out_bias", None),
            dropout=getattr(cfg, "mlp_dropout", 0.0), name="mlp",
        )  # fmt: skip


class PreNormEncoder(PreNormKinds):
    """The pre-norm layers: `layer_0 ... layer_{n-1}`, or one scanned `layer` with stacked
    weights (`layers.run_layers`), rotary angles computed once for all of them.

    Attributes: `PreNormKinds`', which each layer takes, and
      layer_name / scanned_layer: the layers' names (`layers.run_layers`).

    `__call__(x [B, L, E], mask, positions [B, L] int) -> (y [B, L, E], states, probs)`: y the
    last layer's output (before any final norm: the family's), states the n layers' outputs
    [B, L, E] with `output_hidden_states`, probs their attention probabilities [B, H, L, L]
    with `output_attentions`, else None.
    """

    layer_name: str = LAYER_NAME
    scanned_layer: str = SCANNED_LAYER

    @nn.compact
    def __call__(
        self,
        x,
        mask: AttentionMask,
        positions,
        *,
        deterministic: bool,
        output_hidden_states: bool,
        output_attentions: bool,
    ):
        kinds = ("norm", "mlp", "post_norm", "mlp_names")
        kwargs = dict(
            **{name: getattr(self, name) for name in kinds},
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        angles = rotary_angles(self.config, positions)
        return run_layers(
            PreNormLayer, self.config, self.runtime, kwargs, x, mask, angles,
            layer_name=self.layer_name, scanned_layer=self.scanned_layer,
        )  # fmt: skip


# Where `PostNormRotaryModel`'s layers sit in its tree, as a family's registry row states them
# (LAYERS_PATH, LAYER_NAME, SCANNED_LAYER): `layers/0 ...`, one stacked `layers/layer` scanned.
ROTARY_LAYERS = (("layers",), "{}", SCANNED_LAYER)


class PostNormRotaryModel(EncoderModel):
    """An encoder of BERT's call on this stack, post-norm with rotary positions (NomicBERT's,
    GTE's, Jina-v3's): `embeddings` (`encoder.LearnedEmbeddings` without a position table; token
    types where the config has a table), `layers` (`PreNormEncoder` with `post_norm`, LayerNorm,
    the feed-forward kind `mlp_kind` named `mlp_names`), `pooler` (tanh(dense(first token))).
    A family subclasses it, naming its config and what differs (its docstring: the call)."""

    stack_reads_positions: ClassVar[bool] = True
    mlp_kind: ClassVar[str] = "gated"
    mlp_names: ClassVar[tuple[str, ...] | None] = None
    # transformers' names of the layers (`layers.3`) and the one scanned layer
    layer_name: ClassVar[str] = "{}"
    scanned_layer: ClassVar[str] = SCANNED_LAYER

    def embed(self, input_ids, token_type_ids, attention_mask, position_ids, *, deterministic):
        embeddings = LearnedEmbeddings(
            self.config, self.runtime, position_table=False,
            token_types=bool(self.config.type_vocab_size), name="embeddings",
        )  # fmt: skip
        return embeddings(input_ids, token_type_ids, None, deterministic=deterministic)

    def stack(self, x, mask: AttentionMask, *, positions, **kwargs):
        layers = PreNormEncoder(
            self.config, self.runtime, "layer_norm", self.mlp_kind, post_norm=True,
            mlp_names=self.mlp_names, layer_name=self.layer_name,
            scanned_layer=self.scanned_layer, name="layers",
        )  # fmt: skip
        return layers(x, mask, positions, **kwargs)

    def pool(self, y, cls_positions):
        return Pooler(self.config, self.runtime, name="pooler")(y, cls_positions)


@dataclasses.dataclass(frozen=True)
class RotaryPostLNConfig(PostLNConfig):
    """A post-LayerNorm family with rotary positions and no position table (NomicBERT, GTE,
    Jina-v3): its `rope` field (declared by the family, a `rotary.RopeParameters` of its
    `default_theta`; an experiment config's dict of transformers' keys is read), config.json's
    `rope_parameters` (or the older `rope_scaling` and `rope_theta`) read and written, and the
    names the shared stack reads (`models.prenorm`: one key/value head a query head).

    Attributes (beyond `PostLNConfig`'s, checked by `_check_rotary_config`):
      classifier_dropout: dropout before the classifiers; None: hidden_dropout_prob.
      bos_token_id / eos_token_id: kept for transformers and the tokenizer (the model reads
        neither); None: unset.
    """

    default_theta: ClassVar[float] = 10000.0
    hf_names: ClassVar[Mapping[str, str]] = {"rope": "rope_parameters"}
    hf_derived: ClassVar[tuple[str, ...]] = ("head_dim", "rope_theta", "rope_scaling")

    classifier_dropout: float | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self):
        self._check_rotary_config()

    def _check_rotary_config(self, sizes: tuple[str, ...] = LAYER_SIZES) -> None:
        """What every rotary family's config checks: its `rope`, the layer `sizes` and the
        dropouts (`classifier_dropout` optional), heads of an even size, ids and labels, and
        `bos_token_id` / `eos_token_id` where set; ValueError naming the field."""
        self._check_rope()
        optional = ("classifier_dropout",)
        self._check_layers(sizes=sizes, probabilities=optional, optional=optional)
        self._check_rotary_heads()
        self._check_ids_and_labels()
        for name in ("bos_token_id", "eos_token_id"):
            if getattr(self, name) is not None:
                self._check_special_ids(name)

    def _check_rope(self) -> None:
        """`rope` made a RopeParameters where it is a dict; ValueError naming it otherwise, or
        where it rotates part of a head (transformers rotates whole heads)."""
        rope = self.rope
        if hasattr(rope, "to_dict"):  # an experiment config's `model.rope` (a ConfigDict)
            rope = rope.to_dict()
        if isinstance(rope, Mapping):  # its dict: transformers' keys, unset ones None
            rope = {k: v for k, v in rope.items() if v is not None}
            object.__setattr__(self, "rope", RopeParameters.from_hf(rope, self.default_theta))
        if not isinstance(self.rope, RopeParameters):
            self._fail("rope", self.rope, "must be a rotary.RopeParameters or its dict")
        if self.rope.partial_rotary_factor != 1.0:  # transformers rotates whole heads
            self._fail("rope", self.rope, "partial_rotary_factor must be 1 (whole heads rotate)")

    def _check_rotary_heads(self) -> None:
        """ValueError naming hidden_size where a head's size is odd (rotary pairs its dims)."""
        if self.head_dim % 2:
            self._fail("hidden_size", self.hidden_size, "must split into heads of an even size")

    norm_eps = property(lambda self: self.layer_norm_eps)
    num_key_value_heads = property(lambda self: self.num_attention_heads)

    @classmethod
    def _from_hf_fields(cls, d: Mapping[str, Any], kwargs: dict[str, Any]):
        """The config of config.json `d`: its `rope_parameters` (or the older `rope_scaling`
        and `rope_theta`) made a `RopeParameters`; a `head_dim` other than E / H raises."""
        theta = d.get("rope_theta") or cls.default_theta
        rope = kwargs.pop("rope", None) or d.get("rope_scaling")
        config = cls(**kwargs, rope=RopeParameters.from_hf(rope, theta))
        head_dim = d.get("head_dim")
        if head_dim is not None and head_dim != config.head_dim:
            raise ValueError(
                f"config.json has head_dim={head_dim}; bert_jax builds heads of hidden_size / "
                f"num_attention_heads = {config.head_dim}"
            )
        return config

    def _hf_derived(self) -> dict[str, Any]:
        """transformers' `rope_parameters` dict."""
        return {"rope_parameters": self.rope.to_hf()}
