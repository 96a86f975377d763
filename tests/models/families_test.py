"""The registry read by role: every row's roles, the objectives' heads in every family, a class
name of one family standing for its role in another, and config.json through transformers.

Parametrized over `families.FAMILIES`, so a family added later is covered with no edit here.
"""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import pytest

from bert_jax.models import families, heads
from bert_jax.models.family import Role
from bert_jax.models.params import init_params
from bert_jax.training import objectives

ROWS = sorted(families.FAMILIES)
# Small sizes every family's config takes (ModernBERT's head size is even; RoBERTa's position
# table keeps room for its pad id + 1 first rows with the pad id at 90).
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=128,
)


def tiny_config(model_type: str):
    cls = families.FAMILIES[model_type].config_class
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in TINY.items() if k in names}
    if "local_attention" in names:
        fields["local_attention"] = 8
    if cls().pad_token_id >= TINY["vocab_size"]:  # ModernBERT's [PAD] is 50283
        fields["pad_token_id"] = 0
    return cls(**fields)


@pytest.mark.parametrize("model_type", ROWS)
def test_every_role_is_a_class_of_the_family(model_type):
    family = families.FAMILIES[model_type]
    assert next(iter(family.roles)) is Role.ENCODER
    assert family.base_model == family.roles[Role.ENCODER].__name__
    assert list(family.model_classes.values()) == list(family.roles.values())
    for role, cls in family.roles.items():
        assert isinstance(role, Role)
        assert family.head_for(role) == cls.__name__
        assert family.head_for(role.value) == cls.__name__  # the role's name
        assert family.role_of(cls.__name__) is role
        assert families.role_of(cls.__name__) is role  # the reverse lookup of the registry
        assert families.get_model_class(cls.__name__) is cls


# The tasks of the families, each one shared class of `models.heads` on the family's hooks
# (NomicBERT has no multiple-choice or question-answering head: transformers has none).
SHARED_TASKS = {
    Role.SEQUENCE_CLASSIFICATION: heads.SequenceClassification,
    Role.MULTIPLE_CHOICE: heads.MultipleChoice,
    Role.TOKEN_CLASSIFICATION: heads.TokenClassification,
    Role.QUESTION_ANSWERING: heads.QuestionAnswering,
}


@pytest.mark.parametrize("model_type", ROWS)
def test_task_heads_are_the_shared_ones(model_type):
    """A family's classifiers and QA head are `models.heads`' task classes, never a copy: the
    family states only its hooks (its layers where they differ from BERT's) on its head base."""
    family = families.FAMILIES[model_type]
    for role, task in SHARED_TASKS.items():
        if role not in family.roles:  # EuroBERT: transformers has no QA or multiple-choice head
            continue
        cls = family.roles[role]
        assert issubclass(cls, task) and issubclass(cls, heads.Head), cls.__name__
        own = [c for c in cls.__mro__ if "head" in vars(c) and c is not heads.Head]
        assert own[0] is task, (
            f"{cls.__name__}'s head is {own[0].__name__}'s, not {task.__name__}'s"
        )


def test_the_rows_are_every_family_folders():
    folders = {f.config_class.__module__.rsplit(".", 1)[0] for f in families.FAMILIES.values()}
    assert {f"bert_jax.models.{n}" for n in ("bert", "modernbert", "roberta")} <= folders
    assert list(families.FAMILIES)[0] == families.DEFAULT_MODEL_TYPE == "bert"
    for model_type, family in families.FAMILIES.items():
        assert family.model_type == family.config_class.model_type == model_type


OBJECTIVES = sorted(objectives.OBJECTIVES)


@pytest.mark.parametrize("model_type", ROWS)
@pytest.mark.parametrize("name", OBJECTIVES)
def test_an_objectives_role_resolves_or_fails_naming_the_roles(model_type, name):
    family = families.FAMILIES[model_type]
    role = objectives.get_objective(name).role
    assert isinstance(role, Role)
    config = tiny_config(model_type)
    if role in family.roles:
        head = family.head_for(role)
        assert families.head_in_family(config, role) == head
        assert families.get_model_class(head) is family.roles[role]
    else:
        with pytest.raises(ValueError, match=f"{model_type} has no {role.value} head") as e:
            family.head_for(role)
        for have, cls in family.roles.items():  # it names the roles the family has
            assert f"{have.value} ({cls.__name__})" in str(e.value)


def test_roberta_has_no_next_sentence_prediction():
    roberta = families.FAMILIES["roberta"]
    assert Role.NEXT_SENTENCE not in roberta.roles
    with pytest.raises(ValueError, match="roberta has no pretraining head; its roles: encoder"):
        roberta.head_for(objectives.get_objective("pretraining").role)
    assert roberta.head_for(objectives.get_objective("mlm").role) == "RobertaForMaskedLM"


@pytest.mark.parametrize("model_type", ROWS)
def test_a_class_name_of_another_family_is_refused_naming_the_familys_own(model_type):
    """Names never cross in silence: another family's class (every class of every other family)
    raises naming that family and this family's class for its role, or the roles it has; a role
    stands for the family's class."""
    family = families.FAMILIES[model_type]
    config = tiny_config(model_type)
    assert families.head_in_family(config, Role.ENCODER) == family.base_model
    assert family.head_for("encoder") == family.base_model
    mine = f"{re.escape(family.config_class.display_name)} \\({model_type}\\)"
    for other in families.FAMILIES.values():
        if other is family:
            continue
        theirs = f"{re.escape(other.config_class.display_name)} \\({other.model_type}\\)"
        for role, cls in other.roles.items():
            own = family.roles.get(role)
            instead = (
                f"its {role.value} head is {own.__name__}; pass that, or the role '{role.value}'"
                if own
                else f"it has no {role.value} head; its roles: encoder \\({family.base_model}\\)"
            )
            want = f"^{cls.__name__} is a class of {theirs}, but this model is {mine}: {instead}"
            with pytest.raises(ValueError, match=want):
                family.head_for(cls.__name__)
            with pytest.raises(ValueError, match=want):
                families.head_in_family(config, cls.__name__)
    with pytest.raises(ValueError, match="unknown model class 'BertForTranslation'"):
        family.head_for("BertForTranslation")


@pytest.mark.torch
@pytest.mark.parametrize("model_type", ROWS)
def test_every_class_can_be_verified_against_pytorch(model_type):
    """`convert --verify` checks every class of the family: against transformers' class of its
    name, or, for a head transformers lacks, against the family's reference
    (`FamilyConversion.reference_heads`), which only such a head has."""
    transformers = pytest.importorskip("transformers")
    family = families.FAMILIES[model_type]
    lacking = {name for name in family.model_classes if not hasattr(transformers, name)}
    assert lacking == {name for name, _ in family.conversion.reference_heads}, lacking


def test_no_role_and_no_class_raises_naming_the_classes():
    with pytest.raises(ValueError, match="unknown model class 'masked-lm'; known: "):
        families.role_of("masked-lm")
    assert families.role_of("masked_lm") is Role.MASKED_LM
    assert families.role_of(Role.ENCODER) is Role.ENCODER


@pytest.mark.parametrize("model_type", ROWS)
def test_config_json_round_trips(model_type, tmp_path):
    config = tiny_config(model_type).replace(num_labels=3, label_names=("a", "b", "c"))
    family = families.FAMILIES[model_type]
    config.to_json_file(tmp_path / "config.json", architecture=family.base_model)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == model_type
    assert written["architectures"] == [family.base_model]
    assert families.config_from_json_file(tmp_path) == config
    assert family.config_class.from_hf_dict(config.to_hf_dict()) == config


@pytest.mark.torch
@pytest.mark.parametrize("model_type", ROWS)
def test_transformers_reads_the_special_token_ids_we_write(model_type, tmp_path):
    """Every special-token id transformers' config class sets is written, and transformers'
    AutoConfig reads the config back with our values (made distinct from its defaults)."""
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoConfig.for_model(model_type).to_dict()
    special = sorted(k for k, v in theirs.items() if k.endswith("_token_id") and v is not None)
    assert "pad_token_id" in special
    config = tiny_config(model_type)
    ours = [f.name for f in dataclasses.fields(config) if f.name.endswith("_token_id")]
    assert set(special) <= set(ours), f"{model_type}'s config lacks {set(special) - set(ours)}"
    config = config.replace(**{name: 90 + i for i, name in enumerate(ours)})
    config.to_json_file(tmp_path / "config.json")
    written = json.loads((tmp_path / "config.json").read_text())
    read = transformers.AutoConfig.from_pretrained(tmp_path)
    assert read.model_type == model_type
    for name in ours:
        assert written[name] == getattr(config, name)
        assert getattr(read, name) == getattr(config, name), name
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        assert getattr(read, name) == getattr(config, name)
    assert families.config_from_hf_dict(read.to_dict()) == config


def test_a_task_class_whose_name_the_module_has_is_refused():
    """`heads.task_classes` declares each class in the family's module; a name already there
    (here BERT's own head base) is refused, naming it, and the module keeps what it had."""
    from bert_jax.models.bert import model as bert

    head = bert.BertHead
    with pytest.raises(ValueError, match="bert_jax.models.bert.model has BertHead already"):
        heads.declared("BertHead", (heads.SequenceClassification, head), None)
    assert bert.BertHead is head


# The families whose encoder's call has no token_type_ids (`takes_token_type_ids`).
WITHOUT_TOKEN_TYPE_IDS = [
    m
    for m in ROWS
    if not getattr(families.FAMILIES[m].roles[Role.ENCODER], "takes_token_type_ids", True)
]


def test_the_families_without_token_type_ids_are_the_final_norm_ones():
    assert WITHOUT_TOKEN_TYPE_IDS == ["eurobert", "modernbert"]


@pytest.mark.parametrize("model_type", WITHOUT_TOKEN_TYPE_IDS)
def test_a_head_of_a_family_without_token_type_ids_refuses_them_naming_it(model_type):
    """Every head of a family whose encoder takes no token_type_ids refuses them in one
    ValueError naming the family, and runs without them."""
    family = families.FAMILIES[model_type]
    cfg = tiny_config(model_type)
    for role, cls in family.roles.items():
        if role is Role.ENCODER:
            continue
        model = cls(cfg)
        params = init_params(model, jax.random.PRNGKey(0), 6)
        ids = jnp.ones((1, 2, 6) if model.choices else (1, 6), jnp.int32)
        model.apply({"params": params}, ids)  # no token types: fine
        with pytest.raises(ValueError) as err:
            model.apply({"params": params}, ids, token_type_ids=jnp.zeros_like(ids))
        assert str(err.value) == (
            f"{cls.__name__} takes no token_type_ids ({cfg.display_name} has none)"
        )
