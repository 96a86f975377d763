"""MPNet's architecture (`MPNetConfig`), with its Hugging Face `config.json` fields, and the
released sizes.

MPNet (Song et al. 2020, arXiv 2004.09297) is BERT's post-LayerNorm encoder with RoBERTa's
position table (rows counted from padding_idx + 1 = 2), no token types, and a learned
relative-position score bias shared by every layer: T5's bidirectional buckets of the distance
between two tokens (32 of them, up to a distance of 128), each bucket a value per head added to
the attention scores. sentence-transformers' all-mpnet-base-v2 is the base size.

It holds exactly what a checkpoint needs to be rebuilt, is frozen (hashable) and checks every
field on construction; defaults are transformers' MPNetConfig defaults (what a config.json
missing a key means), and `PRESETS` the released sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import LAYER_SIZES, BertLayersConfig, bert_size

# transformers' MPNet embeds positions from a padding_idx of 1 whatever pad_token_id says, and
# buckets distances into 32 buckets up to 128 whatever relative_attention_num_buckets says (that
# field sizes the bias table only).
PADDING_IDX = 1
NUM_BUCKETS = 32
MAX_DISTANCE = 128

_RELEASED = dict(max_position_embeddings=514, layer_norm_eps=1e-5)
# Named sizes (`MPNetConfig.preset`): the released microsoft/mpnet-base (and
# sentence-transformers/all-mpnet-base-v2, its fine-tuned encoder) with its 30,527 pieces, and
# "tiny" (2 layers x 128, 514 positions) for CPU runs, whose vocabulary is the tokenizer's.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {**bert_size(12, 768), **_RELEASED},
    "tiny": {**bert_size(2, 128), **_RELEASED},
}


@dataclasses.dataclass(frozen=True)
class MPNetConfig(BertLayersConfig):
    """The MPNet architecture, with Hugging Face `config.json` field names: the fields of
    `models.config.BertLayersConfig` (transformers' MPNetConfig changes one default: vocab_size)
    and MPNet's own.

    Attributes:
      hidden_act: as BertLayersConfig's; the MLM head's activation is always the exact GELU, as
        in transformers.
      hidden_dropout_prob: as BertLayersConfig's, and in the classification heads.
      max_position_embeddings: rows of the position table; rows 0 and 1 (up to padding_idx) are
        never read by a real token, so sequences hold at most `max_sequence_length` tokens.
      initializer_range: stddev of the truncated-normal initializer.
      layer_norm_eps: epsilon of every LayerNorm.
      relative_attention_num_buckets: rows of the relative-position bias table (per head); the
        distances fill its first 32 (`NUM_BUCKETS`), so it is at least that.
      pad_token_id: id of <pad> (1 in the released models). The position table counts from
        padding_idx 1 whatever this says, and omitted positions count over the ids other than 1,
        as transformers does.
      bos_token_id / eos_token_id: ids of <s> and </s>, for the tokenizer and transformers (the
        model reads neither).
      num_labels: output width of the sequence/token classification heads (1 means regression).
      label_names: optional names of the labels, written to config.json as id2label.
      vocab_pad_multiple: as `PostLNConfig`'s: the word table and MLM bias have
        `padded_vocab_size` rows; not written to config.json.
    """

    model_type: ClassVar[str] = "mpnet"  # config.json's; the family's name
    display_name: ClassVar[str] = "MPNet"
    released_vocab_size: ClassVar[int] = 30527  # the base preset's
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    hf_if_set: ClassVar[tuple[str, ...]] = ("vocab_pad_multiple",)  # bert_jax's own
    # No token types; the relative-position table's rows instead (`__post_init__`'s checks).
    layer_sizes: ClassVar[tuple[str, ...]] = (
        *(s for s in LAYER_SIZES if s not in ("type_vocab_size", "num_labels")),
        "relative_attention_num_buckets",
        "num_labels",
    )
    special_ids: ClassVar[tuple[str, ...]] = ("bos_token_id", "eos_token_id")
    vocab_size: int = 30527
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    relative_attention_num_buckets: int = 32
    pad_token_id: int = PADDING_IDX
    bos_token_id: int = 0
    eos_token_id: int = 2
    num_labels: int = 2
    label_names: tuple[str, ...] | None = None
    vocab_pad_multiple: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.relative_attention_num_buckets < NUM_BUCKETS:
            self._fail(
                "relative_attention_num_buckets",
                self.relative_attention_num_buckets,
                f"MPNet buckets distances into {NUM_BUCKETS} buckets (as transformers does), "
                "so the bias table needs at least that many rows",
            )
        if self.max_sequence_length < 1:
            self._fail(
                "max_position_embeddings",
                self.max_position_embeddings,
                f"leaves no position for a token: rows 0..{PADDING_IDX} are never read, so it "
                f"must be at least {self.position_offset + 1}",
            )

    # ---- derived sizes and the shared code's names ----
    @property
    def position_offset(self) -> int:
        """The position table's row of a sequence's first token: padding_idx + 1."""
        return PADDING_IDX + 1

    @property
    def max_sequence_length(self) -> int:
        """The longest sequence the position table holds: max_position_embeddings less the
        rows below `position_offset` (512 for the released 514)."""
        return self.max_position_embeddings - self.position_offset

    @property
    def type_vocab_size(self) -> int:
        """0: MPNet has no token-type table (what DeBERTa's type_vocab_size=0 says, for the code
        that asks; not a config.json key)."""
        return 0

    @property
    def classifier_dropout(self) -> None:
        """MPNet's classifiers drop out at hidden_dropout_prob (no field of their own)."""
        return None

    @property
    def attention_score_bias(self) -> bool:
        """The relative-position bias is added to every layer's scores (xla and fused_xla
        attention only: `models.attention.takes_score_bias`)."""
        return True
