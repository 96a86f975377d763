"""Model families: the registry of every family's rows, and the lookups that read it.

A family is one folder, `models/<family>/` (what it holds: docs/architecture.md, "A model
family"); its `__init__.py` builds its rows (`ROWS`, `models.family.Family`). This module finds
the folders (every subpackage of `bert_jax.models` with `ROWS`), so a new family edits nothing
here.

  model_type (config.json)   config             model module           head classes
  "bert"                     BertConfig         bert_jax.models.bert.model         Bert*
  "modernbert"               ModernBertConfig   bert_jax.models.modernbert.model    ModernBert*
  "roberta"                  RobertaConfig      bert_jax.models.roberta.model       Roberta*
  "xlm-roberta"              XLMRobertaConfig   bert_jax.models.roberta.model       XLMRoberta*
  "electra"                  ElectraConfig      bert_jax.models.electra.model       Electra*
  "deberta-v2"               DebertaV2Config    bert_jax.models.deberta_v2.model    DebertaV2*

A test registers a family of its own for a `with` block (`registered`). Jobs and conversion go
through this module: `config_from_hf_dict` / `config_from_json_file`
(by `model_type`), `get_model_class` (by class name), `family_of` (by config), `head_in_family`
(a role, or a class name of the config's family; another family's class name is refused).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import pkgutil
from collections.abc import Iterator, Mapping
from typing import Any

import flax.linen as nn

import bert_jax.models
from bert_jax.models.config import EncoderConfig
from bert_jax.models.family import Family, Role
from bert_jax.paths import as_path

__all__ = ["FAMILIES", "EncoderConfig", "Family", "Role"]


def _discover() -> dict[str, Family]:
    """The rows of every family folder: each subpackage of `bert_jax.models` that declares
    `ROWS`, in the order of the folders' names."""
    rows: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(bert_jax.models.__path__), key=lambda m: m.name):
        if not info.ispkg:
            continue
        package = importlib.import_module(f"{bert_jax.models.__name__}.{info.name}")
        for family in getattr(package, "ROWS", ()):
            if family.model_type in rows:
                raise ValueError(f"two families register model_type {family.model_type!r}")
            # The registry's rows know the other families' classes (`Family.head_for`).
            rows[family.model_type] = dataclasses.replace(family, family_of_class=family_of_model)
    return rows


def family_of_model(name: str) -> Family:
    """The family of a head class name ("ModernBertForMaskedLM" -> modernbert)."""
    for family in FAMILIES.values():
        if name in family.model_classes:
            return family
    raise ValueError(f"unknown model class {name!r}; known: {sorted(MODEL_CLASSES)}")


FAMILIES: dict[str, Family] = _discover()
# The family of a config.json or an experiment's `model` block that names no model_type.
DEFAULT_MODEL_TYPE = "bert"
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    name: cls for f in FAMILIES.values() for name, cls in f.model_classes.items()
}


@contextlib.contextmanager
def registered(*rows: Family) -> Iterator[None]:
    """The registry with `rows` added for the `with` block, then as it was: a family defined
    outside `bert_jax.models` (a test's, built from the shared blocks) is looked up like any
    folder's meanwhile. A model_type or class name already registered raises."""
    for family in rows:
        if family.model_type in FAMILIES:
            raise ValueError(f"model_type {family.model_type!r} is registered already")
        clash = sorted(set(family.model_classes) & set(MODEL_CLASSES))
        if clash:
            raise ValueError(f"{family.model_type}: classes {clash} are registered already")
    try:
        for family in rows:  # knowing the other families' classes, as a folder's rows do
            FAMILIES[family.model_type] = dataclasses.replace(
                family, family_of_class=family_of_model
            )
            MODEL_CLASSES.update(family.model_classes)
        yield
    finally:
        for family in rows:
            FAMILIES.pop(family.model_type, None)
            for name in family.model_classes:
                MODEL_CLASSES.pop(name, None)


def family_of(config: EncoderConfig) -> Family:
    """The family of a config instance: the row of its class's `model_type` (an XLMRobertaConfig
    is a RobertaConfig, and its family is XLM-RoBERTa's)."""
    family = FAMILIES.get(getattr(type(config), "model_type", None))
    if family is None or not isinstance(config, family.config_class):
        raise TypeError(f"{type(config).__name__} is no model family's config")
    return family


def role_of(head: Role | str) -> Role:
    """The role `head` names: a `Role`, a role's value ("masked_lm"), or a class name of any
    family, whose role is looked up in its family's table ("BertModel" -> Role.ENCODER).

    Raises:
      ValueError: `head` is no role and no class of any family (naming the known ones).
    """
    if isinstance(head, Role):
        return head
    if head in Role._value2member_map_:
        return Role(head)
    family = family_of_model(head)
    return family.role_of(head)


def head_in_family(config: EncoderConfig, head: Role | str) -> str:
    """The class name of `config`'s family for `head`: a role (Role.ENCODER for a ModernBERT
    config -> "ModernBertModel"), or a class of the family (itself). A class of another family
    ("BertModel" for a ModernBERT config) raises, naming the family's own class for its role;
    a role the family lacks raises, naming the roles it has (`Family.head_for`)."""
    return family_of(config).head_for(head)


def check_head(head: Role | str) -> Role | str:
    """`head` when it is a role or a class of some family; else raises naming the classes."""
    role_of(head)
    return head


def get_model_class(name: str) -> type[nn.Module]:
    """The head class named like its Hugging Face counterpart, of any family."""
    return family_of_model(name).model_classes[name]


def config_from_hf_dict(d: Mapping[str, Any]) -> EncoderConfig:
    """The config of a Hugging Face `config.json` dict, of the family its `model_type` names
    (BERT when it names none)."""
    model_type = d.get("model_type", DEFAULT_MODEL_TYPE)
    if model_type not in FAMILIES:
        raise ValueError(
            f"config.json has model_type={model_type!r}; bert_jax knows {sorted(FAMILIES)}"
        )
    return FAMILIES[model_type].config_class.from_hf_dict(d)


def config_from_fields(fields: Mapping[str, Any]) -> EncoderConfig:
    """The config of an experiment's `model` block: its family's config fields, plus
    `model_type` naming the family (BERT when absent)."""
    fields = dict(fields)
    model_type = fields.pop("model_type", DEFAULT_MODEL_TYPE)
    if model_type not in FAMILIES:
        raise ValueError(f"model.model_type={model_type!r}; bert_jax knows {sorted(FAMILIES)}")
    return FAMILIES[model_type].config_class(**fields)


def model_fields(config: EncoderConfig) -> dict[str, Any]:
    """The `model` block of an experiment config for `config` (`config_from_fields`'s input):
    its fields but label_names, and `model_type` for a family other than BERT."""
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k != "label_names"}
    model_type = family_of(config).model_type
    return fields if model_type == DEFAULT_MODEL_TYPE else {"model_type": model_type, **fields}


def config_from_json_file(path: str | os.PathLike) -> EncoderConfig:
    """Reads a `config.json` (or the directory holding one) of any family; a BERT directory may
    hold google-research/bert's `bert_config.json` instead (the default family's
    `from_json_file`: BERT's). Local or at a URL (`etils.epath`)."""
    path = as_path(path)
    file = path / "config.json" if path.is_dir() else path
    if file.exists():
        try:
            d = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            d = None  # the default family's reader names the error
        if isinstance(d, dict) and d.get("model_type", DEFAULT_MODEL_TYPE) != DEFAULT_MODEL_TYPE:
            return config_from_hf_dict(d)
    return FAMILIES[DEFAULT_MODEL_TYPE].config_class.from_json_file(path)
