"""ELECTRA's architecture (`ElectraConfig`), with its Hugging Face `config.json` fields, and the
released sizes.

ELECTRA (Clark et al. 2020, arXiv 2003.10555) is BERT's encoder trained as a discriminator of
replaced tokens, with a smaller generator (a masked LM) making the replacements. Its embeddings
may be narrower than the layers (`embedding_size` M < `hidden_size` E: ELECTRA-small's 128 and
256), projected to E by `embeddings_project`; the generator shares the discriminator's embedding
tables, so the two have the same M and differ in their layers (google-research/electra's
generator is a quarter to a third of the discriminator's width). One config describes one of
them: a generator's config is its own (google/electra-base-generator's config.json, hidden 256,
beside google/electra-base-discriminator's 768).

`ElectraConfig` holds exactly what a checkpoint needs to be rebuilt, is frozen (hashable) and
checks every field on construction; defaults are transformers' class defaults (ELECTRA-small's
discriminator), `PRESETS` the released sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import ACTIVATIONS, LAYER_SIZES, PostLNConfig, bert_size

# How the multiple-choice head summarizes a sequence (transformers' ElectraSequenceSummary):
# its first token's state, its last position's (a pad in a right-padded row, as transformers
# reads it) or the mean over every position (padding included, as transformers computes it).
SUMMARY_TYPES = ("first", "last", "mean")
# The summary's activation: one of the layers' (`ACTIVATIONS`), tanh, or "" for none.
SUMMARY_ACTIVATIONS = (*ACTIVATIONS, "tanh")

# Named sizes (`ElectraConfig.preset`): google-research/electra's released discriminators
# (google/electra-{small,base,large}-discriminator), and "tiny" for CPU runs, BERT's tiny layers
# (2 x 128) under embeddings half as wide, so that `embeddings_project` is in every tiny model.
PRESETS: dict[str, dict[str, int]] = {
    "small": {**bert_size(12, 256), "embedding_size": 128},
    "base": {**bert_size(12, 768), "embedding_size": 768},
    "large": {**bert_size(24, 1024), "embedding_size": 1024},
    "tiny": {**bert_size(2, 128), "embedding_size": 64},
}


@dataclasses.dataclass(frozen=True)
class ElectraConfig(PostLNConfig):
    """The ELECTRA architecture (a discriminator or a generator), with Hugging Face `config.json`
    field names: the fields of `models.config.PostLNConfig` (transformers' ElectraConfig
    defaults are ELECTRA-small's layers) and ELECTRA's own.

    Attributes:
      vocab_size: V, rows of the word-embedding table (and columns of the generator's logits);
        with `vocab_pad_multiple`, the table and the generator's output bias have
        `padded_vocab_size` rows.
      embedding_size: M, width of the embedding tables and of the generator head's output (the
        tied decoder's input); projected to E by `embeddings_project` when it differs from E.
      hidden_act: the layers' and the discriminator head's activation; "gelu" is the exact erf
        GELU (google-research/electra's too). The generator head's and the classification head's
        activation is always the exact GELU, as in transformers.
      hidden_dropout_prob: as PostLNConfig's, and (unless `classifier_dropout`) in the
        classification heads.
      summary_type: how the multiple-choice head reads a sequence (`SUMMARY_TYPES`).
      summary_use_proj: the multiple-choice head's summary has a dense layer E -> E.
      summary_activation: the summary's activation (`SUMMARY_ACTIVATIONS`), "" for none (as
        transformers 5 spells it; None, transformers 4's null, is taken as "").
      summary_last_dropout: dropout after the summary's activation.
      classifier_dropout: dropout of the classification heads; None means hidden_dropout_prob.
    """

    model_type: ClassVar[str] = "electra"  # config.json's; the family's name
    display_name: ClassVar[str] = "ELECTRA"
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    hf_fixed: ClassVar[Mapping[str, Any]] = {"position_embedding_type": "absolute"}
    hidden_size: int = 256
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    embedding_size: int = 128
    summary_type: str = "first"
    summary_use_proj: bool = True
    summary_activation: str = "gelu"
    summary_last_dropout: float = 0.1
    classifier_dropout: float | None = None

    def __post_init__(self):
        self._check_layers(
            sizes=(*LAYER_SIZES[:2], "embedding_size", *LAYER_SIZES[2:]),
            probabilities=("classifier_dropout", "summary_last_dropout"),
            bools=("summary_use_proj",),
            optional=("classifier_dropout",),  # None: hidden_dropout_prob
        )
        if self.summary_type not in SUMMARY_TYPES:
            self._fail(
                "summary_type",
                self.summary_type,
                f"expected one of {SUMMARY_TYPES} (transformers' 'cls_index' and 'attn' are "
                "not implemented)",
            )
        if self.summary_activation is None:  # transformers 4's "none"
            object.__setattr__(self, "summary_activation", "")
        if self.summary_activation and self.summary_activation not in SUMMARY_ACTIVATIONS:
            self._fail(
                "summary_activation",
                self.summary_activation,
                f"expected '' (none) or one of {SUMMARY_ACTIVATIONS}",
            )
        self._check_ids_and_labels()

    # ---- derived sizes ----
    @property
    def projects_embeddings(self) -> bool:
        """Whether the embeddings are projected to E (`embeddings_project`): M != E."""
        return self.embedding_size != self.hidden_size

    @classmethod
    def _from_hf_fields(cls, d: Mapping[str, Any], kwargs: dict[str, Any]) -> ElectraConfig:
        """A null `summary_activation` in config.json (transformers 4's) is no activation, not
        the field's default."""
        if "summary_activation" in d and d["summary_activation"] is None:
            kwargs["summary_activation"] = ""
        return cls(**kwargs)
