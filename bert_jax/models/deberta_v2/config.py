"""DeBERTa-v2's architecture (`DebertaV2Config`), with its Hugging Face `config.json` fields, and
the released DeBERTa-v3 sizes.

DeBERTa (He et al. 2020, arXiv 2006.03654) is BERT's post-LayerNorm encoder with disentangled
attention: each score adds to the content term q.k a content-to-position term (the query against
the keys' relative positions, `c2p`) and a position-to-content term (the key against the query's
relative position, `p2c`), read from a table of relative-position embeddings shared by every
layer. DeBERTa-v2 buckets distances logarithmically beyond `position_buckets // 2`
(`make_log_bucket_position`), normalizes the table (`norm_rel_ebd`) and projects it with the
layers' own query and key projections (`share_att_key`). DeBERTa-v3 (He et al. 2021, arXiv
2111.09543) is this architecture (model_type "deberta-v2") without absolute positions, trained
as a replaced-token-detection discriminator on a 128,000-piece SentencePiece vocabulary.

The fields are transformers' `DebertaV2Config`'s, with its class defaults (what a config.json
missing a key means: no relative attention, absolute positions), plus the keys transformers reads
with `getattr` (`position_buckets`, `norm_rel_ebd`, `share_att_key`, `embedding_size`,
`cls_dropout`, `conv_kernel_size`). Not implemented, and refused naming the field: the
convolution beside layer 0 of deberta-v2-xlarge/xxlarge (`conv_kernel_size` > 0), a head size
other than hidden_size / num_attention_heads (`attention_head_size`), a pooler width other than
hidden_size (transformers' ContextPooler cannot run with one) and position-attention types other
than "c2p" and "p2c". `PRESETS` are the released microsoft/deberta-v3-* sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import LAYER_SIZES, PostLNConfig, bert_size

POSITION_ATTENTION_TYPES = ("c2p", "p2c")  # content-to-position, position-to-content
REL_EMBEDDING_NORMS = ("none", "layer_norm")
# DeBERTa-v3's settings: relative attention only, log buckets, the table normalized and projected
# by the layers' own query/key projections, no token types.
_V3 = dict(
    relative_attention=True,
    max_relative_positions=-1,
    position_buckets=256,
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    pos_att_type=("p2c", "c2p"),
    position_biased_input=False,
    type_vocab_size=0,
    max_position_embeddings=512,
    layer_norm_eps=1e-7,
)
# Named sizes (`DebertaV2Config.preset`): microsoft/deberta-v3-{xsmall,small,base,large} (their
# vocabulary `released_vocab_size`: 128,000 pieces and [MASK], the table padded to 128,100), and
# "tiny" for CPU runs (its vocabulary is the tokenizer's: pass vocab_size).
PRESETS: dict[str, dict[str, Any]] = {
    "xsmall": {**bert_size(12, 384), **_V3},
    "small": {**bert_size(6, 768), **_V3},
    "base": {**bert_size(12, 768), **_V3},
    "large": {**bert_size(24, 1024), **_V3},
    "tiny": {**bert_size(2, 128), **_V3},
}


@dataclasses.dataclass(frozen=True)
class DebertaV2Config(PostLNConfig):
    """The DeBERTa-v2/v3 architecture, with Hugging Face `config.json` field names: the fields of
    `models.config.PostLNConfig` (under transformers' DebertaV2Config defaults) and DeBERTa's
    own.

    Attributes:
      hidden_act: activation of the feed-forward layer, the MLM head's transform and the
        replaced-token-detection head; "gelu" is the exact erf GELU.
      hidden_dropout_prob: dropout on the embeddings, each sub-layer's output, the
        relative-position table (per layer) and (unless `cls_dropout`) before the classifiers.
      max_position_embeddings: rows of the absolute position table (with `position_biased_input`)
        and the relative span when `max_relative_positions` < 1; the longest row the jobs make.
      type_vocab_size: rows of the token-type table; 0: none (DeBERTa-v3), token types unread.
      relative_attention: disentangled attention over relative positions (the `rel_embeddings`
        table); False: content scores only.
      max_relative_positions: the largest distance the buckets resolve (< 1:
        max_position_embeddings).
      position_biased_input: add absolute position embeddings to the word embeddings.
      pos_att_type: the position terms of each score, a subset of ("c2p", "p2c") (config.json
        may spell it "p2c|c2p"); each also widens the scale to 1 / sqrt(D (1 + #terms)).
      pooler_dropout / pooler_hidden_act: the classifiers' ContextPooler (dense E -> E on the
        first token, after this dropout, then this activation). config.json's
        `pooler_hidden_size` is hidden_size (written so; another value is refused).
      legacy: the MLM head's layout: True (transformers' default) `cls.predictions` (transform,
        decoder tied to the word embeddings, bias); False the original's `lm_predictions.lm_head`
        (dense, LayerNorm, bias; the same computation), which DeBERTa's checkpoints hold.
      position_buckets: the number of relative positions each side; distances beyond half of it
        are bucketed logarithmically up to `max_relative_positions`. < 1: no buckets, the span is
        max_relative_positions.
      norm_rel_ebd: "layer_norm" (the table normalized once per forward, `encoder.LayerNorm`) or
        "none"; config.json's "|"-joined form is read.
      share_att_key: the table is projected by each layer's own query/key projections; False:
        by their own `pos_query_proj` / `pos_key_proj`.
      conv_kernel_size: 0; the convolution layer of deberta-v2-xlarge is not implemented.
      embedding_size: width of the embedding tables, projected to E by `embed_proj` (no bias)
        when it differs; None: hidden_size.
      cls_dropout: dropout before the sequence classifier and multiple-choice scorer; None:
        hidden_dropout_prob.
    """

    model_type: ClassVar[str] = "deberta-v2"  # config.json's; the family's name
    display_name: ClassVar[str] = "DeBERTa-v2"
    released_vocab_size: ClassVar[int] = 128100  # the presets' (the tokenizer has 128,001)
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    hf_if_set: ClassVar[tuple[str, ...]] = ("vocab_pad_multiple", "embedding_size", "cls_dropout")
    hf_derived: ClassVar[tuple[str, ...]] = ("pooler_hidden_size", "attention_head_size")
    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    max_relative_positions: int = -1
    position_biased_input: bool = True
    pos_att_type: tuple[str, ...] = ()
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    legacy: bool = True
    position_buckets: int = -1
    norm_rel_ebd: str = "none"
    share_att_key: bool = False
    conv_kernel_size: int = 0
    embedding_size: int | None = None
    cls_dropout: float | None = None

    def __post_init__(self):
        self._check_layers(
            sizes=tuple(s for s in LAYER_SIZES if s != "type_vocab_size"),  # 0: no table
            probabilities=("pooler_dropout", "cls_dropout"),
            bools=("relative_attention", "position_biased_input", "legacy", "share_att_key"),
            activations=("pooler_hidden_act",),
            optional=("cls_dropout",),  # None: hidden_dropout_prob
        )
        for name in ("type_vocab_size", "conv_kernel_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                self._fail(name, value, "must be a non-negative integer")
        for name in ("max_relative_positions", "position_buckets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                self._fail(name, value, "must be an integer (< 1: unset)")
        if self.embedding_size is not None:
            value = self.embedding_size
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                self._fail("embedding_size", value, "must be a positive integer or None")
        if self.conv_kernel_size:
            self._fail(
                "conv_kernel_size",
                self.conv_kernel_size,
                "the convolution layer beside layer 0 (deberta-v2-xlarge/xxlarge) is not "
                "implemented; bert_jax reads DeBERTa-v2/v3 models without it (0)",
            )
        self._normalize_pos_att_type()
        self._normalize_norm_rel_ebd()
        if self.norm_rel_ebd == "layer_norm" and not self.relative_attention:
            self._fail(
                "norm_rel_ebd",
                self.norm_rel_ebd,
                "normalizes the relative-position table, which relative_attention=False lacks",
            )
        span = self.max_relative_positions
        if self.relative_attention and self.position_buckets > 0 and span > 0:
            if span <= self.position_buckets // 2 + 1:
                self._fail(
                    "max_relative_positions",
                    span,
                    f"must exceed position_buckets // 2 + 1 = {self.position_buckets // 2 + 1} "
                    "(the log buckets reach from there to it)",
                )
        self._check_ids_and_labels()

    def _normalize_pos_att_type(self) -> None:
        """pos_att_type as a tuple of lower-case names: from None, a list, or "p2c|c2p"."""
        value = self.pos_att_type
        if value is None:
            value = ()
        elif isinstance(value, str):
            value = tuple(x.strip() for x in value.lower().split("|") if x.strip())
        elif isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
            value = tuple(x.strip().lower() for x in value)
        else:
            self._fail("pos_att_type", value, "must be a list of names, or 'p2c|c2p'")
        unknown = [x for x in value if x not in POSITION_ATTENTION_TYPES]
        if unknown or len(set(value)) != len(value):
            self._fail(
                "pos_att_type",
                self.pos_att_type,
                f"takes each of {POSITION_ATTENTION_TYPES} at most once; {unknown or 'repeated'} "
                "not implemented",
            )
        object.__setattr__(self, "pos_att_type", value)

    def _normalize_norm_rel_ebd(self) -> None:
        """norm_rel_ebd as "layer_norm" or "none" (transformers reads "|"-joined parts)."""
        value = self.norm_rel_ebd
        if not isinstance(value, str):
            self._fail("norm_rel_ebd", value, f"must be one of {REL_EMBEDDING_NORMS}")
        parts = {x.strip() for x in value.lower().split("|")}
        if not parts <= set(REL_EMBEDDING_NORMS):
            self._fail("norm_rel_ebd", value, f"must be one of {REL_EMBEDDING_NORMS}")
        object.__setattr__(self, "norm_rel_ebd", "layer_norm" if "layer_norm" in parts else "none")

    # ---- derived sizes ----
    @property
    def embedding_width(self) -> int:
        """Width of the embedding tables: `embedding_size`, else hidden_size."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @property
    def relative_distance(self) -> int:
        """The largest distance the buckets resolve: max_relative_positions, or
        max_position_embeddings when that is < 1."""
        if self.max_relative_positions < 1:
            return self.max_position_embeddings
        return self.max_relative_positions

    @property
    def attention_span(self) -> int:
        """Relative positions on each side of a query: position_buckets, else
        `relative_distance`; the table has twice as many rows."""
        return self.position_buckets if self.position_buckets > 0 else self.relative_distance

    @property
    def rel_embedding_rows(self) -> int:
        """Rows of the relative-position table `encoder.rel_embeddings`: 2 x attention_span."""
        return 2 * self.attention_span

    @property
    def score_scale_factor(self) -> int:
        """1 + the number of position terms: scores are scaled by 1 / sqrt(D x this)."""
        return 1 + len(self.pos_att_type)

    @property
    def attention_score_bias(self) -> bool:
        """Whether the attention adds relative-position scores to the content scores, which
        only the xla and fused_xla kernels take (`models.attention.resolve_attention`)."""
        return self.relative_attention and bool(self.pos_att_type)

    # ---- config.json ----
    @classmethod
    def _from_hf_fields(cls, d: Mapping[str, Any], kwargs: dict[str, Any]) -> DebertaV2Config:
        """The config of config.json `d`; its `pooler_hidden_size` and `attention_head_size`,
        where given, must be what bert_jax builds (hidden_size, hidden_size / heads)."""
        config = cls(**kwargs)
        derived = config._hf_derived()
        for key, built in (
            ("pooler_hidden_size", derived["pooler_hidden_size"]),
            ("attention_head_size", config.head_dim),
        ):
            if d.get(key) not in (None, built):
                raise ValueError(
                    f"config.json has {key}={d[key]!r}; DeBERTa-v2 is implemented with "
                    f"{key}={built} only"
                )
        return config

    def _hf_derived(self) -> dict[str, Any]:
        """transformers' `pooler_hidden_size` (the ContextPooler's width, hidden_size), and
        pos_att_type as the list transformers' strict config class takes."""
        return {"pooler_hidden_size": self.hidden_size, "pos_att_type": list(self.pos_att_type)}
