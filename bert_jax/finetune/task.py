"""What a fine-tuning task is: one `FinetuneTask` per task, registered in `tasks.TASKS`.

A task reads and featurizes its splits (`load`), names the objective that trains it (the head
follows from the objective: `training.objectives.OBJECTIVES`), and scores a split's predictions
with its official metrics, writing its prediction files (`score`). `run.train_and_evaluate` does
the rest for every task alike: the model, the seeds, the loop, evaluation after each epoch,
exports.

Adding a task: write a module with its reader, featurizer and scorer, expose one `FinetuneTask`
built from them, and add it to `tasks.TASKS` (docs/architecture.md has a worked example).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging
from etils import epath

from bert_jax import tokenization
from bert_jax.data import sentence_features, tables, text_io
from bert_jax.finetune import metrics


@dataclasses.dataclass
class EvalSet:
    """A split to evaluate: its features, examples and the host-side metadata to decode them."""

    name: str
    features: dict[str, np.ndarray]
    examples: list
    labelled: bool
    extra: Any = None  # SQuAD windows, NER rows


@dataclasses.dataclass
class TaskData:
    """A task's featurized splits.

    Attributes:
      objective: the `bert_jax.training.objectives` name that trains it (which names its head).
      num_labels, label_names: the head's outputs (label_names None for regression, QA, choice).
      train: the training features ([N, ...] numpy arrays).
      evals: the dev (and test) splits.
      dataset: the `text_io.TextDataset` of a sequence task (its metrics), else None.
    """

    objective: str
    num_labels: int
    label_names: tuple[str, ...] | None
    train: dict[str, np.ndarray]
    evals: list[EvalSet]
    dataset: Any = None


Loader = Callable[[Any, tokenization.SubwordTokenizer], TaskData]
Scorer = Callable[[TaskData, EvalSet, Mapping[str, np.ndarray], Any, "str | None"], dict]


@dataclasses.dataclass(frozen=True)
class FinetuneTask:
    """One fine-tuning task.

    Attributes:
      name: the task's name (`configs/finetune.py:task=NAME`).
      load: (config.finetune, tokenizer) -> TaskData: reads and featurizes the splits.
      score: (data, eval_set, model outputs by field, config.finetune, out_dir or None) ->
        metrics of a labelled split; writes the prediction files into out_dir when given.
      files: the standard (train, dev, test) file names in `config.finetune.data_dir`.
      packable: whether several short examples may share a row (`config.finetune.pack`).
      objective, num_labels: what trains it and its head's outputs (as `TaskData` gives them),
        where they are known before any data is read; "" / 0 where the data decides (a custom
        task's labels). `train.py --mode=compile` needs them.
    """

    name: str
    load: Loader
    score: Scorer
    files: tuple[str, str, str] = ("", "", "")
    packable: bool = False
    objective: str = ""
    num_labels: int = 0


# ---- Helpers shared by the tasks ----
def split_file(ft, which: int, files: Sequence[str] = ("", "", "")) -> str:
    """The file of split `which` (0 train, 1 dev, 2 test): config.finetune's explicit
    train_file/dev_file/test_file, else the task's standard name in data_dir, else ""."""
    explicit = (ft.train_file, ft.dev_file, ft.test_file)[which]
    if explicit:
        return explicit
    name = files[which]
    return os.path.join(ft.data_dir, name) if name and ft.data_dir else ""


def hub_split_files(data_dir: str, split: str, configs: Sequence[str] = ()) -> list[str]:
    """The data files of `split` in `data_dir` laid out as the Hugging Face Hub keeps a dataset
    (`<config>/<split>-00000-of-00001.parquet`, `data/<split>-*.parquet`, a `datasets`
    DatasetDict folder, ...: `tables.split_files`), under the first of `configs` that has them,
    else in `data_dir` itself; [] if there are none (or no data_dir)."""
    if not data_dir:
        return []
    for config in (*configs, None):
        try:
            return tables.split_files(data_dir, split, config=config)
        except FileNotFoundError:
            continue
    return []


def read_split(
    ft,
    which: int,
    files: Sequence[str],
    hub_split: str,
    hub_configs: Sequence[str],
    read_file: Callable[[str], list],
    read_hub: Callable[[list[str]], list],
) -> list | None:
    """A split's examples: its file (`split_file`; an explicit .parquet file through `read_hub`,
    else `read_file`), else the Hub's layout of `hub_split` in data_dir under the first of
    `hub_configs` (`hub_split_files`); None if neither is there."""
    path = split_file(ft, which, files)
    if path.lower().endswith(".parquet"):
        return read_hub([path])
    if path and os.path.exists(path):
        return read_file(path)
    hub = hub_split_files(ft.data_dir, hub_split, hub_configs)
    return read_hub(hub) if hub else None


def file_columns(path: str) -> list[str]:
    """The column names of a CSV/TSV header (or the keys of the first JSONL record, or a
    Parquet/.arrow file's schema)."""
    if path.lower().endswith((".parquet", ".arrow")):
        return tables.column_names(path)
    with text_io.open_text(path) as f:
        if path.endswith((".jsonl", ".ndjson", ".json")):
            first = f.readline()
            try:
                record = json.loads(first or "{}")
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:1: not a JSON object: {e}") from None
            return list(record) if isinstance(record, dict) else []
        _, header = next(text_io.csv_rows(f, path, tsv=path.endswith(".tsv")), (0, []))
    return header


def has_column(path: str, column: str) -> bool:
    """Whether a file's header (`file_columns`) has `column` (test files may not)."""
    return column in file_columns(path)


def subsample(examples: list, limit: int, seed: int) -> list:
    """At most `limit` of the examples (0: all), chosen by `seed`, in their order."""
    if not limit or len(examples) <= limit:
        return examples
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), limit, replace=False))
    logging.info("using %d of %d examples", limit, len(examples))
    return [examples[i] for i in keep]


def sequence_data(splits: Mapping[str, list], dataset: text_io.TextDataset, ft, tokenizer):
    """TaskData of a sequence classification/regression task from its read splits ("train",
    optional "dev" and "test" lists of `text_io.TextExample`)."""
    train = subsample(splits["train"], ft.max_train_examples, 0)
    features, stats = sentence_features.featurize(train, tokenizer, dataset, ft.max_seq_length)
    stats.log()
    evals = []
    for split in ("dev", "test"):
        if split in splits and splits[split]:
            examples = subsample(splits[split], ft.max_eval_examples, 1)
            f, s = sentence_features.featurize(examples, tokenizer, dataset, ft.max_seq_length)
            s.log()
            labelled = all(e.label is not None for e in examples)
            evals.append(EvalSet(split, f, examples, labelled))
    regression = dataset.is_regression
    return TaskData(
        "regression" if regression else "classification",
        1 if regression else dataset.num_labels,
        None if regression else tuple(dataset.label_names),
        features,
        evals,
        dataset=dataset,
    )


def sequence_predictions(data: TaskData, outputs) -> np.ndarray:
    """[N] predictions of a sequence task: class ids, or the score of a regression."""
    logits = outputs["logits"]
    return logits[:, 0] if data.objective == "regression" else np.argmax(logits, -1)


def score_sequence(data: TaskData, eval_set: EvalSet, outputs, ft, out_dir) -> dict[str, float]:
    """The dataset's metrics of a labelled split, and `<split>_predictions.tsv`."""
    del ft
    preds = sequence_predictions(data, outputs)
    result = {}
    if eval_set.labelled:
        labels = np.array([e.label for e in eval_set.examples])
        result = metrics.compute(data.dataset.metrics, labels, preds)
    if out_dir is not None:
        write_rows(
            os.path.join(out_dir, f"{eval_set.name}_predictions.tsv"),
            [(e.guid, e.label, p) for e, p in zip(eval_set.examples, preds)],
            data.label_names,
        )
    return result


def write_rows(path: str, rows: Sequence[tuple], label_names) -> None:
    """A prediction TSV: id, label (gold, "" if unknown) and prediction, label ids as names
    (written through `etils.epath`: `path` may be a `gs://` URL)."""

    def name(value):
        if label_names is not None and isinstance(value, (int, np.integer)) and value >= 0:
            return label_names[int(value)]
        return "" if value is None else (f"{value:.6g}" if isinstance(value, float) else str(value))

    with epath.Path(path).open("w", encoding="utf-8") as f:
        f.write("id\tlabel\tprediction\n")
        for guid, label, pred in rows:
            f.write(f"{guid}\t{name(label)}\t{name(pred)}\n")
