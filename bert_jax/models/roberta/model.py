"""RoBERTa and XLM-RoBERTa in Flax linen: the encoder and every Hugging Face task head.

BERT's post-LayerNorm encoder (exact erf GELU by default, absolute learned positions; the shared
`models.layers.PostLNEncoder` and `Pooler`) with RoBERTa's differences, which are what this file
holds: positions counted from `pad_token_id + 1` over each row's real tokens (transformers'
`create_position_ids_from_input_ids`), one token type in the released models, an MLM head of
dense + GELU + LayerNorm + the decoder tied to the word embeddings (`lm_head`), a classification
head on `<s>` of its own (dense, tanh, `out_proj`; no pooler), and no next-sentence head.
XLM-RoBERTa's classes are RoBERTa's under their own names (its checkpoints differ in vocabulary
and `model_type` only). Submodule names mirror Hugging Face's state dict
(`roberta/encoder/layer_3/attention/self/query` is `roberta.encoder.layer.3.attention.self.query`),
so conversion is a rename and a transpose.

Dimension legend:
  B batch            L sequence length     E hidden size (hidden_size)
  H attention heads  D head size (E / H)   F intermediate size
  V vocabulary       P predictions per sequence (masked positions)
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
from bert_jax.models.family import Role
from bert_jax.models.heads import Head, tied_logits
from bert_jax.models.layers import (
    Dropout,
    Embed,
    Pooler,
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
from bert_jax.models.roberta.config import RobertaConfig

Array = jax.Array

# The family's facts its registry rows read (`models.families.Family`): the heads' encoder
# submodule (both models' checkpoints call it `roberta`), where its layers sit and their names
# (one stacked `layer` under `scan_layers`), and the parameters a pretraining run may start
# specially.
ENCODER_NAME = "roberta"
LAYERS_PATH = ("encoder",)
LAYER_NAME = layers.LAYER_NAME  # `layer_0 ...`: the shared post-LayerNorm stack's names
SCANNED_LAYER = layers.SCANNED_LAYER
STARTING_PATHS = {
    "mlm_bias": ("lm_head", "bias"),
    "position_embeddings": (ENCODER_NAME, "embeddings", "position_embeddings", "embedding"),
}


def _layer_norm(cfg: RobertaConfig, rt: RuntimeConfig, name: str = "LayerNorm") -> nn.LayerNorm:
    return layer_norm(rt, cfg.layer_norm_eps, name)


def position_index(cfg: RobertaConfig, input_ids: Array, position_ids: Array | None) -> Array:
    """The position table's rows [B, L] int32.

    Args:
      input_ids: [B, L] token ids.
      position_ids: [B, L] positions counted from 0 in each sequence (the shared batches' packed
        rows restart them per sequence), or None.

    Returns:
      position_ids + pad_token_id + 1; for None, transformers' `create_position_ids_from_input_ids`:
      pad_token_id + the count of non-pad ids up to and including each token, pad_token_id at
      pad ids (either side of a row, and holes).
    """
    if position_ids is not None:
        return position_ids.astype(jnp.int32) + cfg.position_offset
    real = (input_ids != cfg.pad_token_id).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + cfg.pad_token_id


class RobertaEmbeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout. Returns [B, L, E]."""

    config: RobertaConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, input_ids, token_type_ids, positions, *, deterministic: bool):
        cfg, rt = self.config, self.runtime

        def embed(num, axes, name, one_hot=False):
            return Embed(
                num, cfg.hidden_size, axes, cfg.initializer_range, rt.dtype, rt.param_dtype,
                one_hot, name=name,
            )  # fmt: skip

        x = embed(cfg.padded_vocab_size, ("vocab", "embed"), "word_embeddings")(input_ids)
        x += embed(cfg.type_vocab_size, (None, "embed"), "token_type_embeddings", one_hot=True)(
            token_type_ids
        )
        x += embed(
            cfg.max_position_embeddings, (None, "embed"), "position_embeddings", one_hot=True
        )(positions)
        x = _layer_norm(cfg, rt)(x)
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        return constrain(x, "act_batch", "act_len", "act_embed")


class RobertaModel(nn.Module):
    """The RoBERTa encoder: embeddings, layers and (optionally) the pooler.

    Call arguments:
      input_ids: [B, L] int token ids.
      token_type_ids: [B, L] int token types; zeros when omitted (RoBERTa's tokenizers make
        none, so the jobs pass none: `token_types` is False).
      attention_mask: [B, L] 1 for real tokens, 0 for padding (either side); ones when omitted.
      position_ids: [B, L] int positions counted from 0 in each sequence (the table row read is
        this + pad_token_id + 1, transformers' for a sequence alone); None: counted over the
        non-pad ids of each row, as transformers does. Unlike transformers' own argument, these
        are positions, not table rows, as every family's batches give them.
      segment_ids: [B, L] int ids of packed sequences (0 = padding); attention stays inside one.
      cls_positions: [B, S] int positions of each packed sequence's <s> for the pooler.
      deterministic: False turns dropout on (needs `rngs={"dropout": key}`).
      output_hidden_states / output_attentions: also return every layer's states / probabilities.

    Returns:
      `EncoderOutput`: last_hidden_state [B, L, E]; pooler_output [B, E] ([B, S, E]) with
      `add_pooling_layer`; hidden_states L+1 arrays [B, L, E]; attentions [B, H, L, L] float32.
    """

    config: RobertaConfig
    runtime: RuntimeConfig = RuntimeConfig()
    add_pooling_layer: bool = True
    token_types: ClassVar[bool] = False  # the pipelines pass no token types (see the call)

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
        token_type_ids, attention_mask = encoder_inputs(
            rt, input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        )
        if position_ids is not None and position_ids.shape != input_ids.shape:
            raise ValueError(
                f"position_ids has shape {position_ids.shape} but input_ids has {input_ids.shape}"
            )
        if input_ids.shape[1] > cfg.max_sequence_length:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds the {cfg.max_sequence_length} "
                f"positions of {cfg.display_name}'s table (max_position_embeddings="
                f"{cfg.max_position_embeddings}, its rows 0..{cfg.pad_token_id} unused)"
            )
        x = RobertaEmbeddings(cfg, rt, name="embeddings")(
            input_ids,
            token_type_ids,
            position_index(cfg, input_ids, position_ids),
            deterministic=deterministic,
        )
        mask = AttentionMask(attention_mask.astype(bool), segment_ids)
        y, states, probs = PostLNEncoder(cfg, rt, name="encoder")(
            x,
            mask,
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        pooled = None
        if self.add_pooling_layer:
            pooled = Pooler(cfg, rt, name="pooler")(y, cls_positions)
        return EncoderOutput(
            last_hidden_state=y,
            pooler_output=pooled,
            hidden_states=(x, *states) if output_hidden_states else None,
            attentions=probs,
        )


# ---- Heads ----
class RobertaLMHead(nn.Module):
    """`lm_head`: LayerNorm(GELU(dense(h))) (the exact GELU whatever `hidden_act`, as in
    transformers), then logits against the tied word embeddings plus `bias`. h [..., E],
    embedding [V', E] -> float32 logits [..., V]."""

    config: RobertaConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, embedding):
        cfg, rt = self.config, self.runtime
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(h)
        h = _layer_norm(cfg, rt, "layer_norm")(ACTIVATIONS["gelu"](h))
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.padded_vocab_size,), rt.param_dtype)
        logits = tied_logits(h, embedding, rt.dtype) + bias.astype(jnp.float32)  # [..., V']
        return logits[..., : cfg.vocab_size]  # the padding rows are no tokens


class RobertaClassificationHead(nn.Module):
    """`classifier`: dropout, dense, tanh, dropout, `out_proj` on the <s> states [..., E] ->
    float32 logits [..., N]."""

    config: RobertaConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, first, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        drop = Dropout(_classifier_dropout(cfg))
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(
            drop(first, deterministic=deterministic)
        )
        h = drop(jnp.tanh(h), deterministic=deterministic)
        return dense(
            cfg, rt, cfg.num_labels, ("embed",), (None,), "out_proj", out_dtype=jnp.float32
        )(h)


def _classifier_dropout(cfg: RobertaConfig) -> float:
    """The classification heads' dropout: `classifier_dropout`, else `hidden_dropout_prob`."""
    return cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout


class RobertaHead(Head):
    """A task head on top of `roberta` (a RobertaModel), with every head's call
    (`models.heads.Head`): input_ids, token_type_ids, attention_mask, position_ids, segment_ids
    [B, L] ([B, C, L] for multiple choice), cls_positions [B, S] (the heads reading <s>),
    masked_positions [B, P] (the MLM head)."""

    config: RobertaConfig
    pooled: ClassVar[bool] = False  # reads <s>'s state (and takes cls_positions)
    pooler: ClassVar[bool] = False  # its encoder has the pooler layer
    token_types: ClassVar[bool] = False  # the pipelines pass none (RobertaModel's call)

    def encode(self, input_ids, inputs, **kwargs) -> EncoderOutput:
        """The encoder's outputs: `roberta`, a RobertaModel (with its pooler under `pooler`)."""
        model = RobertaModel(
            self.config, self.runtime, add_pooling_layer=self.pooler, name=ENCODER_NAME
        )
        return model(input_ids, **inputs, **kwargs)

    def _linear(self, x, features: int, name: str):
        """A dense output layer `name`: [..., E] -> float32 [..., features]."""
        cfg, rt = self.config, self.runtime
        return dense(cfg, rt, features, ("embed",), (None,), name, out_dtype=jnp.float32)(x)


class RobertaForMaskedLM(RobertaHead):
    """`lm_head` on every token: logits [B, L, V] float32, or [B, P, V] at `masked_positions`
    (P/L of the cost; equal to gathering the full logits)."""

    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        h = out.last_hidden_state
        if masked_positions is not None:
            h = gather_positions(h, masked_positions)  # [B, P, E]
        table = self.variables["params"][ENCODER_NAME]["embeddings"]["word_embeddings"]
        logits = RobertaLMHead(self.config, self.runtime, name="lm_head")(h, table["embedding"])
        return MaskedLMOutput(logits, out.hidden_states, out.attentions)


class RobertaForSequenceClassification(RobertaHead):
    """`classifier` (RobertaClassificationHead) on <s>: logits [B, N] (N = 1: regression);
    [B, S, N] with packed rows (`segment_ids`, `cls_positions` [B, S])."""

    pooled = True

    def encode(self, input_ids, inputs, *, cls_positions=None, **kwargs) -> EncoderOutput:
        """The encoder's outputs, `pooler_output` the <s> states [B, E] ([B, S, E]): the
        classification head's input (RoBERTa's classifier has no pooler layer)."""
        out = super().encode(input_ids, inputs, **kwargs)
        return out.replace(pooler_output=first_tokens(out.last_hidden_state, cls_positions))

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        classify = RobertaClassificationHead(self.config, self.runtime, name="classifier")
        logits = classify(out.pooler_output, deterministic=deterministic)
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class RobertaForMultipleChoice(RobertaHead):
    """Inputs [B, C, L]; each choice is encoded, pooled (the encoder's pooler), dropped out
    (`hidden_dropout_prob`) and scored by `classifier`: logits [B, C]."""

    pooled = True
    pooler = True
    choices = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        pooled = Dropout(self.config.hidden_dropout_prob)(
            out.pooler_output, deterministic=deterministic
        )
        logits = self._linear(pooled, 1, "classifier")  # [B*C, 1]
        return ClassifierOutput(logits.reshape(batch_shape[:2]), out.hidden_states, out.attentions)


class RobertaForTokenClassification(RobertaHead):
    """Per-token labels: sequence output -> dropout -> `classifier`: logits [B, L, N]."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        h = Dropout(_classifier_dropout(self.config))(
            out.last_hidden_state, deterministic=deterministic
        )
        logits = self._linear(h, self.config.num_labels, "classifier")
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class RobertaForQuestionAnswering(RobertaHead):
    """Extractive QA: `qa_outputs` maps each token to start/end logits, each [B, L]."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self._linear(out.last_hidden_state, 2, "qa_outputs")
        return QuestionAnsweringOutput(
            logits[..., 0], logits[..., 1], out.hidden_states, out.attentions
        )


# The class of each role (`models.family.Role`), the encoder first; MODEL_CLASSES names them.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: RobertaModel,
    Role.MASKED_LM: RobertaForMaskedLM,
    Role.SEQUENCE_CLASSIFICATION: RobertaForSequenceClassification,
    Role.MULTIPLE_CHOICE: RobertaForMultipleChoice,
    Role.TOKEN_CLASSIFICATION: RobertaForTokenClassification,
    Role.QUESTION_ANSWERING: RobertaForQuestionAnswering,
}
MODEL_CLASSES: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in ROLES.values()}


# ---- XLM-RoBERTa: the same modules under transformers' XLMRoberta* names ----
class XLMRobertaModel(RobertaModel):
    """XLM-RoBERTa's encoder: RobertaModel's (config an `XLMRobertaConfig`)."""


class XLMRobertaForMaskedLM(RobertaForMaskedLM):
    """XLM-RoBERTa's masked LM: RobertaForMaskedLM's."""


class XLMRobertaForSequenceClassification(RobertaForSequenceClassification):
    """XLM-RoBERTa's sequence classifier: RobertaForSequenceClassification's."""


class XLMRobertaForMultipleChoice(RobertaForMultipleChoice):
    """XLM-RoBERTa's multiple-choice head: RobertaForMultipleChoice's."""


class XLMRobertaForTokenClassification(RobertaForTokenClassification):
    """XLM-RoBERTa's token classifier: RobertaForTokenClassification's."""


class XLMRobertaForQuestionAnswering(RobertaForQuestionAnswering):
    """XLM-RoBERTa's extractive QA head: RobertaForQuestionAnswering's."""


XLM_ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: XLMRobertaModel,
    Role.MASKED_LM: XLMRobertaForMaskedLM,
    Role.SEQUENCE_CLASSIFICATION: XLMRobertaForSequenceClassification,
    Role.MULTIPLE_CHOICE: XLMRobertaForMultipleChoice,
    Role.TOKEN_CLASSIFICATION: XLMRobertaForTokenClassification,
    Role.QUESTION_ANSWERING: XLMRobertaForQuestionAnswering,
}
XLM_MODEL_CLASSES: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in XLM_ROLES.values()}
