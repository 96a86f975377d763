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

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax

from bert_jax.models import heads
from bert_jax.models.encoder import (
    POST_LN_LAYERS,
    EncoderModel,
    LearnedEmbeddings,
    padded_positions,
    starting_paths,
)
from bert_jax.models.family import Role
from bert_jax.models.layers import Pooler
from bert_jax.models.roberta.config import RobertaConfig

Array = jax.Array

# The family's facts its registry rows read (`models.families.Family`): the heads' encoder
# submodule (both models' checkpoints call it `roberta`), where its layers sit and their names
# (one stacked `layer` under `scan_layers`), and the parameters a pretraining run may start
# specially.
ENCODER_NAME = "roberta"
LAYERS_PATH, LAYER_NAME, SCANNED_LAYER = POST_LN_LAYERS  # `encoder/layer_0 ...`
STARTING_PATHS = starting_paths(ENCODER_NAME, mlm_bias=("lm_head", "bias"))


class RobertaModel(EncoderModel):
    """The RoBERTa encoder: embeddings, layers and (optionally) the pooler.

    Call arguments and outputs: the encoders' call (`bert_jax.models`), but:
      position_ids: the table row read is this + pad_token_id + 1 (transformers' for a sequence
        alone); None: counted over the non-pad ids of each row, as transformers does. Unlike
        transformers' own argument, these are positions, not table rows.
    """

    config: RobertaConfig
    token_types: ClassVar[bool] = False  # the pipelines pass no token types (see the call)
    positions_from_ids: ClassVar[bool] = True  # omitted position_ids: counted over the ids

    def embed(self, input_ids, token_type_ids, attention_mask, position_ids, *, deterministic):
        cfg, rt = self.config, self.runtime
        positions = padded_positions(input_ids, position_ids, cfg.pad_token_id)  # the table's rows
        embeddings = LearnedEmbeddings(cfg, rt, name="embeddings")
        return embeddings(input_ids, token_type_ids, positions, deterministic=deterministic)

    def pool(self, y, cls_positions):
        return Pooler(self.config, self.runtime, name="pooler")(y, cls_positions)


# ---- Heads ----
class RobertaHead(heads.FirstTokenHooks, heads.Head):
    """A task head on top of `roberta` (a RobertaModel), with every head's call
    (`models.heads.Head`): input_ids, token_type_ids, attention_mask, position_ids, segment_ids
    [B, L] ([B, C, L] for multiple choice), cls_positions [B, S] (the heads reading <s>),
    masked_positions [B, P] (the MLM head). Its own layers: the sequence classifier
    (`classifier`: dense, tanh, `out_proj` on <s>, no pooler) and the multiple-choice score (the
    encoder's pooler, dropout `hidden_dropout_prob`, `classifier`)."""

    config: RobertaConfig
    token_types: ClassVar[bool] = False  # the pipelines pass none (RobertaModel's call)
    encoder = RobertaModel
    encoder_name = ENCODER_NAME


# The class of each role (`models.family.Role`), the encoder first: RobertaForMaskedLM, ...
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: RobertaModel,
    **heads.task_classes(RobertaHead, heads.FIRST_TOKEN_TASKS),
}
# XLM-RoBERTa's: the same modules under transformers' XLMRoberta* names.
XLM_ROLES = heads.renamed(ROLES, "Roberta", "XLMRoberta")
