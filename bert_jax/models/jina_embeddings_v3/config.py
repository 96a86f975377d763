"""The Jina-embeddings-v3 architecture (`JinaEmbeddingsV3Config`), with its Hugging Face
`config.json` fields.

Jina-embeddings-v3 (Sturua et al. 2024, arXiv 2409.10173; jinaai/jina-embeddings-v3) is
XLM-RoBERTa's post-LayerNorm encoder with rotary positions in place of the position table: word
and token-type embeddings (one token type as released), then layers of attention with biases and
a two-layer GELU feed-forward layer, each sub-layer's residual sum normed after it. The fields
are transformers' `JinaEmbeddingsV3Config`'s with its defaults (the released model's sizes:
XLM-R large's, 8,194 positions), BERT's (`models.config.PostLNConfig`) where they are shared.

`rope_parameters` is transformers' dict (any `rotary.ROPE_TYPES` type; theta 20,000 when absent,
or the older top-level `rope_theta` and `rope_scaling`), held as a `rotary.RopeParameters` in
the field `rope`. A `head_dim` in config.json is read only to check that it is hidden_size /
num_attention_heads (the only head size transformers' class and bert_jax build). The MLM head
is tied to the word embeddings, as transformers' class builds it: `tie_word_embeddings` false
raises. The original release's task LoRA adapters (its remote code's) are no part of
transformers' classes, nor of these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import bert_size
from bert_jax.models.prenorm import RotaryPostLNConfig
from bert_jax.models.rotary import RopeParameters

MODEL_TYPE = "jina_embeddings_v3"
DEFAULT_THETA = 20000.0  # transformers' `JinaEmbeddingsV3Config.default_theta`
# Named sizes (`JinaEmbeddingsV3Config.preset`): "large" is jinaai/jina-embeddings-v3 (the
# class's defaults); "tiny" the CPU pretraining job's 2 layers x 128 (its vocabulary is the
# tokenizer's: pass vocab_size).
PRESETS: dict[str, dict[str, Any]] = {
    "large": {},
    "tiny": {**bert_size(2, 128), "max_position_embeddings": 512},
}


@dataclasses.dataclass(frozen=True)
class JinaEmbeddingsV3Config(RotaryPostLNConfig):
    """The Jina-embeddings-v3 architecture, with Hugging Face `config.json` field names.

    Attributes (beyond `RotaryPostLNConfig`'s, whose defaults it changes as transformers does:
    XLM-R large's sizes and 250,002 pieces, 8,194 positions, one token type, eps 1e-5, <pad> 1):
      max_position_embeddings: the length the model was trained for (no table: rotary
        positions; the dynamic and yarn RoPE read it).
      type_vocab_size: rows of the token-type table (1 as released: every token reads row 0).
      bos_token_id / eos_token_id: ids of <s> and </s>, kept for transformers and the tokenizer
        (the model reads neither).
      rope: the rotary variant (config.json's `rope_parameters`); default RoPE of theta 20,000.
    """

    model_type: ClassVar[str] = MODEL_TYPE
    display_name: ClassVar[str] = "Jina-embeddings-v3"
    released_vocab_size: ClassVar[int] = 250002  # the large preset's (the default)
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    hf_fixed: ClassVar[Mapping[str, Any]] = {"tie_word_embeddings": True}
    # What the shared stack reads (`models.prenorm`): multi-head attention and a dense
    # feed-forward layer, both with biases.
    attention_bias: ClassVar[bool] = True
    mlp_bias: ClassVar[bool] = True
    vocab_size: int = 250002
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    max_position_embeddings: int = 8194
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    rope: RopeParameters = RopeParameters(rope_theta=DEFAULT_THETA)
    default_theta: ClassVar[float] = DEFAULT_THETA

    # config.json is read and written as `RotaryPostLNConfig` does (`rope_parameters`).
