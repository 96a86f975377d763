"""BERT in Flax linen: the encoder of google-research/bert and every Hugging Face task head.

Post-LayerNorm layers, exact (erf) GELU by default, absolute learned positions, a tanh pooler on
[CLS], and an MLM decoder tied to the word embeddings with its own bias. Submodule names mirror
Hugging Face's `BertModel` state dict (`encoder/layer_3/attention/self/query`), so conversion is a
rename and a transpose. Built from the shared blocks (`models.layers`: the layers are its
post-LayerNorm stack `PostLNEncoder`, the pooler its `Pooler`), the encoder with its call and
its embeddings (`models.encoder`), attention kernels (`models.attention`), the shared task heads
(`models.heads`: BERT's classifiers are their defaults) and output records (`models.outputs`).

Dimensions: the letters of `bert_jax.models`' legend.
Logical axis names: as `models.layers` states them.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax.models import heads
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.encoder import POST_LN_LAYERS, EncoderModel, LearnedEmbeddings, starting_paths
from bert_jax.models.family import Role
from bert_jax.models.layers import Pooler, dense, gather_positions
from bert_jax.models.outputs import ClassifierOutput, MaskedLMOutput

Array = jax.Array

# The family's facts its registry row reads (`models.families.Family`): the heads' encoder
# submodule, where its layers sit in the encoder's tree and their names (one stacked `layer`
# under `scan_layers`), and the parameters a pretraining run may start specially.
ENCODER_NAME = "bert"
LAYERS_PATH, LAYER_NAME, SCANNED_LAYER = POST_LN_LAYERS  # `encoder/layer_0 ...`
STARTING_PATHS = starting_paths(ENCODER_NAME, mlm_bias=("cls", "predictions", "bias"))


class BertModel(EncoderModel):
    """The BERT encoder: embeddings, layers (`models.layers.PostLNEncoder`) and (optionally) the
    pooler (`models.encoder.EncoderModel`'s call).

    Call arguments and outputs: the encoders' call (`bert_jax.models`); the pooler reads [CLS].
    """

    config: BertConfig

    def embed(self, input_ids, token_type_ids, attention_mask, position_ids, *, deterministic):
        cfg, rt = self.config, self.runtime
        embeddings = LearnedEmbeddings(cfg, rt, positions_first=True, name="embeddings")
        return embeddings(input_ids, token_type_ids, position_ids, deterministic=deterministic)

    def pool(self, y, cls_positions):
        return Pooler(self.config, self.runtime, name="pooler")(y, cls_positions)


# ---- Heads ----
@flax.struct.dataclass
class BertForPreTrainingOutput:
    """prediction_logits [B, L, V], or [B, P, V] at `masked_positions`;
    seq_relationship_logits [B, 2] (or [B, S, 2] packed). Logits are float32."""

    prediction_logits: Array
    seq_relationship_logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


class BertPreTrainingHeads(nn.Module):
    """`cls`: the MLM head (`predictions`: dense + `hidden_act` + LayerNorm in `transform`, then
    the decoder tied to the word embeddings with its own bias, `models.heads.MaskedLMHead`)
    and/or the NSP head (`seq_relationship`)."""

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
            predictions = heads.MaskedLMHead(
                cfg, rt, cfg.hidden_size, cfg.hidden_act, transform_name="transform",
                name="predictions",
            )  # fmt: skip
            mlm_logits = predictions(h, embedding)
        if self.nsp:
            nsp = dense(cfg, rt, 2, ("embed",), (None,), "seq_relationship")
            nsp_logits = nsp(pooled_output).astype(jnp.float32)
        return mlm_logits, nsp_logits


class BertHead(heads.Head):
    """A task head on top of `bert` (a BertModel), with every head's call (`models.heads.Head`):
    input_ids, token_type_ids, attention_mask, position_ids, segment_ids [B, L] ([B, C, L] for
    multiple choice), cls_positions [B, S] (pooled heads), masked_positions [B, P] (MLM heads).
    Its classifiers are the shared defaults: dropout (`classifier_dropout`, else
    `hidden_dropout_prob`), then `classifier` (`qa_outputs` for spans)."""

    config: BertConfig
    encoder = BertModel
    encoder_name = ENCODER_NAME


class BertForPreTraining(BertHead):
    """Masked LM + next sentence prediction, as in the original pretraining.

    With `masked_positions` [B, P] the MLM logits are computed only there ([B, P, V]), which is
    what pretraining needs and costs P/L of the full head; equal to gathering the full [B, L, V]
    logits at those positions.
    """

    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        mlm, nsp = BertPreTrainingHeads(self.config, self.runtime, name="cls")(
            out.last_hidden_state, out.pooler_output, self.word_embeddings(), masked_positions
        )
        return BertForPreTrainingOutput(mlm, nsp, out.hidden_states, out.attentions)


class BertForMaskedLM(BertHead):
    """Masked LM only (no pooler, as in Hugging Face). `masked_positions` as in pretraining."""

    pooled = False
    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        mlm, _ = BertPreTrainingHeads(self.config, self.runtime, nsp=False, name="cls")(
            out.last_hidden_state, None, self.word_embeddings(), masked_positions
        )
        return MaskedLMOutput(mlm, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(BertHead):
    """Next-sentence prediction only: logits [B, 2], 0 = B follows A, 1 = B is random."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        _, nsp = BertPreTrainingHeads(self.config, self.runtime, mlm=False, name="cls")(
            out.last_hidden_state, out.pooler_output, None
        )
        return ClassifierOutput(nsp, out.hidden_states, out.attentions)


# The class of each role (`models.family.Role`), the encoder first.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: BertModel,
    Role.PRETRAINING: BertForPreTraining,
    Role.MASKED_LM: BertForMaskedLM,
    Role.NEXT_SENTENCE: BertForNextSentencePrediction,
    **heads.task_classes(BertHead, heads.POOLED_TASKS),
}
