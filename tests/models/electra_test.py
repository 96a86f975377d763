"""ELECTRA against transformers: every head within 1e-5 (eager attention, float32) on full,
right-padded, left-padded and holed rows of odd configurations with embeddings narrower than
the layers (M 24 < E 32) and a generator narrower than its discriminator (E 16, the same M);
packed rows, the scanned and rematerialized layers against the loop; config.json; conversion
both ways (PyTorch state dict, safetensors through `python -m bert_jax.convert`); and
google-research/electra's TF checkpoints (both models of a pretraining run in one checkpoint,
written here by TensorFlow) read as the discriminator and as the generator.

Worst absolute differences from transformers 5.24 seen here (CPU, float32, every head on both
configurations): logits 8.3e-7, hidden states 1.2e-6, attention maps 8.9e-8; the TF imports
1.2e-6 (discriminator) and 9.5e-7 (generator).
"""

import json

import jax
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import detect, hf, table, verify
from bert_jax.checkpoints import tf as tf_checkpoints
from bert_jax.models import families
from bert_jax.models.electra import model as EL
from bert_jax.models.electra.config import ElectraConfig
from tests import family_fixtures

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

LENGTH = 9
# The discriminator: M 24 < E 32, the tanh GELU in its layers and discriminator head (the
# generator and classification heads keep the exact one), 3 token types, a summary in tanh.
DISCRIMINATOR = ElectraConfig(
    vocab_size=99, embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, max_position_embeddings=20, type_vocab_size=3, hidden_act="gelu_new",
    summary_activation="tanh", num_labels=3,
)  # fmt: skip
# Its generator: the same embeddings (M 24, the tables a TF checkpoint shares), narrower layers.
GENERATOR = DISCRIMINATOR.replace(
    hidden_size=16, num_attention_heads=2, intermediate_size=29, hidden_act="gelu"
)
CONFIGS = {"discriminator": DISCRIMINATOR, "generator": GENERATOR}
MASK = np.array(
    [
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 1, 1, 1, 1, 1],
    ]
)
HEADS = [cls.__name__ for cls in EL.ROLES.values()]
# Every head on the discriminator's sizes; the generator's (M 24 > E 16) as a generator.
CASES = [("discriminator", head) for head in HEADS]
CASES += [("generator", head) for head in ("ElectraModel", "ElectraForMaskedLM")]

torch_model = family_fixtures.transformers_model  # random, every weight perturbed


def _inputs(cfg, head: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, cfg.vocab_size, MASK.shape)
    ids[MASK == 0] = cfg.pad_token_id
    types = (np.arange(LENGTH) >= 5).astype(np.int64) * MASK * 2  # types 0 and 2 of 3
    out = dict(input_ids=ids, token_type_ids=types, attention_mask=MASK)
    if head.endswith("MultipleChoice"):  # [2, 2, L]: the rows paired as choices
        out = {k: v.reshape(2, 2, LENGTH) for k, v in out.items()}
    return out


def _apply(cfg, head, params, inputs):
    model = families.get_model_class(head)(cfg)
    out = jax.jit(
        lambda p, x: model.apply(
            {"params": p}, **x, output_hidden_states=True, output_attentions=True
        )
    )(params, inputs)
    return verify.named_outputs(out)


def _assert_close(ours, theirs, atol=1e-5):
    assert set(ours) == set(theirs) and len(theirs) >= 1 + 3 + 2  # output, states, maps
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, atol=atol, rtol=0, err_msg=name)


@pytest.mark.parametrize("which, head", CASES, ids=[f"{w}-{h}" for w, h in CASES])
def test_every_head_equals_transformers(which, head):
    """Logits, hidden states (the first the projected embeddings) and attention maps within 1e-5
    at every position (the heads reading [CLS] read position 0, a pad when left padded, as
    transformers' do)."""
    cfg = CONFIGS[which].replace(num_labels=2 if "Question" in head else 3)
    reference = torch_model(cfg, head)
    inputs = _inputs(cfg, head)
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    params, report = hf.hf_state_to_params(cfg, state, head)
    assert not report.unused and not report.newly_initialized
    _assert_close(_apply(cfg, head, params, inputs), verify.torch_outputs(reference, inputs))


@pytest.mark.parametrize("summary", [dict(summary_type="mean", summary_use_proj=False),
                                     dict(summary_type="last", summary_activation=None)])  # fmt: skip
def test_the_other_sequence_summaries_equal_transformers(summary):
    """ElectraForMultipleChoice's summary of each choice: the mean over every position (padding
    included) with no projection; the last position with no activation (transformers 5's "",
    its 4.x's null in config.json)."""
    head = "ElectraForMultipleChoice"
    cfg = DISCRIMINATOR.replace(**summary)
    assert families.config_from_hf_dict(cfg.to_hf_dict()) == cfg
    if cfg.summary_activation == "":
        null = {**cfg.to_hf_dict(), "summary_activation": None}
        assert families.config_from_hf_dict(null) == cfg
    reference = torch_model(cfg, head)
    inputs = _inputs(cfg, head)
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    params, _ = hf.hf_state_to_params(cfg, state, head)
    _assert_close(_apply(cfg, head, params, inputs), verify.torch_outputs(reference, inputs))


def random_params(cfg, head: str, seed: int = 2) -> dict:
    """Parameters of `head` drawn from N(0, 0.3) (norm scales and biases too), without an init."""
    noise = np.random.default_rng(seed)
    flat = {k: noise.normal(0, 0.3, shape).astype(np.float32)
            for k, shape in table.expected_shapes(cfg, head).items()}  # fmt: skip
    return table.unflatten_params(flat, scan_layers=False)


def test_packed_rows_equal_the_sequences_alone():
    """Two sequences (lengths 5 and 3) packed in one row, positions restarting at 0: the
    classifier read at each one's [CLS] (cls_positions) and the discriminator's per-token
    logits equal those of each sequence alone."""
    rng = np.random.default_rng(1)
    a, b = rng.integers(3, 99, 5), rng.integers(3, 99, 3)
    packed = np.zeros((1, LENGTH), np.int32)
    packed[0, :8] = np.concatenate([a, b])
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]])
    alone = np.zeros((2, LENGTH), np.int32)
    alone[0, :5], alone[1, :3] = a, b
    packing = dict(attention_mask=segments > 0, segment_ids=segments, position_ids=positions)
    for head, extra in (
        ("ElectraForSequenceClassification", dict(cls_positions=np.array([[0, 5]]))),
        ("ElectraForPreTraining", {}),
    ):
        model = families.get_model_class(head)(DISCRIMINATOR)
        params = random_params(DISCRIMINATOR, head)
        apply = jax.jit(lambda p, ids, kw, m=model: m.apply({"params": p}, ids, **kw).logits)
        one = apply(params, packed, {**packing, **extra})
        two = apply(params, alone, dict(attention_mask=alone != 0))
        if head == "ElectraForSequenceClassification":
            np.testing.assert_allclose(one[0], two, atol=1e-5)
        else:
            np.testing.assert_allclose(one[0, :8], np.concatenate([two[0, :5], two[1, :3]]), atol=1e-5)  # fmt: skip


# --------------------------------------------------------------------------------------------
# config.json, the registry, FLOPs
# --------------------------------------------------------------------------------------------
def test_config_presets_and_registry(tmp_path):
    for cfg in (DISCRIMINATOR, ElectraConfig.preset("small"), ElectraConfig.preset("tiny")):
        cfg.to_json_file(tmp_path / "config.json", architecture="ElectraForPreTraining")
        assert families.config_from_json_file(tmp_path) == cfg
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)  # tiny: M 64 < E 128
    assert (theirs.embedding_size, theirs.hidden_size) == (64, 128)
    assert ElectraConfig() == ElectraConfig.preset("small")  # transformers' defaults
    large = ElectraConfig.preset("large")
    assert (large.embedding_size, large.hidden_size, large.num_hidden_layers) == (1024, 1024, 24)
    electra = families.family_of(DISCRIMINATOR)
    assert electra.head_for(families.Role.REPLACED_TOKEN_DETECTION) == "ElectraForPreTraining"
    assert electra.head_for(families.Role.MASKED_LM) == "ElectraForMaskedLM"
    with pytest.raises(ValueError, match="electra has no pretraining head"):
        electra.head_for(families.Role.PRETRAINING)
    for change, match in (
        (dict(hidden_size=30), "not divisible"),
        (dict(embedding_size=0), "embedding_size.*positive integer"),
        (dict(summary_type="cls_index"), "summary_type"),
        (dict(summary_activation="swish"), "summary_activation"),
    ):
        with pytest.raises(ValueError, match=f"ElectraConfig.*{match}"):
            DISCRIMINATOR.replace(**change)


def test_flops_are_berts_plus_the_projection():
    from bert_jax.models.bert.config import BertConfig
    from bert_jax.models.bert.flops import encoder_forward_flops

    lengths = np.array([[9, 4], [1, 7]])
    sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    bert = encoder_forward_flops(BertConfig(**{k: getattr(DISCRIMINATOR, k) for k in sizes}), lengths)  # fmt: skip
    ours = families.family_of(DISCRIMINATOR).encoder_flops
    assert ours(DISCRIMINATOR, lengths) == bert + 2 * 24 * 32 * lengths.sum()
    assert ours(DISCRIMINATOR.replace(embedding_size=32), lengths) == bert


# --------------------------------------------------------------------------------------------
# Conversion both ways
# --------------------------------------------------------------------------------------------
def test_round_trip_through_transformers_and_the_command_line(tmp_path, capsys):
    """bert_jax -> save_pytorch (safetensors) -> transformers loads it with no missing,
    unexpected or mismatched key -> its save_pretrained -> `python -m bert_jax.convert` to
    bert_jax with --verify -> back to Hugging Face: the same parameters; a classifier takes the
    generator's encoder and initializes only its own weights."""
    head = "ElectraForMaskedLM"
    params = random_params(GENERATOR, head)
    hf.save_pytorch(GENERATOR, params, tmp_path / "ours", head)
    theirs, info = transformers.ElectraForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs.save_pretrained(tmp_path / "theirs")
    assert (tmp_path / "theirs" / "model.safetensors").exists()
    argv = [str(tmp_path / "theirs"), str(tmp_path / "jax"), "--verify"]
    assert convert.main(argv) == 0
    out = capsys.readouterr().out
    assert float(out.split("worst max abs difference ")[1].split()[0]) < 1e-5, out
    assert convert.main([str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    config, back, report = hf.load_pytorch(tmp_path / "back", None, return_report=True)
    assert config == GENERATOR and not report.unused and not report.newly_initialized
    assert table.max_difference(params, back) == 0.0
    _, _, report = hf.load_pytorch(tmp_path / "theirs", "ElectraForSequenceClassification",
                                   allow_new_heads=True, return_report=True)  # fmt: skip
    assert sorted(report.newly_initialized) == [
        f"classifier/{m}/{p}" for m in ("dense", "out_proj") for p in ("bias", "kernel")
    ]
    assert sorted(report.unused) == [f"generator_{k}" for k in ("lm_head.bias", "predictions.LayerNorm.bias", "predictions.LayerNorm.weight", "predictions.dense.bias", "predictions.dense.weight")]  # fmt: skip


# --------------------------------------------------------------------------------------------
# google-research/electra's TF checkpoints
# --------------------------------------------------------------------------------------------
def _tf_name(key: str) -> str:
    """A transformers key in google-research/electra's spelling: "/" scopes, `layer_N`,
    LayerNorm gamma/beta, kernels and embedding tables without `weight`."""
    name = key.replace(".", "/").replace("layer/", "layer_")
    name = name.replace("LayerNorm/weight", "LayerNorm/gamma").replace("LayerNorm/bias", "LayerNorm/beta")  # fmt: skip
    if name.endswith("_embeddings/weight"):
        return name[: -len("/weight")]
    return name[: -len("/weight")] + "/kernel" if name.endswith("/weight") else name


def electra_variables(discriminator, generator) -> dict[str, np.ndarray]:
    """The variables google-research/electra's run_pretraining.py saves for a discriminator and
    a generator (transformers models; the generator's embeddings are the discriminator's), named
    independently of bert_jax's table: TF kernels [in, out], the discriminator under `electra/`
    (its head's second dense `dense_1`), the generator's layers and projection under
    `generator/`, its output bias `generator_predictions/output_bias`."""
    out = {}
    for key, value in discriminator.state_dict().items():
        v = value.detach().numpy()
        name = _tf_name(key.replace("dense_prediction", "dense_1"))
        out[name] = v.T if name.endswith("/kernel") else v
    for key, value in generator.state_dict().items():
        v = value.detach().numpy()
        if key.startswith(("electra.embeddings.", "generator_lm_head.weight")):
            continue  # the discriminator's tables; the tied decoder
        key = key.replace("electra.", "generator.").replace(
            "generator_lm_head.bias", "generator_predictions.output_bias"
        )
        name = _tf_name(key)
        out[name] = v.T if name.endswith("/kernel") else v
    return out


def test_tf_checkpoint_reads_as_the_discriminator_and_as_the_generator(tmp_path, capsys):
    """One checkpoint of both models (TF's Saver, optimizer slots and global_step beside them),
    the discriminator's config.json beside it: read as ElectraForPreTraining by default (also by
    `python -m bert_jax.convert`) and as ElectraForMaskedLM with the generator's config
    (`--config`); every output within 1e-5 of the transformers models it was written from."""
    pytest.importorskip("tensorflow")
    from tests.checkpoints.convert_tf_test import write_tf_checkpoint

    discriminator = torch_model(DISCRIMINATOR, "ElectraForPreTraining", seed=3)
    generator = torch_model(GENERATOR, "ElectraForMaskedLM", seed=4)
    with torch.no_grad():  # google's generator reads the discriminator's embedding tables
        generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    folder = tmp_path / "electra_tiny"
    variables = electra_variables(discriminator, generator)
    write_tf_checkpoint(variables, folder, name="model.ckpt", global_step=20)
    DISCRIMINATOR.to_json_file(folder / "config.json")
    GENERATOR.to_json_file(tmp_path / "generator.json")

    config, params, report = tf_checkpoints.load_tf(folder, return_report=True)
    assert config == DISCRIMINATOR and not report.newly_initialized
    assert len(report.ignored) == 2 * len(variables) + 1  # adam_m, adam_v and global_step
    assert all(k.startswith(("generator", "generator_predictions/")) for k in report.unused)
    assert not any("erf is assumed" in n for n in report.notes)  # config.json names its GELU
    for name, reference in (("ElectraForPreTraining", discriminator), ("ElectraForMaskedLM", generator)):  # fmt: skip
        cfg = DISCRIMINATOR if reference is discriminator else GENERATOR
        if reference is generator:
            config, params, report = tf_checkpoints.load_tf(
                folder, name, config_path=tmp_path / "generator.json", return_report=True
            )
            assert config == GENERATOR and not report.newly_initialized
            assert all(k.startswith(("electra/encoder/", "electra/embeddings_project/", "discriminator_")) for k in report.unused)  # fmt: skip
        inputs = _inputs(cfg, name)
        _assert_close(_apply(cfg, name, params, inputs), verify.torch_outputs(reference, inputs))

    # A fine-tuning head from the discriminator's encoder, its own weights new.
    _, params, report = tf_checkpoints.load_tf(
        folder, "ElectraForSequenceClassification", allow_new_heads=True, return_report=True
    )
    assert sorted({k.split("/")[0] for k in report.newly_initialized}) == ["classifier"]
    # The command line: the discriminator (config.json beside it), the generator (--config).
    assert detect.detect_format(str(folder)) == "tf"
    assert convert.main([str(folder), str(tmp_path / "disc"), "--to", "hf"]) == 0
    written = json.loads((tmp_path / "disc" / "config.json").read_text())
    assert written["architectures"] == ["ElectraForPreTraining"]
    argv = [str(folder), str(tmp_path / "gen"), "--to", "hf", "--model", "ElectraForMaskedLM",
            "--config", str(tmp_path / "generator.json"), "--verify"]  # fmt: skip
    capsys.readouterr()
    assert convert.main(argv) == 0
    out = capsys.readouterr().out
    assert float(out.split("worst max abs difference ")[1].split()[0]) < 1e-5, out
    assert families.config_from_json_file(tmp_path / "gen") == GENERATOR
    # The loader's head: the config's family's default, a role as the family's class; a class of
    # another family is refused, naming the family's own.
    assert tf_checkpoints.tf_head(folder) == "ElectraForPreTraining"
    assert tf_checkpoints.tf_head(folder, "masked_lm") == "ElectraForMaskedLM"
    with pytest.raises(ValueError, match="BertForMaskedLM is a class of BERT.*ElectraForMaskedLM"):
        tf_checkpoints.tf_head(folder, "BertForMaskedLM")
    # Without the generator's config the discriminator's does not fit its layers: said so.
    with pytest.raises(table.ConversionError, match="generator/.* does not fit"):
        tf_checkpoints.load_tf(folder, "ElectraForMaskedLM")
    # google's checkpoints come without a config file: the error says what to give.
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json.*config_path"):
        tf_checkpoints.load_tf(folder, "ElectraForPreTraining")
