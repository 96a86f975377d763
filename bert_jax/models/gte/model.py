"""GTE in Flax linen (Zhang et al. 2024, arXiv 2407.19669) and every Hugging Face head
transformers has for it (`GteModel`, `GteForMaskedLM`, `GteForSequenceClassification`,
`GteForTokenClassification`).

The encoder is BERT's call (`models.encoder.EncoderModel`): word embeddings and (where
`type_vocab_size` > 0) token-type embeddings, then LayerNorm (no position table), then
post-LayerNorm layers with rotary positions of any `rope_parameters` and a gated feed-forward
layer: the shared stack of `models.prenorm` with `post_norm` (LayerNorm, `mlp.FeedForward`'s
"gated" kind; biases on the attention projections and the down projection only, dropout on the
activated features, as the config says). Submodule names mirror transformers' state dict
(`gte/layers/3/self_attn/q_proj` is `gte.layers.3.self_attn.q_proj`), so conversion is a rename
and a transpose (`bert_jax.convert`; the fused names transformers saves are split by
`conversion.py`).

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn

from bert_jax.models import heads
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.family import Role
from bert_jax.models.gte.config import GteConfig
from bert_jax.models.prenorm import ROTARY_LAYERS, PostNormRotaryModel

# The registry row's facts (`models.families.Family`): the encoder submodule, its
# layers (`PostNormRotaryModel`'s) and the MLM bias (rotary positions: no position table).
ENCODER_NAME = "gte"
LAYERS_PATH, LAYER_NAME, SCANNED_LAYER = ROTARY_LAYERS  # `layers/0 ...`
STARTING_PATHS = {"mlm_bias": ("lm_head", "decoder", "bias")}


class GteModel(PostNormRotaryModel):
    """The GTE encoder: embeddings, the post-norm rotary layers (`layers`) and (optionally) the
    pooler (`pooler`: tanh(dense(first token))).

    Call arguments and outputs: the encoders' call (`bert_jax.models`); token_type_ids read
    where the config has a table, position_ids the rotary angles'.
    """

    config: GteConfig
    add_pooling_layer: bool = False  # transformers' GteModel has none unless asked


class GteLMHead(nn.Module):
    """`lm_head`: LayerNorm(GELU(`dense`(h))) (`layer_norm`; the exact GELU whatever
    `hidden_act`, as transformers'), then `decoder`: logits against the tied word embeddings
    plus its `bias` (`models.heads.MaskedLMHead`). h [..., E], embedding [V', E] -> float32
    logits [..., V]."""

    config: GteConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, embedding_table):
        cfg, rt = self.config, self.runtime
        h = heads.transform(cfg, rt, h, cfg.hidden_size, "gelu", norm_name="layer_norm")
        return heads.MaskedLMHead(cfg, rt, name="decoder")(h, embedding_table)


class GteHead(heads.Head):
    """A task head on top of `gte` (a GteModel), with every head's call (`models.heads.Head`):
    input_ids, token_type_ids, attention_mask, position_ids, segment_ids [B, L], cls_positions
    [B, S] (pooled heads), masked_positions [B, P] (MLM). Its classifiers are the shared
    defaults: dropout (`classifier_dropout`, else `hidden_dropout_prob`), then `classifier`."""

    config: GteConfig
    token_types: ClassVar[bool] = True  # read where the config has a token-type table
    encoder = GteModel
    encoder_name = ENCODER_NAME


class GteForMaskedLM(heads.OwnMaskedLM, GteHead):
    """Masked LM (no pooler): `lm_head` (`GteLMHead`) on every token."""

    lm_head_cls = GteLMHead


# The class of each role (`models.family.Role`), the encoder first.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: GteModel,
    Role.MASKED_LM: GteForMaskedLM,
    **heads.task_classes(
        GteHead, heads.POOLED_TASKS, without=(Role.MULTIPLE_CHOICE, Role.QUESTION_ANSWERING)
    ),
}
