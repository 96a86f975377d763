"""RoBERTa's and XLM-RoBERTa's architecture (`RobertaConfig`, `XLMRobertaConfig`), with their
Hugging Face `config.json` fields, and the released sizes.

RoBERTa (Liu et al. 2019, arXiv 1907.11692) is BERT's encoder with another vocabulary (byte-level
BPE), no next-sentence head, one token type in the released models, and a position table whose
first `pad_token_id + 1` rows are never read by a real token: fairseq counts positions from
`padding_idx + 1` (so roberta-base's 514 rows hold 512 positions). XLM-RoBERTa (Conneau et al.
2019, arXiv 1911.02116) is the same architecture with a SentencePiece vocabulary of 250,002
pieces; its config.json differs in `model_type` ("xlm-roberta") and defaults only, so
`XLMRobertaConfig` is `RobertaConfig` under the other name.

Both hold exactly what a checkpoint needs to be rebuilt, are frozen (hashable) and check every
field on construction; defaults are transformers' class defaults (what a config.json missing a
key means), and `PRESETS` the released sizes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import HF_HOUSEKEEPING, EncoderConfig, labels_from_hf, labels_to_hf
from bert_jax.paths import as_path

_SIZES = (
    "vocab_size",
    "vocab_pad_multiple",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "num_labels",
)
# config.json keys read here that are not fields, or that must hold a value bert_jax implements.
_CHECKED_KEYS = {"position_embedding_type", "is_decoder", "add_cross_attention", "num_labels"}
_SIZE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
_LARGE = dict(
    hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
)
_RELEASED = dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)
# Named sizes (`RobertaConfig.preset`): the released FacebookAI/roberta-{base,large} and
# xlm-roberta-{base,large} (with the class's `released_vocab_size`: 50,265 or 250,002 pieces), and
# "tiny", BERT's tiny shape (2 layers x 128) with RoBERTa's 514 positions, for CPU runs (its
# vocabulary is the tokenizer's: pass vocab_size).
PRESETS: dict[str, dict[str, Any]] = {
    "base": {**_SIZE, **_RELEASED},
    "large": {**_LARGE, **_RELEASED},
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=512, **_RELEASED),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RobertaConfig(EncoderConfig):
    """The RoBERTa architecture, with Hugging Face `config.json` field names.

    Attributes:
      vocab_size: V, rows of the word-embedding table (and columns of the MLM logits).
      hidden_size: E, width of the residual stream.
      num_hidden_layers: number of transformer layers.
      num_attention_heads: H; head size D = E / H.
      intermediate_size: F, width of the feed-forward layer.
      hidden_act: feed-forward activation; "gelu" is the exact erf GELU. (The MLM head's
        activation is always the exact GELU, as in transformers.)
      hidden_dropout_prob: dropout on embeddings, on each sub-layer output and (unless
        `classifier_dropout`) in the classification heads.
      attention_probs_dropout_prob: dropout on the attention probabilities.
      max_position_embeddings: rows of the position table, padding_idx + 1 of them never read by
        a real token: sequences hold at most `max_sequence_length` tokens.
      type_vocab_size: rows of the token-type table (1 in the released models).
      initializer_range: stddev of the truncated-normal initializer.
      layer_norm_eps: epsilon of every LayerNorm.
      pad_token_id: id of <pad>, and fairseq's `padding_idx`: the position table row of padding,
        real tokens' positions counted from pad_token_id + 1.
      classifier_dropout: dropout of the classification heads; None means hidden_dropout_prob.
      num_labels: output width of the sequence/token classification heads (1 means regression).
      label_names: optional names of the labels, written to config.json as id2label.
      vocab_pad_multiple: the word-embedding table and the MLM bias have `padded_vocab_size`
        rows, V rounded up to this multiple (as BertConfig's: never looked up, logits cut to V,
        stripped by every export; not written to a Hugging Face config.json).
    """

    model_type: ClassVar[str] = "roberta"  # config.json's; the family's name
    display_name: ClassVar[str] = "RoBERTa"
    released_vocab_size: ClassVar[int] = 50265  # the base and large presets'
    vocab_size: int = 50265
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 1
    classifier_dropout: float | None = None
    num_labels: int = 2
    label_names: tuple[str, ...] | None = None
    vocab_pad_multiple: int = 1

    def __post_init__(self):
        self._check_fields(
            sizes=_SIZES,
            probabilities=(
                "hidden_dropout_prob",
                "attention_probs_dropout_prob",
                "classifier_dropout",
            ),
            positive=("initializer_range", "layer_norm_eps"),
            activations=("hidden_act",),
            optional=("classifier_dropout",),  # None: hidden_dropout_prob
        )
        if self.hidden_size % self.num_attention_heads:
            self._fail(
                "hidden_size",
                self.hidden_size,
                f"not divisible by num_attention_heads={self.num_attention_heads}",
            )
        self._check_ids_and_labels()
        if self.max_sequence_length < 1:
            self._fail(
                "max_position_embeddings",
                self.max_position_embeddings,
                f"leaves no position for a token: rows 0..{self.pad_token_id} (pad_token_id) are "
                "never read, so it must be at least pad_token_id + 2",
            )

    # ---- derived sizes ----
    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word-embedding table: V rounded up to `vocab_pad_multiple`."""
        return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

    @property
    def position_offset(self) -> int:
        """The position table's row of a sequence's first token: pad_token_id + 1."""
        return self.pad_token_id + 1

    @property
    def max_sequence_length(self) -> int:
        """The longest sequence the position table holds: max_position_embeddings less the
        rows below `position_offset` (512 for the released 514)."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> RobertaConfig:
        """A named size (`PRESETS`): "base", "large" (the released models, their vocabulary
        `released_vocab_size`) or "tiny"."""
        released = {} if name.lower() == "tiny" else {"vocab_size": cls.released_vocab_size}
        return cls(**{**released, **cls._preset_fields(PRESETS, name), **overrides})

    # ---- Hugging Face config.json ----
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> RobertaConfig:
        """A config from the dict of a Hugging Face `config.json` of this model_type.

        Relative position embeddings, a decoder and cross-attention (which bert_jax does not
        implement) raise; housekeeping keys are ignored; any other unknown key is logged, never
        silently dropped.
        """
        d = dict(d)
        if d.get("model_type", cls.model_type) != cls.model_type:
            raise ValueError(
                f"config.json has model_type={d['model_type']!r}, not {cls.model_type!r}"
            )
        pos = d.get("position_embedding_type", "absolute")
        if pos not in (None, "absolute"):
            raise ValueError(
                f"config.json has position_embedding_type={pos!r}; only 'absolute' is supported"
            )
        for flag in ("is_decoder", "add_cross_attention"):
            if d.get(flag):
                raise ValueError(f"config.json has {flag}=true; bert_jax implements the encoder")
        names = {f.name for f in dataclasses.fields(cls)} - {"num_labels", "label_names"}
        kwargs = {k: d[k] for k in names if d.get(k) is not None}
        if "classifier_dropout" in d:
            kwargs["classifier_dropout"] = d["classifier_dropout"]
        unknown = set(d) - names - HF_HOUSEKEEPING - _CHECKED_KEYS
        if unknown:
            logging.warning("config.json keys not used by bert_jax: %s", sorted(unknown))
        return cls(**kwargs, **labels_from_hf(d))

    def to_hf_dict(self, architecture: str | None = None) -> dict[str, Any]:
        """The dict of a Hugging Face `config.json` for this config."""
        d: dict[str, Any] = {"model_type": self.model_type}
        if architecture:
            d["architectures"] = [architecture]
        for f in dataclasses.fields(self):
            if f.name not in ("num_labels", "label_names", "vocab_pad_multiple"):
                d[f.name] = getattr(self, f.name)
        if self.vocab_pad_multiple != 1:  # bert_jax's own (a Hugging Face export strips it)
            d["vocab_pad_multiple"] = self.vocab_pad_multiple
        d.update(labels_to_hf(self.label_names, self.num_labels))
        d["position_embedding_type"] = "absolute"
        d["tie_word_embeddings"] = True
        return d

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> RobertaConfig:
        """Reads a Hugging Face `config.json` (or the directory holding one), local or at a URL
        (`etils.epath`)."""
        path = as_path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_hf_dict(json.loads(path.read_text(encoding="utf-8")))

    def to_json_file(self, path: str | os.PathLike, *, architecture: str | None = None):
        """Writes a Hugging Face `config.json`."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_hf_dict(architecture), f, indent=2, sort_keys=True)
            f.write("\n")


@dataclasses.dataclass(frozen=True)
class XLMRobertaConfig(RobertaConfig):
    """XLM-RoBERTa: RoBERTa's architecture and fields, config.json's model_type "xlm-roberta"
    (transformers' XLMRobertaConfig, whose only other difference is its default vocab_size).
    The released xlm-roberta-base is `XLMRobertaConfig.preset("base")`."""

    model_type: ClassVar[str] = "xlm-roberta"
    display_name: ClassVar[str] = "XLM-RoBERTa"
    released_vocab_size: ClassVar[int] = 250002
    vocab_size: int = 30522
