"""The task registry: every fine-tuning task is one FinetuneTask registered once, and the worked
example of docs/architecture.md adds a task as it says."""

import importlib.util
import pathlib
import re
import sys

import ml_collections
import numpy as np

from bert_jax.finetune import task as task_lib
from bert_jax.finetune import tasks
from bert_jax.models.families import Role
from bert_jax.training import objectives
from tests.common import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_registry_names_each_task_once_and_configs_offer_them_all():
    assert all(name == t.name for name, t in tasks.TASKS.items())
    assert all(isinstance(t, task_lib.FinetuneTask) for t in tasks.TASKS.values())
    finetune_config = load_config_file("finetune.py")
    assert list(finetune_config.TASKS) == sorted(tasks.TASKS)
    for name in tasks.TASKS:
        assert finetune_config.get_config(f"task={name}").finetune.name == name


def test_unknown_task_is_refused_with_the_known_ones():
    try:
        tasks.get_task("paraphrase-xl")
    except ValueError as e:
        assert "paraphrase-xl" in str(e) and "mrpc" in str(e)
    else:
        raise AssertionError("an unknown task was accepted")


def _docs_example_module(tmp_path):
    """The paraphrase task module of docs/architecture.md, imported from the docs' own text."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    code = re.search(r"```python\n(# bert_jax/finetune/paraphrase\.py\n.*?)```", text, re.S)
    assert code, "docs/architecture.md lost its worked example"
    path = tmp_path / "paraphrase.py"
    path.write_text(code.group(1))
    spec = importlib.util.spec_from_file_location("paraphrase_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_documented_example_task_loads_and_scores(tmp_path, tokenizer, monkeypatch):
    paraphrase = _docs_example_module(tmp_path)
    monkeypatch.setitem(tasks.TASKS, paraphrase.TASK.name, paraphrase.TASK)
    rows = [("a cat sat", "a cat was sitting", "1"), ("a cat sat", "stocks fell", "0")] * 3
    for name in ("pairs_train.tsv", "pairs_dev.tsv"):
        lines = ["left\tright\tsame"] + ["\t".join(r) for r in rows]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    ft = ml_collections.ConfigDict(
        dict(
            data_dir=str(tmp_path),
            train_file="",
            dev_file="",
            test_file="",
            max_train_examples=0,
            max_eval_examples=0,
            max_seq_length=16,
        )
    )
    task = tasks.get_task("paraphrase")
    data = task.load(ft, tokenizer)
    assert data.objective == "classification"
    assert objectives.get_objective(data.objective).role is Role.SEQUENCE_CLASSIFICATION
    assert data.train["input_ids"].shape == (6, 16) and [e.name for e in data.evals] == ["dev"]
    labels = np.array([1, 0] * 3)
    logits = np.stack([1 - labels, labels], axis=1).astype(np.float32)  # always right
    scores = task.score(data, data.evals[0], {"logits": logits}, ft, str(tmp_path))
    assert scores == {"accuracy": 1.0, "f1": 1.0}
    assert (tmp_path / "dev_predictions.tsv").read_text().splitlines()[1] == "0\t1\t1"
