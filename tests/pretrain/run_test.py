"""The pretraining job (bert_jax/pretrain/run.py): how a scratch run starts two parameters
(`mlm_bias_init`, `position_embeddings_init`): the values, their placement on a mesh, and bad
settings."""

import dataclasses

import jax
import numpy as np
import pytest

from bert_jax.models import families
from bert_jax.models.bert.config import BertConfig
from bert_jax.pretrain import run
from bert_jax.training import experiment, start
from tests.common import load_config_file


def test_sinusoid_positions():
    table = run.sinusoid_positions(64, 16, rms=0.06)
    assert table.shape == (64, 16) and table.dtype == np.float32
    np.testing.assert_allclose(np.sqrt(np.mean(table**2)), 0.06, rtol=1e-6)
    # Position 0: sin 0 = 0 and cos 0 = 1 in every pair; the first pair turns one radian a step.
    np.testing.assert_allclose(table[0], np.tile([0.0, 0.06 * np.sqrt(2)], 8), atol=1e-7)
    np.testing.assert_allclose(table[1, :2] / (0.06 * np.sqrt(2)), [np.sin(1), np.cos(1)], 1e-6)
    # Nearby positions start alike, far ones less so: what lets attention find neighbours.
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    near = np.mean(np.sum(unit[:-1] * unit[1:], axis=1))
    far = np.mean(np.sum(unit[:-32] * unit[32:], axis=1))
    assert near > 0.8 and far < 0.5
    with pytest.raises(ValueError, match="even width, not 15"):
        run.sinusoid_positions(8, 15, rms=1.0)


def test_starting_values_keep_each_parameters_sharding():
    """The values are set inside the scratch init: placed and typed as the parameters they
    replace, everything else as a plain scratch init with the same seed."""
    config = load_config_file("pretrain.py").get_config("size=tiny")
    config.model.update(
        vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=16,
    )  # fmt: skip
    config.mesh.update(data=2, fsdp=4, tensor=1)
    cfg = BertConfig(**config.model.to_dict())
    exp = experiment.Experiment.build(config, cfg, "BertForPreTraining", "pretraining", 10)
    before = jax.device_get(start.init_state(exp, seed=0).params)

    bias = np.log(np.arange(1, 100) / 4950.0)
    paths = families.family_of(cfg).starting_paths
    values = {
        paths["mlm_bias"]: run.mlm_bias(bias, cfg.padded_vocab_size),
        paths["position_embeddings"]: run.position_sinusoids(cfg),
    }
    state = start.init_state(exp, seed=0, overrides=values)  # set inside the jitted init

    positions = state.params["bert"]["embeddings"]["position_embeddings"]["embedding"]
    want = run.sinusoid_positions(16, 32, run.SINUSOID_SCALE * cfg.initializer_range)
    np.testing.assert_array_equal(np.asarray(positions), want)
    got_bias = np.asarray(state.params["cls"]["predictions"]["bias"])
    assert got_bias.shape == (cfg.padded_vocab_size,)  # 99 rows padded to 128
    np.testing.assert_allclose(got_bias[:99], bias, rtol=1e-6)
    assert not got_bias[99:].any()  # the padding rows' logits are cut off anyway
    for (path, array), sh in zip(
        jax.tree_util.tree_leaves_with_path(state.params),
        jax.tree_util.tree_leaves(exp.state_shardings.params),
    ):
        assert array.sharding == sh, path
        assert array.dtype == np.float32, path
    # Nothing else changed.
    after = jax.device_get(state.params)
    after["bert"]["embeddings"].pop("position_embeddings")
    before["bert"]["embeddings"].pop("position_embeddings")
    after["cls"]["predictions"].pop("bias")
    before["cls"]["predictions"].pop("bias")
    jax.tree_util.tree_map(np.testing.assert_array_equal, after, before)


@pytest.mark.parametrize("key", ["mlm_bias_init", "position_embeddings_init"])
def test_an_unknown_starting_value_stops_the_run_at_once(key, tmp_path):
    config = load_config_file("pretrain.py").get_config("size=tiny")
    config[key] = "sinusoidal"
    with pytest.raises(ValueError, match=f"config.{key}='sinusoidal': expected one of"):
        run.train_and_evaluate(config, str(tmp_path))
    assert not any(tmp_path.iterdir())  # stopped before writing anything


def test_a_starting_value_of_the_wrong_shape_is_refused():
    config = load_config_file("pretrain.py").get_config("size=tiny")
    config.model.update(vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37)
    cfg = BertConfig(**config.model.to_dict())
    exp = experiment.Experiment.build(config, cfg, "BertForPreTraining", "pretraining", 10)
    bias = families.family_of(cfg).starting_paths["mlm_bias"]
    with pytest.raises(ValueError, match=r"cls/predictions/bias: shape \(99,\), the parameter"):
        start.init_state(exp, overrides={bias: np.zeros(99, np.float32)})


def test_every_pretraining_config_parses_into_the_typed_block():
    """check_config returns the job's settings typed (`PretrainSettings`, its data block
    `inputs.PretrainData`) for every shipped architecture, its values the config's."""
    module = load_config_file("pretrain.py")
    for arch in module.ARCHS:
        config = module.get_config(f"arch={arch}")
        job = run.check_config(config)
        assert job.data.max_seq_length == config.data.max_seq_length, arch
        assert job.data.masked_lm_prob == config.data.masked_lm_prob, arch
        assert job.data.vocab_kind == config.data.vocab_kind, arch
        assert (job.mlm_bias_init, job.position_embeddings_init)[0] in ("zeros", "unigram")
        with pytest.raises(dataclasses.FrozenInstanceError):
            job.data.seed = 1


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("source", "gcs", r"config\.data\.source='gcs': expected one of \('default', 'records'\)"),
        ("vocab_kind", "sentencepiece", r"config\.data\.vocab_kind='sentencepiece'"),
        ("masked_lm_prob", 1.5, r"config\.data\.masked_lm_prob=1\.5: expected a number in"),
        ("max_seq_length", 1, r"config\.data\.max_seq_length=1: expected an integer >= 2"),
        ("max_segments", 0, r"config\.data\.max_segments=0: expected an integer >= 1"),
        ("num_eval_shards", -1, r"config\.data\.num_eval_shards=-1: expected an integer >= 0"),
        ("worker_count", -2, r"config\.data\.worker_count=-2: expected an integer >= 0"),
    ],
)
def test_a_bad_data_value_is_refused_naming_its_key(key, value, message, tmp_path):
    config = load_config_file("pretrain.py").get_config("size=tiny")
    with config.unlocked():
        config.data[key] = value
    with pytest.raises(ValueError, match=message):
        run.train_and_evaluate(config, str(tmp_path))
    assert not any(tmp_path.iterdir())  # stopped before writing anything
