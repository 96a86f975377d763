"""The NomicBERT architecture (`NomicBertConfig`), with its Hugging Face `config.json` fields.

NomicBERT (Nussbaum et al. 2024, arXiv 2402.01613; nomic-ai/nomic-embed-text-v1 and -v1.5):
BERT's post-LayerNorm layers with rotary positions in place of the position table, a SwiGLU
feed-forward layer, and no biases in the attention or feed-forward projections. The fields are
transformers' `NomicBertConfig`'s with its defaults (those of nomic-embed-text-v1.5), BERT's
(`models.config.PostLNConfig`) where they are shared.

`rope_parameters` is transformers' dict (any `rotary.ROPE_TYPES` type; theta 1000 when absent,
or the older top-level `rope_theta`), held as a `rotary.RopeParameters` in the field `rope`.
`head_dim` is written to config.json as transformers writes it, and read only to check that it
is hidden_size / num_attention_heads (the only head size bert_jax builds). The original
release's config.json (its own code's `n_embd`, `n_layer`, ...) is read too (`from_hf_dict`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.prenorm import RotaryPostLNConfig
from bert_jax.models.rotary import RopeParameters

MODEL_TYPE = "nomic_bert"
DEFAULT_THETA = 1000.0  # transformers' `NomicBertConfig.default_theta`
# Named sizes (`NomicBertConfig.preset`): "base" is nomic-embed-text-v1.5 (and -v1); "tiny" the
# CPU pretraining job's 2 layers x 128 for an 8,192-piece vocabulary.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {},
    "tiny": dict(vocab_size=8192, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=256, max_position_embeddings=128),
}  # fmt: skip


# The original release's config.json keys (its own code's, nomic-ai/nomic-embed-text-v1.5's),
# which transformers 5 reads past: those that name a field here, and those whose only value
# bert_jax (and transformers' NomicBert) implements, None meaning absent.
LEGACY_NAMES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "layer_norm_epsilon": "layer_norm_eps",
    "resid_pdrop": "hidden_dropout_prob",
    "attn_pdrop": "attention_probs_dropout_prob",
    "rotary_emb_base": "rope_theta",
}
LEGACY_FIXED = {  # the values bert_jax implements (None: the key may be absent)
    "prenorm": (False,),
    "qkv_proj_bias": (False,),
    "mlp_fc1_bias": (False,),
    "mlp_fc2_bias": (False,),
    "rotary_emb_fraction": (1.0,),
    "rotary_emb_interleaved": (False,),
    "rotary_scaling_factor": (None,),  # the original's dynamic NTK scaling: must be null
    "activation_function": ("swiglu",),
    "num_experts": (None, 0),  # nomic-embed-text-v2-moe's mixture of experts
}
# Keys of the original config.json that say nothing about the weights here.
_LEGACY_HOUSEKEEPING = frozenset(
    """
    auto_map n_positions max_trained_positions embd_pdrop summary_first_dropout
    scale_attn_weights scale_attn_by_inverse_layer_idx reorder_and_upcast_attn causal
    dense_seq_output fused_bias_fc fused_dropout_add_ln pad_vocab_size_multiple
    use_flash_attn use_rms_norm use_xentropy mlp_fc1_bias mlp_fc2_bias qkv_proj_bias prenorm
    rotary_emb_fraction rotary_emb_interleaved rotary_scaling_factor activation_function
    rotary_emb_scale_base
    """.split()
)


@dataclasses.dataclass(frozen=True)
class NomicBertConfig(RotaryPostLNConfig):
    """The NomicBERT architecture, with Hugging Face `config.json` field names.

    Attributes (beyond `RotaryPostLNConfig`'s, whose defaults it changes as transformers does:
    V 30528, silu, no dropout, 2048 positions):
      hidden_act: the SwiGLU gate's activation (`mlp/gate_proj`); "silu" in the released models.
      max_position_embeddings: the length the model was trained for (no table: rotary
        positions; the dynamic RoPE grows its theta past it).
      type_vocab_size: rows of the token-type table (at least 1: every token reads row 0 when
        no token types are given).
      rope: the rotary variant (config.json's `rope_parameters`); default RoPE of theta 1000.
    """

    model_type: ClassVar[str] = MODEL_TYPE
    display_name: ClassVar[str] = "NomicBERT"
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    # What the shared stack reads (`models.prenorm`): plain multi-head attention without biases.
    attention_bias: ClassVar[bool] = False
    mlp_bias: ClassVar[bool] = False
    vocab_size: int = 30528
    hidden_act: str = "silu"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 2048
    rope: RopeParameters = RopeParameters(rope_theta=DEFAULT_THETA)
    default_theta: ClassVar[float] = DEFAULT_THETA

    # ---- Hugging Face config.json ----
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> NomicBertConfig:
        """A config from a Hugging Face `config.json` dict in transformers 5's spelling or the
        original release's (`LEGACY_NAMES`, read where transformers' key is absent; a
        `LEGACY_FIXED` key of another value raises, naming it)."""
        d = dict(d)
        for key, allowed in LEGACY_FIXED.items():
            if d.get(key) is not None and d[key] not in allowed:
                raise ValueError(
                    f"config.json has {key}={d[key]!r}; bert_jax's NomicBERT (as transformers') "
                    f"implements {key}={allowed[-1]!r} only"
                )
        for old, new in LEGACY_NAMES.items():
            value = d.pop(old, None)
            if value is not None and d.get(new) is None:
                d[new] = value
        return super().from_hf_dict({k: v for k, v in d.items() if k not in _LEGACY_HOUSEKEEPING})

    def _hf_derived(self) -> dict[str, Any]:
        """transformers' `rope_parameters` dict and `head_dim`."""
        return {**super()._hf_derived(), "head_dim": self.head_dim}
