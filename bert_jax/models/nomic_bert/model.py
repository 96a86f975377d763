"""NomicBERT in Flax linen (Nussbaum et al. 2024, arXiv 2402.01613) and every Hugging Face head
transformers has for it (`NomicBertModel`, `NomicBertForMaskedLM`,
`NomicBertForSequenceClassification`, `NomicBertForTokenClassification`).

The encoder is BERT's call (`models.encoder.EncoderModel`): word and token-type embeddings, then
LayerNorm (no position table), then post-LayerNorm layers with rotary positions of any
`rope_parameters` and a SwiGLU feed-forward layer, no biases in either: the shared stack of
`models.prenorm` with `post_norm` (LayerNorm, `mlp.FeedForward`'s "gated" kind). Submodule names
mirror transformers' state dict (`nomic_bert/layers/3/self_attn/q_proj` is
`nomic_bert.layers.3.self_attn.q_proj`), so conversion is a rename and a transpose
(`bert_jax.convert`; the original checkpoints' fused `attn.Wqkv` is split by `conversion.py`).

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

import flax.linen as nn

from bert_jax.models import heads
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.family import Role
from bert_jax.models.nomic_bert.config import NomicBertConfig
from bert_jax.models.prenorm import ROTARY_LAYERS, PostNormRotaryModel

# The registry row's facts (`models.families.Family`): the encoder submodule, its
# layers (`PostNormRotaryModel`'s) and the MLM bias (rotary positions: no position table).
ENCODER_NAME = "nomic_bert"
LAYERS_PATH, LAYER_NAME, SCANNED_LAYER = ROTARY_LAYERS  # `layers/0 ...`
STARTING_PATHS = {"mlm_bias": ("cls", "predictions", "bias")}


class NomicBertModel(PostNormRotaryModel):
    """The NomicBERT encoder: embeddings, the post-norm rotary layers (`layers`) and
    (optionally) the pooler (`pooler`: tanh(dense(first token))).

    Call arguments and outputs: the encoders' call (`bert_jax.models`); position_ids the
    rotary angles'.
    """

    config: NomicBertConfig
    add_pooling_layer: bool = False  # transformers' NomicBertModel has none unless asked


# ---- Heads ----
class NomicBertOnlyMLMHead(nn.Module):
    """`cls`: `predictions` (`models.heads.MaskedLMHead`: dense + `hidden_act` + `layer_norm` in
    `transform`, then the decoder tied to the word embeddings with its own `bias`).
    h [..., E], embedding [V', E] -> float32 logits [..., V]."""

    config: NomicBertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, embedding_table):
        cfg = self.config
        predictions = heads.MaskedLMHead(
            cfg, self.runtime, cfg.hidden_size, cfg.hidden_act, norm_name="layer_norm",
            transform_name="transform", name="predictions",
        )  # fmt: skip
        return predictions(h, embedding_table)


class NomicBertHead(heads.Head):
    """A task head on top of `nomic_bert` (a NomicBertModel), with every head's call
    (`models.heads.Head`): input_ids, token_type_ids, attention_mask, position_ids,
    segment_ids [B, L], cls_positions [B, S] (pooled heads), masked_positions [B, P] (MLM).
    Its classifiers are the shared defaults: dropout (`classifier_dropout`, else
    `hidden_dropout_prob`), then `classifier`."""

    config: NomicBertConfig
    encoder = NomicBertModel
    encoder_name = ENCODER_NAME


class NomicBertForMaskedLM(heads.OwnMaskedLM, NomicBertHead):
    """Masked LM (no pooler): `cls` (`NomicBertOnlyMLMHead`) on every token."""

    lm_head_cls = NomicBertOnlyMLMHead
    lm_head_name = "cls"


# The class of each role (`models.family.Role`), the encoder first.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: NomicBertModel,
    Role.MASKED_LM: NomicBertForMaskedLM,
    **heads.task_classes(
        NomicBertHead, heads.POOLED_TASKS, without=(Role.MULTIPLE_CHOICE, Role.QUESTION_ANSWERING)
    ),
}
