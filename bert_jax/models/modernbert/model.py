"""ModernBERT in Flax linen (Warner et al. 2024, arXiv 2412.13663) and every Hugging Face head.

Pre-LayerNorm layers without biases (layer 0 has no attention norm: the embeddings' norm serves),
rotary positions with a global and a local theta, GeGLU feed-forward layers, and attention that
alternates between global layers and local ones of a sliding window
(`ModernBertConfig.global_attn_every_n_layers`, `local_attention`). Submodule names mirror Hugging
Face's `ModernBertModel` state dict (`layers_3/attn/Wqkv` is `layers.3.attn.Wqkv`), so conversion
is a rename and a transpose (`bert_jax.convert`).

Unpadding: rows may be padded on either side, or packed with several sequences a row
(`segment_ids`, with `position_ids` restarting per sequence or not: rotary scores depend only on
the distance between positions); each gives the outputs the sequences would have alone.

Dimensions: the letters of `bert_jax.models`' legend (F: GeGLU's Wi makes 2F).
"""

from __future__ import annotations

import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.activations import ACTIVATIONS, REMAT_POLICIES
from bert_jax.models import heads
from bert_jax.models.attention import AttentionMask, layer_attend
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.encoder import FinalNormEncoderModel
from bert_jax.models.family import Role
from bert_jax.models.layers import (
    Dropout,
    Embed,
    constrain,
    dense,
    gather_positions,
    layer_norm,
)
from bert_jax.models.mlp import FeedForward
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.rotary import rotary

Array = jax.Array

# The family's facts its registry row reads (`models.families.Family`): the heads' encoder
# submodule, where its layers sit in the encoder's tree (at its top) and their names (never
# stacked: the layers differ, see `ModernBertModel`), and the parameters a pretraining run may
# start specially (no position table: rotary positions).
ENCODER_NAME = "model"
LAYERS_PATH = ()
LAYER_NAME = "layers_{}"
SCANNED_LAYER = None
STARTING_PATHS = {"mlm_bias": ("decoder", "bias")}


# ---- Building blocks ----
def _norm(cfg: ModernBertConfig, rt: RuntimeConfig, name: str) -> nn.LayerNorm:
    """LayerNorm over E, statistics in float32, with a bias only under `norm_bias`."""
    return layer_norm(rt, cfg.norm_eps, name, use_bias=cfg.norm_bias)


def _out_stddev(cfg: ModernBertConfig) -> float:
    """ModernBERT's initializer for layers writing into the residual stream: range / sqrt(2n)."""
    return cfg.initializer_range / math.sqrt(2.0 * cfg.num_hidden_layers)


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout (no positions: RoPE). ids [B, L] -> [B, L, E]."""

    config: ModernBertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, input_ids, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        x = Embed(
            cfg.padded_vocab_size,
            cfg.hidden_size,
            ("vocab", "embed"),
            cfg.initializer_range,
            rt.dtype,
            rt.param_dtype,
            name="tok_embeddings",
        )(input_ids)
        x = _norm(cfg, rt, "norm")(x)
        x = Dropout(cfg.embedding_dropout)(x, deterministic=deterministic)
        return constrain(x, "act_batch", "act_len", "act_embed")


class ModernBertAttention(nn.Module):
    """`attn`: Wqkv, RoPE with the layer's theta, attention (local: a window), Wo, dropout.

    x [B, L, E] -> ([B, L, E], probabilities [B, H, L, L] float32 or None).
    """

    config: ModernBertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    is_global: bool = True

    @nn.compact
    def __call__(self, x, mask: AttentionMask, positions, *, deterministic, output_attentions):
        cfg, rt = self.config, self.runtime
        heads = (cfg.num_attention_heads, cfg.head_dim)
        # One matmul [E] x [E, 3, H, D]: Hugging Face's Wqkv [3 H D, E] viewed (3, H, D).
        qkv = dense(
            cfg, rt, (3, *heads), ("embed",), (None, "heads", "kv"), "Wqkv",
            use_bias=cfg.attention_bias,
        )(x)  # fmt: skip
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, L, H, D] each
        theta = cfg.global_rope_theta if self.is_global else cfg.local_rope_theta
        q, k = rotary(q, positions, theta), rotary(k, positions, theta)
        q, k, v = (constrain(t, "act_batch", "act_len", "act_heads", None) for t in (q, k, v))
        context, probs = layer_attend(
            self,
            q,
            k,
            v,
            mask if self.is_global else mask.local(cfg.window),
            deterministic=deterministic,
            output_attentions=output_attentions,
        )
        out = dense(
            cfg, rt, cfg.hidden_size, ("heads", "kv"), ("embed",), "Wo",
            use_bias=cfg.attention_bias, stddev=_out_stddev(cfg),
        )(context)  # fmt: skip
        return Dropout(cfg.attention_dropout)(out, deterministic=deterministic), probs


class ModernBertEncoderLayer(nn.Module):
    """One pre-LayerNorm layer: x + attn(attn_norm(x)), then + mlp(mlp_norm(.)).

    Run mode lives in attributes so that `nn.remat` sees only arrays.
    `__call__(x [B, L, E], mask, positions [B, L]) -> (x', probs or None)`.
    """

    config: ModernBertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    index: int = 0
    deterministic: bool = True
    output_attentions: bool = False

    @nn.compact
    def __call__(self, x, mask, positions):
        cfg, rt, det = self.config, self.runtime, self.deterministic
        h = x if self.index == 0 else _norm(cfg, rt, "attn_norm")(x)  # layer 0: embeddings' norm
        a, probs = ModernBertAttention(cfg, rt, cfg.is_global(self.index), name="attn")(
            h, mask, positions, deterministic=det, output_attentions=self.output_attentions
        )
        x = x + a
        # `mlp`: GeGLU, Wo(dropout(act(x Wi_in) * (x Wi_gate))); Wi [E, 2, F] is Hugging Face's
        # Wi [2F, E], its first half the input, its second the gate.
        mlp = FeedForward(
            cfg, rt, "fused_gated", cfg.hidden_activation, cfg.mlp_bias, cfg.mlp_dropout,
            out_stddev=_out_stddev(cfg), name="mlp",
        )  # fmt: skip
        x = x + mlp(_norm(cfg, rt, "mlp_norm")(x), deterministic=det)
        return constrain(x, "act_batch", "act_len", "act_embed"), probs


class ModernBertModel(FinalNormEncoderModel):
    """The ModernBERT encoder (`FinalNormEncoderModel`): embeddings, layers `layers_0 ...
    layers_{n-1}`, final norm.

    Call arguments and outputs: `FinalNormEncoderModel`'s, but:
      attention_mask: may have holes as well as padding.
      position_ids: also right for packed rows when omitted (RoPE sees only distances).
      pooler_output (returned): the classifier heads' input (`pool`: no parameters).
    """

    config: ModernBertConfig

    def embed(self, input_ids, *, deterministic):
        return ModernBertEmbeddings(self.config, self.runtime, name="embeddings")(
            input_ids, deterministic=deterministic
        )

    def stack(self, x, mask, positions, *, deterministic, output_hidden_states, output_attentions):
        cfg, rt = self.config, self.runtime
        if rt.scan_layers:
            raise ValueError(
                "RuntimeConfig.scan_layers=True: ModernBERT's layers differ (layer 0 has no "
                "attention norm; global and local layers alternate), so they are not scanned"
            )
        layer_cls = ModernBertEncoderLayer
        if rt.remat_policy != "none":
            layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[rt.remat_policy])
        states, probs = [], []
        for i in range(cfg.num_hidden_layers):
            layer = layer_cls(
                cfg,
                rt,
                i,
                deterministic,
                output_attentions=output_attentions,
                name=LAYER_NAME.format(i),
            )
            x, p = layer(x, mask, positions)
            states.append(x)
            probs.append(p)
        return x, tuple(states), tuple(probs) if output_attentions else None

    def final_norm(self, y):
        return _norm(self.config, self.runtime, "final_norm")(y)

    def pool(self, y, mask, cls_positions):
        return pool(self.config, y, mask, cls_positions)


def pool(
    cfg: ModernBertConfig, sequence: Array, mask: AttentionMask, cls_positions: Array | None
) -> Array:
    """The classifier heads' input, by `classifier_pooling`.

    Args:
      sequence: [B, L, E], the final-norm states.
      mask: the rows' real tokens and packed-sequence ids.
      cls_positions: [B, S] int position of each packed sequence's first token, or None for one
        sequence a row.

    Returns:
      [B, E] ([B, S, E] packed): "cls" the first real token's state (the rule of Hugging Face's
      multiple-choice head; its sequence classifier reads position 0, a pad in a left-padded
      row), "mean" the mean over the sequence's real tokens.
    """
    if cfg.classifier_pooling == "cls":
        if cls_positions is None:
            return gather_positions(sequence, jnp.argmax(mask.tokens, axis=-1)[:, None])[:, 0]
        return gather_positions(sequence, cls_positions)
    weights = mask.tokens[:, None, :]  # [B, 1, L]
    if cls_positions is not None:  # packed sequence s has segment id s + 1
        segments = jnp.arange(1, cls_positions.shape[1] + 1)[None, :, None]
        weights = weights & (mask.segment_ids[:, None, :] == segments)  # [B, S, L]
    weights = weights.astype(jnp.float32)
    total = jnp.einsum("bsl,ble->bse", weights, sequence.astype(jnp.float32))
    mean = total / jnp.maximum(weights.sum(-1, keepdims=True), 1.0)
    return (mean[:, 0] if cls_positions is None else mean).astype(sequence.dtype)


# ---- Heads ----
class ModernBertPredictionHead(nn.Module):
    """`head`: norm(act(dense(h))), [..., E] -> [..., E]."""

    config: ModernBertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h):
        cfg, rt = self.config, self.runtime
        h = dense(
            cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense",
            use_bias=cfg.classifier_bias, stddev=_out_stddev(cfg),
        )(h)  # fmt: skip
        return _norm(cfg, rt, "norm")(ACTIVATIONS[cfg.classifier_activation](h))


class ModernBertHead(heads.Head):
    """A task head on top of `model` (a ModernBertModel), with every head's call
    (`models.heads.Head`): input_ids, attention_mask, position_ids, segment_ids [B, L]
    ([B, C, L] for multiple choice), cls_positions [B, S] (pooled heads), masked_positions [B, P]
    (the MLM head), deterministic, output_hidden_states, output_attentions, all by keyword.
    token_type_ids must stay None: ModernBERT has no token types. Every classifier, spans'
    included, is `head` (ModernBertPredictionHead), dropout, then `classifier`."""

    config: ModernBertConfig
    pooled: ClassVar[bool] = False  # reads `classifier_pooling`'s pooled state
    token_types: ClassVar[bool] = False
    encoder = ModernBertModel
    encoder_name = ENCODER_NAME

    def classify(self, h, features: int, deterministic: bool):
        """head -> dropout -> `classifier` (with a bias): float32 logits [..., features]."""
        cfg, rt = self.config, self.runtime
        h = ModernBertPredictionHead(cfg, rt, name="head")(h)
        h = Dropout(cfg.classifier_dropout)(h, deterministic=deterministic)
        return self.linear(h, features, "classifier", stddev=cfg.hidden_size**-0.5)

    def classify_tokens(self, h, features: int, deterministic: bool):
        return self.classify(h, features, deterministic)

    def span_logits(self, h, deterministic: bool):
        return self.classify(h, 2, deterministic)


class ModernBertForMaskedLM(ModernBertHead):
    """`head`, then logits against the tied token embeddings plus `decoder/bias`: [B, L, V]
    float32, or [B, P, V] at `masked_positions` (P/L of the cost; equal to gathering)."""

    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        cfg, rt = self.config, self.runtime
        h = heads.masked_states(out, masked_positions)  # [B, L|P, E]
        t = ModernBertPredictionHead(cfg, rt, name="head")(h)
        table = self.word_embeddings("tok_embeddings")
        return self.tied_mlm(out, t, table, "decoder" if cfg.decoder_bias else None)


# The class of each role (`models.family.Role`), the encoder first.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: ModernBertModel,
    Role.MASKED_LM: ModernBertForMaskedLM,
    **heads.task_classes(ModernBertHead, heads.POOLED_TASKS),
}
