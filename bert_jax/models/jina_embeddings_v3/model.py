"""Jina-embeddings-v3 in Flax linen (Sturua et al. 2024, arXiv 2409.10173) and every Hugging
Face head transformers has for it (`JinaEmbeddingsV3Model`, `...ForMaskedLM`,
`...ForSequenceClassification`, `...ForTokenClassification`, `...ForQuestionAnswering`).

XLM-RoBERTa's encoder with rotary positions: word and token-type embeddings, LayerNorm (no
position table: `encoder.LearnedEmbeddings` without one), then post-LayerNorm layers of
attention with biases and rotary positions of any `rope_parameters`, and a dense GELU
feed-forward layer (`fc1`, `fc2`): the shared stack of `models.prenorm` with `post_norm`
(LayerNorm, `mlp.FeedForward`'s "dense" kind). Positions count 0..L-1 along each row unless
given, as transformers' (left padding included: rotary scores read only distances). Its heads
are XLM-R's: `lm_head` (dense, GELU, `layer_norm`, the decoder tied to the word embeddings), a
classifier on <s> (dense, tanh, `out_proj`; no pooler layer), `classifier` per token and
`qa_outputs`; the encoder alone has the pooler. Submodule names mirror transformers' state dict
(`roberta/layers/3/self_attn/q_proj` is `roberta.layers.3.self_attn.q_proj`), so conversion is
a rename and a transpose. The original release's task LoRA adapters are not built (transformers'
classes have none).

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn

from bert_jax.models import heads
from bert_jax.models.family import Role
from bert_jax.models.jina_embeddings_v3.config import JinaEmbeddingsV3Config
from bert_jax.models.prenorm import ROTARY_LAYERS, PostNormRotaryModel

# The registry row's facts (`models.families.Family`): the encoder submodule (transformers'
# `roberta`), its layers (`PostNormRotaryModel`'s) and the MLM bias (no position table).
ENCODER_NAME = "roberta"
LAYERS_PATH, LAYER_NAME, SCANNED_LAYER = ROTARY_LAYERS  # `layers/0 ...`
STARTING_PATHS = {"mlm_bias": ("lm_head", "bias")}
MLP_NAMES = ("fc1", "fc2")  # the feed-forward layer's projections (E -> F, F -> E)


class JinaEmbeddingsV3Model(PostNormRotaryModel):
    """The Jina-embeddings-v3 encoder: embeddings, the post-norm rotary layers (`layers`) and
    (optionally) the pooler (`pooler`: tanh(dense(first token))).

    Call arguments and outputs: the encoders' call (`bert_jax.models`); position_ids the
    rotary angles'.
    """

    config: JinaEmbeddingsV3Config
    token_types: ClassVar[bool] = False  # the pipelines pass no token types (see the call)
    mlp_kind: ClassVar[str] = "dense"
    mlp_names: ClassVar[tuple[str, ...]] = MLP_NAMES


class JinaEmbeddingsV3Head(heads.FirstTokenHooks, heads.Head):
    """A task head on top of `roberta` (a JinaEmbeddingsV3Model), with every head's call
    (`models.heads.Head`): input_ids, token_type_ids, attention_mask, position_ids, segment_ids
    [B, L], cls_positions [B, S] (the classifier reading <s>), masked_positions [B, P] (the MLM
    head). Its sequence classifier is XLM-R's (`classifier`: dense, tanh, `out_proj` on <s>, no
    pooler layer)."""

    config: JinaEmbeddingsV3Config
    token_types: ClassVar[bool] = False  # the pipelines pass none (the encoder's call)
    encoder = JinaEmbeddingsV3Model
    encoder_name = ENCODER_NAME


# The class of each role (`models.family.Role`), the encoder first.
ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: JinaEmbeddingsV3Model,
    **heads.task_classes(
        JinaEmbeddingsV3Head, heads.FIRST_TOKEN_TASKS, without=(Role.MULTIPLE_CHOICE,)
    ),
}
