"""Every checkpoint format written to a bucket reads back from it: the writers (`save_pytorch`,
`save_hf_flax`, `save_pretrained`) and readers (`load_any`, `load_pytorch`, `load_pretrained`,
`hf_flax.read_file`, `load_tf`) go through `etils.epath`, so a gs:// path is never made a local
one. The bucket is the `fake_bucket` fixture (tests/conftest.py: epath's backend mocked, a
temporary directory behind gs://bucket, every path asked for recorded).
"""

import os

import numpy as np
import pytest
from flax import linen as nn

from bert_jax import convert
from bert_jax.checkpoints import hf, hf_flax, table
from bert_jax.models.families import get_model_class
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.params import init_params
from tests.common import TINY

BUCKET = "gs://bucket"
MODERN = ModernBertConfig(
    vocab_size=99,
    hidden_size=32,
    intermediate_size=37,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    pad_token_id=0,
    local_attention=16,
)


def _params(config, head, seed=0):
    module = get_model_class(head)(config)
    return nn.meta.unbox(init_params(module, np.uint32([0, seed])))


def _assert_same(a, b):
    a, b = table.flatten_params(a), table.flatten_params(b)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _stayed_in_bucket(tmp_path, seen):
    """Nothing became a local `gs:` folder, and every URL epath was asked for kept its scheme."""
    assert not (tmp_path / "gs:").exists()
    assert not [p for p in seen if "gs:/" in p and not p.startswith(BUCKET)]


@pytest.mark.parametrize(
    ("config", "head"), [(TINY, "BertForPreTraining"), (MODERN, "ModernBertForMaskedLM")]
)
def test_safetensors_in_a_bucket(fake_bucket, tmp_path, config, head):
    root, seen = fake_bucket
    params = _params(config, head)
    assert hf.save_pytorch(config, params, f"{BUCKET}/hf", head) == f"{BUCKET}/hf"
    assert (root / "hf" / "model.safetensors").is_file()
    got_config, loaded = convert.load_pytorch(f"{BUCKET}/hf", head)
    assert got_config == config
    _assert_same(loaded, params)
    got_config, loaded, model, report = convert.load_any(f"{BUCKET}/hf", None)
    assert model == head and not report.newly_initialized
    _assert_same(loaded, params)
    assert f"{BUCKET}/hf/model.safetensors" in seen
    _stayed_in_bucket(tmp_path, seen)


def test_pytorch_bin_and_sharded_index_in_a_bucket(fake_bucket, tmp_path):
    torch = pytest.importorskip("torch")
    root, seen = fake_bucket
    head = "BertForMaskedLM"
    params = _params(TINY, head)
    hf.save_pytorch(TINY, params, tmp_path / "local", head)
    state = hf.read_hf_state_dict(tmp_path / "local")
    # Uploaded as a pytorch_model.bin in two shards with their index, beside config.json.
    (root / "bin").mkdir()
    (root / "bin" / "config.json").write_text((tmp_path / "local" / "config.json").read_text())
    keys = sorted(state)
    shards = {
        "pytorch_model-00001-of-00002.bin": keys[::2],
        "pytorch_model-00002-of-00002.bin": keys[1::2],
    }
    for name, part in shards.items():
        torch.save({k: torch.from_numpy(state[k]) for k in part}, root / "bin" / name)
    weight_map = {k: name for name, part in shards.items() for k in part}
    import json

    (root / "bin" / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": weight_map})
    )
    _, loaded = convert.load_pytorch(f"{BUCKET}/bin", head)
    _assert_same(loaded, params)
    assert f"{BUCKET}/bin/pytorch_model-00002-of-00002.bin" in seen
    _stayed_in_bucket(tmp_path, seen)


@pytest.mark.parametrize(
    ("config", "head"), [(TINY, "BertForSequenceClassification"), (MODERN, "ModernBertForMaskedLM")]
)
def test_flax_msgpack_in_a_bucket(fake_bucket, tmp_path, config, head):
    root, seen = fake_bucket
    params = _params(config, head)
    # Sharded: several msgpack files and their index, all read from the bucket.
    hf_flax.save_hf_flax(config, params, f"{BUCKET}/flax", head, max_shard_size=4000)
    assert (root / "flax" / hf_flax.INDEX_NAME).is_file()
    assert convert.load_any(f"{BUCKET}/flax", head)[2] == head
    _, loaded = convert.load_pytorch(f"{BUCKET}/flax", head)
    _assert_same(loaded, params)
    first = sorted(p.name for p in (root / "flax").iterdir() if p.name.endswith(".msgpack"))[0]
    assert hf_flax.read_file(f"{BUCKET}/flax/{first}")
    _stayed_in_bucket(tmp_path, seen)


def test_flax_msgpack_of_a_modernbert_head_reads_back(tmp_path):
    """save_hf_flax writes a family without vocabulary padding (no `vocab_pad_multiple`)."""
    head = "ModernBertForSequenceClassification"
    params = _params(MODERN.replace(num_labels=3), head, seed=2)
    hf_flax.save_hf_flax(MODERN.replace(num_labels=3), params, tmp_path / "m", head)
    config, loaded = convert.load_pytorch(tmp_path / "m", head)
    assert config == MODERN.replace(num_labels=3)
    _assert_same(loaded, params)


def test_bert_jax_format_in_a_bucket(fake_bucket, tmp_path, monkeypatch):
    """Orbax cannot use the fake bucket: tensorstore's GCS driver goes to the network (it waits
    for credentials), and under epath's mock its local OCDBT merge fails ("CopyRange not
    supported"). So Orbax is replaced by a checkpointer that records the path it is handed (the
    gs:// URL, asserted) and keeps the tree in a folder of the bucket; config.json, the
    directory moves and every check go through epath and the bucket."""
    import orbax.checkpoint as ocp
    from etils import epath

    root, seen = fake_bucket
    handed, trees = [], {}

    class InBucket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def save(self, path, tree):
            handed.append(os.fspath(path))
            epath.Path(path).mkdir(parents=True)
            trees[epath.Path(path).parent] = tree

        def wait_until_finished(self):
            pass

        def restore(self, path):
            handed.append(os.fspath(path))
            assert epath.Path(path).is_dir()
            return trees[epath.Path(path).parent]

    monkeypatch.setattr(ocp, "StandardCheckpointer", InBucket)
    head = "BertForMaskedLM"
    params = _params(TINY, head)
    assert convert.save_pretrained(f"{BUCKET}/own", TINY, params, head) == f"{BUCKET}/own"
    assert sorted(p.name for p in (root / "own").iterdir()) == ["config.json", "params"]
    config, loaded, model = convert.load_pretrained(f"{BUCKET}/own")
    assert (config, model) == (TINY, head)
    _assert_same(loaded, params)
    assert handed == [f"{BUCKET}/own/.params.tmp", f"{BUCKET}/own/params"]
    assert convert.load_any(f"{BUCKET}/own", None)[2] == head
    with pytest.raises(FileExistsError, match="gs://bucket/own already holds"):
        convert.save_pretrained(f"{BUCKET}/own", TINY, params, head)
    _stayed_in_bucket(tmp_path, seen)


def test_tf_checkpoint_in_a_bucket(fake_bucket, tmp_path):
    pytest.importorskip("tensorflow")
    from tests.checkpoints.convert_test import hf_model
    from tests.checkpoints.convert_tf_test import original_variables, write_tf_checkpoint
    from tests.common import ODD

    root, seen = fake_bucket
    cfg = ODD.replace(hidden_act="gelu")
    torch_model = hf_model(cfg, "BertForPreTraining", seed=7)
    write_tf_checkpoint(
        original_variables(torch_model), tmp_path / "local", name="model.ckpt", global_step=5
    )
    (root / "tf").mkdir()
    for f in (tmp_path / "local").iterdir():
        (root / "tf" / f.name).write_bytes(f.read_bytes())
    cfg.to_json_file(root / "tf" / "bert_config.json", original=True)
    _, local = convert.load_tf(
        tmp_path / "local" / "model.ckpt-5", config_path=root / "tf" / "bert_config.json"
    )
    # A folder in the bucket (its newest step), and a prefix there.
    config, params, model, report = convert.load_any(f"{BUCKET}/tf", None)
    assert model == "BertForPreTraining" and config == cfg.replace(num_labels=2)  # none stored
    _assert_same(params, local)
    _, params = convert.load_tf(f"{BUCKET}/tf/model.ckpt-5")
    _assert_same(params, local)
    assert f"{BUCKET}/tf/model.ckpt-5.index" in seen
    _stayed_in_bucket(tmp_path, seen)


def test_missing_checkpoint_in_a_bucket_is_named(fake_bucket):
    with pytest.raises(FileNotFoundError, match="gs://bucket/nothing"):
        convert.load_any(f"{BUCKET}/nothing", None)
    with pytest.raises(FileNotFoundError, match="gs://bucket/nothing"):
        convert.load_pytorch(f"{BUCKET}/nothing")
    assert not os.path.exists("gs:")
