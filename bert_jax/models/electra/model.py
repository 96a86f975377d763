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

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.activations import ACTIVATIONS
from bert_jax.models import heads
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.electra.config import ElectraConfig
from bert_jax.models.encoder import POST_LN_LAYERS, EncoderModel, LearnedEmbeddings, starting_paths
from bert_jax.models.family import Role
from bert_jax.models.layers import Dropout, constrain, dense
from bert_jax.models.outputs import ClassifierOutput, EncoderOutput, MaskedLMOutput

Array = jax.Array

# The family's facts its registry row reads (`models.families.Family`): the heads' encoder
# submodule (the discriminator's and the generator's checkpoints both call it `electra`), where
# its layers sit and their names (one stacked `layer` under `scan_layers`), and the parameters a
# pretraining run may start specially (the generator's output bias, the position table).
ENCODER_NAME = "electra"
LAYERS_PATH, LAYER_NAME, SCANNED_LAYER = POST_LN_LAYERS  # `encoder/layer_0 ...`
STARTING_PATHS = starting_paths(ENCODER_NAME, mlm_bias=("generator_lm_head", "bias"))


class ElectraModel(EncoderModel):
    """The ELECTRA encoder: embeddings (M wide), their projection to E where M != E, layers.

    Call arguments and outputs: the encoders' call (`bert_jax.models`), but:
      hidden_states (returned): the first is the layers' input, the embeddings after their
        projection, as transformers returns it.
      pooler_output (returned): the first token's state (no parameters: ELECTRA has no pooler
        layer).
    """

    config: ElectraConfig
    add_pooling_layer: bool = False

    def embed(self, input_ids, token_type_ids, attention_mask, position_ids, *, deterministic):
        cfg, rt = self.config, self.runtime
        embeddings = LearnedEmbeddings(cfg, rt, cfg.embedding_size, name="embeddings")
        x = embeddings(input_ids, token_type_ids, position_ids, deterministic=deterministic)  # M
        if cfg.projects_embeddings:
            project = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "embeddings_project")
            x = constrain(project(x), "act_batch", "act_len", "act_embed")  # [B, L, E]
        return x


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
            h = heads.HEAD_ACTIVATIONS[cfg.summary_activation](h)
        return Dropout(cfg.summary_last_dropout)(h, deterministic=deterministic)


class ElectraHead(heads.Head):
    """A task head on top of `electra` (an ElectraModel), with every head's call
    (`models.heads.Head`): input_ids, token_type_ids, attention_mask, position_ids, segment_ids
    [B, L] ([B, C, L] for multiple choice), cls_positions [B, S] (the heads reading [CLS]),
    masked_positions [B, P] (the generator). Its own layers: the sequence classifier
    (`classifier`: dense, GELU, `out_proj` on [CLS]) and the multiple-choice score
    (`sequence_summary`, then `classifier`)."""

    config: ElectraConfig
    pooled: ClassVar[bool] = False  # reads [CLS]'s state (and takes cls_positions)
    encoder = ElectraModel
    encoder_name = ENCODER_NAME

    def classify(self, pooled, features, deterministic):
        """`classifier` (`models.heads.ClassificationHead`, the exact GELU; BERT's pooler has
        tanh) on the [CLS] states."""
        classify = heads.ClassificationHead(self.config, self.runtime, "gelu", name="classifier")
        return classify(pooled, deterministic=deterministic)

    def score_choices(self, pooled, deterministic):
        """`sequence_summary` (ElectraSequenceSummary), then `classifier`: [B*C, 1]."""
        summary = ElectraSequenceSummary(self.config, self.runtime, name="sequence_summary")
        return self.linear(summary(pooled, deterministic=deterministic), 1, "classifier")


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
        h = heads.masked_states(out, masked_positions)  # [B, L|P, E]
        # `generator_predictions`: LayerNorm(GELU(dense h)), E -> M (the exact GELU whatever
        # `hidden_act`, as in transformers); `generator_lm_head`: the tied decoder and its bias.
        h = heads.Transform(cfg, rt, cfg.embedding_size, "gelu", name="generator_predictions")(h)
        logits = heads.MaskedLMHead(cfg, rt, name="generator_lm_head")(h, self.word_embeddings())
        return MaskedLMOutput(logits, out.hidden_states, out.attentions)


class ElectraForMultipleChoice(heads.MultipleChoice, ElectraHead):
    """Inputs [B, C, L]; each choice is encoded, summarized (`sequence_summary`) and scored by
    `classifier`: logits [B, C]."""

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


# The class of each role (`models.family.Role`), the encoder first.
# No pretraining (MLM + NSP) or next-sentence head: ELECTRA's pretraining is the generator's
# masked LM and the discriminator's replaced-token detection.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: ElectraModel,
    Role.REPLACED_TOKEN_DETECTION: ElectraForPreTraining,
    Role.MASKED_LM: ElectraForMaskedLM,
    **heads.task_classes(
        ElectraHead, heads.POOLED_TASKS, own={Role.MULTIPLE_CHOICE: ElectraForMultipleChoice}
    ),
}
