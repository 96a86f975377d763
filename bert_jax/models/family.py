"""What a model family declares: the roles its classes play (`Role`) and its registry row
(`Family`).

A family's folder (`models/<family>/`) builds its rows from its own modules in its
`__init__.py` (`ROWS`), and `models.families` collects the rows of every folder. The shared
code asks a row for the class of a role (`Family.head_for(Role.MASKED_LM)`:
"BertForMaskedLM", "RobertaForMaskedLM", ...), never for a name built from strings.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import flax.linen as nn

from bert_jax.models.conversion import FamilyConversion


class Role(str, enum.Enum):
    """What a model class is for: the encoder alone, or the encoder under one kind of head.

    The values are the names a config or a command line may give ("masked_lm"). A family has a
    class for some of them (`Family.roles`); a family with another kind of head adds its role
    here.
    """

    ENCODER = "encoder"  # the bare encoder: transformers' *Model
    PRETRAINING = "pretraining"  # masked LM + next-sentence prediction: *ForPreTraining
    MASKED_LM = "masked_lm"  # *ForMaskedLM
    NEXT_SENTENCE = "next_sentence"  # *ForNextSentencePrediction
    SEQUENCE_CLASSIFICATION = "sequence_classification"  # *ForSequenceClassification
    TOKEN_CLASSIFICATION = "token_classification"  # *ForTokenClassification
    QUESTION_ANSWERING = "question_answering"  # *ForQuestionAnswering
    MULTIPLE_CHOICE = "multiple_choice"  # *ForMultipleChoice
    # The discriminator of replaced-token detection (ELECTRA): one logit per token, "this token
    # was replaced". ElectraForPreTraining; a family whose transformers classes have none
    # (DeBERTa-v3) names its own class.
    REPLACED_TOKEN_DETECTION = "replaced_token_detection"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Family:
    """One architecture: its `config.json` model_type, config class and model classes by role.

    Attributes:
      model_type: the `model_type` of its Hugging Face config.json.
      config_class: its frozen config dataclass (an `EncoderConfig`: `from_hf_dict`,
        `to_hf_dict`, `to_json_file`).
      roles: {role: Flax module class} of every class it has, the encoder first; the classes
        are named like their Hugging Face counterparts ("BertForMaskedLM").
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
      family_of_class: the registry's lookup of the family of any family's class name (raising
        for a name no family has), which `models.families` gives the rows it collects, so that
        `head_for` can name another family's class as such; a row without it (a folder's own
        `ROWS`, before the registry) refuses every name it lacks as unknown.
    """

    model_type: str
    config_class: type
    roles: Mapping[Role, type[nn.Module]]
    encoder_name: str
    layers_path: tuple[str, ...]
    layer_name: str
    scanned_layer: str | None
    starting_paths: Mapping[str, tuple[str, ...]]
    encoder_flops: Callable[[Any, Any], float]
    conversion: FamilyConversion
    family_of_class: Callable[[str], Family] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )

    @classmethod
    def of(cls, config_class: type, model, flops, conversion: FamilyConversion, roles=None):
        """The row of a family folder's modules: `config_class` (its `model_type` names the
        row), `model` (the module holding `ROLES`, `ENCODER_NAME`, `LAYERS_PATH`, `LAYER_NAME`,
        `SCANNED_LAYER` and `STARTING_PATHS`), `flops` (`encoder_forward_flops`) and its
        `conversion`; `roles` in place of `model.ROLES` (XLM-RoBERTa's names of RoBERTa's)."""
        return cls(
            config_class.model_type,
            config_class,
            model.ROLES if roles is None else roles,
            model.ENCODER_NAME,
            layers_path=model.LAYERS_PATH,
            layer_name=model.LAYER_NAME,
            scanned_layer=model.SCANNED_LAYER,
            starting_paths=model.STARTING_PATHS,
            encoder_flops=flops.encoder_forward_flops,
            conversion=conversion,
        )

    def __post_init__(self):
        if next(iter(self.roles), None) is not Role.ENCODER:
            raise ValueError(f"{self.model_type}: its roles must start with Role.ENCODER")

    @property
    def model_classes(self) -> dict[str, type[nn.Module]]:
        """{Hugging Face class name: Flax module class}, the encoder first."""
        return {cls.__name__: cls for cls in self.roles.values()}

    @property
    def base_model(self) -> str:
        """The encoder's class name ("BertModel", "ModernBertModel")."""
        return self.roles[Role.ENCODER].__name__

    def role_of(self, name: str) -> Role | None:
        """The role of this family's class `name`, or None when it has no class of that name."""
        return next((r for r, cls in self.roles.items() if cls.__name__ == name), None)

    def head_for(self, role: Role | str) -> str:
        """This family's class name for `role` (Role.MASKED_LM -> "ModernBertForMaskedLM").

        Args:
          role: a `Role`, its value ("masked_lm"), or a class name of this family (itself).

        Raises:
          ValueError: `role` is a class of another family (naming that family and this
            family's class for the role: names never cross silently); the family has no class
            for the role, naming the roles it has; `role` is no role and no class of any family.
        """
        if not isinstance(role, Role):
            if self.role_of(role) is not None:
                return role
            if role not in Role._value2member_map_:
                self._refuse_other_family(role)
            role = Role(role)
        cls = self.roles.get(role)
        if cls is None:
            raise ValueError(
                f"{self.model_type} has no {role.value} head; its roles: {self._roles_text()}"
            )
        return cls.__name__

    def _roles_text(self) -> str:
        return ", ".join(f"{r.value} ({c.__name__})" for r, c in self.roles.items())

    def _refuse_other_family(self, name: str) -> NoReturn:
        """Raises for `name`, a class name this family lacks: another family's class (naming
        that family and this one's class for its role), or no class of any family."""
        if self.family_of_class is None:
            raise ValueError(
                f"unknown model class {name!r} for {self.model_type}; its roles: "
                f"{self._roles_text()}"
            )
        other = self.family_of_class(name)  # raises for a name no family has
        role = other.role_of(name)
        ours = self.roles.get(role)
        mine = f"{self.config_class.display_name} ({self.model_type})"
        instead = (
            f"its {role.value} head is {ours.__name__}; pass that, or the role {role.value!r}"
            if ours is not None
            else f"it has no {role.value} head; its roles: {self._roles_text()}"
        )
        raise ValueError(
            f"{name} is a class of {other.config_class.display_name} ({other.model_type}), but "
            f"this model is {mine}: {instead}"
        )
