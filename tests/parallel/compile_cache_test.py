"""The persistent compilation cache that train.py turns on (`bert_jax.parallel.compile_cache`; the
Experiment's own compile caching is tested over a whole multi-seed fine-tuning run in
tests/finetune/run_test.py)."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax.parallel import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A fresh process (the cache is process-wide state) that turns the cache on as train.py does,
# compiles one program and reports where the cache is and whether the program came from it.
_COMPILE_ONE = """
import json, sys
import jax, jax.numpy as jnp
from bert_jax.parallel import compile_cache
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
directory = compile_cache.enable_compilation_cache(sys.argv[1])
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
    assert compile_cache.default_compilation_cache_dir() == str(
        tmp_path / ".cache" / "bert_jax" / "jax"
    )
    with pytest.raises(ValueError, match="compilation cache directory is empty"):
        compile_cache.enable_compilation_cache("")
