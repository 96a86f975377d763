"""Custom sequence classification or regression: your own CSV, TSV or JSONL files.

    python train.py --config=configs/finetune.py:task=custom --workdir=runs/mine \
      --config.finetune.train_file=train.csv --config.finetune.dev_file=dev.csv \
      --config.finetune.text_columns=question,answer --config.finetune.label_column=label

Texts come from the 1 or 2 named columns; labels are collected from the training file (sorted;
surrounding whitespace removed, a blank label refused: `text_io.label_value`), or read as floats
with `regression=True`. A test file without the label column is predicted, not
scored; a dev file must have it (it is there to be scored).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from bert_jax.data import text_io
from bert_jax.finetune.task import (
    FinetuneTask,
    file_columns,
    has_column,
    score_sequence,
    sequence_data,
    split_file,
)

FILES = ("train.csv", "dev.csv", "test.csv")


def custom_dataset(
    name: str,
    text_keys: Sequence[str],
    *,
    label_column: str = "label",
    label_names: Sequence[str] | None = None,
    regression: bool = False,
    metrics: Sequence[str] | None = None,
) -> text_io.TextDataset:
    """A classification or regression task read from files with named columns.

    Args:
      name: the task's name.
      text_keys: the 1 or 2 text columns (CSV/TSV header names or JSONL keys).
      label_column: the label column.
      label_names: the label strings in id order (see `text_io.collect_label_names`); None for
        regression.
      regression: predict one float per example.
      metrics: default ("pearson", "spearman") for regression, else ("accuracy",) plus "f1" for
        two classes (the F1 of label id 1, the second of `label_names`).

    Returns:
      The task.
    """
    if regression:
        if label_names:
            raise ValueError("a regression task has no label_names")
        num_labels, label_names = 1, ()
        metrics = tuple(metrics or ("pearson", "spearman"))
    else:
        if not label_names or len(label_names) < 2:
            raise ValueError(
                f"task {name!r}: a classification task needs at least 2 label_names (got "
                f"{label_names}); collect_label_names(path, label_column) lists a file's labels"
            )
        label_names = tuple(str(n) for n in label_names)
        num_labels = len(label_names)
        metrics = tuple(metrics or (("accuracy", "f1") if num_labels == 2 else ("accuracy",)))
    return text_io.TextDataset(
        name,
        tuple(text_keys),
        num_labels,
        metrics,
        label_names,
        label_column=label_column,
    )


def load(ft, tokenizer):
    """TaskData of config.finetune's files (train_file, else data_dir/train.csv; dev, test)."""
    columns = tuple(c.strip() for c in ft.text_columns.split(",") if c.strip())
    train_path = split_file(ft, 0, FILES)
    if not train_path:
        raise ValueError("task=custom needs config.finetune.train_file (or data_dir/train.csv)")
    labels = None
    if not ft.regression:
        labels = text_io.collect_label_names(train_path, ft.label_column)
        if len(labels) < 2:
            raise ValueError(
                f"{train_path}: every training example has the label {labels[0]!r} (column "
                f"{ft.label_column!r}); a classifier needs at least 2 labels: add examples of "
                "the others, or set finetune.regression=True for numeric scores"
            )
    dataset = custom_dataset(
        "custom",
        columns,
        label_column=ft.label_column,
        label_names=labels,
        regression=ft.regression,
    )
    splits = {"train": text_io.read_records(train_path, dataset)}
    for which, split in ((1, "dev"), (2, "test")):
        path = split_file(ft, which, FILES)
        explicit = (ft.dev_file, ft.test_file)[which - 1]
        if explicit and not os.path.isfile(explicit):
            raise FileNotFoundError(f"finetune.{split}_file: no such file: {explicit}")
        if path and os.path.exists(path):
            labelled = has_column(path, ft.label_column)
            if split == "dev" and not labelled:  # a dev set is there to be scored
                raise ValueError(
                    f"{path}: the dev file has no label column {ft.label_column!r} "
                    f"(finetune.label_column); its columns are {file_columns(path)}"
                )
            splits[split] = text_io.read_records(path, dataset, labelled=labelled)
    return sequence_data(splits, dataset, ft, tokenizer)


TASK = FinetuneTask("custom", load, score_sequence, files=FILES, packable=True)
