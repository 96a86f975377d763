"""The ModernBERT architecture (`ModernBertConfig`), with its Hugging Face `config.json` fields.

ModernBERT (Warner et al. 2024, arXiv 2412.13663): rotary positions with two thetas, GeGLU
feed-forward layers, pre-LayerNorm without biases, and attention that alternates between global
layers (every `global_attn_every_n_layers`-th, from layer 0) and local ones (a sliding window of
`local_attention` tokens, `local_attention // 2` on each side).

Like `BertConfig`, it holds exactly what a checkpoint needs to be rebuilt, is frozen (hashable),
and checks every field on construction. `config.json` is read in both spellings transformers
knows (the original `global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta` and the
newer `layer_types`, `rope_parameters`) and written in both, so either reader rebuilds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import HF_HOUSEKEEPING, EncoderConfig
from bert_jax.models.pooling import CLASSIFIER_POOLINGS as POOLINGS

MODEL_TYPE = "modernbert"
GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' `layer_types` words
# config.json keys of transformers' ModernBertConfig that say nothing about the weights.
_HOUSEKEEPING = HF_HOUSEKEEPING | {
    "deterministic_flash_attn",
    "sparse_prediction",
    "sparse_pred_ignore_index",
    "reference_compile",
    "repad_logits_with_grad",
    "initializer_cutoff_factor",
}
# Named sizes (`ModernBertConfig.preset`): the released answerdotai/ModernBERT-base and -large,
# and "tiny", the CPU pretraining job's 3 layers x 128 (one global layer, two local ones) for its
# own 8,192-piece vocabulary ([PAD] = 0) and 128-token rows (configs/pretrain.py, arch=modernbert).
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                 num_attention_heads=12),
    "large": dict(hidden_size=1024, intermediate_size=2624, num_hidden_layers=28,
                  num_attention_heads=16),
    "tiny": dict(vocab_size=8192, pad_token_id=0, hidden_size=128, intermediate_size=256,
                 num_hidden_layers=3, num_attention_heads=2, local_attention=64,
                 max_position_embeddings=128),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(EncoderConfig):
    """The ModernBERT architecture, with Hugging Face `config.json` field names.

    Attributes:
      vocab_size: V, rows of the word-embedding table (and columns of the MLM logits); not
        padded (`padded_vocab_size` is V: ModernBERT's vocabularies are padded already).
      hidden_size: E, width of the residual stream.
      intermediate_size: F, width of the GeGLU feed-forward layer (`Wi` projects to 2F).
      num_hidden_layers: number of transformer layers.
      num_attention_heads: H; head size D = E / H (even: rotary pairs).
      hidden_activation: the gate's activation; "gelu" is the exact erf GELU.
      max_position_embeddings: the longest sequence the model is meant for (no table: RoPE).
      initializer_range: stddev of the truncated-normal initializer.
      norm_eps: epsilon of every LayerNorm.
      norm_bias / attention_bias / mlp_bias / classifier_bias: whether those layers have biases
        (all False in the released models); `decoder_bias`: the MLM decoder's output bias.
      pad_token_id: id of [PAD].
      bos_token_id / eos_token_id / cls_token_id / sep_token_id: ids of [CLS] and [SEP] under
        transformers' names, for the tokenizer and transformers (the model reads none of them).
      global_attn_every_n_layers: layer i attends globally when i % this == 0, else locally.
      local_attention: the local window, in tokens: keys within local_attention // 2 positions of
        the query on either side.
      global_rope_theta / local_rope_theta: RoPE base of the global / local layers.
      attention_dropout: dropout on the attention probabilities and on the attention output.
      embedding_dropout / mlp_dropout / classifier_dropout: dropout after the embeddings' norm,
        inside the MLP (before `Wo`), and before the classifier.
      classifier_pooling: "cls" (the first real token) or "mean" (over real tokens).
      classifier_activation: activation of the prediction head (`head/dense`).
      num_labels: output width of the sequence/token classification heads (1: regression).
      label_names: optional names of the labels, written to config.json as id2label.
    """

    model_type: ClassVar[str] = MODEL_TYPE
    display_name: ClassVar[str] = "ModernBERT"
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    hf_housekeeping: ClassVar[frozenset[str]] = _HOUSEKEEPING
    hf_derived: ClassVar[tuple[str, ...]] = ("layer_types", "rope_parameters")
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 50283
    bos_token_id: int = 50281
    eos_token_id: int = 50282
    cls_token_id: int = 50281
    sep_token_id: int = 50282
    global_attn_every_n_layers: int = 3
    local_attention: int = 128
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    attention_bias: bool = False
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    num_labels: int = 2
    label_names: tuple[str, ...] | None = None

    def __post_init__(self):
        self._check_fields(
            sizes=(
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "max_position_embeddings",
                "global_attn_every_n_layers",
                "local_attention",
                "num_labels",
            ),
            probabilities=(
                "attention_dropout",
                "embedding_dropout",
                "mlp_dropout",
                "classifier_dropout",
            ),
            positive=("initializer_range", "norm_eps", "global_rope_theta", "local_rope_theta"),
            bools=("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias"),
            activations=("hidden_activation", "classifier_activation"),
        )
        if self.hidden_size % self.num_attention_heads or self.head_dim % 2:
            self._fail(
                "hidden_size",
                self.hidden_size,
                f"must split into {self.num_attention_heads} heads of an even size (RoPE pairs)",
            )
        if self.classifier_pooling not in POOLINGS:
            self._fail("classifier_pooling", self.classifier_pooling, f"expected one of {POOLINGS}")
        self._check_ids_and_labels()
        self._check_special_ids("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")

    # ---- derived ----
    @property
    def attention_probs_dropout_prob(self) -> float:
        """`attention_dropout` under the name `models.attention.resolve_attention` reads."""
        return self.attention_dropout

    def is_global(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) attends globally."""
        return layer % self.global_attn_every_n_layers == 0

    @property
    def layer_types(self) -> tuple[str, ...]:
        """transformers' per-layer words: "full_attention" (global) or "sliding_attention"."""
        return tuple(GLOBAL if self.is_global(i) else LOCAL for i in range(self.num_hidden_layers))

    @property
    def window(self) -> int:
        """Keys a local layer's query sees on each side: local_attention // 2 positions."""
        return self.local_attention // 2

    # ---- Hugging Face config.json ----
    @classmethod
    def _from_hf_fields(cls, d: Mapping[str, Any], kwargs: dict[str, Any]) -> ModernBertConfig:
        """The config of config.json `d`, whose `rope_parameters` and `layer_types` (when given)
        say the thetas and the period too: they must be plain ("default") RoPE and ModernBERT's
        periodic pattern, and agree with the fields; anything else raises."""
        for theta, kind in (("global_rope_theta", GLOBAL), ("local_rope_theta", LOCAL)):
            rope = (d.get("rope_parameters") or {}).get(kind) or {}
            if rope.get("rope_type", "default") != "default":
                raise ValueError(f"config.json has {kind} RoPE {rope}; only 'default' RoPE")
            if "rope_theta" in rope:
                kwargs.setdefault(theta, rope["rope_theta"])
                if kwargs[theta] != rope["rope_theta"]:
                    raise ValueError(f"config.json: {theta} disagrees with rope_parameters")
        config = cls(**kwargs)
        types = d.get("layer_types")
        if types is not None and tuple(types) != config.layer_types:
            period = _period(types)
            if period is None or "global_attn_every_n_layers" in d:
                raise ValueError(
                    f"config.json has layer_types={types}: bert_jax takes ModernBERT's pattern, "
                    "a global layer every global_attn_every_n_layers from layer 0"
                )
            config = config.replace(global_attn_every_n_layers=period)
        return config

    def _hf_derived(self) -> dict[str, Any]:
        """transformers' newer spelling of the pattern and the thetas, beside the original."""
        return {
            "layer_types": list(self.layer_types),
            "rope_parameters": {
                GLOBAL: {"rope_type": "default", "rope_theta": self.global_rope_theta},
                LOCAL: {"rope_type": "default", "rope_theta": self.local_rope_theta},
            },
        }


def _period(types) -> int | None:
    """n when `types` is global exactly at multiples of n (from layer 0), else None."""
    for n in range(1, len(types) + 1):
        if all((t == GLOBAL) == (i % n == 0) for i, t in enumerate(types)):
            return n
    return None
