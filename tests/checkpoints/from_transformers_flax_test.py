"""docs/from_transformers_flax.md: its runnable example runs, on a checkpoint transformers 4.57's
FlaxBertForSequenceClassification wrote, and what it saves reads back."""

import pathlib
import re
import shutil

import numpy as np

import bert_jax
from bert_jax.checkpoints import detect, hf_flax, table

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "from_transformers_flax.md"
FIXTURE = ROOT / "tests" / "testdata" / "hf_flax" / "BertForSequenceClassification"


def runnable_example() -> str:
    """The python block under the guide's "A runnable example" heading."""
    section = GUIDE.read_text().split("## A runnable example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_guides_example_runs(tmp_path, monkeypatch):
    shutil.copytree(FIXTURE, tmp_path / "my-flax-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(18)]
    (tmp_path / "my-flax-bert" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(runnable_example(), str(GUIDE), "exec"), scope)  # noqa: S102 - the docs' code
    assert scope["logits"].shape == (2, 4) and np.isfinite(float(scope["loss"]))
    tuned = bert_jax.from_pretrained(tmp_path / "my-flax-bert-tuned")
    assert table.max_difference(scope["params"], tuned.params) == 0.0
    before = hf_flax.read_file(tmp_path / "my-flax-bert" / hf_flax.WEIGHTS_NAME)
    after = hf_flax.read_file(tmp_path / "my-flax-bert-tuned" / hf_flax.WEIGHTS_NAME)
    assert sorted(before) == sorted(after)  # the tree transformers wrote, trained
    assert detect.detect_format(str(tmp_path / "my-bert-tuned-pt")) == "hf"
