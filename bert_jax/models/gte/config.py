"""The GTE architecture (`GteConfig`), with its Hugging Face `config.json` fields.

GTE (Zhang et al. 2024, arXiv 2407.19669; Alibaba-NLP's gte-multilingual-base and
gte-base-en-v1.5, transformers' `Gte*` classes): BERT's post-LayerNorm layers with rotary
positions in place of the position table, a gated feed-forward layer (GeGLU with the released
"gelu": no biases on its gate and up projections, one on its down projection), biases on the
attention projections, and a token-type table that may be absent (`type_vocab_size` 0:
gte-base-en-v1.5). The fields are transformers' `GteConfig`'s with its defaults (those of
gte-multilingual-base), BERT's (`models.config.PostLNConfig`) where they are shared.

`rope_parameters` is transformers' dict (any `rotary.ROPE_TYPES` type; theta 160000 when absent,
or the older top-level `rope_theta` and `rope_scaling`), held as a `rotary.RopeParameters` in
the field `rope`. A `head_dim` in config.json is read only to check that it is hidden_size /
num_attention_heads (the only head size bert_jax builds); transformers writes none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import LAYER_SIZES
from bert_jax.models.prenorm import RotaryPostLNConfig
from bert_jax.models.rotary import RopeParameters

MODEL_TYPE = "gte"
DEFAULT_THETA = 160_000.0  # transformers' `GteConfig.default_theta`
# Named sizes (`GteConfig.preset`): "base" is gte-multilingual-base (transformers' defaults);
# "tiny" the CPU pretraining job's 2 layers x 128 for an 8,192-piece vocabulary, no token types
# (as gte-base-en-v1.5), pad id 0 (WordPiece's [PAD]), no dropout (as every tiny job here).
PRESETS: dict[str, dict[str, Any]] = {
    "base": {},
    "tiny": dict(vocab_size=8192, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=256, max_position_embeddings=128, type_vocab_size=0,
                 pad_token_id=0, hidden_dropout_prob=0.0),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class GteConfig(RotaryPostLNConfig):
    """The GTE architecture, with Hugging Face `config.json` field names.

    Attributes (beyond `RotaryPostLNConfig`'s, whose defaults it changes as transformers does:
    V 250048, no attention dropout, 8192 positions, one token type, pad id 1):
      hidden_act: the gated feed-forward layer's activation (`mlp/gate_proj`); "gelu" (GeGLU)
        in the released models.
      max_position_embeddings: the length the model was trained for (no table: rotary
        positions; the dynamic RoPE grows its theta past it).
      type_vocab_size: rows of the token-type table; 0: no table (token_type_ids are not read).
      rope: the rotary variant (config.json's `rope_parameters`); default RoPE of theta 160000.
    """

    model_type: ClassVar[str] = MODEL_TYPE
    display_name: ClassVar[str] = "GTE"
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    # What the shared stack reads (`models.prenorm`): plain multi-head attention with biases; a
    # gated MLP whose gate and up projections have no bias, its down projection one, and dropout
    # (hidden_dropout_prob) on the activated [B, L, F].
    attention_bias: ClassVar[bool] = True
    mlp_bias: ClassVar[bool] = False
    mlp_out_bias: ClassVar[bool] = True
    vocab_size: int = 250048
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 8192
    type_vocab_size: int = 1
    pad_token_id: int = 1
    rope: RopeParameters = RopeParameters(rope_theta=DEFAULT_THETA)
    default_theta: ClassVar[float] = DEFAULT_THETA

    def __post_init__(self):
        types = self.type_vocab_size
        if isinstance(types, bool) or not isinstance(types, int) or types < 0:
            self._fail("type_vocab_size", types, "must be a non-negative integer (0: no table)")
        self._check_rotary_config(sizes=tuple(s for s in LAYER_SIZES if s != "type_vocab_size"))

    mlp_dropout = property(lambda self: self.hidden_dropout_prob)

    # config.json is read and written as `RotaryPostLNConfig` does (`rope_parameters`).
