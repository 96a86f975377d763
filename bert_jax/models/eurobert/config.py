"""The EuroBERT architecture (`EuroBertConfig`), with its Hugging Face `config.json` fields.

EuroBERT (Boizard et al. 2025, arXiv 2503.05500) is Llama's layer stack made bidirectional: pre-
norm layers with RMSNorm, SwiGLU feed-forward layers without biases, grouped-query attention
(`num_key_value_heads` <= `num_attention_heads`) with rotary positions of any of transformers'
`rope_parameters`, no token types, a masked-LM head (`lm_head`) tied to the token embeddings or
not (`tie_word_embeddings`), and a classifier whose pooling is `classifier_pooling`.

The fields are transformers' EuroBertConfig keys with its defaults. config.json is read in both
spellings transformers knows (`rope_parameters`; the older `rope_theta` and `rope_scaling` beside
it, and the first releases' `clf_pooling`) and written in transformers 5's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import HF_HOUSEKEEPING, EncoderConfig, bert_size
from bert_jax.models.pooling import EUROBERT_CLASSIFIER_POOLINGS as CLASSIFIER_POOLINGS
from bert_jax.models.prenorm import check_heads
from bert_jax.models.rotary import RopeParameters

MODEL_TYPE = "eurobert"
# config.json keys of transformers' EuroBertConfig (and of the first releases' remote code) that
# say nothing about the weights.
_HOUSEKEEPING = HF_HOUSEKEEPING | {"pretraining_tp", "auto_map", "hidden_dropout"}
# Named sizes (`EuroBertConfig.preset`): the released EuroBERT/EuroBERT-210m, -610m and -2.1B,
# and "tiny", the CPU pretraining job's 2 layers x 128 (4 query heads on 2 key/value heads) for
# its own 8,192-piece vocabulary ([PAD] = 0) and 128-token rows (configs/pretrain.py,
# arch=eurobert).
PRESETS: dict[str, dict[str, Any]] = {
    "210m": {**bert_size(12, 768), "num_key_value_heads": 12},
    "610m": dict(hidden_size=1152, intermediate_size=4096, num_hidden_layers=26,
                 num_attention_heads=18, num_key_value_heads=6),
    "2.1b": dict(hidden_size=2304, intermediate_size=6144, num_hidden_layers=32,
                 num_attention_heads=18, num_key_value_heads=6),
    "tiny": dict(vocab_size=8192, pad_token_id=0, hidden_size=128, intermediate_size=256,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=128),
}  # fmt: skip
_RELEASED = dict(rope_parameters=RopeParameters(rope_theta=250000.0), tie_word_embeddings=False)


@dataclasses.dataclass(frozen=True)
class EuroBertConfig(EncoderConfig):
    """The EuroBERT architecture, with Hugging Face `config.json` field names.

    Attributes:
      vocab_size: V, rows of the token-embedding table (and columns of the MLM logits); not
        padded (`padded_vocab_size` is V: the released vocabulary is a multiple of 128).
      hidden_size: E, width of the residual stream.
      intermediate_size: F, width of the SwiGLU layer (gate_proj and up_proj make F each).
      num_hidden_layers: number of layers.
      num_attention_heads: H, query heads.
      num_key_value_heads: K, key/value heads, each shared by H / K query heads; None: H.
      hidden_act: the gate's activation ("silu": SwiGLU).
      max_position_embeddings: the longest sequence the model is meant for (no table: RoPE;
        dynamic and yarn RoPE read it).
      initializer_range: stddev of the truncated-normal initializer.
      rms_norm_eps: epsilon of every RMSNorm.
      pad_token_id / bos_token_id / eos_token_id / mask_token_id: the special tokens' ids, for
        the tokenizer and transformers (the model reads none of them).
      tie_word_embeddings: the MLM head's weight is the token embeddings (else its own
        `lm_head` kernel; the released models' is untied).
      rope_parameters: the rotary variant (`rotary.RopeParameters`, or transformers' dict of
        it); None: default RoPE of theta 10000.
      attention_bias / mlp_bias: whether the attention / MLP projections have biases (the MLM
        head's too, under `mlp_bias`, as transformers builds it).
      attention_dropout: dropout on the attention probabilities.
      head_size: D, the width of one head (config.json's `head_dim`); None: E / H.
      classifier_pooling: the sequence classifier's pooling (`CLASSIFIER_POOLINGS`).
      num_labels: output width of the classification heads (1: regression).
      label_names: optional names of the labels, written to config.json as id2label.
    """

    model_type: ClassVar[str] = MODEL_TYPE
    display_name: ClassVar[str] = "EuroBERT"
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    hf_names: ClassVar[Mapping[str, str]] = {"head_size": "head_dim"}
    hf_housekeeping: ClassVar[frozenset[str]] = _HOUSEKEEPING
    hf_derived: ClassVar[tuple[str, ...]] = ("rope_theta", "rope_scaling", "clf_pooling")
    vocab_size: int = 128256
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_key_value_heads: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-5
    pad_token_id: int = 128001
    bos_token_id: int = 128000
    eos_token_id: int = 128001
    tie_word_embeddings: bool = False
    rope_parameters: RopeParameters | None = None
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False
    head_size: int | None = None
    mask_token_id: int = 128002
    classifier_pooling: str = "late"
    num_labels: int = 2
    label_names: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.num_key_value_heads is None:  # as transformers fills it
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        rope = self.rope_parameters
        if hasattr(rope, "to_dict"):  # an experiment config's block (ml_collections)
            rope = {k: v for k, v in rope.to_dict().items() if v is not None}
        if not isinstance(rope, RopeParameters):  # None or transformers' dict
            object.__setattr__(self, "rope_parameters", RopeParameters.from_hf(rope))
        self._check_fields(
            sizes=("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                   "num_labels", *(("head_size",) if self.head_size is not None else ())),
            probabilities=("attention_dropout",),
            positive=("initializer_range", "rms_norm_eps"),
            bools=("tie_word_embeddings", "attention_bias", "mlp_bias"),
            activations=("hidden_act",),
        )  # fmt: skip
        if self.head_size is None and self.hidden_size % self.num_attention_heads:
            self._fail(
                "hidden_size", self.hidden_size,
                f"must split into num_attention_heads={self.num_attention_heads} heads "
                "(or set head_dim)",
            )  # fmt: skip
        if self.head_size == self.hidden_size // self.num_attention_heads:
            object.__setattr__(self, "head_size", None)  # one spelling of E / H: config == read
        if self.rope_parameters.rotated_dims(self.head_dim) % 2:
            self._fail("head_size", self.head_dim, "the rotated dims of a head must be even")
        check_heads(self)
        if self.classifier_pooling not in CLASSIFIER_POOLINGS:
            self._fail(
                "classifier_pooling",
                self.classifier_pooling,
                f"expected one of {CLASSIFIER_POOLINGS}",
            )
        self._check_ids_and_labels()
        self._check_special_ids("bos_token_id", "eos_token_id", "mask_token_id")

    # ---- what the shared blocks read (`models.prenorm`, `models.attention`) ----
    @property
    def head_dim(self) -> int:
        """D, the width of one attention head: `head_size`, else E / H."""
        return self.head_size or self.hidden_size // self.num_attention_heads

    @property
    def rope(self) -> RopeParameters:
        return self.rope_parameters

    @property
    def norm_eps(self) -> float:
        return self.rms_norm_eps

    @property
    def attention_probs_dropout_prob(self) -> float:
        return self.attention_dropout

    @property
    def hidden_dropout_prob(self) -> float:
        """No dropout on the sub-layers' outputs (transformers' EuroBERT has none)."""
        return 0.0

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> EuroBertConfig:
        """A named size (`PRESETS`): "210m", "610m", "2.1b" as released, or "tiny"; each with
        the released models' RoPE and untied head (`_RELEASED`) unless it says otherwise."""
        return cls(**{**_RELEASED, **cls._preset_fields(cls.presets, name), **overrides})

    # ---- Hugging Face config.json ----
    @classmethod
    def _from_hf_fields(cls, d: Mapping[str, Any], kwargs: dict[str, Any]) -> EuroBertConfig:
        """`rope_parameters`, or the older `rope_scaling` with `rope_theta` beside it (transformers
        4's spelling); `clf_pooling` where `classifier_pooling` is absent."""
        rope = kwargs.get("rope_parameters") or d.get("rope_scaling")
        kwargs["rope_parameters"] = RopeParameters.from_hf(rope, d.get("rope_theta"))
        if "classifier_pooling" not in kwargs and d.get("clf_pooling") is not None:
            kwargs["classifier_pooling"] = d["clf_pooling"]
        return cls(**kwargs)

    def to_hf_dict(self, architecture: str | None = None) -> dict[str, Any]:
        """config.json as transformers 5 writes it: `rope_parameters` a dict, `head_dim` and
        `num_key_value_heads` filled in, the head's tying as set."""
        d = super().to_hf_dict(architecture)
        d["rope_parameters"] = self.rope_parameters.to_hf()
        d["head_dim"] = self.head_dim
        d["tie_word_embeddings"] = self.tie_word_embeddings
        return d
