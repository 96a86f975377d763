"""GLUE: the dataset table, readers, the fine-tuning tasks and the submission file.

`GLUE_DATASETS` holds one frozen `text_io.TextDataset` per task (text keys, labels in id order,
metrics; the table: docs/finetune_data.md, "GLUE"). Label strings are those of the GLUE TSV files,
which a submission must contain; the first metric is the one the BERT paper reports.

Readers, each giving `TextExample(guid, texts, label)`: `read_glue`/`read_glue_tsv` (the GLUE TSV
files), `read_glue_hub` (the Hub's Parquet of `nyu-mll/glue`, which the tasks read when
`data_dir` holds no GLUE TSV files; class ids mapped to the TSV labels through their names) and
`read_glue_tfds`. `sentence_features.featurize` makes the features; `TASKS` are the fine-tuning
tasks of every
dataset with a training set; `write_submission` writes a test split's submission TSV.

Bad input raises with the file, line and column: a label outside the label set, a missing column,
a short row, an empty file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
from etils import epath

from bert_jax.data import tables
from bert_jax.data.text_io import (
    ID_COLUMNS,
    ReadStats,
    TextDataset,
    TextExample,
    as_str,
    check_on_bad_row,
    csv_rows,
    note_read,
    open_text,
    tfds_builder,
    tfds_records,
)
from bert_jax.finetune import task as task_lib

# ---- The task table ----


_BINARY = ("0", "1")
_NLI3 = ("contradiction", "entailment", "neutral")  # run_classifier.py's MNLI order.
_NLI2 = ("entailment", "not_entailment")
_PAIR = ("sentence1", "sentence2")
_NLI_PAIR = ("premise", "hypothesis")


def _glue(
    name: str,
    glue_dir: str,
    text_keys: tuple[str, ...],
    num_labels: int,
    metrics: tuple[str, ...],
    label_names: tuple[str, ...] = (),
    **fields,
) -> TextDataset:
    """A GLUE task: tfds "glue/<name>", submission "<glue_dir>.tsv" unless `fields` say."""
    derived = dict(glue_dir=glue_dir, tfds_name=f"glue/{name}", submission_file=f"{glue_dir}.tsv")
    return TextDataset(name, text_keys, num_labels, metrics, label_names, **(derived | fields))


def _mnli(name: str, half: str, submission_tag: str) -> TextDataset:
    """MNLI's "matched" or "mismatched" half: one train set, its own dev/test files and splits."""
    return _glue(
        name,
        "MNLI",
        _NLI_PAIR,
        3,
        ("accuracy",),
        _NLI3,
        text_columns=_PAIR,
        label_column="gold_label",
        dev_file=f"dev_{half}.tsv",
        test_file=f"test_{half}.tsv",
        tfds_name="glue/mnli",
        tfds_dev_split=f"validation_{half}",
        tfds_test_split=f"test_{half}",
        submission_file=f"MNLI-{submission_tag}.tsv",
    )


GLUE_DATASETS: dict[str, TextDataset] = {
    t.name: t
    for t in [
        _glue(
            "cola", "CoLA", ("sentence",), 2, ("matthews_corrcoef",), _BINARY, headerless=((3,), 1)
        ),
        _glue("sst2", "SST-2", ("sentence",), 2, ("accuracy",), _BINARY),
        _glue(
            "mrpc",
            "MRPC",
            _PAIR,
            2,
            ("f1", "accuracy"),
            _BINARY,
            text_columns=("#1 String", "#2 String"),
            label_column="Quality",
        ),
        _glue("stsb", "STS-B", _PAIR, 1, ("spearman", "pearson"), label_column="score"),
        _glue(
            "qqp",
            "QQP",
            ("question1", "question2"),
            2,
            ("f1", "accuracy"),
            _BINARY,
            label_column="is_duplicate",
        ),
        _mnli("mnli", "matched", "m"),
        _mnli("mnli_mismatched", "mismatched", "mm"),
        _glue("qnli", "QNLI", ("question", "sentence"), 2, ("accuracy",), _NLI2),
        _glue("rte", "RTE", _PAIR, 2, ("accuracy",), _NLI2),
        _glue("wnli", "WNLI", _PAIR, 2, ("accuracy",), _BINARY),
        _glue(
            "ax",
            "diagnostic",
            _NLI_PAIR,
            3,
            ("matthews_corrcoef",),
            _NLI3,
            text_columns=_PAIR,
            train_file="",
            dev_file="",
            test_file="diagnostic.tsv",
            tfds_dev_split="",
            submission_file="AX.tsv",
        ),
    ]
}


_ALIASES = {
    "sst": "sst2",
    "sts": "stsb",
    "mnlim": "mnli",
    "mnlimatched": "mnli",
    "mnlimm": "mnli_mismatched",
    "mnlimismatched": "mnli_mismatched",
    "diagnostic": "ax",
}


def get_dataset(task: str | TextDataset) -> TextDataset:
    """The `TextDataset` of a name ("mrpc", "SST-2", "MNLI-mm", ...), or `task` itself."""
    if isinstance(task, TextDataset):
        return task
    key = task.lower().replace("-", "").replace("_", "")
    key = _ALIASES.get(key, key)
    if key not in GLUE_DATASETS:
        raise KeyError(f"unknown GLUE task {task!r}; known: {sorted(GLUE_DATASETS)}")
    return GLUE_DATASETS[key]


# ---- Examples and reading ----


def read_glue_tsv(
    task: str | TextDataset,
    path: str | os.PathLike,
    *,
    on_bad_row: str = "raise",
    stats: ReadStats | None = None,
) -> list[TextExample]:
    """Reads one GLUE TSV file (train, dev or test) of `task`.

    Columns are found by their header names (`task.text_columns`, `task.label_column`); a file
    without the label column (a test file) gives `label=None`. CoLA's train/dev files have no
    header and are read by position. Fields are tab-separated with no quoting, as the original.

    Args:
      task: a `TextDataset` or its name.
      path: the .tsv file.
      on_bad_row: "raise" (default) on a short row or a bad label, or "skip" it and record it in
        `stats.skipped`.
      stats: filled with counts.

    Returns:
      The examples in file order.

    Raises:
      ValueError: empty file, missing columns, a short row, a label outside the label set; the
        message names the file, line and column.
    """
    task, path = get_dataset(task), os.fspath(path)
    check_on_bad_row(on_bad_row)
    stats = stats if stats is not None else ReadStats()
    examples = []
    with open_text(path) as f:
        rows = (row for _, row in csv_rows(f, path, tsv=True))  # one line a row: no quoting
        header = next(rows, None)
        if header is None:
            raise ValueError(f"{path} is empty")
        text_idx, label_idx, id_idx, first_line = _locate_columns(task, path, header)
        if first_line == 1:
            rows = _chain([header], rows)
        for row_number, row in enumerate(rows):
            where = f"{path}:{row_number + first_line}"
            try:
                example = _row_to_example(task, row, text_idx, label_idx, id_idx, where, row_number)
            except ValueError as e:
                if on_bad_row == "raise":
                    raise
                stats.skipped.append(str(e))
                continue
            examples.append(example)
    if not examples:
        raise ValueError(f"{path} has no examples")
    stats.examples += len(examples)
    return examples


def _chain(first: Iterable, rest: Iterable):
    yield from first
    yield from rest


def _locate_columns(
    task: TextDataset, path: str, header: list[str]
) -> tuple[list[int], int | None, int | None, int]:
    """(text column indices, label index or None, id index or None, line of the first row)."""
    if all(c in header for c in task.text_columns):
        text_idx = [header.index(c) for c in task.text_columns]
        label_idx = header.index(task.label_column) if task.label_column in header else None
        id_idx = next((header.index(c) for c in ID_COLUMNS if c in header), None)
        return text_idx, label_idx, id_idx, 2
    if task.headerless is not None and not any(c in ID_COLUMNS for c in header):
        text_idx, label_idx = task.headerless
        return list(text_idx), label_idx, None, 1
    missing = [c for c in task.text_columns if c not in header]
    raise ValueError(
        f"{path}: the header lacks the column(s) {missing} of task {task.name!r}; it has {header}"
    )


def _row_to_example(
    task: TextDataset,
    row: list[str],
    text_idx: list[int],
    label_idx: int | None,
    id_idx: int | None,
    where: str,
    row_number: int,
) -> TextExample:
    needed = max([*text_idx, label_idx or 0, id_idx or 0]) + 1
    if len(row) < needed:
        raise ValueError(f"{where}: {len(row)} tab-separated field(s), expected at least {needed}")
    label = None
    if label_idx is not None:
        column = task.label_column if task.headerless is None else f"column {label_idx + 1}"
        try:
            label = task.label_id(row[label_idx])
        except ValueError as e:
            raise ValueError(f"{where}: {column}: {e}") from None
    guid = row[id_idx] if id_idx is not None else str(row_number)
    return TextExample(guid, tuple(row[i] for i in text_idx), label)


def glue_file(task: str | TextDataset, glue_dir: str | os.PathLike, split: str) -> str:
    """The path of a task's split ("train", "dev" or "test") in the GLUE data directory."""
    task = get_dataset(task)
    files = {"train": task.train_file, "dev": task.dev_file, "test": task.test_file}
    if split not in files:
        raise ValueError(f"split must be 'train', 'dev' or 'test', not {split!r}")
    if not files[split]:
        raise ValueError(f"task {task.name!r} has no {split} split")
    return os.path.join(os.fspath(glue_dir), task.glue_dir, files[split])


def read_glue(
    task: str | TextDataset,
    glue_dir: str | os.PathLike,
    split: str,
    *,
    on_bad_row: str = "raise",
    stats: ReadStats | None = None,
) -> list[TextExample]:
    """Reads a split of a task from the standard GLUE data directory (as `download_glue_data.py`
    lays it out: `<glue_dir>/MRPC/train.tsv`, `<glue_dir>/MNLI/dev_mismatched.tsv`, ...).

    Row numbers become the guids of files without an index column; the row numbering restarts
    for each file. See `read_glue_tsv` for the arguments and errors.
    """
    return read_glue_tsv(task, glue_file(task, glue_dir, split), on_bad_row=on_bad_row, stats=stats)


# The Hub's class names where they are not the GLUE files' labels by id ("0", "1"): the datasets
# library's glue configurations (for files without its metadata).
_HUB_NLI3 = ("entailment", "neutral", "contradiction")
_HUB_LABEL_NAMES = {"mnli": _HUB_NLI3, "ax": _HUB_NLI3, "qnli": _NLI2, "rte": _NLI2}


def _hub_split(task: TextDataset, split: str) -> tuple[str, str]:
    """(configuration, split name) of a task's "train"/"dev"/"test" on the Hub (tfds's names)."""
    names = {"train": "train", "dev": task.tfds_dev_split, "test": task.tfds_test_split}
    if split not in names:
        raise ValueError(f"split must be 'train', 'dev' or 'test', not {split!r}")
    if not names[split] or (split == "train" and not task.train_file):
        raise ValueError(f"task {task.name!r} has no {split} split")
    return task.tfds_name.split("/")[1], names[split]


def glue_hub_files(task: str | TextDataset, data_dir: str | os.PathLike, split: str) -> list[str]:
    """The Parquet files of a task's split in a folder of the Hub's `nyu-mll/glue` layout (its
    configuration's folder, or `data_dir` itself being that folder); [] if there are none."""
    task = get_dataset(task)
    config, hub_split = _hub_split(task, split)
    return task_lib.hub_split_files(os.fspath(data_dir), hub_split, (config,))


def read_glue_hub(
    task: str | TextDataset, data_dir: str | os.PathLike, split: str
) -> list[TextExample]:
    """Reads a split ("train", "dev" or "test") of a task from the Hub's Parquet layout of
    `nyu-mll/glue` in `data_dir` (docs/finetune_data.md, "The Hub's Parquet layout"). The guid
    is the row's `idx`; a test split's labels (-1) read as None.

    Raises:
      FileNotFoundError: no files of the split.
      ValueError: a missing column, a null text, a label outside the task's labels; the message
        names the file and row.
    """
    task = get_dataset(task)
    files = glue_hub_files(task, data_dir, split)
    if not files:
        config, hub_split = _hub_split(task, split)
        raise FileNotFoundError(
            f"no {config}/{hub_split}-*.parquet (the Hub's nyu-mll/glue layout) in {data_dir}"
        )
    columns = [*task.text_keys, "label", "idx"]
    examples = []
    for path in files:
        note_read(path)
        names = tables.class_label_names(path).get("label")
        names = names or _HUB_LABEL_NAMES.get(task.tfds_name.split("/")[1])
        for row, record in tables.iter_rows(path, columns):
            where = f"{path}: row {row}"
            texts = tuple(record[k] for k in task.text_keys)
            if any(t is None for t in texts):
                raise ValueError(f"{where}: a text ({', '.join(task.text_keys)}) is null")
            label = None if split == "test" else _hub_label(task, record["label"], names, where)
            examples.append(TextExample(str(record["idx"]), texts, label))
    if not examples:
        raise ValueError(f"{files[0]} has no examples")
    return examples


def _hub_label(task: TextDataset, value, names: Sequence[str] | None, where: str):
    """The label id (or score) of a Hub class id, through its class name where the task has it."""
    if value is None:
        raise ValueError(f"{where}: the label is null")
    if task.is_regression:
        return float(value)
    value = int(value)
    name = names[value] if names and 0 <= value < len(names) else None
    try:
        return task.label_id(name if name in task.label_names else str(value))
    except ValueError as e:
        raise ValueError(f"{where}: label {value}: {e}") from None


def read_glue_tfds(
    task: str | TextDataset,
    split: str,
    *,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
) -> list[TextExample]:
    """Reads a split of a GLUE task prepared by tensorflow-datasets (`glue/<config>`).

    Labels are mapped through their names (tfds orders MNLI's classes differently from the
    GLUE files); test splits, whose tfds labels are -1, get `label=None`. The guid is tfds's
    `idx`, the row of the GLUE file (as a submission needs it).

    Args:
      task: a GLUE task or its name.
      split: "train", "dev" or "test" (e.g. "dev" of "mnli_mismatched" is tfds's
        `validation_mismatched`), or any tfds split string such as "train[:10%]".
      data_dir: the tfds data directory holding the prepared dataset.
      download: download and prepare it when it is missing (needs network).

    Returns:
      The examples in tfds order.

    Raises:
      ImportError: tensorflow-datasets is not installed (the `tf` extra).
      FileNotFoundError: the dataset is not prepared in `data_dir` and `download` is False.
    """
    task = get_dataset(task)
    if not task.tfds_name:
        raise ValueError(f"task {task.name!r} has no tfds dataset")
    tfds_split = {"train": "train", "dev": task.tfds_dev_split, "test": task.tfds_test_split}.get(
        split, split
    )
    if not tfds_split:
        raise ValueError(f"task {task.name!r} has no {split} split in tfds")
    builder = tfds_builder(task.tfds_name, data_dir, download)
    features = builder.info.features
    tfds_label_names = getattr(features["label"], "names", None)
    is_test = tfds_split.startswith(task.tfds_test_split) if task.tfds_test_split else False
    where = f"tfds:{task.tfds_name}/{tfds_split}"
    examples = []
    for record in tfds_records(builder, tfds_split):
        texts = tuple(as_str(record[k]) for k in task.text_keys)
        raw = record["label"]
        if is_test or (tfds_label_names is not None and int(raw) < 0):
            label = None
        elif task.is_regression:
            label = float(raw)
        else:
            name = tfds_label_names[int(raw)]
            value = name if name in task.label_names else str(int(raw))
            try:
                label = task.label_id(value)
            except ValueError as e:
                raise ValueError(f"{where}: idx {int(record['idx'])}: {e}") from None
        examples.append(TextExample(str(int(record["idx"])), texts, label))
    if not examples:
        raise ValueError(f"{where} has no examples")
    return examples


# ---- GLUE submission ----


def write_submission(
    output_dir: str | os.PathLike,
    task: str | TextDataset,
    examples: Sequence[TextExample],
    predictions: Sequence[int] | Sequence[float] | np.ndarray,
) -> str:
    """Writes a task's GLUE submission file, e.g. `<output_dir>/MRPC.tsv`.

    The file has the header `index<TAB>prediction` and one row per test example: its index (the
    guid) and the predicted label string ("entailment", "1", ...) or, for STS-B, the score
    clipped to [0, 5].

    Args:
      output_dir: the directory of the submission (created if missing).
      task: a GLUE task with a `submission_file`.
      examples: the test examples, in file order.
      predictions: [N] class ids (int) or scores (float, regression).

    Returns:
      The path written.
    """
    task = get_dataset(task)
    if not task.submission_file:
        raise ValueError(f"task {task.name!r} is not part of a GLUE submission")
    predictions = np.asarray(predictions)
    if predictions.shape != (len(examples),):
        raise ValueError(
            f"{len(examples)} examples but predictions of shape {predictions.shape}; drop the "
            "batch fillers (example_weights 0) first"
        )
    output_dir = epath.Path(output_dir)  # a gs:// URL stays one
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / task.submission_file
    lines = ["index\tprediction"]
    for example, prediction in zip(examples, predictions):
        if task.is_regression:
            value = f"{float(np.clip(prediction, 0.0, 5.0)):.3f}"
        else:
            label_id = int(prediction)
            if not 0 <= label_id < task.num_labels:
                raise ValueError(f"example {example.guid!r}: predicted class {label_id} invalid")
            value = task.label_names[label_id]
        lines.append(f"{example.guid}\t{value}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return os.fspath(path)


# ---- The fine-tuning tasks ----


def _load(name: str):
    def load(ft, tokenizer):
        """TaskData of a GLUE task: the GLUE files in data_dir (else the Hub's Parquet layout
        there), or tensorflow-datasets."""
        dataset = get_dataset(name)
        splits = {}
        for split in ("train", "dev", "test"):
            if ft.source == "tfds":
                splits[split] = read_glue_tfds(dataset, split, data_dir=ft.tfds_data_dir or None)
                continue
            path = glue_file(dataset, ft.data_dir, split)
            if os.path.exists(path):
                splits[split] = read_glue(dataset, ft.data_dir, split)
            elif ft.data_dir and glue_hub_files(dataset, ft.data_dir, split):
                splits[split] = read_glue_hub(dataset, ft.data_dir, split)
            elif split == "train":
                raise FileNotFoundError(
                    f"data_dir={ft.data_dir!r} holds neither {path} (the GLUE files) nor "
                    f"{_hub_split(dataset, split)[0]}/train-*.parquet (the Hub's nyu-mll/glue)"
                )
        return task_lib.sequence_data(splits, dataset, ft, tokenizer)

    return load


def _score(data, eval_set, outputs, ft, out_dir):
    """The dataset's metrics, the prediction TSV, and the GLUE submission file of a test split."""
    result = task_lib.score_sequence(data, eval_set, outputs, ft, out_dir)
    if out_dir is not None and eval_set.name == "test":
        preds = task_lib.sequence_predictions(data, outputs)
        write_submission(out_dir, data.dataset, eval_set.examples, preds)
    return result


# Every GLUE dataset with a training set (the diagnostic "ax" is test only).
TASKS = tuple(
    task_lib.FinetuneTask(
        name,
        _load(name),
        _score,
        packable=True,
        objective="regression" if dataset.num_labels == 1 else "classification",
        num_labels=dataset.num_labels,
    )
    for name, dataset in GLUE_DATASETS.items()
    if dataset.train_file
)
