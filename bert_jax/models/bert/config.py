"""BERT's architecture (`BertConfig`), with Hugging Face `config.json` field names, and its sizes.

`BertConfig` holds exactly what a checkpoint needs to be rebuilt, so a config round-trips through
HF's `config.json` and google-research/bert's `bert_config.json`. It is frozen: hashable, so
modules can hold it and `jax.jit` can close over it. `PRESETS` are the published sizes (tiny to
large and the 24 miniatures), by name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from bert_jax.models.config import PostLNConfig, bert_size, write_json
from bert_jax.paths import as_path

# Fields of google-research/bert's `bert_config.json`, in the order it writes them.
_ORIGINAL_FIELDS = (
    "attention_probs_dropout_prob",
    "hidden_act",
    "hidden_dropout_prob",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "type_vocab_size",
    "vocab_size",
)

# The 24 miniatures (L layers x H wide), then the named sizes; every one `bert_size`'s shape.
PRESETS: dict[str, dict[str, int]] = {
    **{
        f"L{layers}-H{hidden}": bert_size(layers, hidden)
        for layers in (2, 4, 6, 8, 10, 12)
        for hidden in (128, 256, 512, 768)
    },
    "tiny": bert_size(2, 128),
    "mini": bert_size(4, 256),
    "small": bert_size(4, 512),
    "medium": bert_size(8, 512),
    "base": bert_size(12, 768),
    "large": bert_size(24, 1024),
}


@dataclasses.dataclass(frozen=True)
class BertConfig(PostLNConfig):
    """The BERT architecture, with Hugging Face `config.json` field names: the fields of
    `models.config.PostLNConfig` (transformers' BertConfig defaults are its own) and

    Attributes:
      classifier_dropout: dropout before classification heads; None means hidden_dropout_prob.
    """

    model_type: ClassVar[str] = "bert"  # config.json's; the family's name
    display_name: ClassVar[str] = "BERT"
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = PRESETS
    hf_fixed: ClassVar[Mapping[str, Any]] = {"position_embedding_type": "absolute"}
    optional_dropouts: ClassVar[tuple[str, ...]] = ("classifier_dropout",)
    classifier_dropout: float | None = None

    # ---- presets ----
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A named size: "base", "large", "tiny", "mini", "small", "medium", or a miniature.

        The 24 BERT miniatures (Turc et al. 2019) are "L{2,4,6,8,10,12}-H{128,256,512,768}", with
        H/64 heads and a 4H feed-forward layer; google's file names such as "uncased_L-4_H-512_A-8"
        are accepted too.
        """
        key = name.lower()
        m = re.fullmatch(r"(?:bert-)?(?:(?:un)?cased_)?l-?(\d+)[_-]h-?(\d+)(?:[_-]a-?\d+)?", key)
        if m:
            key = f"l{m.group(1)}-h{m.group(2)}"
        return cls(**{**cls._preset_fields(cls.presets, name, key), **overrides})

    # ---- google-research/bert bert_config.json ----
    @classmethod
    def from_original_dict(cls, d: Mapping[str, Any]) -> BertConfig:
        """A config from google-research/bert's `bert_config.json` dict (no pad id; eps 1e-12)."""
        missing = [k for k in _ORIGINAL_FIELDS if k not in d]
        if missing:
            raise ValueError(f"bert_config.json lacks {missing}")
        return cls(**{k: d[k] for k in _ORIGINAL_FIELDS})

    def to_original_dict(self) -> dict[str, Any]:
        """The dict of google-research/bert's `bert_config.json`."""
        if self.hidden_act in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(
                f"BertConfig.hidden_act={self.hidden_act!r} (the tanh GELU) cannot be written to "
                "a bert_config.json unambiguously: google-research/bert reads its 'gelu' as the "
                "erf GELU in its 2018 release and as the tanh form in its code since February "
                "2019. Write a Hugging Face config.json instead (it keeps 'gelu_new'), or write "
                "hidden_act='gelu' and load it back with hidden_act='gelu_new' "
                "(python -m bert_jax.convert --hidden-act gelu_new)"
            )
        if self.hidden_act not in ("gelu", "relu"):
            raise ValueError(
                f"BertConfig.hidden_act={self.hidden_act!r} has no google-research/bert name "
                "(bert_config.json knows 'gelu' and 'relu')"
            )
        return {k: getattr(self, k) for k in _ORIGINAL_FIELDS}

    # ---- files ----
    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> BertConfig:
        """Reads an HF `config.json` or an original `bert_config.json` (told apart by content),
        local or at a URL (`etils.epath`)."""
        path = as_path(path)
        if path.is_dir():
            for name in ("config.json", "bert_config.json"):
                if (path / name).exists():
                    path = path / name
                    break
            else:
                raise FileNotFoundError(f"no config.json or bert_config.json in {path}")
        if not path.exists():
            raise FileNotFoundError(f"config file not found: {path}")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        if not isinstance(d, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        if "model_type" in d or "pad_token_id" in d or "layer_norm_eps" in d:
            return cls.from_hf_dict(d)
        missing = [k for k in _ORIGINAL_FIELDS if k not in d]
        if missing:
            raise ValueError(
                f"{path} is no model config: it has no model_type, and as google-research/bert's "
                f"bert_config.json it lacks {missing}"
            )
        return cls.from_original_dict(d)

    def to_json_file(self, path: str | os.PathLike, *, original: bool = False, architecture=None):
        """Writes HF `config.json`, or the original `bert_config.json` when `original=True`."""
        write_json(path, self.to_original_dict() if original else self.to_hf_dict(architecture))
