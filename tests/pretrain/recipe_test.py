"""The tiny main job's recipe leaves the unigram plateau on more than one corpus.

A shortened version of the recipe study in docs/pretraining.md: the `size=tiny` config with its
defaults, as `make pretrain` runs it but with its step count changed (300 for 1,200, so the warmup
and decay change with it), on the plays and on a second corpus built here offline (the docstrings
of Python's standard library, with its own vocabulary), stopped (SIGTERM, which saves and exits
with status 143) after the first third of its steps. By then the held-out MLM accuracy must be clearly
above the share of the commonest masked token (what a model that ignores its input scores).
"""

import ast
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.common import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_docstring_corpus(path: str | os.PathLike, max_files: int | None = None) -> int:
    """Writes the docstrings of the standard library's modules as a text corpus.

    One document per module (blank lines between documents), one paragraph a line. The text
    ships with every Python, so the corpus is built offline.

    Args:
      path: the text file to write.
      max_files: read at most this many modules (sorted by path), or all.

    Returns:
      The number of documents written.
    """
    stdlib = pathlib.Path(os.__file__).parent
    skip = re.compile(r"/(test|tests|idlelib|site-packages|dist-packages|lib2to3|__phello__)/")
    files = sorted(p for p in stdlib.rglob("*.py") if not skip.search(str(p)))[:max_files]
    documents = []
    for file in files:
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        paragraphs = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                for para in re.split(r"\n\s*\n", doc or ""):
                    text = " ".join(para.split())
                    if len(text) >= 40 and not text.startswith((">>>", "...")):
                        paragraphs.append(text)
        if len(paragraphs) >= 3:
            documents.append("\n".join(paragraphs))
    pathlib.Path(path).write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return len(documents)


def build_docstring_shards(out_dir, *, vocab_size=4096, max_files=None):
    """Shards of the docstring corpus with its own WordPiece vocabulary, as README's commands
    build a user's corpus (NSP pairs, masks drawn at load time), with the tiny recipe's sequence
    length and predictions a sequence."""
    from bert_jax import tokenization
    from bert_jax.pretrain.data import build, sources

    data = load_config_file("pretrain.py").get_config("size=tiny").data

    out_dir = pathlib.Path(out_dir)
    text = out_dir.parent / f"{out_dir.name}.txt"
    write_docstring_corpus(text, max_files)
    documents = list(sources.text_file_documents(str(text)))
    tokenizer = tokenization.train_wordpiece(
        (s for d in documents for s in d), vocab_size=vocab_size, lowercase=True
    )
    options = build.PretrainingOptions(
        max_seq_length=data.max_seq_length, max_predictions_per_seq=data.max_predictions_per_seq,
        masked_lm_prob=data.masked_lm_prob, dupe_factor=2, static_masking=False,
    )  # fmt: skip
    build.build_pretraining_shards(documents, out_dir, tokenizer, options, progress=False)
    return str(out_dir)


def eval_rows(workdir) -> list[dict]:
    """The held-out rows of a run's metrics.jsonl (a line still being written is left out)."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        lines = [line for line in f if line.endswith("\n")]
    return [r for r in map(json.loads, lines) if "eval/mlm_accuracy" in r]


# 70-85 s each on 2 cores: out of the default suite; the plays with -m e2e (CI), the docstrings
# with -m full (`make test-full`).
@pytest.mark.parametrize(
    "corpus",
    [
        pytest.param("plays", marks=pytest.mark.e2e),
        pytest.param("docstrings", marks=pytest.mark.full),
    ],
)
def test_tiny_recipe_leaves_the_unigram_plateau_in_the_first_third(corpus, tmp_path):
    steps, third = 300, 100
    overrides = [
        f"--config.num_train_steps={steps}",
        f"--config.eval_every_steps={third}",
        "--config.num_eval_steps=4",
        "--config.log_every_steps=50",
    ]
    if corpus == "docstrings":
        build_dir = build_docstring_shards(tmp_path / "docstrings")
        overrides += [
            "--config.data.source=records",
            f"--config.data.paths={build_dir}",
            "--config.model.vocab_size=4096",
        ]
    else:
        overrides.append(f"--config.data.build_dir={tmp_path / 'plays'}")
    workdir = tmp_path / "run"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "train.py"),
            "--config=" + os.path.join(ROOT, "configs", "pretrain.py") + ":size=tiny",
            f"--workdir={workdir}",
            *overrides,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 1200
    while proc.poll() is None and time.time() < deadline:
        if (workdir / "metrics.jsonl").exists() and any(
            r["step"] == third for r in eval_rows(workdir)
        ):
            break
        time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-4000:]  # stopped, not done
    rows = {r["step"]: r for r in eval_rows(workdir)}
    share = rows[0]["eval/commonest_token_share"]
    assert 0.02 < share < 0.2
    assert rows[third]["eval/mlm_accuracy"] > share + 0.03, (share, rows)
    assert steps not in rows  # it was the first third of the run
