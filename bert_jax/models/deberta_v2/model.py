"""DeBERTa-v2 and -v3 in Flax linen: the encoder, every Hugging Face task head and the v3
replaced-token-detection discriminator.

BERT's post-LayerNorm layers with disentangled self-attention: besides the content scores q.k,
each query reads the keys' relative positions (content-to-position, `c2p`) and each key the
query's (position-to-content, `p2c`), both from one table of relative-position embeddings
(`encoder/rel_embeddings`, normalized once per forward under `norm_rel_ebd`) projected by each
layer's own query and key projections (`share_att_key`). Distances beyond `position_buckets // 2`
share log-spaced buckets (`models.relative_position`); the scores are scaled by
1 / sqrt(D (1 + number of position terms)). The position terms reach the shared kernels as a
score bias (`models.attention.attend(..., bias=)`: xla and fused_xla; cudnn and splash are
refused up front). Masking is transformers': a padding query's whole row is masked too and the
embeddings are zeroed at padding, so every position, padding included, equals transformers'.

Relative positions are the distances between row indices, as in transformers (position_ids feed
only the absolute table of `position_biased_input`), so packed rows (`segment_ids`) equal the
sequences alone. Submodule names mirror Hugging Face's state dict
(`deberta/encoder/layer_3/attention/self/query_proj` is
`deberta.encoder.layer.3.attention.self.query_proj`); the discriminator's head is DeBERTa's
(microsoft/DeBERTa `LMMaskPredictionHead`, `mask_predictions.*` in the released v3 checkpoints).

Dimensions: the letters of `bert_jax.models`' legend (R: the relative positions,
2 x attention_span, the table's rows).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.activations import ACTIVATIONS
from bert_jax.models import heads
from bert_jax.models.attention import AttentionMask, layer_attend
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.deberta_v2.config import DebertaV2Config
from bert_jax.models.encoder import EncoderModel
from bert_jax.models.family import Role
from bert_jax.models.layers import (
    DenseWeights,
    Dropout,
    Embed,
    PostLNEncoder,
    PostLNLayer,
    ResidualOutput,
    constrain,
    dense,
    embedding,
    gather_positions,
    layer_norm,
)
from bert_jax.models.outputs import (
    ClassifierOutput,
    EncoderOutput,
    MaskedLMOutput,
)
from bert_jax.models.relative_position import relative_positions

Array = jax.Array

# The family's facts its registry row reads (`models.families.Family`): the heads' encoder
# submodule, where its layers sit and their names (one stacked `layer` under `scan_layers`), and
# the parameters a pretraining run may start specially: the MLM bias of transformers' default
# (`legacy`) head; no position table (DeBERTa-v3 has none).
ENCODER_NAME = "deberta"
LAYERS_PATH = ("encoder",)
LAYER_NAME = "layer_{}"
SCANNED_LAYER = "layer"
STARTING_PATHS = {"mlm_bias": ("cls", "predictions", "bias")}


def _layer_norm(cfg: DebertaV2Config, rt: RuntimeConfig, name: str = "LayerNorm") -> nn.LayerNorm:
    return layer_norm(rt, cfg.layer_norm_eps, name)


# ---- Embeddings and layers ----
class DebertaV2Embeddings(nn.Module):
    """Word (+ absolute position, + token-type) embeddings, `embed_proj` to E when the tables are
    narrower, LayerNorm, zeroed at padding, dropout. Returns [B, L, E]."""

    config: DebertaV2Config
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, input_ids, token_type_ids, position_ids, attention_mask, *, deterministic):
        cfg, rt = self.config, self.runtime

        def embed(rows, name, **word):
            return embedding(cfg, rt, rows, cfg.embedding_width, name, **word)

        x = embed(cfg.padded_vocab_size, "word_embeddings", word=True)(input_ids)
        if cfg.position_biased_input:
            x += embed(cfg.max_position_embeddings, "position_embeddings")(position_ids)
        if cfg.type_vocab_size > 0:
            x += embed(cfg.type_vocab_size, "token_type_embeddings")(token_type_ids)
        if cfg.embedding_width != cfg.hidden_size:
            x = dense(cfg, rt, cfg.hidden_size, (None,), ("embed",), "embed_proj", use_bias=False)(
                x
            )
        x = _layer_norm(cfg, rt)(x)
        x = x * attention_mask[..., None].astype(x.dtype)  # transformers zeroes padding
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        return constrain(x, "act_batch", "act_len", "act_embed")


class DisentangledSelfAttention(nn.Module):
    """`attention/self`: query_proj, key_proj, value_proj and disentangled attention.

    `__call__(x [B, L, E], mask, rel_embeddings [R, E] or None, relative_pos [L, L] int or
    None)` -> (context [B, L, H, D], probs [B, H, L, L] float32 or None).
    """

    config: DebertaV2Config
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(
        self, x, mask: AttentionMask, rel_embeddings, relative_pos, *, deterministic,
        output_attentions,
    ):  # fmt: skip
        cfg, rt = self.config, self.runtime
        heads = (cfg.num_attention_heads, cfg.head_dim)

        def weights(name):
            return DenseWeights(
                heads, ("embed",), ("heads", "kv"), cfg.initializer_range, rt.param_dtype, name=name
            )((cfg.hidden_size,))

        # One matmul [E] x [E, 3, H, D] for the three projections, their weights apart.
        qkv_weights = [weights(name) for name in ("query_proj", "key_proj", "value_proj")]
        kernel = jnp.stack([w.astype(rt.dtype) for w, _ in qkv_weights], axis=1)  # [E, 3, H, D]
        bias = jnp.stack([b.astype(rt.dtype) for _, b in qkv_weights], axis=0)  # [3, H, D]
        qkv = jax.lax.dot_general(x.astype(rt.dtype), kernel, (((2,), (0,)), ((), ()))) + bias
        q, k, v = (
            constrain(qkv[:, :, i], "act_batch", "act_len", "act_heads", None) for i in range(3)
        )  # [B, L, H, D] each
        # transformers divides by sqrt(D x scale_factor) computed in float32.
        scale = np.sqrt(np.float32(cfg.head_dim) * np.float32(cfg.score_scale_factor))
        score_bias = None
        if cfg.attention_score_bias:
            rel = Dropout(cfg.hidden_dropout_prob)(rel_embeddings, deterministic=deterministic)
            rel = rel.astype(rt.dtype)  # [R, E]
            types = cfg.pos_att_type
            if cfg.share_att_key:  # the layer's own query and key projections
                query_w, key_w = qkv_weights[0], qkv_weights[1]
            else:
                query_w = weights("pos_query_proj") if "p2c" in types else None
                key_w = weights("pos_key_proj") if "c2p" in types else None

            def project(weights_and_bias):  # the table through a projection: [R, H, D]
                w, b = weights_and_bias
                return jnp.einsum("re,ehd->rhd", rel, w.astype(rt.dtype)) + b.astype(rt.dtype)

            pos_query = project(query_w) if "p2c" in types else None
            pos_key = project(key_w) if "c2p" in types else None
            score_bias = self._position_scores(q, k, relative_pos, pos_query, pos_key, scale)
        return layer_attend(
            self,
            q,
            k,
            v,
            mask,
            deterministic=deterministic,
            output_attentions=output_attentions,
            bias=score_bias,
            scale=float(1.0 / scale),
        )

    def _position_scores(self, q, k, relative_pos, pos_query, pos_key, scale):
        """The c2p and p2c terms, float32 [B, H, L, L], each divided by `scale`: q and k
        [B, L, H, D] against the table's projections pos_key and pos_query [R, H, D]."""
        cfg = self.config
        span = cfg.attention_span
        length = q.shape[1]
        rows = jnp.arange(length)[:, None]
        score = 0.0
        if "c2p" in cfg.pos_att_type:
            # query i against the key projection of its distance to key j
            c2p = jnp.einsum(
                "bqhd,rhd->bhqr", q, pos_key, preferred_element_type=jnp.float32
            )  # [B, H, L, R]
            index = jnp.clip(relative_pos + span, 0, 2 * span - 1)  # [L, L]
            score = score + c2p[:, :, rows, index] / scale
        if "p2c" in cfg.pos_att_type:
            # key j against the query projection of its distance from query i: transformers
            # gathers row j of [keys, R] at -bucket(j - i), then transposes to [queries, keys]
            p2c = jnp.einsum(
                "bkhd,rhd->bhkr", k, pos_query, preferred_element_type=jnp.float32
            )  # [B, H, L(keys), R]
            index = jnp.clip(-relative_pos + span, 0, 2 * span - 1)  # [L(keys), L(queries)]
            score = score + jnp.swapaxes(p2c[:, :, rows, index], -1, -2) / scale
        return score


class DebertaV2Attention(nn.Module):
    """Self-attention sub-layer (`attention/self` + `attention/output`): [B, L, E], probs."""

    config: DebertaV2Config
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask, rel_embeddings, relative_pos, *, deterministic, output_attentions):
        cfg, rt = self.config, self.runtime
        context, probs = DisentangledSelfAttention(cfg, rt, name="self")(
            x,
            mask,
            rel_embeddings,
            relative_pos,
            deterministic=deterministic,
            output_attentions=output_attentions,
        )
        out = ResidualOutput(cfg, rt, from_heads=True, name="output")(
            context, x, deterministic=deterministic
        )
        return out, probs


class DebertaV2Layer(PostLNLayer):
    """One post-LayerNorm layer (BERT's, `PostLNLayer`) whose attention is disentangled:
    `__call__(x [B, L, E], mask, rel_embeddings, relative_pos)`."""

    attention_cls: ClassVar[type[nn.Module]] = DebertaV2Attention


class DebertaV2Encoder(PostLNEncoder):
    """`PostLNEncoder` with the relative-position table (`rel_embeddings` [R, E], and its
    `LayerNorm` under norm_rel_ebd) that every layer reads: `layer_0 ... layer_{n-1}`, or one
    scanned `layer`."""

    layer_cls = DebertaV2Layer
    config: DebertaV2Config

    def layer_inputs(self, x):
        """(rel_embeddings [R, E], relative_pos [L, L] int), None and None without
        `relative_attention`."""
        cfg, rt = self.config, self.runtime
        if not cfg.relative_attention:
            return None, None
        rows = cfg.rel_embedding_rows
        rel_embeddings = Embed(
            rows, cfg.hidden_size, (None, "embed"), cfg.initializer_range, rt.dtype,
            rt.param_dtype, name="rel_embeddings",
        )(jnp.arange(rows))  # the whole table [R, E]  # fmt: skip
        if cfg.norm_rel_ebd == "layer_norm":
            rel_embeddings = _layer_norm(cfg, rt)(rel_embeddings)
        relative_pos = relative_positions(x.shape[1], cfg.position_buckets, cfg.relative_distance)
        return rel_embeddings, jnp.asarray(relative_pos)


class DebertaV2Model(EncoderModel):
    """The DeBERTa-v2 encoder: embeddings and layers (no pooler: the classifiers' ContextPooler
    is theirs, `pooler`).

    Call arguments and outputs: the encoders' call (`bert_jax.models`), but:
      token_type_ids: read only when type_vocab_size > 0.
      position_ids: for the absolute table (`position_biased_input`); relative positions are
        row distances.
      pooler_output (returned): the first token's state (no parameters).
    """

    config: DebertaV2Config
    add_pooling_layer: bool = False
    token_types: ClassVar[bool] = True  # read where the config has a token-type table
    mask_queries: ClassVar[bool] = True  # a padding query's row is masked too (transformers')

    def embed(self, input_ids, token_type_ids, attention_mask, position_ids, *, deterministic):
        cfg, rt = self.config, self.runtime
        if cfg.position_biased_input and input_ids.shape[1] > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds the {cfg.max_position_embeddings} "
                f"positions of {cfg.display_name}'s absolute table (position_biased_input)"
            )
        return DebertaV2Embeddings(cfg, rt, name="embeddings")(
            input_ids, token_type_ids, position_ids, attention_mask, deterministic=deterministic
        )

    def stack(self, x, mask, **kwargs):
        return DebertaV2Encoder(self.config, self.runtime, name="encoder")(x, mask, **kwargs)


# ---- Heads ----
class _MLMHeads(nn.Module):
    """`cls` (legacy) or `lm_predictions`: holds the MLM head (`models.heads.MaskedLMHead`:
    dense E -> the tables' width, `hidden_act`, LayerNorm, then the decoder tied to the word
    embeddings plus `bias`), `predictions` or `lm_head`. h [..., E], embedding [V', E'] ->
    float32 [..., V].

    `legacy` (transformers' default, `cls/predictions`): the dense and LayerNorm sit under
    `transform`; else (`lm_predictions/lm_head`, DeBERTa's own) directly in the head.
    """

    config: DebertaV2Config
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, embedding):
        cfg, legacy = self.config, self.config.legacy
        return heads.MaskedLMHead(
            cfg, self.runtime, cfg.embedding_width, cfg.hidden_act,
            transform_name="transform" if legacy else None,
            name="predictions" if legacy else "lm_head",
        )(h, embedding)  # fmt: skip


class ContextPooler(nn.Module):
    """`pooler`: pooler_hidden_act(dense(dropout(first))), the first tokens' states [..., E] ->
    [..., E] (transformers' ContextPooler)."""

    config: DebertaV2Config
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, first, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        h = Dropout(cfg.pooler_dropout)(first, deterministic=deterministic)
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(h)
        return ACTIVATIONS[cfg.pooler_hidden_act](h)


class DebertaV2Head(heads.Head):
    """A task head on top of `deberta` (a DebertaV2Model), with every head's call
    (`models.heads.Head`): input_ids, token_type_ids, attention_mask, position_ids, segment_ids
    [B, L] ([B, C, L] for multiple choice), cls_positions [B, S] (the heads reading the first
    token), masked_positions [B, P] (the MLM head). Its own layers: the sequence classifier and
    the multiple-choice score (`pooler`, a ContextPooler, then dropout `cls_dropout` and
    `classifier`); the token classifier's dropout is `hidden_dropout_prob`."""

    config: DebertaV2Config
    pooled: ClassVar[bool] = False  # reads the first token's state (and takes cls_positions)
    token_types: ClassVar[bool] = True  # read where the config has a token-type table
    encoder = DebertaV2Model
    encoder_name = ENCODER_NAME

    def dropout_rate(self) -> float:
        return self.config.hidden_dropout_prob

    def classify(self, pooled, features: int, deterministic: bool):
        """`pooler` (ContextPooler), dropout (`cls_dropout`), `classifier`: float32 [..., N]."""
        cfg = self.config
        pooled = ContextPooler(cfg, self.runtime, name="pooler")(
            pooled, deterministic=deterministic
        )
        rate = cfg.hidden_dropout_prob if cfg.cls_dropout is None else cfg.cls_dropout
        pooled = Dropout(rate)(pooled, deterministic=deterministic)
        return self.linear(pooled, features, "classifier")


class DebertaV2ForMaskedLM(DebertaV2Head):
    """The MLM head on every token: logits [B, L, V] float32, or [B, P, V] at
    `masked_positions` (P/L of the cost; equal to gathering the full logits). `cls.predictions`
    (legacy, transformers' default) or `lm_predictions.lm_head`, by the config's `legacy`."""

    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        name = "cls" if self.config.legacy else "lm_predictions"
        logits = _MLMHeads(self.config, self.runtime, name=name)(
            heads.masked_states(out, masked_positions), self.word_embeddings()
        )
        return MaskedLMOutput(logits, out.hidden_states, out.attentions)


class DebertaV2ForReplacedTokenDetection(DebertaV2Head):
    """DeBERTa-v3's discriminator (microsoft/DeBERTa's `ReplacedTokenDetectionModel`; transformers
    has no such class): `mask_predictions` adds the first token's state to every token's,
    LayerNorm, dense, `hidden_act`, `classifier` -> one logit a token, "this token was replaced":
    logits [B, L] float32. In packed rows (`segment_ids`, `cls_positions`) each token adds its own
    sequence's first token."""

    pooled = True

    def encode(self, input_ids, inputs, **kwargs) -> EncoderOutput:
        """The encoder's outputs, `pooler_output` the first state of each token's sequence
        [B, L|1, E]."""
        out = super().encode(input_ids, inputs, **kwargs)
        first = out.pooler_output  # [B, E], or [B, S, E] at cls_positions
        if first.ndim == 2:
            return out.replace(pooler_output=first[:, None])
        segments = inputs.get("segment_ids")
        if segments is None:
            raise ValueError(f"{type(self).__name__}: cls_positions need segment_ids")
        index = jnp.clip(segments - 1, 0, first.shape[1] - 1)  # [B, L]: 1..S -> 0..S-1
        return out.replace(pooler_output=gather_positions(first, index))

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        cfg, rt = self.config, self.runtime
        logits = _MaskPredictionHead(cfg, rt, name="mask_predictions")(
            out.last_hidden_state, out.pooler_output
        )
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class _MaskPredictionHead(nn.Module):
    """`mask_predictions` (DeBERTa's LMMaskPredictionHead): h [B, L, E], first [B, L|1, E] ->
    classifier(hidden_act(dense(LayerNorm(first + h)))) float32 [B, L]."""

    config: DebertaV2Config
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, first):
        cfg, rt = self.config, self.runtime
        h = _layer_norm(cfg, rt)(first + h)
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(h)
        h = ACTIVATIONS[cfg.hidden_act](h)
        logits = dense(cfg, rt, 1, ("embed",), (None,), "classifier", out_dtype=jnp.float32)(h)
        return logits[..., 0]


# The class of each role (`models.family.Role`), the encoder first.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: DebertaV2Model,
    Role.MASKED_LM: DebertaV2ForMaskedLM,
    **heads.task_classes(DebertaV2Head, heads.POOLED_TASKS),
    Role.REPLACED_TOKEN_DETECTION: DebertaV2ForReplacedTokenDetection,
}
