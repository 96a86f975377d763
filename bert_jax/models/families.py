"""Model families: a checkpoint's names pick its architecture's config and model classes.

A family is one folder, `models/<family>/`: its config class (Hugging Face `config.json`
fields) and its model module (its encoder and heads, named like transformers' classes, and the
facts about its parameter tree the row below reads: layer names, starting-value paths), plus
its row here, and its encoder's FLOPs (`flops.py`); its names in Hugging Face and TF checkpoints
(`conversion.py`, the row's `conversion`).
Attention kernels, blocks, heads' call, sharding rules, objectives, steps and the loop are
shared, and read the family's row where they need a fact of it.

  model_type (config.json)   config             model module           head classes
  "bert"                     BertConfig         bert_jax.models.bert.model         Bert*
  "modernbert"               ModernBertConfig   bert_jax.models.modernbert.model    ModernBert*
  "roberta"                  RobertaConfig      bert_jax.models.roberta.model       Roberta*
  "xlm-roberta"              XLMRobertaConfig   bert_jax.models.roberta.model       XLMRoberta*

Jobs and conversion go through this module: `config_from_hf_dict` / `config_from_json_file`
(by `model_type`), `get_model_class` (by class name), `family_of` (by config).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn

from bert_jax.models.bert import conversion as bert_conversion
from bert_jax.models.bert import flops as bert_flops
from bert_jax.models.bert import model
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.conversion import FamilyConversion
from bert_jax.models.modernbert import conversion as modernbert_conversion
from bert_jax.models.modernbert import flops as modernbert_flops
from bert_jax.models.modernbert import model as modernbert
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.roberta import conversion as roberta_conversion
from bert_jax.models.roberta import flops as roberta_flops
from bert_jax.models.roberta import model as roberta
from bert_jax.models.roberta.config import RobertaConfig, XLMRobertaConfig
from bert_jax.paths import as_path

ModelConfig = BertConfig | ModernBertConfig | RobertaConfig


@dataclasses.dataclass(frozen=True)
class Family:
    """One architecture: its `config.json` model_type, config class and model classes by name.

    Attributes:
      model_type: the `model_type` of its Hugging Face config.json.
      config_class: its frozen config dataclass (`from_hf_dict`, `to_hf_dict`, `to_json_file`).
      model_classes: {Hugging Face class name: Flax module class}, the encoder first.
      encoder_name: the heads' encoder submodule: params[encoder_name] are the base model's.
      layers_path: the keys from the base model's tree to the dict holding its layers.
      layer_name: layer i's name there, `layer_name.format(i)`.
      scanned_layer: the name of the one layer stacked on a leading axis under `scan_layers`;
        None for a family whose layers are never scanned (`models.params.stack_layers`).
      starting_paths: {role: parameter path in its heads' trees} of the parameters a scratch
        pretraining run may start specially ("mlm_bias": the MLM decoder's output bias,
        "position_embeddings": the position table); a role it lacks is absent.
      encoder_flops: (config, real sequence lengths) -> the encoder's forward model FLOPs
        (`models/<family>/flops.py`; `training.flops` adds the heads and the backward pass).
      conversion: its names and layouts in Hugging Face and TF checkpoints
        (`models/<family>/conversion.py`; `checkpoints.table` reads them).
    """

    model_type: str
    config_class: type
    model_classes: Mapping[str, type[nn.Module]]
    encoder_name: str
    layers_path: tuple[str, ...]
    layer_name: str
    scanned_layer: str | None
    starting_paths: Mapping[str, tuple[str, ...]]
    encoder_flops: Callable[[Any, Any], float]
    conversion: FamilyConversion

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
        Family(
            "bert",
            BertConfig,
            model.MODEL_CLASSES,
            model.ENCODER_NAME,
            layers_path=model.LAYERS_PATH,
            layer_name=model.LAYER_NAME,
            scanned_layer=model.SCANNED_LAYER,
            starting_paths=model.STARTING_PATHS,
            encoder_flops=bert_flops.encoder_forward_flops,
            conversion=bert_conversion.CONVERSION,
        ),
        Family(
            "modernbert",
            ModernBertConfig,
            modernbert.MODEL_CLASSES,
            modernbert.ENCODER_NAME,
            layers_path=modernbert.LAYERS_PATH,
            layer_name=modernbert.LAYER_NAME,
            scanned_layer=modernbert.SCANNED_LAYER,
            starting_paths=modernbert.STARTING_PATHS,
            encoder_flops=modernbert_flops.encoder_forward_flops,
            # No TF checkpoints (`tf_config_file` empty); its table rows keep the TF names they
            # have always had (google-research/bert's), which nothing reads.
            conversion=dataclasses.replace(
                modernbert_conversion.CONVERSION, **bert_conversion.TF_NAMES
            ),
        ),
        # One architecture, two model_types: XLM-RoBERTa's rows are RoBERTa's but its config
        # class (a subclass, named by config.json's "xlm-roberta") and class names.
        *(
            Family(
                config_class.model_type,
                config_class,
                classes,
                roberta.ENCODER_NAME,
                layers_path=roberta.LAYERS_PATH,
                layer_name=roberta.LAYER_NAME,
                scanned_layer=roberta.SCANNED_LAYER,
                starting_paths=roberta.STARTING_PATHS,
                encoder_flops=roberta_flops.encoder_forward_flops,
                conversion=roberta_conversion.CONVERSION,
            )
            for config_class, classes in (
                (RobertaConfig, roberta.MODEL_CLASSES),
                (XLMRobertaConfig, roberta.XLM_MODEL_CLASSES),
            )
        ),
    )
}
# The family of a config.json or an experiment's `model` block that names no model_type.
DEFAULT_MODEL_TYPE = "bert"
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    name: cls for f in FAMILIES.values() for name, cls in f.model_classes.items()
}


def family_of(config: ModelConfig) -> Family:
    """The family of a config instance: the row of its class's `model_type` (an XLMRobertaConfig
    is a RobertaConfig, and its family is XLM-RoBERTa's)."""
    family = FAMILIES.get(getattr(type(config), "model_type", None))
    if family is None or not isinstance(config, family.config_class):
        raise TypeError(f"{type(config).__name__} is no model family's config")
    return family


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
    model_type = d.get("model_type", DEFAULT_MODEL_TYPE)
    if model_type not in FAMILIES:
        raise ValueError(
            f"config.json has model_type={model_type!r}; bert_jax knows {sorted(FAMILIES)}"
        )
    return FAMILIES[model_type].config_class.from_hf_dict(d)


def config_from_fields(fields: Mapping[str, Any]) -> ModelConfig:
    """The config of an experiment's `model` block: its family's config fields, plus
    `model_type` naming the family (BERT when absent)."""
    fields = dict(fields)
    model_type = fields.pop("model_type", DEFAULT_MODEL_TYPE)
    if model_type not in FAMILIES:
        raise ValueError(f"model.model_type={model_type!r}; bert_jax knows {sorted(FAMILIES)}")
    return FAMILIES[model_type].config_class(**fields)


def model_fields(config: ModelConfig) -> dict[str, Any]:
    """The `model` block of an experiment config for `config` (`config_from_fields`'s input):
    its fields but label_names, and `model_type` for a family other than BERT."""
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k != "label_names"}
    model_type = family_of(config).model_type
    return fields if model_type == DEFAULT_MODEL_TYPE else {"model_type": model_type, **fields}


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
        if isinstance(d, dict) and d.get("model_type", DEFAULT_MODEL_TYPE) != DEFAULT_MODEL_TYPE:
            return config_from_hf_dict(d)
    return BertConfig.from_json_file(path)
