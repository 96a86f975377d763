"""ELECTRA in Flax linen: the encoder and every Hugging Face task head.

BERT's post-LayerNorm encoder (the shared `models.layers.PostLNEncoder`: exact erf GELU by
default, absolute learned positions counted from 0) under embeddings of their own width M
(`embedding_size`), projected to E by `embeddings_project` where M != E, and no pooler. This
file holds ELECTRA's differences: those embeddings and its heads, the replaced-token
discriminator (`ElectraForPreTraining`: a per-token logit), the generator (`ElectraForMaskedLM`:
dense E -> M, GELU, LayerNorm, then the decoder tied to the word embeddings with its own bias),
a classification head on [CLS] of its own (dense, GELU, `out_proj`) and the multiple-choice
head's sequence summary. Submodule names mirror Hugging Face's state dict
(`electra/encoder/layer_3/attention/self/query` is `electra.encoder.layer.3.attention.self.query`),
so conversion is a rename and a transpose.

Dimension legend:
  B batch            L sequence length     E hidden size (hidden_size)
  M embedding size (embedding_size)        H attention heads   D head size (E / H)
  F intermediate size                      V vocabulary
  P predictions per sequence (masked positions)
  S sequences packed in one row            C choices (multiple choice)   N labels
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.activations import ACTIVATIONS
from bert_jax.models import layers
from bert_jax.models.attention import AttentionMask
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.electra.config import ElectraConfig
from bert_jax.models.family import Role
from bert_jax.models.heads import Head, tied_logits
from bert_jax.models.layers import (
    Dropout,
    Embed,
    PostLNEncoder,
    constrain,
    dense,
    encoder_inputs,
    first_tokens,
    gather_positions,
    layer_norm,
    zeros_init,
)
from bert_jax.models.outputs import (
    ClassifierOutput,
    EncoderOutput,
    MaskedLMOutput,
    QuestionAnsweringOutput,
)

Array = jax.Array

# The family's facts its registry row reads (`models.families.Family`): the heads' encoder
# submodule (the discriminator's and the generator's checkpoints both call it `electra`), where
# its layers sit and their names (one stacked `layer` under `scan_layers`), and the parameters a
# pretraining run may start specially (the generator's output bias, the position table).
ENCODER_NAME = "electra"
LAYERS_PATH = ("encoder",)
LAYER_NAME = layers.LAYER_NAME  # `layer_0 ...`: the shared post-LayerNorm stack's names
SCANNED_LAYER = layers.SCANNED_LAYER
STARTING_PATHS = {
    "mlm_bias": ("generator_lm_head", "bias"),
    "position_embeddings": (ENCODER_NAME, "embeddings", "position_embeddings", "embedding"),
}
# The summary's activations beyond the layers' (transformers' get_activation names).
_SUMMARY_ACTIVATIONS = {**ACTIVATIONS, "tanh": jnp.tanh}


def _layer_norm(cfg: ElectraConfig, rt: RuntimeConfig, name: str = "LayerNorm") -> nn.LayerNorm:
    return layer_norm(rt, cfg.layer_norm_eps, name)


class ElectraEmbeddings(nn.Module):
    """Word + token-type + position embeddings, LayerNorm, dropout, all of width M.
    Returns [B, L, M]."""

    config: ElectraConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, input_ids, token_type_ids, position_ids, *, deterministic: bool):
        cfg, rt = self.config, self.runtime

        def embed(num, axes, name, one_hot=False):
            return Embed(
                num, cfg.embedding_size, axes, cfg.initializer_range, rt.dtype, rt.param_dtype,
                one_hot, name=name,
            )  # fmt: skip

        x = embed(cfg.padded_vocab_size, ("vocab", "embed"), "word_embeddings")(input_ids)
        x += embed(cfg.type_vocab_size, (None, "embed"), "token_type_embeddings", one_hot=True)(
            token_type_ids
        )
        x += embed(
            cfg.max_position_embeddings, (None, "embed"), "position_embeddings", one_hot=True
        )(position_ids)
        x = _layer_norm(cfg, rt)(x)
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        return constrain(x, "act_batch", "act_len", "act_embed")


class ElectraModel(nn.Module):
    """The ELECTRA encoder: embeddings (M wide), their projection to E where M != E, layers.

    Call arguments:
      input_ids: [B, L] int token ids.
      token_type_ids: [B, L] int segment A/B ids; zeros when omitted.
      attention_mask: [B, L] 1 for real tokens, 0 for padding (either side); ones when omitted.
      position_ids: [B, L] int positions; 0..L-1 when omitted (restart per packed sequence).
      segment_ids: [B, L] int ids of packed sequences (0 = padding); attention stays inside one.
      cls_positions: [B, S] int positions of each packed sequence's [CLS] (pooling only).
      deterministic: False turns dropout on (needs `rngs={"dropout": key}`).
      output_hidden_states / output_attentions: also return every layer's states / probabilities.

    Returns:
      `EncoderOutput`: last_hidden_state [B, L, E]; hidden_states L+1 arrays [B, L, E] (the
      first the layers' input: the embeddings after their projection, as transformers returns
      it); attentions [B, H, L, L] float32. pooler_output: with `add_pooling_layer`, the first
      token's state [B, E] ([B, S, E] at cls_positions; no parameters: ELECTRA has no pooler
      layer), else None.
    """

    config: ElectraConfig
    runtime: RuntimeConfig = RuntimeConfig()
    add_pooling_layer: bool = False

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        position_ids=None,
        segment_ids=None,
        cls_positions=None,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        cfg, rt = self.config, self.runtime
        token_type_ids, attention_mask, position_ids = encoder_inputs(
            rt,
            input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        if input_ids.shape[1] > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        x = ElectraEmbeddings(cfg, rt, name="embeddings")(
            input_ids, token_type_ids, position_ids, deterministic=deterministic
        )  # [B, L, M]
        if cfg.projects_embeddings:
            project = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "embeddings_project")
            x = constrain(project(x), "act_batch", "act_len", "act_embed")  # [B, L, E]
        mask = AttentionMask(attention_mask.astype(bool), segment_ids)
        y, states, probs = PostLNEncoder(cfg, rt, name="encoder")(
            x,
            mask,
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        return EncoderOutput(
            last_hidden_state=y,
            pooler_output=first_tokens(y, cls_positions) if self.add_pooling_layer else None,
            hidden_states=(x, *states) if output_hidden_states else None,
            attentions=probs,
        )


# ---- Heads ----
class ElectraDiscriminatorPredictions(nn.Module):
    """`discriminator_predictions`: dense E -> E, `hidden_act`, `dense_prediction` E -> 1:
    [..., E] -> float32 logits [...] (one per token: "replaced")."""

    config: ElectraConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h):
        cfg, rt = self.config, self.runtime
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(h)
        h = ACTIVATIONS[cfg.hidden_act](h)
        logits = dense(cfg, rt, 1, ("embed",), (None,), "dense_prediction", out_dtype=jnp.float32)
        return logits(h)[..., 0]


class ElectraGeneratorPredictions(nn.Module):
    """`generator_predictions`: LayerNorm(GELU(dense h)), E -> M (the exact GELU whatever
    `hidden_act`, as in transformers). [..., E] -> [..., M]."""

    config: ElectraConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h):
        cfg, rt = self.config, self.runtime
        h = dense(cfg, rt, cfg.embedding_size, ("embed",), (None,), "dense")(h)
        return _layer_norm(cfg, rt)(ACTIVATIONS["gelu"](h))


class ElectraTiedDecoder(nn.Module):
    """`generator_lm_head`: logits against the tied word embeddings plus its own `bias`.
    h [..., M], embedding [V', M] -> float32 logits [..., V]."""

    config: ElectraConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, embedding):
        cfg, rt = self.config, self.runtime
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.padded_vocab_size,), rt.param_dtype)
        logits = tied_logits(h, embedding, rt.dtype) + bias.astype(jnp.float32)  # [..., V']
        return logits[..., : cfg.vocab_size]  # the padding rows are no tokens


class ElectraClassificationHead(nn.Module):
    """`classifier`: dropout, dense, GELU (exact; BERT's pooler has tanh), dropout, `out_proj`
    on the [CLS] states [..., E] -> float32 logits [..., N]."""

    config: ElectraConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, first, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        drop = Dropout(_classifier_dropout(cfg))
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(
            drop(first, deterministic=deterministic)
        )
        h = drop(ACTIVATIONS["gelu"](h), deterministic=deterministic)
        return dense(
            cfg, rt, cfg.num_labels, ("embed",), (None,), "out_proj", out_dtype=jnp.float32
        )(h)


class ElectraSequenceSummary(nn.Module):
    """`sequence_summary` of the multiple-choice head, as ELECTRA's config sets transformers'
    SequenceSummary: the sequence's `summary_type` state [..., E] -> `summary` (dense E -> E,
    with `summary_use_proj`) -> `summary_activation` -> dropout (`summary_last_dropout`)."""

    config: ElectraConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        if cfg.summary_use_proj:
            h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "summary")(h)
        if cfg.summary_activation:  # "": none
            h = _SUMMARY_ACTIVATIONS[cfg.summary_activation](h)
        return Dropout(cfg.summary_last_dropout)(h, deterministic=deterministic)


def _classifier_dropout(cfg: ElectraConfig) -> float:
    """The classification heads' dropout: `classifier_dropout`, else `hidden_dropout_prob`."""
    return cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout


def _word_embedding(module: nn.Module) -> Array:
    """The word-embedding table [V', M] of the module's `electra` child, for the tied decoder."""
    table = module.variables["params"][ENCODER_NAME]["embeddings"]["word_embeddings"]["embedding"]
    return nn.meta.unbox(table)


class ElectraHead(Head):
    """A task head on top of `electra` (an ElectraModel), with every head's call
    (`models.heads.Head`): input_ids, token_type_ids, attention_mask, position_ids, segment_ids
    [B, L] ([B, C, L] for multiple choice), cls_positions [B, S] (the heads reading [CLS]),
    masked_positions [B, P] (the generator)."""

    config: ElectraConfig
    pooled: ClassVar[bool] = False  # reads [CLS]'s state (and takes cls_positions)

    def encode(self, input_ids, inputs, **kwargs) -> EncoderOutput:
        """The encoder's outputs (pooler_output [CLS]'s state when `pooled`): `electra`, an
        ElectraModel."""
        model = ElectraModel(
            self.config, self.runtime, add_pooling_layer=self.pooled, name=ENCODER_NAME
        )
        return model(input_ids, **inputs, **kwargs)

    def _linear(self, x, features: int, name: str):
        """A dense output layer `name`: [..., E] -> float32 [..., features]."""
        cfg, rt = self.config, self.runtime
        return dense(cfg, rt, features, ("embed",), (None,), name, out_dtype=jnp.float32)(x)


class ElectraForPreTraining(ElectraHead):
    """The replaced-token discriminator: `discriminator_predictions` on every token, logits
    [B, L] float32 (> 0: "replaced"; transformers' ElectraForPreTraining)."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        predict = ElectraDiscriminatorPredictions(
            self.config, self.runtime, name="discriminator_predictions"
        )
        return ClassifierOutput(predict(out.last_hidden_state), out.hidden_states, out.attentions)


class ElectraForMaskedLM(ElectraHead):
    """The generator: `generator_predictions` and `generator_lm_head` on every token, logits
    [B, L, V] float32, or [B, P, V] at `masked_positions` (P/L of the cost; equal to gathering
    the full logits)."""

    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        cfg, rt = self.config, self.runtime
        h = out.last_hidden_state
        if masked_positions is not None:
            h = gather_positions(h, masked_positions)  # [B, P, E]
        h = ElectraGeneratorPredictions(cfg, rt, name="generator_predictions")(h)  # [..., M]
        logits = ElectraTiedDecoder(cfg, rt, name="generator_lm_head")(h, _word_embedding(self))
        return MaskedLMOutput(logits, out.hidden_states, out.attentions)


class ElectraForSequenceClassification(ElectraHead):
    """`classifier` (ElectraClassificationHead) on [CLS]: logits [B, N] (N = 1: regression);
    [B, S, N] with packed rows (`segment_ids`, `cls_positions` [B, S])."""

    pooled = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        classify = ElectraClassificationHead(self.config, self.runtime, name="classifier")
        logits = classify(out.pooler_output, deterministic=deterministic)
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class ElectraForMultipleChoice(ElectraHead):
    """Inputs [B, C, L]; each choice is encoded, summarized (`sequence_summary`) and scored by
    `classifier`: logits [B, C]."""

    pooled = True
    choices = True

    def encode(self, input_ids, inputs, *, cls_positions=None, **kwargs) -> EncoderOutput:
        """The encoder's outputs, `pooler_output` the sequence's state by `summary_type`
        [B', E] (first tokens at cls_positions [B', S] for "first" only)."""
        summary_type = self.config.summary_type
        if cls_positions is not None and summary_type != "first":
            raise ValueError(
                f"cls_positions (packed rows) are read by summary_type='first', not "
                f"{summary_type!r}"
            )
        out = super().encode(input_ids, inputs, cls_positions=cls_positions, **kwargs)
        h = out.last_hidden_state
        if summary_type == "last":  # the last position, a pad in a right-padded row
            out = out.replace(pooler_output=h[:, -1])
        elif summary_type == "mean":  # over every position, padding included (transformers')
            out = out.replace(pooler_output=jnp.mean(h.astype(jnp.float32), axis=1).astype(h.dtype))
        return out

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        summary = ElectraSequenceSummary(self.config, self.runtime, name="sequence_summary")
        pooled = summary(out.pooler_output, deterministic=deterministic)
        logits = self._linear(pooled, 1, "classifier")  # [B*C, 1]
        return ClassifierOutput(logits.reshape(batch_shape[:2]), out.hidden_states, out.attentions)


class ElectraForTokenClassification(ElectraHead):
    """Per-token labels: sequence output -> dropout -> `classifier`: logits [B, L, N]."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        h = Dropout(_classifier_dropout(self.config))(
            out.last_hidden_state, deterministic=deterministic
        )
        logits = self._linear(h, self.config.num_labels, "classifier")
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class ElectraForQuestionAnswering(ElectraHead):
    """Extractive QA: `qa_outputs` maps each token to start/end logits, each [B, L]."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self._linear(out.last_hidden_state, 2, "qa_outputs")
        return QuestionAnsweringOutput(
            logits[..., 0], logits[..., 1], out.hidden_states, out.attentions
        )


# The class of each role (`models.family.Role`), the encoder first; MODEL_CLASSES names them.
# No pretraining (MLM + NSP) or next-sentence head: ELECTRA's pretraining is the generator's
# masked LM and the discriminator's replaced-token detection.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: ElectraModel,
    Role.REPLACED_TOKEN_DETECTION: ElectraForPreTraining,
    Role.MASKED_LM: ElectraForMaskedLM,
    Role.SEQUENCE_CLASSIFICATION: ElectraForSequenceClassification,
    Role.MULTIPLE_CHOICE: ElectraForMultipleChoice,
    Role.TOKEN_CLASSIFICATION: ElectraForTokenClassification,
    Role.QUESTION_ANSWERING: ElectraForQuestionAnswering,
}
MODEL_CLASSES: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in ROLES.values()}
