"""transformers' Flax checkpoints (flax_model.msgpack), against fixtures that transformers 4.57's
FlaxBert classes wrote (tests/testdata/make_hf_flax_fixtures.py bert): every head loads exactly, what
bert_jax writes is the tree transformers wrote, and every bad input names its problem."""

import importlib.util
import json
import os
import pathlib
import shutil

import jax
import numpy as np
import pytest

import bert_jax
from bert_jax import convert
from bert_jax.checkpoints import detect, hf, hf_flax, table, verify

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "testdata" / "hf_flax"
_spec = importlib.util.spec_from_file_location(
    "make_hf_flax_fixtures", FIXTURES.parent / "make_hf_flax_fixtures.py"
)
_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_script)
fixtures = _script.FAMILIES["bert"]
NAMES = fixtures.names


def outputs(loaded: bert_jax.Pretrained, head: str) -> dict[str, np.ndarray]:
    """bert_jax's outputs on the fixture inputs, named as the reference's."""
    out = loaded.model.apply(
        {"params": loaded.params},
        **fixtures.inputs(head),
        output_hidden_states=True,
        output_attentions=True,
    )
    return verify.named_outputs(out)


def assert_matches_reference(ours: dict, name: str, atol: float = 1e-5) -> None:
    ref = dict(np.load(FIXTURES / name / "outputs.npz"))
    assert set(ours) == set(ref)
    for key, value in ref.items():
        np.testing.assert_allclose(ours[key], value, atol=atol, rtol=0, err_msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_of_every_head_loads_exactly(name):
    head = fixtures.head_of(name)
    assert detect.detect_format(str(FIXTURES / name)) == "hf_flax"
    loaded = bert_jax.from_pretrained(FIXTURES / name)  # the head from config.json
    assert loaded.head == head and loaded.tokenizer is None
    assert_matches_reference(outputs(loaded, head), name)


@pytest.mark.parametrize("name", NAMES)
def test_what_bert_jax_writes_is_the_tree_transformers_wrote(tmp_path, name):
    """Same names, shapes, dtypes and values (and the same shards): FlaxBert*.from_pretrained
    reads it as it read its own (make_hf_flax_fixtures.py `check` runs that with transformers 4.57)."""
    head = fixtures.head_of(name)
    config, params, _, _ = detect.load_any(str(FIXTURES / name), head)
    shard = "8KB" if name == fixtures.sharded else None
    hf_flax.save_hf_flax(config, params, tmp_path, head, max_shard_size=shard)
    # Read as PyTorch names, which map one to one onto the Flax names (hf_flax.to_torch_names).
    theirs = hf.read_hf_state_dict(FIXTURES / name)
    ours = hf.read_hf_state_dict(tmp_path)
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype and ours[key].shape == theirs[key].shape, key
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    assert sorted(os.listdir(tmp_path)) == sorted(
        f for f in os.listdir(FIXTURES / name) if f != "outputs.npz"
    )
    if shard:
        index = json.loads((tmp_path / hf_flax.INDEX_NAME).read_text())
        assert index == json.loads((FIXTURES / name / hf_flax.INDEX_NAME).read_text())
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [head]
    _, reloaded, _, _ = detect.load_any(str(tmp_path), head)
    assert table.max_difference(params, reloaded) == 0.0


def test_prefix_is_added_or_dropped_as_the_head_needs():
    """A FlaxBertModel tree (no `bert/` prefix) under a head: every encoder weight is found and
    only the new head's are missing; and a head's tree read as the bare encoder."""
    with pytest.raises(table.ConversionError) as err:
        bert_jax.from_pretrained(FIXTURES / "BertModel", "FlaxBertForSequenceClassification")
    assert "lacks 2 weight(s)" in str(err.value) and "allow_new_heads" in str(err.value)
    encoder = bert_jax.from_pretrained(FIXTURES / "BertForPreTraining", "BertModel")
    full = bert_jax.from_pretrained(FIXTURES / "BertForPreTraining")
    assert table.max_difference(encoder.params, full.params["bert"]) == 0.0


def test_num_labels_gives_a_new_head_on_the_checkpoints_encoder():
    tuned = bert_jax.from_pretrained(
        FIXTURES / "BertModel", "FlaxBertForSequenceClassification", num_labels=3
    )
    assert tuned.config.num_labels == 3 and tuned.params["classifier"]["kernel"].shape == (12, 3)
    base = bert_jax.from_pretrained(FIXTURES / "BertModel")
    assert table.max_difference(base.params, tuned.params["bert"]) == 0.0


def test_dtype_scan_and_remat_are_honoured(tmp_path):
    name = FIXTURES / "BertForSequenceClassification"
    half = bert_jax.from_pretrained(name, dtype=jax.numpy.bfloat16, param_dtype="bfloat16")
    assert half.model.runtime.dtype == "bfloat16" and half.model.runtime.param_dtype == "bfloat16"
    assert {x.dtype.name for x in jax.tree_util.tree_leaves(half.params)} == {"bfloat16"}
    # bfloat16 parameters (transformers' to_bf16) are written and read back as they are.
    hf_flax.save_hf_flax(half.config, half.params, tmp_path, half.head)
    written = hf_flax.read_file(tmp_path / hf_flax.WEIGHTS_NAME)
    assert {x.dtype.name for x in written.values()} == {"bfloat16"}
    again = bert_jax.from_pretrained(tmp_path, param_dtype="bfloat16")
    assert table.max_difference(half.params, again.params) == 0.0
    scanned = bert_jax.from_pretrained(name, scan_layers=True, remat_policy="full")
    assert scanned.model.runtime.scan_layers and scanned.model.runtime.remat_policy == "full"
    query = scanned.params["bert"]["encoder"]["layer"]["attention"]["self"]["query"]["kernel"]
    assert query.shape == (2, 12, 3, 4)  # [layers, E, H, D]


def test_tokenizer_beside_the_weights_comes_along(tmp_path):
    shutil.copytree(FIXTURES / "BertModel", tmp_path / "m")
    words = [f"w{i}" for i in range(fixtures.config["vocab_size"] - 5)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (tmp_path / "m" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    loaded = bert_jax.from_pretrained(tmp_path / "m")
    assert loaded.tokenizer is not None and loaded.tokenizer.vocab_size == len(vocab)


def test_keys_that_do_not_fit_the_head_are_listed():
    with pytest.raises(table.ConversionError) as err:
        detect.load_any(str(FIXTURES / "BertForQuestionAnswering"), "BertForTokenClassification")
    message = str(err.value)
    assert "classifier/kernel" in message and "qa_outputs.weight" in message


def test_bad_files_are_named(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURES / "BertModel", broken)
    (broken / hf_flax.WEIGHTS_NAME).write_bytes(b"\x93not msgpack at all")
    with pytest.raises(table.ConversionError, match="corrupt or not a Flax msgpack"):
        bert_jax.from_pretrained(broken)
    (broken / hf_flax.WEIGHTS_NAME).write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(table.ConversionError, match="git lfs pull"):
        bert_jax.from_pretrained(broken)
    sharded = tmp_path / "sharded"
    shutil.copytree(FIXTURES / fixtures.sharded, sharded)
    (sharded / "flax_model-00002-of-00002.msgpack").unlink()
    with pytest.raises(FileNotFoundError, match="flax_model-00002-of-00002.msgpack"):
        bert_jax.from_pretrained(sharded)


def test_command_line_writes_flax_and_refuses_stale_shards(tmp_path, capsys):
    src = str(FIXTURES / "BertForMaskedLM")
    dst = tmp_path / "out"
    assert convert.main([src, str(dst), "--to", "hf_flax", "--max-shard-size", "8KB"]) == 0
    assert (dst / hf_flax.INDEX_NAME).exists()
    # A single file now would leave the old index, which transformers reads first.
    assert convert.main([src, str(dst), "--to", "hf_flax", "--overwrite"]) == 1
    assert "flax_model.msgpack.index.json" in capsys.readouterr().err
