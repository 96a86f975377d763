"""Multiple choice in the SWAG format.

`read_swag` reads SWAG's CSV files (`sent1` the context, `sent2` the next sentence's start, any
number of `ending<k>` columns: C choices, and `label` except in the test file); `read_swag_hub`
the Hub's Parquet of `allenai/swag`, which the task reads when `data_dir` holds no train.csv
(docs/finetune_data.md). Each choice is one row [CLS] sent1 [SEP] sent2 ending_k [SEP], as the
BERT paper's SWAG set-up, truncated longest-first to `max_seq_length`:

    input_ids        int32   [N, C, L]
    token_type_ids   int32   [N, C, L]   0 for [CLS] sent1 [SEP], 1 for the ending and last [SEP]
    attention_mask   int32   [N, C, L]
    labels           int32   [N]         the right choice; -1 in an unlabelled file
    example_weights  float32 [N]         1.0 (`batching.batches` adds 0.0 fillers)

Bad input raises with the file and line: a missing column, a label that is not a choice index,
an empty file. Choices longer than `max_seq_length` are truncated and counted.
tensorflow-datasets 4.9 has no `swag` builder, so there is no tfds reader.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

import numpy as np

from bert_jax import tokenization
from bert_jax.data import sentence_features, tables, text_io
from bert_jax.finetune import metrics
from bert_jax.finetune import task as task_lib

_ENDING = re.compile(r"^ending(\d+)$")


@dataclasses.dataclass(frozen=True)
class MultipleChoiceExample:
    """One multiple-choice question.

    Attributes:
      guid: the example's id (the file's `fold-ind` column, else its row number).
      context: the first segment (SWAG's `sent1`).
      start: the shared start of every ending (SWAG's `sent2`).
      endings: the C candidate endings.
      label: the index of the right ending, or None (unlabelled).
    """

    guid: str
    context: str
    start: str
    endings: tuple[str, ...]
    label: int | None


def read_swag(
    path: str | os.PathLike, *, labelled: bool | None = None
) -> list[MultipleChoiceExample]:
    """Reads a SWAG-format CSV file.

    Args:
      path: e.g. train.csv, val.csv or test.csv.
      labelled: whether to read the `label` column; None reads it when present.

    Returns:
      The examples in file order.

    Raises:
      ValueError: an empty file, a missing column (`sent1`, `sent2`, `ending0`, `ending1`, ...,
        `label` if labelled), a row with the wrong number of fields, a label outside
        0..C-1; the message names the file, line and column.
    """
    path = os.fspath(path)
    with text_io.open_text(path) as f:
        rows = text_io.csv_rows(f, path)
        _, header = next(rows, (0, None))
        if header is None:
            raise ValueError(f"{path} is empty")
        endings, index, id_index = _columns(path, header, labelled)
        examples = []
        for line, row in rows:
            if not row:
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{path}:{line}: {len(row)} field(s), but the header has {len(header)}"
                )
            label = _label(path, line, row, index, len(endings))
            guid = row[id_index] if id_index is not None else str(len(examples))
            examples.append(
                MultipleChoiceExample(
                    guid,
                    row[index["sent1"]],
                    row[index["sent2"]],
                    tuple(row[i] for _, i in endings),
                    label,
                )
            )
    if not examples:
        raise ValueError(f"{path} has no examples")
    return examples


def read_swag_hub(files: Sequence[str]) -> list[MultipleChoiceExample]:
    """Reads the Hub's Parquet files of one SWAG split (local or gs://), streamed; a label of -1
    (the test split) reads as None.

    Raises:
      ValueError: a missing column, a null text, a label that is not a choice index; the
        message names the file and row.
    """
    examples = []
    for path in files:
        text_io.note_read(path)
        header = tables.column_names(path)
        endings, _, _ = _columns(path, header, labelled=False)
        ending_columns = [header[i] for _, i in endings]
        extra = [c for c in ("label", "fold-ind") if c in header]
        for row, record in tables.iter_rows(path, ["sent1", "sent2", *ending_columns, *extra]):
            where = f"{path}: row {row}"
            nulls = [c for c, v in record.items() if v is None and c != "label"]
            if nulls:
                raise ValueError(f"{where}: {nulls} null")
            label = record.get("label")
            if label is not None and label != -1 and not 0 <= label < len(endings):
                raise ValueError(f"{where}: label: {label} is not a choice index")
            examples.append(
                MultipleChoiceExample(
                    str(record.get("fold-ind", len(examples))),
                    record["sent1"],
                    record["sent2"],
                    tuple(record[c] for c in ending_columns),
                    None if label in (None, -1) else int(label),
                )
            )
    if not examples:
        raise ValueError(f"{', '.join(files)} has no examples")
    return examples


def _columns(
    path: str, header: list[str], labelled: bool | None
) -> tuple[list[tuple[int, int]], dict[str, int], int | None]:
    """The columns: (number, column) of each ending, of sent1/sent2/label, of fold-ind or None."""
    endings = sorted((int(m.group(1)), i) for i, c in enumerate(header) if (m := _ENDING.match(c)))
    if len(endings) < 2 or [k for k, _ in endings] != list(range(len(endings))):
        raise ValueError(
            f"{path}: the header needs columns ending0, ending1, ... (at least 2); it has {header}"
        )
    if labelled is None:
        labelled = "label" in header
    needed = ["sent1", "sent2"] + (["label"] if labelled else [])
    missing = [c for c in needed if c not in header]
    if missing:
        raise ValueError(f"{path}: the header lacks the column(s) {missing}; it has {header}")
    index = {c: header.index(c) for c in needed}
    id_index = header.index("fold-ind") if "fold-ind" in header else None
    return endings, index, id_index


def _label(path: str, line: int, row: list[str], index: dict[str, int], choices: int) -> int | None:
    """The row's label (None without a label column); ValueError if not a choice index."""
    label = None
    if "label" in index:
        value = row[index["label"]]
        if not value.strip().isdigit() or int(value) >= choices:
            raise ValueError(
                f"{path}:{line}: label: {value!r} is not a choice index in 0..{choices - 1}"
            )
        label = int(value)
    return label


def featurize(
    examples: Sequence[MultipleChoiceExample],
    tokenizer: tokenization.SubwordTokenizer,
    max_seq_length: int,
) -> tuple[dict[str, np.ndarray], sentence_features.FeatureStats]:
    """Multiple-choice features (keys in the module docstring).

    Args:
      examples: N examples with C endings each.
      tokenizer: the WordPiece tokenizer.
      max_seq_length: L; longer choices are truncated (counted per choice in the stats).

    Returns:
      (features with leading axis N, counts over the N * C choice rows).
    """
    if not examples:
        raise ValueError("no examples to featurize")
    num_choices = len(examples[0].endings)
    for example in examples:
        if len(example.endings) != num_choices:
            raise ValueError(
                f"example {example.guid!r} has {len(example.endings)} endings, the first has "
                f"{num_choices}"
            )
    firsts = [e.context for e in examples for _ in e.endings]
    seconds = [f"{e.start} {ending}".strip() for e in examples for ending in e.endings]
    rows, stats = sentence_features.encode_texts(tokenizer, firsts, seconds, max_seq_length)
    n = len(examples)
    features = {k: v.reshape(n, num_choices, max_seq_length) for k, v in rows.items()}
    features["labels"] = np.array(
        [-1 if e.label is None else e.label for e in examples], dtype=np.int32
    )
    features["example_weights"] = np.ones(n, dtype=np.float32)
    return features, stats


# ---- The fine-tuning task ----

FILES = ("train.csv", "val.csv", "test.csv")
NUM_CHOICES = 4  # SWAG's endings (other files may have other counts: the data decides)


def _load(ft, tokenizer):
    """TaskData of SWAG: the CSV files in data_dir, else the Hub's Parquet layout there (inputs
    [N, C, L], one row per choice)."""
    train_examples = _read(ft, 0, "train")
    if train_examples is None:  # read_swag names the file that is missing
        train_examples = read_swag(task_lib.split_file(ft, 0, FILES))
    train = task_lib.subsample(train_examples, ft.max_train_examples, 0)
    features, _ = featurize(train, tokenizer, ft.max_seq_length)
    evals = []
    for which, split in ((1, "dev"), (2, "test")):
        examples = _read(ft, which, "validation" if split == "dev" else split)
        if examples:
            examples = task_lib.subsample(examples, ft.max_eval_examples, 1)
            f, _ = featurize(examples, tokenizer, ft.max_seq_length)
            labelled = all(e.label is not None for e in examples)
            evals.append(task_lib.EvalSet(split, f, examples, labelled))
    num_choices = features["input_ids"].shape[1]
    return task_lib.TaskData("multiple_choice", num_choices, None, features, evals)


def _read(ft, which: int, hub_split: str) -> list[MultipleChoiceExample] | None:
    """A split's examples: its CSV (or an explicit .parquet file), else the Hub's `regular`
    configuration in data_dir; None if neither is there."""
    return task_lib.read_split(ft, which, FILES, hub_split, ("regular",), read_swag, read_swag_hub)


def _score(data, eval_set, outputs, ft, out_dir):
    """Accuracy over the choices, and `<split>_predictions.tsv`."""
    del data, ft
    preds = np.argmax(outputs["logits"], -1)
    if out_dir is not None:
        task_lib.write_rows(
            os.path.join(out_dir, f"{eval_set.name}_predictions.tsv"),
            [(e.guid, e.label, p) for e, p in zip(eval_set.examples, preds)],
            None,
        )
    if not eval_set.labelled:
        return {}
    return {"accuracy": metrics.accuracy([e.label for e in eval_set.examples], preds)}


TASK = task_lib.FinetuneTask(
    "swag", _load, _score, files=FILES, objective="multiple_choice", num_labels=NUM_CHOICES
)
