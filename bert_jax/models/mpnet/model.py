"""MPNet in Flax linen: the encoder and every Hugging Face task head.

BERT's post-LayerNorm layers (the shared `Intermediate` and `ResidualOutput`) with MPNet's
differences, which are what this file holds: embeddings of words and positions only (no token
types; positions counted from padding_idx + 1 over each row's real tokens, as RoBERTa's), and
self-attention (`attention/attn`: `q`, `k`, `v`, `o`, then `attention/LayerNorm`) whose scores
take a learned relative-position bias, computed once per forward from T5's bidirectional buckets
(`models.relative_position.t5_relative_position_buckets`) and the encoder's table
`encoder/relative_attention_bias` [buckets, H], and shared by every layer. The bias reaches the
shared kernels as a score bias (`models.attention.attend(..., bias=)`: xla and fused_xla).
Distances are between row indices, as in transformers, so packed rows (`segment_ids`) equal the
sequences alone. The heads are RoBERTa's: `lm_head` (dense, GELU, `layer_norm`, the decoder tied
to the word embeddings plus `bias`), a classifier on <s> (dense, tanh, `out_proj`), the pooler
only for multiple choice. Submodule names mirror Hugging Face's state dict
(`mpnet/encoder/layer_3/attention/attn/q` is `mpnet.encoder.layer.3.attention.attn.q`).

Dimensions: the letters of `bert_jax.models`' legend (R: the relative-position buckets,
relative_attention_num_buckets).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import heads
from bert_jax.models.attention import AttentionMask, layer_attend
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.encoder import (
    POST_LN_LAYERS,
    EncoderModel,
    LearnedEmbeddings,
    padded_positions,
    starting_paths,
)
from bert_jax.models.family import Role
from bert_jax.models.layers import (
    Dropout,
    Embed,
    Pooler,
    PostLNEncoder,
    PostLNLayer,
    dense,
    layer_norm,
    qkv_heads,
)
from bert_jax.models.mpnet.config import MAX_DISTANCE, NUM_BUCKETS, PADDING_IDX, MPNetConfig
from bert_jax.models.relative_position import t5_relative_position_buckets

Array = jax.Array

# The family's facts its registry row reads (`models.families.Family`): the heads' encoder
# submodule, where its layers sit and their names (one stacked `layer` under `scan_layers`), and
# the parameters a pretraining run may start specially.
ENCODER_NAME = "mpnet"
LAYERS_PATH, LAYER_NAME, SCANNED_LAYER = POST_LN_LAYERS  # `encoder/layer_0 ...`
STARTING_PATHS = starting_paths(ENCODER_NAME, mlm_bias=("lm_head", "bias"))


# ---- Layers ----
class MPNetSelfAttention(nn.Module):
    """`attention/attn`: q, k, v, attention with the position bias, and `o`.

    `__call__(x [B, L, E], mask, position_bias float32 [1, H, L, L])` -> (o(context) [B, L, E],
    probs [B, H, L, L] float32 or None).
    """

    config: MPNetConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask: AttentionMask, position_bias, *, deterministic, output_attentions):
        cfg, rt = self.config, self.runtime
        q, k, v = qkv_heads(cfg, rt, x, ("q", "k", "v"))  # [B, L, H, D] each
        context, probs = layer_attend(
            self,
            q,
            k,
            v,
            mask,
            deterministic=deterministic,
            output_attentions=output_attentions,
            bias=position_bias,
        )
        out = dense(cfg, rt, cfg.hidden_size, ("heads", "kv"), ("embed",), "o")(context)
        return out, probs


class MPNetAttention(nn.Module):
    """The attention sub-layer: LayerNorm(x + dropout(attn(x))), [B, L, E], probs."""

    config: MPNetConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask, position_bias, *, deterministic, output_attentions):
        cfg, rt = self.config, self.runtime
        out, probs = MPNetSelfAttention(cfg, rt, name="attn")(
            x, mask, position_bias, deterministic=deterministic,
            output_attentions=output_attentions,
        )  # fmt: skip
        out = Dropout(cfg.hidden_dropout_prob)(out, deterministic=deterministic)
        return layer_norm(rt, cfg.layer_norm_eps)(out + x), probs


class MPNetLayer(PostLNLayer):
    """One post-LayerNorm layer (BERT's, `PostLNLayer`) whose attention reads the relative
    position bias: `__call__(x [B, L, E], mask, position_bias)`."""

    attention_cls: ClassVar[type[nn.Module]] = MPNetAttention


class MPNetEncoder(PostLNEncoder):
    """`PostLNEncoder` with the relative-position bias (`relative_attention_bias` [R, H], read
    once for every layer): `layer_0 ... layer_{n-1}`, or one scanned `layer`."""

    layer_cls = MPNetLayer
    config: MPNetConfig

    def layer_inputs(self, x):
        """(position_bias float32 [1, H, L, L],)."""
        cfg, rt = self.config, self.runtime
        buckets = t5_relative_position_buckets(x.shape[1], NUM_BUCKETS, MAX_DISTANCE)  # [L, L]
        table = Embed(
            cfg.relative_attention_num_buckets, cfg.num_attention_heads, (None, "heads"),
            cfg.initializer_range, "float32", rt.param_dtype, name="relative_attention_bias",
        )  # fmt: skip
        return (jnp.transpose(table(jnp.asarray(buckets)), (2, 0, 1))[None],)


class MPNetModel(EncoderModel):
    """The MPNet encoder: embeddings, layers and (optionally) the pooler.

    Call arguments and outputs: the encoders' call (`bert_jax.models`), but:
      token_type_ids: not read (MPNet has no token types).
      position_ids: the table row read is this + padding_idx + 1; None: counted over the
        non-pad ids of each row, as transformers does (positions, not table rows).
    """

    config: MPNetConfig
    token_types: ClassVar[bool] = False  # no token-type table
    positions_from_ids: ClassVar[bool] = True  # omitted position_ids: counted over the ids

    def embed(self, input_ids, token_type_ids, attention_mask, position_ids, *, deterministic):
        cfg, rt = self.config, self.runtime
        positions = padded_positions(input_ids, position_ids, PADDING_IDX)  # the table's rows
        embeddings = LearnedEmbeddings(cfg, rt, token_types=False, name="embeddings")
        return embeddings(input_ids, None, positions, deterministic=deterministic)

    def stack(self, x, mask: AttentionMask, **kwargs):
        return MPNetEncoder(self.config, self.runtime, name="encoder")(x, mask, **kwargs)

    def pool(self, y, cls_positions):
        return Pooler(self.config, self.runtime, name="pooler")(y, cls_positions)


# ---- Heads ----
class MPNetHead(heads.FirstTokenHooks, heads.Head):
    """A task head on top of `mpnet` (an MPNetModel), with every head's call
    (`models.heads.Head`; token_type_ids are not read). Its own layers: the sequence classifier
    (`classifier`: dense, tanh, `out_proj` on <s>, no pooler) and the multiple-choice score (the
    encoder's pooler, dropout `hidden_dropout_prob`, `classifier`)."""

    config: MPNetConfig
    token_types: ClassVar[bool] = False  # the pipelines pass none (no table)
    encoder = MPNetModel
    encoder_name = ENCODER_NAME


# The class of each role (`models.family.Role`), the encoder first.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: MPNetModel,
    **heads.task_classes(MPNetHead, heads.FIRST_TOKEN_TASKS),
}
