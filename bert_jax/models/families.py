"""Model families: a checkpoint's names pick its architecture's config and model classes.

A family is one config class (Hugging Face `config.json` fields), one model module (its
encoder and heads, named like transformers' classes) and its rows here; its parameter names for
conversion live in its folder (`models/<family>/conversion.py`, the row's `conversion`).
Attention kernels, sharding rules, objectives, steps and the loop are shared.

  model_type (config.json)   config             model module           head classes
  "bert"                     BertConfig         bert_jax.models.bert.model         Bert*
  "modernbert"               ModernBertConfig   bert_jax.models.modernbert.model    ModernBert*

Jobs and conversion go through this module: `config_from_hf_dict` / `config_from_json_file`
(by `model_type`), `get_model_class` (by class name), `family_of` (by config).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import flax.linen as nn

from bert_jax.models.bert import conversion as bert_conversion
from bert_jax.models.bert import model
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.conversion import FamilyConversion
from bert_jax.models.modernbert import conversion as modernbert_conversion
from bert_jax.models.modernbert import model as modernbert
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.paths import as_path

ModelConfig = BertConfig | ModernBertConfig


@dataclasses.dataclass(frozen=True)
class Family:
    """One architecture: its `config.json` model_type, config class and model classes by name.

    Attributes:
      model_type: the `model_type` of its Hugging Face config.json.
      config_class: its frozen config dataclass (`from_hf_dict`, `to_hf_dict`, `to_json_file`).
      model_classes: {Hugging Face class name: Flax module class}, the encoder first.
      conversion: its names and layouts in Hugging Face and TF checkpoints.
    """

    model_type: str
    config_class: type
    model_classes: Mapping[str, type[nn.Module]]
    encoder_name: str  # the heads' encoder submodule: params[encoder_name] are the base model's
    conversion: FamilyConversion | None = None

    @property
    def base_model(self) -> str:
        """The encoder's class name ("BertModel", "ModernBertModel")."""
        return next(iter(self.model_classes))

    def head_for(self, bert_head: str) -> str:
        """This family's class for the role of the BERT head `bert_head` (objectives name BERT's:
        "BertForMaskedLM" -> "ModernBertForMaskedLM"); a role it has no class for raises."""
        name = self.base_model.removesuffix("Model") + bert_head.removeprefix("Bert")
        if name not in self.model_classes:
            raise ValueError(
                f"{self.model_type} has no {bert_head.removeprefix('Bert')} head ({name}); "
                f"its heads: {sorted(self.model_classes)}"
            )
        return name


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("bert", BertConfig, model.MODEL_CLASSES, "bert", bert_conversion.CONVERSION),
        Family(
            "modernbert",
            ModernBertConfig,
            modernbert.MODEL_CLASSES,
            "model",
            # No TF checkpoints (`tf_config_file` empty); its table rows keep the TF names they
            # have always had (google-research/bert's), which nothing reads.
            dataclasses.replace(modernbert_conversion.CONVERSION, **bert_conversion.TF_NAMES),
        ),
    )
}
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    name: cls for f in FAMILIES.values() for name, cls in f.model_classes.items()
}


def family_of(config: ModelConfig) -> Family:
    """The family of a config instance."""
    for family in FAMILIES.values():
        if isinstance(config, family.config_class):
            return family
    raise TypeError(f"{type(config).__name__} is no model family's config")


def family_of_model(name: str) -> Family:
    """The family of a head class name ("ModernBertForMaskedLM" -> modernbert)."""
    for family in FAMILIES.values():
        if name in family.model_classes:
            return family
    raise ValueError(f"unknown model class {name!r}; known: {sorted(MODEL_CLASSES)}")


def head_in_family(config: ModelConfig, name: str) -> str:
    """`name` if it is a class of `config`'s family, else the family's class for the role of
    the BERT class `name` ("BertModel" for a ModernBERT config -> "ModernBertModel")."""
    family = family_of(config)
    if name in family.model_classes:
        return name
    family_of_model(name)  # an unknown name raises
    return family.head_for(name)


def get_model_class(name: str) -> type[nn.Module]:
    """The head class named like its Hugging Face counterpart, of any family."""
    return family_of_model(name).model_classes[name]


def config_from_hf_dict(d: Mapping[str, Any]) -> ModelConfig:
    """The config of a Hugging Face `config.json` dict, of the family its `model_type` names
    (BERT when it names none)."""
    model_type = d.get("model_type", "bert")
    if model_type not in FAMILIES:
        raise ValueError(
            f"config.json has model_type={model_type!r}; bert_jax knows {sorted(FAMILIES)}"
        )
    return FAMILIES[model_type].config_class.from_hf_dict(d)


def config_from_fields(fields: Mapping[str, Any]) -> ModelConfig:
    """The config of an experiment's `model` block: its family's config fields, plus
    `model_type` naming the family (BERT when absent)."""
    fields = dict(fields)
    model_type = fields.pop("model_type", "bert")
    if model_type not in FAMILIES:
        raise ValueError(f"model.model_type={model_type!r}; bert_jax knows {sorted(FAMILIES)}")
    return FAMILIES[model_type].config_class(**fields)


def model_fields(config: ModelConfig) -> dict[str, Any]:
    """The `model` block of an experiment config for `config` (`config_from_fields`'s input):
    its fields but label_names, and `model_type` for a family other than BERT."""
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k != "label_names"}
    family = family_of(config)
    return fields if family.model_type == "bert" else {"model_type": family.model_type, **fields}


def config_from_json_file(path: str | os.PathLike) -> ModelConfig:
    """Reads a `config.json` (or the directory holding one) of any family; a BERT directory may
    hold google-research/bert's `bert_config.json` instead (`BertConfig.from_json_file`). Local
    or at a URL (`etils.epath`)."""
    path = as_path(path)
    file = path / "config.json" if path.is_dir() else path
    if file.exists():
        try:
            d = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            d = None  # BertConfig names the error
        if isinstance(d, dict) and d.get("model_type", "bert") != "bert":
            return config_from_hf_dict(d)
    return BertConfig.from_json_file(path)
