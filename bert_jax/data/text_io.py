"""Text datasets for fine-tuning: reading files (CSV, TSV, JSONL, tensorflow-datasets) into
sentence (pair) examples, shared by every text task (GLUE, custom files, the
Shakespeare genres, and the readers of SQuAD, CoNLL and SWAG).

A `TextDataset` describes a sequence classification or regression dataset: its text and label
columns, labels, metrics, and where GLUE keeps it. `read_records(path, dataset)` reads a CSV
(standard quoting), TSV (no quoting, as GLUE) or JSONL file with named columns into
`TextExample(guid, texts, label)`, and so does a Parquet or `datasets` .arrow file with those
columns (`bert_jax.data.tables`, streamed); `open_text`, `tfds_builder` and `tfds_records` are
the file and tensorflow-datasets readers the other tasks use.

`sentence_features.featurize` turns the examples into numpy features.

Bad input raises with the file, line and column: a label outside the label set, a missing column,
a short row, an empty file.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import io
import math
import os
from collections.abc import Iterator, Sequence

from absl import logging
from etils import epath

from bert_jax.data import tables


@dataclasses.dataclass(frozen=True)
class TextDataset:
    """One sequence classification or regression task.

    Attributes:
      name: short name, e.g. "mrpc".
      text_keys: the text fields (1 or 2), named as in tfds (and as the columns of a custom file).
      num_labels: the number of classes; 1 means regression.
      metrics: metric names of `metrics.METRIC_FNS`, the first the one to select on.
      label_names: the label strings of the files, in label-id order (empty for regression).
      text_columns: header names of the text fields in the GLUE TSV files (default `text_keys`).
      label_column: header name of the label in the files.
      headerless: (text column indices, label column index) of a file without a header (CoLA's
        train/dev), or None.
      glue_dir: the task's directory in the GLUE data.
      train_file, dev_file, test_file: file names in `glue_dir` ("" if the split does not exist).
      tfds_name: the tensorflow-datasets name, e.g. "glue/mrpc".
      tfds_dev_split, tfds_test_split: the tfds split names of dev and test.
      submission_file: the file name in a GLUE submission, e.g. "MRPC.tsv".
    """

    name: str
    text_keys: tuple[str, ...]
    num_labels: int
    metrics: tuple[str, ...]
    label_names: tuple[str, ...] = ()
    text_columns: tuple[str, ...] = ()
    label_column: str = "label"
    headerless: tuple[tuple[int, ...], int] | None = None
    glue_dir: str = ""
    train_file: str = "train.tsv"
    dev_file: str = "dev.tsv"
    test_file: str = "test.tsv"
    tfds_name: str = ""
    tfds_dev_split: str = "validation"
    tfds_test_split: str = "test"
    submission_file: str = ""

    def __post_init__(self):
        if not 1 <= len(self.text_keys) <= 2:
            raise ValueError(f"task {self.name!r}: needs 1 or 2 text keys, got {self.text_keys}")
        if self.num_labels < 1:
            raise ValueError(f"task {self.name!r}: num_labels must be >= 1")
        if self.num_labels > 1 and len(self.label_names) != self.num_labels:
            raise ValueError(
                f"task {self.name!r}: {self.num_labels} labels but label_names={self.label_names}"
            )
        if len(set(self.label_names)) != len(self.label_names):
            raise ValueError(f"task {self.name!r}: duplicate label names {self.label_names}")
        if not self.text_columns:
            object.__setattr__(self, "text_columns", tuple(self.text_keys))
        if len(self.text_columns) != len(self.text_keys):
            raise ValueError(f"task {self.name!r}: text_columns and text_keys differ in length")

    @property
    def is_regression(self) -> bool:
        """True when the task predicts one float (num_labels == 1)."""
        return self.num_labels == 1

    @property
    def metric(self) -> str:
        """The metric to select checkpoints on."""
        return self.metrics[0]

    def label_id(self, value: str) -> int | float:
        """The label id (or float score) of one label string; ValueError if it is not valid."""
        if self.is_regression:
            score = float(value)
            if not math.isfinite(score):
                raise ValueError(f"score {value!r} is not a finite number")
            return score
        try:
            return self.label_names.index(value)
        except ValueError:
            raise ValueError(
                f"label {value!r} is not one of the task's labels {list(self.label_names)}"
            ) from None


@dataclasses.dataclass(frozen=True)
class TextExample:
    """One example of a sequence classification/regression task.

    Attributes:
      guid: the example's id (the file's index/id column, or its 0-based row number).
      texts: the 1 or 2 texts.
      label: the class id, the float score (regression), or None (unlabelled split).
    """

    guid: str
    texts: tuple[str, ...]
    label: int | float | None


@dataclasses.dataclass
class ReadStats:
    """What a reader read and skipped.

    Attributes:
      examples: examples read.
      skipped: "path:line: reason" of each row skipped (only with `on_bad_row="skip"`).
    """

    examples: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)

    def log(self) -> None:
        """Logs the counts, with a warning for skipped rows."""
        logging.info("read %d examples", self.examples)
        if self.skipped:
            logging.warning(
                "skipped %d bad row(s), e.g. %s", len(self.skipped), "; ".join(self.skipped[:3])
            )


ID_COLUMNS = ("index", "id", "idx")


def check_on_bad_row(on_bad_row: str) -> None:
    if on_bad_row not in ("raise", "skip"):
        raise ValueError(f"on_bad_row must be 'raise' or 'skip', not {on_bad_row!r}")


def open_text(path: str | os.PathLike) -> io.StringIO:
    """The text of a UTF-8 file (a byte-order mark dropped), for the readers of every task.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file is empty or not UTF-8 (naming the file and the byte offset).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    with open(path, "rb") as f:
        raw = f.read()
    if not raw:
        raise ValueError(f"{path} is empty")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (invalid byte at offset {e.start})") from None
    if _reads is not None:
        _reads[os.path.abspath(path)] = {
            "bytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
    return io.StringIO(text, newline="")


def file_identity(path: str | os.PathLike) -> dict:
    """{"bytes": size, "sha256": hex digest of the content} of a local or gs:// file, read in
    8 MiB blocks: what tells a rerun whether the file changed."""
    digest, size = hashlib.sha256(), 0
    with epath.Path(os.fspath(path)).open("rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def note_read(path: str | os.PathLike) -> None:
    """Records a file read other than through `open_text` (a Parquet file streamed by
    `bert_jax.data.tables`) inside `record_reads()`: its `file_identity`."""
    if _reads is None:
        return
    path = os.fspath(path)
    key = path if "://" in path else os.path.abspath(path)
    _reads[key] = file_identity(path)


# The files `open_text` read inside `record_reads()` (None outside it).
_reads: dict[str, dict] | None = None


@contextlib.contextmanager
def record_reads() -> Iterator[dict[str, dict]]:
    """Collects the identity of every file `open_text` reads inside the block: {absolute path:
    {"bytes": size, "sha256": hex digest of the content}} (what a fine-tuning run read, so that
    a rerun can tell whether its data changed)."""
    global _reads
    outer, _reads = _reads, {}
    try:
        yield _reads
    finally:
        _reads = outer


def csv_rows(f, path: str, *, tsv: bool = False) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of each row of a CSV (standard quoting) or TSV (tab-separated, no quoting)
    text, the header included; `line` is the 1-based line where the row starts.

    A field may be as long as the file (a long document is legitimate input: the csv module's
    128 KB field limit is lifted). A malformed row raises ValueError naming `path` and the line.
    """
    tables.lift_csv_field_limit()
    rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.reader(f)
    start = 1
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as e:
            kind = "TSV" if tsv else "CSV"
            raise ValueError(f"{path}:{start}: malformed {kind} row: {e}") from None
        yield start, row
        start = rows.line_num + 1


def tfds_builder(name: str, data_dir: str | os.PathLike | None, download: bool = False):
    """A prepared tensorflow-datasets builder (also used by the squad and ner readers).

    tensorflow-datasets is imported here, never when this module is imported.

    Args:
      name: e.g. "glue/mrpc", "squad/v2.0", "conll2003".
      data_dir: the tfds data directory; None is tfds's default (~/tensorflow_datasets).
      download: download and prepare the dataset when it is missing (needs network).

    Raises:
      ImportError: tensorflow-datasets is not installed (the `tf` extra).
      FileNotFoundError: the dataset is not prepared and `download` is False.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(
            "tfds sources need tensorflow-datasets: pip install 'bert-jax[tf]'"
        ) from e
    builder = tfds.builder(name, data_dir=os.fspath(data_dir) if data_dir is not None else None)
    if not builder.is_prepared():
        if not download:
            raise FileNotFoundError(
                f"tfds dataset {name!r} is not prepared in {builder.data_dir!r}; prepare it with "
                "`tfds build` or pass download=True"
            )
        builder.download_and_prepare()
    return builder


def tfds_records(builder, split: str):
    """The records of one split of a prepared builder as dicts of numpy values, in file order."""
    import tensorflow_datasets as tfds

    return tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))


def as_str(value) -> str:
    """A tfds text value (UTF-8 bytes) as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "table",
    ".arrow": "table",
}


def _format_of(path: str, fmt: str | None) -> str:
    if fmt is None:
        fmt = _FORMATS.get(os.path.splitext(path)[1].lower())
        if fmt is None:
            raise ValueError(f"{path}: cannot tell the format from the extension; pass fmt=")
    if fmt not in ("csv", "tsv", "jsonl", "table"):
        raise ValueError(f"fmt must be 'csv', 'tsv', 'jsonl' or 'table', not {fmt!r}")
    return fmt


def _iter_records(path: str, fmt: str, columns: Sequence[str]):
    """Yields (line number, {column: str value}) from a CSV/TSV with a header, or JSONL; from a
    table (Parquet, `datasets` .arrow) (0-based row, {column: value as JSONL's}), streamed."""
    if fmt == "table":
        note_read(path)
        for row, record in tables.iter_rows(path, columns):
            yield row, {c: _json_value(v) for c, v in record.items()}
        return
    with open_text(path) as f:
        if fmt == "jsonl":
            for line, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                record = tables.json_object(text, f"{path}:{line}")
                missing = [c for c in columns if c not in record]
                if missing:
                    raise ValueError(
                        f"{path}:{line}: missing field(s) {missing}; the record has "
                        f"{sorted(record)}"
                    )
                yield line, {c: _json_value(record[c]) for c in columns}
            return
        rows = csv_rows(f, path, tsv=fmt == "tsv")
        _, header = next(rows, (0, None))
        if header is None:
            raise ValueError(f"{path} is empty")
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{path}: the header lacks the column(s) {missing}; it has {header}")
        index = {c: header.index(c) for c in columns}
        for line, row in rows:
            if not row or not any(field.strip() for field in row):
                continue
            if len(row) != len(header):
                hint = ""
                if any("\n" in field for field in row):
                    hint = " (a field runs over several lines: a quote left open?)"
                raise ValueError(
                    f"{path}:{line}: {len(row)} field(s), but the header has {len(header)}{hint}"
                )
            yield line, {c: row[i] for c, i in index.items()}


def _json_value(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))  # So that 1, 1.0 and true all match the label "1".
    return str(value)


def collect_label_names(
    path: str | os.PathLike, label_column: str = "label", *, fmt: str | None = None
) -> tuple[str, ...]:
    """The distinct label strings of a custom file, sorted (numerically when all are integers),
    each as `label_value` reads it (surrounding whitespace removed).

    Build the label set from the training file and pass it to `custom.custom_dataset`; dev/test
    files with another label then raise instead of silently shifting ids.

    Raises:
      ValueError: the file has no rows (`<file> has no examples`), or a row's label is blank or
        null (naming the file and line: a blank is no class).
    """
    path = os.fspath(path)
    fmt = _format_of(path, fmt)
    values, rows = set(), 0
    for line, record in _iter_records(path, fmt, [label_column]):
        values.add(label_value(record[label_column], _where(path, fmt, line), label_column))
        rows += 1
    if not rows:
        raise ValueError(f"{path} has no examples")
    if all(_is_int(v) for v in values):
        return tuple(sorted(values, key=int))
    return tuple(sorted(values))


def label_value(value: str | None, where: str, column: str) -> str:
    """A custom file's label as every split reads it: its string with surrounding whitespace
    removed (" sports" is "sports", a CSV's space after the comma included).

    Args:
      value: the field as read (None: a JSON null, a Parquet null).
      where: the file and line (or row) for the message, e.g. "train.csv:7".
      column: the label column, for the message.

    Raises:
      ValueError: the label is blank or null, naming `where` and the way out.
    """
    if value is None or not value.strip():
        what = "null" if value is None else f"blank ({value!r})"
        raise ValueError(
            f"{where}: {column}: the label is {what}; a labelled row needs one of the task's "
            "labels: fill it in or drop the row"
        )
    return value.strip()


def _where(path: str, fmt: str, line: int) -> str:
    """Where a record is, for messages: "file:line" (CSV, TSV, JSONL) or "file: row N" (a table,
    0-based)."""
    return f"{path}: row {line}" if fmt == "table" else f"{path}:{line}"


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def read_records(
    path: str | os.PathLike,
    task: TextDataset,
    *,
    fmt: str | None = None,
    labelled: bool = True,
    id_column: str | None = None,
) -> list[TextExample]:
    """Reads a custom classification/regression file.

    Args:
      path: a .csv (comma-separated, standard quoting), .tsv (tab-separated, no quoting) or
        .jsonl (one JSON object a line) file with a header row (CSV/TSV), or a .parquet or
        `datasets` .arrow file (local or gs://; integer labels read as their decimal strings).
      task: names the text columns (`task.text_keys`), the label column and the label set.
      fmt: "csv", "tsv", "jsonl" or "table"; None infers it from the extension.
      labelled: False for files without labels (labels become None).
      id_column: the column holding the guid; None numbers the rows from 0.

    Returns:
      The examples in file order.

    Raises:
      ValueError: empty file, missing column, a row with the wrong number of fields, a blank
        or null label (labels are read by `label_value`: surrounding whitespace removed), a
        label outside `task.label_names` (or not a number, for regression); the message names
        the file, line and column.
    """
    path = os.fspath(path)
    fmt = _format_of(path, fmt)
    columns = list(task.text_keys)
    if labelled:
        columns.append(task.label_column)
    if id_column is not None:
        columns.append(id_column)
    examples = []
    for line, record in _iter_records(path, fmt, columns):
        texts = []
        for key in task.text_keys:
            if record[key] is None:
                raise ValueError(f"{path}:{line}: {key}: the text is null")
            texts.append(record[key])
        label = None
        if labelled:
            where = _where(path, fmt, line)
            value = label_value(record[task.label_column], where, task.label_column)
            try:
                label = task.label_id(value)
            except ValueError as e:
                raise ValueError(f"{where}: {task.label_column}: {e}") from None
        guid = record[id_column] if id_column is not None else str(len(examples))
        examples.append(TextExample(str(guid), tuple(texts), label))
    if not examples:
        raise ValueError(f"{path} has no examples")
    return examples
