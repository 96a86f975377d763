"""EuroBERT in Flax linen (Boizard et al. 2025, arXiv 2503.05500) and every Hugging Face head.

Llama's pre-norm layers attending both ways (`models.prenorm`: RMSNorm, grouped-query attention
with rotary positions, SwiGLU), a final RMSNorm, no token types. Submodule names mirror
transformers' `EuroBertModel` state dict (`layers_3/self_attn/q_proj` is
`layers.3.self_attn.q_proj`), so conversion is a rename and a transpose (`bert_jax.convert`).

Rows may be padded on either side, or packed with several sequences a row (`segment_ids`):
rotary scores depend only on the distance between two positions, so positions restarting per
sequence or counting over the whole row give the same outputs.

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.activations import ACTIVATIONS
from bert_jax.models import heads
from bert_jax.models.encoder import FinalNormEncoderModel
from bert_jax.models.eurobert.config import EuroBertConfig
from bert_jax.models.family import Role
from bert_jax.models.layers import (
    Embed,
    dense,
    run_layers,
)
from bert_jax.models.norms import RMSNorm
from bert_jax.models.outputs import EncoderOutput, MaskedLMOutput
from bert_jax.models.prenorm import PreNormLayer, rotary_angles

Array = jax.Array

# The family's facts its registry row reads (`models.families.Family`): the heads' encoder
# submodule, its layers at the top of the encoder's tree (`layers_<i>`, as transformers'
# `layers.<i>`; `layers` when scanned) and no parameter a pretraining run starts specially.
ENCODER_NAME = "model"
LAYERS_PATH = ()
LAYER_NAME = "layers_{}"
SCANNED_LAYER = "layers"
STARTING_PATHS: dict[str, tuple[str, ...]] = {}


class EuroBertModel(FinalNormEncoderModel):
    """The EuroBERT encoder (`FinalNormEncoderModel`): `embed_tokens`, layers `layers_0 ...
    layers_{n-1}` (`models.prenorm`'s, RMSNorm and SwiGLU), `norm`.

    Call arguments and outputs: `FinalNormEncoderModel`'s; pooler_output the first token's state.
    """

    config: EuroBertConfig

    def embed(self, input_ids, *, deterministic):
        cfg, rt = self.config, self.runtime
        return Embed(
            cfg.padded_vocab_size, cfg.hidden_size, ("vocab", "embed"), cfg.initializer_range,
            rt.dtype, rt.param_dtype, name="embed_tokens",
        )(input_ids)  # fmt: skip

    def stack(self, x, mask, positions, **modes):
        cfg = self.config
        angles = rotary_angles(cfg, positions)  # once for every layer
        kwargs = dict(norm="rms_norm", mlp="gated", **modes)
        return run_layers(
            PreNormLayer, cfg, self.runtime, kwargs, x, mask, angles,
            layer_name=LAYER_NAME, scanned_layer=SCANNED_LAYER,
        )  # fmt: skip

    def final_norm(self, y):
        rt = self.runtime
        return RMSNorm(self.config.rms_norm_eps, rt.dtype, rt.param_dtype, name="norm")(y)


def pooling_weights(kind: str, attention_mask: Array, segment_ids, cls_positions) -> Array:
    """Each sequence's weights over the row's tokens, float32 [B, S, L] (S = 1 for one sequence a
    row): "bos" one at the first token (position 0, as transformers reads it, or the packed
    sequence's cls_position), "mean" and "late" one at each real token of the sequence."""
    length = attention_mask.shape[-1]
    if kind == "bos":
        starts = jnp.zeros((attention_mask.shape[0], 1), jnp.int32)
        starts = starts if cls_positions is None else cls_positions
        return jax.nn.one_hot(starts, length, dtype=jnp.float32)
    weights = attention_mask.astype(bool)[:, None, :]  # [B, 1, L]
    if cls_positions is not None:  # packed sequence s has segment id s + 1
        sequences = jnp.arange(1, cls_positions.shape[1] + 1)[None, :, None]
        weights = weights & (segment_ids[:, None, :] == sequences)  # [B, S, L]
    return weights.astype(jnp.float32)


def weighted_mean(weights: Array, x: Array) -> Array:
    """weights [B, S, L], x [B, L, C] -> float32 [B, S, C], the weighted mean over L."""
    total = jnp.einsum("bsl,blc->bsc", weights, x.astype(jnp.float32))
    return total / jnp.maximum(weights.sum(-1, keepdims=True), 1e-9)


# ---- Heads ----
class Pooled(NamedTuple):
    """What a pooled head's `classify` reads (the encoder's `pooler_output` there): the final
    states [B, L, E], each sequence's pooling weights [B, S, L] (`pooling_weights`), and whether
    the rows are packed (logits [B, S, N]) or not ([B, N])."""

    states: Array
    weights: Array
    packed: bool


class EuroBertHead(heads.Head):
    """A task head on top of `model` (a EuroBertModel), with every head's call
    (`models.heads.Head`). token_type_ids must stay None: EuroBERT has none. No dropout before
    the classifiers (transformers' EuroBERT has none). A pooled head pools itself, by
    `classifier_pooling`: the encoder hands it every state and the weights (`Pooled`)."""

    config: EuroBertConfig
    token_types: ClassVar[bool] = False
    pooler: ClassVar[bool] = False  # the encoder pools nothing: `classify` does
    encoder = EuroBertModel
    encoder_name = ENCODER_NAME

    def encode(self, input_ids, inputs, **kwargs) -> EncoderOutput:
        out = super().encode(input_ids, inputs, **kwargs)
        if not self.pooled:
            return out
        mask = inputs["attention_mask"]
        mask = jnp.ones_like(input_ids) if mask is None else mask
        starts = kwargs["cls_positions"]
        weights = pooling_weights(
            self.config.classifier_pooling, mask, inputs["segment_ids"], starts
        )
        pooled = Pooled(out.last_hidden_state, weights, starts is not None)
        return dataclasses.replace(out, pooler_output=pooled)

    def classify(self, pooled: Pooled, features: int, deterministic: bool):
        """`dense`, GELU, `classifier` on the states pooled by `classifier_pooling` ("bos",
        "mean"), or on every token's state with the logits then averaged over the sequence's
        real tokens ("late"): float32 logits [B, features] ([B, S, features] packed)."""
        cfg, rt = self.config, self.runtime

        def layers(h):
            h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(h)
            return self.linear(ACTIVATIONS["gelu"](h), features, "classifier")

        if cfg.classifier_pooling == "late":
            logits = weighted_mean(pooled.weights, layers(pooled.states))  # [B, S, N]
        else:
            h = weighted_mean(pooled.weights, pooled.states).astype(rt.dtype)  # [B, S, E]
            logits = layers(h)
        return logits if pooled.packed else logits[:, 0]

    def classify_tokens(self, h, features: int, deterministic: bool):
        """`classifier` on every token's state: float32 logits [B, L, features]."""
        return self.linear(h, features, "classifier")


class EuroBertForMaskedLM(EuroBertHead):
    """`lm_head` on the final states: logits [B, L, V] float32, or [B, P, V] at masked_positions.
    Its weight is the token embeddings under `tie_word_embeddings`, else its own kernel; a bias
    under `mlp_bias` (as transformers builds the head)."""

    pooled = False
    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        cfg, rt = self.config, self.runtime
        h = heads.masked_states(out, masked_positions)  # [B, L|P, E]
        if not cfg.tie_word_embeddings:
            logits = dense(
                cfg, rt, cfg.vocab_size, ("embed",), ("vocab",), "lm_head",
                out_dtype=jnp.float32, use_bias=cfg.mlp_bias,
            )(h)  # fmt: skip
            return MaskedLMOutput(logits, out.hidden_states, out.attentions)
        table = self.variables["params"][ENCODER_NAME]["embed_tokens"]["embedding"]
        return self.tied_mlm(out, h, table, "lm_head" if cfg.mlp_bias else None)


# The class of each role (`models.family.Role`), the encoder first.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: EuroBertModel,
    Role.MASKED_LM: EuroBertForMaskedLM,
    **heads.task_classes(
        EuroBertHead, heads.POOLED_TASKS, without=(Role.MULTIPLE_CHOICE, Role.QUESTION_ANSWERING)
    ),
}
