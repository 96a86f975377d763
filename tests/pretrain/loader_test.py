"""The one loader (`checkpoints.pretrained.load`, `bert_jax.from_pretrained`): a Hugging Face Hub
id read from the cache offline by every loader (from_pretrained, fine-tuning's init_from, the
convert command), a path that wins over a Hub id, and checkpoints in a bucket (the fake bucket of
tests/conftest.py)."""

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import types

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

import bert_jax
from bert_jax import convert
from bert_jax.checkpoints import hub, pretrained
from bert_jax.models.families import get_model_class
from bert_jax.models.params import init_params
from tests.common import TINY

ROOT = pathlib.Path(__file__).resolve().parents[2]
REPO = "org/tiny-bert"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(94))]


def tiny_model_dir(path, head="BertForMaskedLM", seed=0) -> dict:
    """Writes a tiny BERT's Hugging Face directory (config.json, model.safetensors, vocab.txt)
    to `path`; returns its parameters."""
    module = get_model_class(head)(TINY)
    params = nn.meta.unbox(init_params(module, jax.random.PRNGKey(seed)))
    params = jax.tree_util.tree_map(np.asarray, params)
    convert.save_pytorch(TINY, params, path, head)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    assert len(VOCAB) == TINY.vocab_size
    return params


def assert_same(ours, theirs) -> None:
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache laid out as huggingface_hub lays it (`models--org--tiny-bert/`:
    `refs/main` holding the commit, `snapshots/<commit>/` links into `blobs/`), offline, with
    the working directory where "org/tiny-bert" is no path; returns the model's parameters."""
    cache = tmp_path / "hf_cache"
    repo = cache / "models--org--tiny-bert"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    params = tiny_model_dir(snapshot, "BertForPreTraining")
    (repo / "blobs").mkdir()
    for file in list(snapshot.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        file.rename(blob)
        file.symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return params


def test_from_pretrained_reads_a_hub_id_from_the_cache_offline(hub_cache):
    assert hub.resolve(REPO).endswith(os.path.join("snapshots", COMMIT))
    loaded = bert_jax.from_pretrained(REPO)
    assert loaded.head == "BertForPreTraining" and loaded.config.vocab_size == TINY.vocab_size
    assert_same(loaded.params, hub_cache)
    assert loaded.tokenizer is not None and loaded.tokenizer.vocab == VOCAB
    record = pretrained.load(REPO, "BertModel")
    assert (record.head, record.family.model_type, record.placed) == ("BertModel", "bert", False)
    assert_same(record.params, hub_cache["bert"])
    assert "cls.predictions.bias" in record.report.unused


def test_a_path_that_exists_wins_over_a_hub_id(hub_cache, tmp_path):
    local = tiny_model_dir(_mkdir(tmp_path / "work" / "org" / "tiny-bert"), "BertModel", seed=7)
    loaded = bert_jax.from_pretrained(REPO)  # the relative path "org/tiny-bert" exists
    assert loaded.head == "BertModel"
    assert_same(loaded.params, local)


def test_what_is_neither_a_path_nor_in_the_cache_is_one_clear_error(hub_cache, capsys):
    with pytest.raises(FileNotFoundError) as err:
        bert_jax.from_pretrained("org/absent")
    message = str(err.value)
    assert message.startswith("no checkpoint at org/absent: no such file or directory")
    assert "not in the Hugging Face cache" in message and os.environ["HF_HUB_CACHE"] in message
    assert "HF_HUB_OFFLINE=1 forbids a download" in message and "\n" not in message
    with pytest.raises(FileNotFoundError, match=r"^no checkpoint at \./absent/dir: no such file"):
        bert_jax.from_pretrained("./absent/dir")  # no repository id: the cache is not asked
    assert convert.main(["org/absent", "out"]) == 1
    assert "error: no checkpoint at org/absent" in capsys.readouterr().err


def test_a_hub_id_not_in_the_cache_is_downloaded_where_allowed(hub_cache, tmp_path, monkeypatch):
    """Online (no HF_HUB_OFFLINE): the config, the vocabulary and one kind of weights are
    fetched, never the repository's other formats; a failed download is one line naming it."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    fetched = tmp_path / "fetched"
    params = tiny_model_dir(_mkdir(fetched), "BertModel")
    calls, real = [], huggingface_hub.snapshot_download

    def snapshot_download(repo_id, **kwargs):
        calls.append(kwargs)
        return real(repo_id, **kwargs) if kwargs.get("local_files_only") else str(fetched)

    files = ["README.md", "config.json", "flax_model.msgpack", "model.safetensors", "vocab.txt"]
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo_id: files)
    monkeypatch.setattr(hub, "hub_unreachable", lambda: None)  # the Hub answers its probe
    loaded = bert_jax.from_pretrained("org/elsewhere")
    assert_same(loaded.params, params)
    assert [c.get("local_files_only") for c in calls] == [True, None]
    assert calls[1]["allow_patterns"] == [
        *hub.CONFIG_FILES,
        "model.safetensors",
        "model-*.safetensors",
    ]
    assert bert_jax.from_pretrained(REPO).head == "BertForPreTraining"  # cached: no download
    assert len(calls) == 3

    def unreachable(repo_id, **kwargs):
        if kwargs.get("local_files_only"):
            return real(repo_id, **kwargs)
        raise OSError("Connection refused\n(details on a second line)")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(FileNotFoundError) as err:
        bert_jax.from_pretrained("org/elsewhere")
    assert str(err.value).startswith("no checkpoint at org/elsewhere: no such file or directory")
    assert "its download failed (Connection refused); give a local checkpoint" in str(err.value)

    # The Hub out of reach (its one probe failed): said so, and no download is tried.
    def no_download(repo_id, **kwargs):
        if kwargs.get("local_files_only"):
            return real(repo_id, **kwargs)
        raise AssertionError("a download was tried with the Hub out of reach")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_download)
    monkeypatch.setattr(hub, "hub_unreachable", lambda: "https://huggingface.co: no route")
    with pytest.raises(FileNotFoundError) as err:
        bert_jax.from_pretrained("org/elsewhere")
    assert "and the Hub is out of reach (https://huggingface.co: no route); " in str(err.value)


def test_finetuning_init_from_a_hub_id(hub_cache):
    from bert_jax.finetune import run

    config = ml_collections.ConfigDict(
        {"init_from": REPO, "finetune": {"tokenizer": "", "random_init": False}}
    )
    run.check_init_from(config.init_from)
    tokenizer = run.find_tokenizer(config)
    assert tokenizer.vocab_size == len(VOCAB)
    data = types.SimpleNamespace(objective="classification", num_labels=3, label_names=None)
    cfg, encoder = run.starting_point(config, data, tokenizer)
    assert (cfg.hidden_size, cfg.num_labels) == (TINY.hidden_size, 3)
    assert_same(encoder, hub_cache["bert"])
    config.finetune.random_init = True  # the architecture only
    assert run.starting_point(config, data, tokenizer) == (cfg, None)


def test_convert_command_reads_a_hub_id(hub_cache, tmp_path):
    """`python -m bert_jax.convert org/tiny-bert OUT` with HF_HUB_OFFLINE=1 (the cache's)."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bert_jax.convert", REPO, str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": ""}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"wrote bert_jax checkpoint to {out}" in proc.stdout
    config, params, head = convert.load_pretrained(out)
    assert (head, config.hidden_size) == ("BertForPreTraining", TINY.hidden_size)
    assert_same(params, hub_cache)


def _mkdir(path):
    path.mkdir(parents=True)
    return path


def _no_local_url(tmp_path, seen) -> None:
    assert not (tmp_path / "gs:").exists()
    assert not [p for p in seen if "gs:/" in p and not p.startswith("gs://bucket")]


def test_an_hf_directory_in_a_bucket_loads_with_its_tokenizer(fake_bucket, tmp_path):
    root, seen = fake_bucket
    params = tiny_model_dir(_mkdir(root / "hf"))
    (root / "hf" / "tf_model.h5").symlink_to(root / "absent")  # another format: reading it fails
    loaded = bert_jax.from_pretrained("gs://bucket/hf")
    assert loaded.head == "BertForMaskedLM"
    assert_same(loaded.params, params)
    assert loaded.tokenizer.vocab_size == len(VOCAB)
    assert "gs://bucket/hf/model.safetensors" in seen and "gs://bucket/hf/vocab.txt" in seen
    assert pretrained.read_config("gs://bucket/hf") == loaded.config
    _no_local_url(tmp_path, seen)


@pytest.fixture(scope="module")
def bert_jax_export(tmp_path_factory):
    """(a bert_jax export of a tiny BertForMaskedLM, its parameters), written before any bucket
    is faked (Orbax's writer needs a real file system)."""
    path = tmp_path_factory.mktemp("export")
    params = tiny_model_dir(path / "hf")
    convert.save_pretrained(path / "export", TINY, params, "BertForMaskedLM")
    return path / "export", params


def test_a_bert_jax_directory_and_a_run_in_a_bucket_load(
    fake_bucket, tmp_path, bert_jax_export, monkeypatch
):
    """A bert_jax export (config.json + Orbax params/), and a finished run's directory: its
    `export/`, with the tokenizer in its `hf/`. Orbax reads gs:// itself (tensorstore's GCS
    driver, which the fake bucket cannot stand in for: it goes to the network), so its reader is
    handed the bucket's URL (recorded) and reads the folder standing for it."""
    import orbax.checkpoint as ocp

    root, seen = fake_bucket
    handed, real = [], ocp.StandardCheckpointer

    class FromBucket(real):
        def restore(self, path, *args, **kwargs):
            handed.append(os.fspath(path))
            local = os.fspath(path).replace("gs://bucket", os.fspath(root), 1)
            return super().restore(local, *args, **kwargs)

    monkeypatch.setattr(ocp, "StandardCheckpointer", FromBucket)
    shutil.copytree(bert_jax_export[0], root / "export")
    params = bert_jax_export[1]
    (root / "export" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    loaded = pretrained.load("gs://bucket/export")
    assert (loaded.head, loaded.tokenizer.vocab_size) == ("BertForMaskedLM", len(VOCAB))
    assert_same(loaded.params, params)
    assert handed == ["gs://bucket/export/params"]

    run = _mkdir(root / "run")
    (root / "export").rename(run / "export")
    (run / "export" / "vocab.txt").rename(_mkdir(run / "hf") / "vocab.txt")
    again = bert_jax.from_pretrained("gs://bucket/run", "BertModel", allow_new_heads=True)
    assert again.head == "BertModel" and again.tokenizer.vocab_size == len(VOCAB)
    assert_same({k: again.params[k] for k in params["bert"]}, params["bert"])  # a new pooler
    assert pretrained.read_config("gs://bucket/run") == loaded.config
    assert "gs://bucket/run/hf/vocab.txt" in seen
    assert handed[1:] == ["gs://bucket/run/export/params"]
    _no_local_url(tmp_path, seen)


def test_a_vocabulary_that_does_not_fit_the_model_is_named(tmp_path):
    tiny_model_dir(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB[:50]) + "\n")
    with pytest.raises(
        ValueError, match=f"{tmp_path / 'vocab.txt'} has 50 tokens but the model 99"
    ):
        bert_jax.from_pretrained(tmp_path)
