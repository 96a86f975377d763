"""BERT in Flax linen: the encoder of google-research/bert and every Hugging Face task head.

Post-LayerNorm layers, exact (erf) GELU by default, absolute learned positions, a tanh pooler on
[CLS], and an MLM decoder tied to the word embeddings with its own bias. Submodule names mirror
Hugging Face's `BertModel` state dict (`encoder/layer_3/attention/self/query`), so conversion is a
rename and a transpose. Built from the shared blocks (`models.layers`: the layers are its
post-LayerNorm stack `PostLNEncoder`, the pooler its `Pooler`), attention kernels
(`models.attention`), head call (`models.heads.Head`) and output records (`models.outputs`).

Dimension legend:
  B batch            L sequence length     E hidden size (hidden_size)
  H attention heads  D head size (E / H)   F intermediate size
  V vocabulary       P predictions per sequence (masked positions)
  S sequences packed in one row            C choices (multiple choice)   N labels

Logical axis names carried by the parameters (mapped to mesh axes by `bert_jax.parallel.sharding`):
  vocab, embed, heads, kv, mlp, layers (the stacked axis under `scan_layers`); None = replicated.
Activations use act_batch, act_len, act_embed, act_heads, act_mlp.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax.activations import ACTIVATIONS
from bert_jax.models import layers
from bert_jax.models.attention import AttentionMask
from bert_jax.models.bert.config import BertConfig
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
# submodule, where its layers sit in the encoder's tree and their names (one stacked `layer`
# under `scan_layers`), and the parameters a pretraining run may start specially.
ENCODER_NAME = "bert"
LAYERS_PATH = ("encoder",)
LAYER_NAME = layers.LAYER_NAME  # `layer_0 ...`: the shared post-LayerNorm stack's names
SCANNED_LAYER = layers.SCANNED_LAYER
STARTING_PATHS = {
    "mlm_bias": ("cls", "predictions", "bias"),
    "position_embeddings": (ENCODER_NAME, "embeddings", "position_embeddings", "embedding"),
}


def _layer_norm(cfg: BertConfig, rt: RuntimeConfig, name: str = "LayerNorm") -> nn.LayerNorm:
    """BERT's LayerNorm over E, with a bias, epsilon `layer_norm_eps`."""
    return layer_norm(rt, cfg.layer_norm_eps, name)


class BertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout. Returns [B, L, E]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, input_ids, token_type_ids, position_ids, *, deterministic: bool):
        cfg, rt = self.config, self.runtime

        def embed(num, axes, name, one_hot=False):
            return Embed(
                num,
                cfg.hidden_size,
                axes,
                cfg.initializer_range,
                rt.dtype,
                rt.param_dtype,
                one_hot,
                name=name,
            )

        x = embed(cfg.padded_vocab_size, ("vocab", "embed"), "word_embeddings")(input_ids)
        x += embed(
            cfg.max_position_embeddings, (None, "embed"), "position_embeddings", one_hot=True
        )(position_ids)
        x += embed(cfg.type_vocab_size, (None, "embed"), "token_type_embeddings", one_hot=True)(
            token_type_ids
        )
        x = _layer_norm(cfg, rt)(x)
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        return constrain(x, "act_batch", "act_len", "act_embed")


class BertModel(nn.Module):
    """The BERT encoder: embeddings, layers and (optionally) the pooler.

    Call arguments:
      input_ids: [B, L] int token ids.
      token_type_ids: [B, L] int segment A/B ids; zeros when omitted.
      attention_mask: [B, L] 1 for real tokens, 0 for padding; ones when omitted.
      position_ids: [B, L] int positions; 0..L-1 when omitted (restart per packed sequence).
      segment_ids: [B, L] int ids of packed sequences (0 = padding); attention stays inside one.
      cls_positions: [B, S] int positions of each packed sequence's [CLS] for the pooler.
      deterministic: False turns dropout on (needs `rngs={"dropout": key}`).
      output_hidden_states / output_attentions: also return every layer's states / probabilities.
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    add_pooling_layer: bool = True

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
        seq_len = input_ids.shape[1]
        if seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        x = BertEmbeddings(cfg, rt, name="embeddings")(
            input_ids, token_type_ids, position_ids, deterministic=deterministic
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
@flax.struct.dataclass
class BertForPreTrainingOutput:
    """prediction_logits [B, L, V], or [B, P, V] at `masked_positions`;
    seq_relationship_logits [B, 2] (or [B, S, 2] packed). Logits are float32."""

    prediction_logits: Array
    seq_relationship_logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


class TransformHead(nn.Module):
    """`cls/predictions/transform`: LayerNorm(act(W h + b)), [..., E] -> [..., E]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h):
        cfg, rt = self.config, self.runtime
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(h)
        return _layer_norm(cfg, rt)(ACTIVATIONS[cfg.hidden_act](h))


class BertLMPredictionHead(nn.Module):
    """`cls/predictions`: dense + activation + LayerNorm, then logits against the tied word
    embeddings plus an own output bias. h [..., E], embedding [V', E] (V' = the padded vocabulary,
    `BertConfig.padded_vocab_size`) -> float32 logits [..., V]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, embedding):
        cfg, rt = self.config, self.runtime
        t = TransformHead(cfg, rt, name="transform")(h)
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.padded_vocab_size,), rt.param_dtype)
        logits = tied_logits(t, embedding, rt.dtype)  # float32 [..., V']
        # The padding rows of the table (`vocab_pad_multiple`) are no tokens: cut them off.
        return (logits + bias.astype(jnp.float32))[..., : cfg.vocab_size]


class BertPreTrainingHeads(nn.Module):
    """`cls`: the MLM head (`predictions`) and/or the NSP head (`seq_relationship`)."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    mlm: bool = True
    nsp: bool = True

    @nn.compact
    def __call__(self, sequence_output, pooled_output, embedding, masked_positions=None):
        cfg, rt = self.config, self.runtime
        mlm_logits = nsp_logits = None
        if self.mlm:
            h = sequence_output
            if masked_positions is not None:
                h = gather_positions(h, masked_positions)  # [B, P, E]
            mlm_logits = BertLMPredictionHead(cfg, rt, name="predictions")(h, embedding)
        if self.nsp:
            nsp = dense(cfg, rt, 2, ("embed",), (None,), "seq_relationship")
            nsp_logits = nsp(pooled_output).astype(jnp.float32)
        return mlm_logits, nsp_logits


def _word_embedding(module: nn.Module) -> Array:
    """The word-embedding table [V', E] (V' = `padded_vocab_size`) of the module's `bert` child,
    for the tied decoder."""
    table = module.variables["params"][ENCODER_NAME]["embeddings"]["word_embeddings"]["embedding"]
    return nn.meta.unbox(table)


class BertHead(Head):
    """A task head on top of `bert` (a BertModel), with every head's call (`models.heads.Head`):
    input_ids, token_type_ids, attention_mask, position_ids, segment_ids [B, L] ([B, C, L] for
    multiple choice), cls_positions [B, S] (pooled heads), masked_positions [B, P] (MLM heads)."""

    config: BertConfig

    def encode(self, input_ids, inputs, **kwargs) -> EncoderOutput:
        """The encoder's outputs (pooled when `pooled`): `bert`, a BertModel."""
        model = BertModel(
            self.config, self.runtime, add_pooling_layer=self.pooled, name=ENCODER_NAME
        )
        return model(input_ids, **inputs, **kwargs)

    def _dropout(self, x, deterministic):
        """BERT's classifier dropout: `classifier_dropout`, else `hidden_dropout_prob`."""
        cfg = self.config
        rate = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
        return Dropout(rate)(x, deterministic=deterministic)

    def _linear(self, x, features: int, name: str):
        """A dense output layer `name`: [..., E] -> float32 [..., features]."""
        cfg, rt = self.config, self.runtime
        # Accumulated in float32: a bfloat16 result would round every logit (and a regression
        # output) to 8 bits of mantissa, and the predictions of a barely trained model to one value.
        return dense(cfg, rt, features, ("embed",), (None,), name, out_dtype=jnp.float32)(x)


class BertForPreTraining(BertHead):
    """Masked LM + next sentence prediction, as in the original pretraining.

    With `masked_positions` [B, P] the MLM logits are computed only there ([B, P, V]), which is
    what pretraining needs and costs P/L of the full head; equal to gathering the full [B, L, V]
    logits at those positions.
    """

    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        mlm, nsp = BertPreTrainingHeads(self.config, self.runtime, name="cls")(
            out.last_hidden_state, out.pooler_output, _word_embedding(self), masked_positions
        )
        return BertForPreTrainingOutput(mlm, nsp, out.hidden_states, out.attentions)


class BertForMaskedLM(BertHead):
    """Masked LM only (no pooler, as in Hugging Face). `masked_positions` as in pretraining."""

    pooled = False
    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        mlm, _ = BertPreTrainingHeads(self.config, self.runtime, nsp=False, name="cls")(
            out.last_hidden_state, None, _word_embedding(self), masked_positions
        )
        return MaskedLMOutput(mlm, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(BertHead):
    """Next-sentence prediction only: logits [B, 2], 0 = B follows A, 1 = B is random."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        _, nsp = BertPreTrainingHeads(self.config, self.runtime, mlm=False, name="cls")(
            out.last_hidden_state, out.pooler_output, None
        )
        return ClassifierOutput(nsp, out.hidden_states, out.attentions)


class BertForSequenceClassification(BertHead):
    """Pooled [CLS] -> dropout -> `classifier`: logits [B, N]; N = 1 is regression.

    With packed rows (`segment_ids`, `cls_positions` [B, S]) the logits are [B, S, N].
    """

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        pooled = self._dropout(out.pooler_output, deterministic)
        logits = self._linear(pooled, self.config.num_labels, "classifier")
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class BertForMultipleChoice(BertHead):
    """Inputs [B, C, L]; each choice is encoded, pooled and scored: logits [B, C]."""

    choices = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        pooled = self._dropout(out.pooler_output, deterministic)
        logits = self._linear(pooled, 1, "classifier")  # [B*C, 1]
        return ClassifierOutput(logits.reshape(batch_shape[:2]), out.hidden_states, out.attentions)


class BertForTokenClassification(BertHead):
    """Per-token labels (NER): sequence output -> dropout -> `classifier`: logits [B, L, N]."""

    pooled = False

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        h = self._dropout(out.last_hidden_state, deterministic)
        logits = self._linear(h, self.config.num_labels, "classifier")
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class BertForQuestionAnswering(BertHead):
    """Extractive QA: `qa_outputs` maps each token to start/end logits, each [B, L]."""

    pooled = False

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self._linear(out.last_hidden_state, 2, "qa_outputs")
        return QuestionAnsweringOutput(
            logits[..., 0], logits[..., 1], out.hidden_states, out.attentions
        )


# The class of each role (`models.family.Role`), the encoder first; MODEL_CLASSES names them.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: BertModel,
    Role.PRETRAINING: BertForPreTraining,
    Role.MASKED_LM: BertForMaskedLM,
    Role.NEXT_SENTENCE: BertForNextSentencePrediction,
    Role.SEQUENCE_CLASSIFICATION: BertForSequenceClassification,
    Role.MULTIPLE_CHOICE: BertForMultipleChoice,
    Role.TOKEN_CLASSIFICATION: BertForTokenClassification,
    Role.QUESTION_ANSWERING: BertForQuestionAnswering,
}
MODEL_CLASSES: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in ROLES.values()}
