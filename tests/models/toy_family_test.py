"""A family built only from the shared blocks (tests/models/toy_family.py: pre-norm, RMSNorm,
SwiGLU, grouped-query attention, rotary positions), registered for these tests alone
(`families.registered`), passes the checks of the suites that need no transformers twin, called
as every registered family's are: its roles and names (families_test), config.json both ways,
packed rows against one text a row, its saved directories read back (the loader; the
inference commands and texts cut to its positions with -m e2e) (conformance_test), the scanned stack against the unrolled one, and its
parameter count and FLOPs."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import families
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.params import count_params, init_params, stack_layers, unstack_layers
from bert_jax.training import objectives
from tests import conformance_test, family_fixtures
from tests.models import families_test, toy_family

MODEL_TYPE = toy_family.ToyConfig.model_type


@pytest.fixture(scope="module")
def toy():
    """The toy family's row in the registry for this module's tests, and out of it after."""
    with families.registered(toy_family.ROW):
        yield families.FAMILIES[MODEL_TYPE]
    assert MODEL_TYPE not in families.FAMILIES


def test_registering_adds_and_removes_the_row_and_refuses_a_taken_name():
    with families.registered(toy_family.ROW):
        assert families.get_model_class("ToyForMaskedLM") is toy_family.ToyForMaskedLM
        with pytest.raises(ValueError, match="model_type 'toy-prenorm' is registered already"):
            with families.registered(toy_family.ROW):
                pass
    assert MODEL_TYPE not in families.FAMILIES
    with pytest.raises(ValueError, match="unknown model class 'ToyForMaskedLM'"):
        families.get_model_class("ToyForMaskedLM")
    bert = dataclasses.replace(families.FAMILIES["bert"], model_type="bert-again")
    with pytest.raises(ValueError, match=r"classes \['BertForMaskedLM', .* registered already"):
        with families.registered(bert):
            pass


def test_roles_and_names_as_every_familys(toy):
    families_test.test_every_role_is_a_class_of_the_family(MODEL_TYPE)
    families_test.test_a_class_name_of_another_family_is_refused_naming_the_familys_own(MODEL_TYPE)
    for name in sorted(objectives.OBJECTIVES):
        families_test.test_an_objectives_role_resolves_or_fails_naming_the_roles(MODEL_TYPE, name)


def test_config_json_round_trips(toy, tmp_path):
    families_test.test_config_json_round_trips(MODEL_TYPE, tmp_path)
    written = toy_family.ToyConfig(rope_theta=77.0).to_hf_dict()
    assert written["rope_parameters"] == {"rope_type": "default", "rope_theta": 77.0}
    assert families.config_from_hf_dict(written).rope_theta == 77.0


@pytest.fixture(scope="module")
def fam(toy, tmp_path_factory) -> family_fixtures.FamilyDir:
    """The toy's masked LM on a WordPiece tokenizer of the fixtures' texts, saved as the
    suite saves every family's (a Hugging Face directory of its names)."""
    tokenizer = family_fixtures.wordpiece(family_fixtures.training_texts())
    config = toy_family.ToyConfig(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    head = family_fixtures.head_of(config, "mlm")
    path = tmp_path_factory.mktemp("toy")
    params = family_fixtures.save_model(config, tokenizer, head, path)
    return family_fixtures.FamilyDir(MODEL_TYPE, config, tokenizer, head, params, path)


@pytest.fixture(scope="module")
def classifier(fam, tmp_path_factory) -> family_fixtures.FamilyDir:
    config = fam.config.replace(num_labels=3, label_names=conformance_test.LABELS)
    head = family_fixtures.head_of(config, "classification")
    path = tmp_path_factory.mktemp("toy_classifier")
    params = family_fixtures.save_model(config, fam.tokenizer, head, path, seed=1)
    return dataclasses.replace(fam, config=config, head=head, params=params, path=path)


def test_packed_rows_equal_one_text_a_row(fam, classifier):
    conformance_test.test_packed_rows_equal_one_text_a_row(fam, classifier)


@pytest.mark.e2e  # the same shared code cuts every family's texts (conformance_test, by default)
def test_texts_longer_than_the_models_positions_are_cut_to_them(fam, classifier):
    conformance_test.test_texts_longer_than_the_models_positions_are_cut_to_them(fam, classifier)


def test_the_loader_reads_its_directory_and_refuses_another_familys_head(fam, tmp_path):
    conformance_test.test_from_pretrained_refuses_a_head_of_another_family(fam, tmp_path)


@pytest.mark.e2e  # 40 s here; every family runs the same commands in conformance_test
def test_the_inference_commands_read_its_directories(fam, classifier, tmp_path, capsys):
    """`python -m bert_jax.inference` attention, fill-mask and predict (in this process, where
    the row is registered) on its saved models, against the model applied directly."""
    conformance_test.test_attention_map_is_the_encoders(fam, tmp_path)
    capsys.readouterr()  # the map's "wrote" line: the next check reads the command's output
    conformance_test.test_fill_mask_gives_the_masked_lm_top_tokens(fam, capsys, "own")
    conformance_test.test_predict_gives_the_classifier_labels(classifier, tmp_path)


def test_scanned_layers_equal_unrolled(fam):
    """The stack scanned and rematerialized (its layers' weights stacked by the family's row)
    equals it unrolled: hidden states, attention maps and MLM logits of padded rows, and the
    gradients of a loss on them."""
    cls = toy_family.ToyForMaskedLM
    scanned = cls(fam.config, RuntimeConfig(scan_layers=True, remat_policy="full"))
    stacked = stack_layers(fam.params)
    assert stacked["model"]["layers"]["layer"]["mlp"]["gate_proj"]["kernel"].shape[0] == 2
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(np.array_equal, unstack_layers(stacked), fam.params)
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(5, fam.config.vocab_size, (3, 9))
    mask = (np.arange(9)[None] < np.array([[9], [5], [7]])).astype(np.int32)

    def outputs(model, params):
        out = model.apply(
            {"params": params}, ids, attention_mask=mask, output_hidden_states=True,
            output_attentions=True,
        )  # fmt: skip
        return out.logits, out.hidden_states, out.attentions

    def loss(model, params):
        logits = model.apply({"params": params}, ids, attention_mask=mask).logits
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 7])

    unrolled = cls(fam.config)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
        outputs(scanned, stacked),
        outputs(unrolled, fam.params),
    )
    grads = unstack_layers(jax.grad(lambda p: loss(scanned, p))(stacked))
    want = jax.grad(lambda p: loss(unrolled, p))(fam.params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, want)


def test_parameter_count_and_flops(toy):
    """Its parameters are what its blocks make: embeddings V E; per layer two RMSNorm scales,
    q and o E H D each, k and v E K D each, SwiGLU 3 E F; the final norm E. Every parameter
    carries logical axes; its FLOPs count the same projections."""
    cfg = toy_family.ToyConfig()
    params = init_params(toy_family.ToyModel(cfg), jax.random.PRNGKey(0))
    e, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    h, k = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = 2 * e + 2 * e * h * d + 2 * e * k * d + 3 * e * f
    assert count_params(params) == cfg.vocab_size * e + cfg.num_hidden_layers * per_layer + e
    boxed = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert all(isinstance(x, nn.Partitioned) for x in boxed)
    flops = toy.encoder_flops(cfg, np.array([9, 5]))
    matmuls = cfg.num_hidden_layers * (per_layer - 2 * e) * 2 * 14  # 14 real tokens
    attention = cfg.num_hidden_layers * 4 * e * (81 + 25)
    assert flops == matmuls + attention
