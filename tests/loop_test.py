"""The persistent compilation cache that train.py turns on (the loop's own compile caching is
tested over a whole multi-seed fine-tuning run in tests/finetune/run_test.py)."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax import loop
from tests.common import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A fresh process (the cache is process-wide state) that turns the cache on as train.py does,
# compiles one program and reports where the cache is and whether the program came from it.
_COMPILE_ONE = """
import json, sys
import jax, jax.numpy as jnp
from bert_jax import loop
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
directory = loop.enable_compilation_cache(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # cache even tiny programs
jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((5, 3)))
print(json.dumps({"directory": directory, "cache_hits": len(hits)}))
"""


def _compile_one(setting: str, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_ONE, setting],
        env={**environ, "PYTHONPATH": ROOT, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_compilation_cache_is_on_by_default_under_the_user_cache_dir(tmp_path):
    expected = str(tmp_path / "bert_jax" / "jax")
    first = _compile_one("auto", XDG_CACHE_HOME=str(tmp_path))
    assert first == {"directory": expected, "cache_hits": 0}
    assert os.listdir(expected)  # the compiled programs were written
    # A second run loads them (the jitted function and the eager ops) instead of compiling.
    assert _compile_one("auto", XDG_CACHE_HOME=str(tmp_path))["cache_hits"] >= 1
    # JAX's own variable wins over the default; "off" reads nothing, though the entries are there.
    other = str(tmp_path / "elsewhere")
    assert _compile_one("auto", JAX_COMPILATION_CACHE_DIR=other)["directory"] == other
    off = _compile_one("off", XDG_CACHE_HOME=str(tmp_path))
    assert off == {"directory": None, "cache_hits": 0}


def test_default_cache_dir_and_bad_setting(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert loop.default_compilation_cache_dir() == str(tmp_path / ".cache" / "bert_jax" / "jax")
    with pytest.raises(ValueError, match="compilation cache directory is empty"):
        loop.enable_compilation_cache("")


def _tiny_pretraining_config(mesh):
    config = load_config_file("pretrain.py").get_config("size=tiny")
    config.model.update(
        vocab_size=99,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=16,
    )
    config.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
    return config


def _experiment(mesh, model_name="BertForPreTraining"):
    from bert_jax.config import BertConfig

    config = _tiny_pretraining_config(mesh)
    task = "pretraining" if model_name == "BertForPreTraining" else "mlm"
    return loop.Experiment.build(config, BertConfig(**config.model.to_dict()), model_name, task, 10)


def test_init_from_a_training_run_reads_the_parameters_into_their_shardings(tmp_path, monkeypatch):
    """Written on one mesh, read on another: every parameter arrives with the new mesh's
    sharding and the written values, the optimizer state is fresh, and nothing goes through the
    host conversion (`convert.load_any`)."""
    import jax
    import numpy as np

    from bert_jax import checkpointing, convert

    source = _experiment((8, 1, 1))
    state = source.init_state(seed=3)
    ckpt = checkpointing.Checkpointer(str(tmp_path / "run" / "checkpoints"), async_save=False)
    meta = {"config": source.cfg.to_hf_dict(source.model_name), "model": source.model_name}
    ckpt.save(5, state, meta={**meta, "step": 5})
    ckpt.close()

    def no_host_path(*args, **kwargs):
        raise AssertionError("init_from went through the host conversion")

    target = _experiment((2, 2, 2))
    monkeypatch.setattr(convert, "load_any", no_host_path)
    fresh = checkpointing.Checkpointer(str(tmp_path / "new" / "checkpoints"))
    got, start = target.create_or_restore(fresh, init_from=str(tmp_path / "run"))
    fresh.close()
    assert start == 0
    want = jax.tree_util.tree_leaves_with_path(jax.device_get(state.params))
    for (path, value), array, sh in zip(
        want,
        jax.tree_util.tree_leaves(got.params),
        jax.tree_util.tree_leaves(target.state_shardings.params),
    ):
        assert array.sharding == sh, path
        np.testing.assert_array_equal(np.asarray(array), value, err_msg=str(path))
    mu = [x for x in jax.tree_util.tree_leaves(got.opt_state) if np.ndim(x) > 0]
    assert mu and all(not np.any(np.asarray(x)) for x in mu)  # fresh moments: zeros

    # Another head: the parameters go through the host conversion, which maps them by name.
    monkeypatch.undo()
    called = []
    real = convert.load_any
    monkeypatch.setattr(convert, "load_any", lambda *a, **k: called.append(a[1]) or real(*a, **k))
    mlm = _experiment((8, 1, 1), "BertForMaskedLM")
    fresh = checkpointing.Checkpointer(str(tmp_path / "mlm" / "checkpoints"))
    mlm.create_or_restore(fresh, init_from=str(tmp_path / "run"))
    fresh.close()
    assert called == ["BertForMaskedLM"]
