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
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import PostLNConfig, bert_size

_RELEASED = dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)
# Named sizes (`RobertaConfig.preset`): the released FacebookAI/roberta-{base,large} and
# xlm-roberta-{base,large} (with the class's `released_vocab_size`: 50,265 or 250,002 pieces), and
# "tiny", BERT's tiny shape (2 layers x 128) with RoBERTa's 514 positions, for CPU runs (its
# vocabulary is the tokenizer's: pass vocab_size).
PRESETS: dict[str, dict[str, Any]] = {
    "base": {**bert_size(12, 768), **_RELEASED},
    "large": {**bert_size(24, 1024), **_RELEASED},
    "tiny": {**bert_size(2, 128), **_RELEASED},
}


@dataclasses.dataclass(frozen=True)
class RobertaConfig(PostLNConfig):
    """The RoBERTa architecture, with Hugging Face `config.json` field names: the fields of
    `models.config.PostLNConfig` (transformers' RobertaConfig changes two defaults: vocab_size,
    pad_token_id) and RoBERTa's own.

    Attributes:
      hidden_act: as PostLNConfig's; the MLM head's activation is always the exact GELU, as in
        transformers.
      hidden_dropout_prob: as PostLNConfig's, and (unless `classifier_dropout`) in the
        classification heads.
      max_position_embeddings: rows of the position table, padding_idx + 1 of them never read by
        a real token: sequences hold at most `max_sequence_length` tokens.
      type_vocab_size: rows of the token-type table (1 in the released models).
      pad_token_id: id of <pad>, and fairseq's `padding_idx`: the position table row of padding,
        real tokens' positions counted from pad_token_id + 1.
      bos_token_id / eos_token_id: ids of <s> and </s>, for the tokenizer and transformers (the
        model reads neither).
      classifier_dropout: dropout of the classification heads; None means hidden_dropout_prob.
    """

    model_type: ClassVar[str] = "roberta"  # config.json's; the family's name
    display_name: ClassVar[str] = "RoBERTa"
    released_vocab_size: ClassVar[int] = 50265  # the base and large presets'
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    hf_fixed: ClassVar[Mapping[str, Any]] = {"position_embedding_type": "absolute"}
    optional_dropouts: ClassVar[tuple[str, ...]] = ("classifier_dropout",)
    special_ids: ClassVar[tuple[str, ...]] = ("bos_token_id", "eos_token_id")
    vocab_size: int = 50265
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    classifier_dropout: float | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.max_sequence_length < 1:
            self._fail(
                "max_position_embeddings",
                self.max_position_embeddings,
                f"leaves no position for a token: rows 0..{self.pad_token_id} (pad_token_id) are "
                "never read, so it must be at least pad_token_id + 2",
            )

    # ---- derived sizes ----
    @property
    def position_offset(self) -> int:
        """The position table's row of a sequence's first token: pad_token_id + 1."""
        return self.pad_token_id + 1

    @property
    def max_sequence_length(self) -> int:
        """The longest sequence the position table holds: max_position_embeddings less the
        rows below `position_offset` (512 for the released 514)."""
        return self.max_position_embeddings - self.position_offset


@dataclasses.dataclass(frozen=True)
class XLMRobertaConfig(RobertaConfig):
    """XLM-RoBERTa: RoBERTa's architecture and fields, config.json's model_type "xlm-roberta"
    (transformers' XLMRobertaConfig, whose only other difference is its default vocab_size).
    The released xlm-roberta-base is `XLMRobertaConfig.preset("base")`."""

    model_type: ClassVar[str] = "xlm-roberta"
    display_name: ClassVar[str] = "XLM-RoBERTa"
    released_vocab_size: ClassVar[int] = 250002
    vocab_size: int = 30522
