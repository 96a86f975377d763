"""Rows of data files where users keep them: Parquet, Hugging Face `datasets` directories, JSONL,
CSV/TSV and text, local or on a bucket (`gs://...`, every read through `etils.epath`).

Formats, told by the file's name:

    .parquet        by row groups (`pyarrow.parquet.ParquetFile.iter_batches`), only `columns`
    .arrow          Arrow IPC as `datasets` writes it (`save_to_disk`'s data-00000-of-00001.arrow,
                    the cache's <name>-train.arrow: the stream format; the file format also reads)
    .jsonl .ndjson .json    one JSON object a line (blank lines skipped)
    .csv .tsv       a header row; CSV with standard quoting, TSV tab-separated without quoting
    anything else   text, one row per line (the line without its end) in the column "text"

Directories: a `save_to_disk` directory (dataset_info.json, state.json, data-*.arrow) gives the
files its state.json lists; a `DatasetDict` (dataset_dict.json and one such directory per split)
gives every split's; any other directory (the Hub's layout, `data/train-00000-of-00002.parquet`,
`mrpc/validation-00000-of-00001.parquet`, a Hugging Face cache folder) gives its Parquet and
Arrow files, or when it has none its JSONL/CSV/TSV/text files, searched recursively (names that
start with "." or "_", and `datasets`' map caches `cache-*.arrow`, are not data).

Values are Python values (`pyarrow`'s `to_pylist`: str, int, float, bool, list, dict for a
struct, None for null); CSV/TSV values are strings. A batch never holds more than `batch_rows`
rows, nor a file more than one batch (plus a row group) in memory.
"""

from __future__ import annotations

import csv
import glob as glob_lib
import io
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence

from etils import epath

from bert_jax import paths

TEXT_COLUMN = "text"
_TABLE_SUFFIXES = (".parquet", ".arrow")
_ROW_SUFFIXES = (".jsonl", ".ndjson", ".csv", ".tsv", ".txt")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
_ARROW_FILE_MAGIC = b"ARROW1"


def _is_url(path: str) -> bool:
    return "://" in path


def expand_inputs(pattern: str) -> list[str]:
    """The data files a glob, directory or file names (local or gs://), sorted.

    Args:
      pattern: one path, glob (`corpus/*.parquet`, `gs://b/shards/part-*`) or directory, or
        several separated by commas. A Hugging Face `datasets` directory (`save_to_disk` output:
        dataset_info.json/state.json + data-*.arrow, or a DatasetDict with dataset_dict.json and
        one folder per split) or a Hub-layout folder of Parquet shards expands to its data files.

    Returns:
      The files, sorted, each once; local files as given (`~` expanded), URLs stay URLs.

    Raises:
      FileNotFoundError: naming the pattern, when it (or one of its parts) matches nothing.
    """
    found: set[str] = set()
    for part in (p.strip() for p in os.fspath(pattern).split(",")):
        if not part:
            continue
        if not _is_url(part):
            part = os.path.expanduser(part)
        if glob_lib.has_magic(part):
            matches = [m for m in _glob(part) if epath.Path(m).exists()]
        else:
            matches = [part] if epath.Path(part).exists() else []
        files = [f for m in matches for f in _data_files(m)]
        if not files:
            what = "no data files" if matches else "nothing"
            raise FileNotFoundError(f"input pattern {part!r} matches {what}")
        found.update(files)
    if not found:
        raise FileNotFoundError(f"input pattern {pattern!r} names no file")
    return sorted(found)


def check_apart(writes: Mapping[str, Sequence[str]], reads: Mapping[str, str | None]) -> None:
    """`paths.check_apart` of a command's outputs (`writes`: {flag: the paths written}) and its
    inputs' patterns (`reads`: {flag: a pattern as `expand_inputs` takes it, or None: not
    given}), no file read; ValueError naming both flags."""
    named = {flag: _named_paths(pattern) for flag, pattern in reads.items() if pattern}
    paths.check_apart(writes, named)


def _named_paths(pattern: str) -> list[str]:
    """What `pattern` names, without reading any file: each part as given (a file or a
    folder), a glob's matches."""
    named = []
    for part in (p.strip() for p in os.fspath(pattern).split(",")):
        if part and not _is_url(part):
            part = os.path.expanduser(part)
        named += _glob(part) if glob_lib.has_magic(part) else [part] if part else []
    return named


def split_files(directory: str, split: str, *, config: str | None = None) -> list[str]:
    """The data files of one split of a dataset folder, sorted.

    Reads the layouts the Hub and `datasets` leave on disk:
    `[config/]split-00000-of-00001.parquet`, `[config/]data/split-*.parquet`,
    `[config/]split/0000.parquet` (the Hub's converted-Parquet branch), a DatasetDict's
    `[config/]split/` folder, the older converter's `<name>-split[-00000-of-00002].parquet` and the
    `datasets` cache's `<name>-split[-00000-of-00003].arrow`.

    Args:
      directory: the folder (local or gs://).
      split: "train", "validation", "test", ...
      config: the dataset's configuration subfolder ("mrpc" of nyu-mll/glue, "plain_text" of
        rajpurkar/squad); None looks in `directory` itself.

    Raises:
      FileNotFoundError: no files of the split, naming the directory and what it holds.
    """
    root = epath.Path(directory)
    if config:
        root = root / config
    candidates = [
        (root / split, None),
        (root, f"{split}-*"),
        (root / "data", f"{split}-*"),
        *((root, f"*-{split}{suffix}") for suffix in _TABLE_SUFFIXES),
        *((root, f"*-{split}-*-of-*{suffix}") for suffix in _TABLE_SUFFIXES),
    ]
    for base, name_pattern in candidates:
        if not base.is_dir():
            continue
        if name_pattern is None:
            files = _data_files(os.fspath(base))
        else:
            files = sorted(
                f
                for m in _glob(os.fspath(base / name_pattern))
                if epath.Path(m).is_file()
                for f in _data_files(m)
            )
        if files:
            return files
    held = sorted(p.name for p in root.iterdir()) if root.is_dir() else "nothing (no such folder)"
    raise FileNotFoundError(f"no {split!r} files in {os.fspath(root)}; it holds {held}")


def _glob(pattern: str) -> list[str]:
    """Local glob (with **), or a URL matched through epath from its first wildcard part."""
    if not _is_url(pattern):
        return sorted(glob_lib.glob(pattern, recursive=True))
    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if glob_lib.has_magic(part))
    base = epath.Path("/".join(parts[:fixed]))
    return sorted(os.fspath(m) for m in base.glob("/".join(parts[fixed:])))


def _data_files(path: str) -> list[str]:
    """`path` itself if a file, else the data files of the directory (module docstring)."""
    p = epath.Path(path)
    if not p.is_dir():
        return [path]
    if (p / "dataset_dict.json").exists():
        splits = json.loads((p / "dataset_dict.json").read_text())["splits"]
        return sorted(f for s in splits for f in _data_files(os.fspath(p / s)))
    if (p / "state.json").exists():
        state = json.loads((p / "state.json").read_text())
        return sorted(os.fspath(p / d["filename"]) for d in state["_data_files"])
    files = list(_walk(p))
    tables = [f for f in files if f.lower().endswith(_TABLE_SUFFIXES)]
    rows = [f for f in files if f.lower().endswith(_ROW_SUFFIXES)]
    return sorted(tables or rows)


def _walk(directory: epath.Path) -> Iterator[str]:
    """The files under `directory`, recursively, skipping hidden and `_` names and map caches."""
    for child in directory.iterdir():
        if child.name.startswith((".", "_")):
            continue
        if child.is_dir():
            yield from _walk(child)
        elif not (child.name.startswith("cache-") and child.name.endswith(".arrow")):
            yield os.fspath(child)


def iter_column_batches(
    path: str, columns: Sequence[str], *, batch_rows: int = 1024
) -> Iterator[tuple[int, dict[str, list]]]:
    """Streams the values of `columns` of one data file in batches.

    Args:
      path: a file of one of the formats in the module docstring (local or gs://).
      columns: the columns wanted; a text file has the one column "text".
      batch_rows: the most rows a batch holds (every batch but the last holds exactly this).

    Yields:
      (index of the batch's first row within the file, {column: list of Python values}); null
      values stay None (the caller reports them by file and row).

    Raises:
      ValueError: a column missing (naming the file, the column wanted and the columns found),
        a line that is not a JSON object, a CSV row of the wrong length, text that is not UTF-8,
        a damaged or truncated Parquet/Arrow file (naming it; the rows before stay yielded).
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    path, columns = os.fspath(path), list(columns)
    name = path.lower()
    if name.endswith(".parquet"):
        batches = _damage_named(path, "Parquet", _parquet_batches(path, columns, batch_rows))
    elif name.endswith(".arrow"):
        batches = _damage_named(path, "Arrow IPC", _arrow_batches(path, columns, batch_rows))
    elif name.endswith(_JSON_SUFFIXES):
        batches = _chunked(_json_rows(path, columns), columns, batch_rows)
    elif name.endswith((".csv", ".tsv")):
        batches = _chunked(_csv_rows(path, columns, tsv=name.endswith(".tsv")), columns, batch_rows)
    else:
        batches = _chunked(_text_rows(path, columns), columns, batch_rows)
    start = 0
    for batch in batches:
        yield start, batch
        start += len(batch[columns[0]]) if columns else 0


def iter_rows(
    path: str, columns: Sequence[str], *, batch_rows: int = 1024
) -> Iterator[tuple[int, dict]]:
    """(0-based row within the file, {column: value}) of each row; `iter_column_batches`."""
    for start, batch in iter_column_batches(path, columns, batch_rows=batch_rows):
        values = [batch[c] for c in columns]
        for offset, row in enumerate(zip(*values)):
            yield start + offset, dict(zip(columns, row))


def column_names(path: str) -> list[str]:
    """The columns of a data file: a table's schema, a CSV/TSV header, the first JSONL record's
    keys ([] for an empty file), or ["text"]."""
    name = path.lower()
    if name.endswith(_TABLE_SUFFIXES):
        return list(_schema(path).names)
    if name.endswith(_JSON_SUFFIXES):
        for number, line in _lines(path):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{number}: not a JSON object: {e}") from None
                return list(record) if isinstance(record, dict) else []
        return []
    if name.endswith((".csv", ".tsv")):
        with epath.Path(path).open("rb") as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
            delimiter = "\t" if name.endswith(".tsv") else ","
            return next(csv.reader(text, delimiter=delimiter), [])
    return [TEXT_COLUMN]


def class_label_names(path: str) -> dict[str, list[str]]:
    """The class names of each label column of a Parquet/Arrow file `datasets` wrote ({column:
    names in id order}, for a `ClassLabel` or a sequence of them, read from the schema's
    "huggingface" metadata); {} for other files."""
    if not path.lower().endswith(_TABLE_SUFFIXES):
        return {}
    metadata = _schema(path).metadata or {}
    try:
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
    except (KeyError, ValueError, TypeError):
        return {}
    names = {}
    for column, feature in features.items():
        while isinstance(feature, dict) and "feature" in feature:  # Sequence / List of labels
            feature = feature["feature"]
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
            names[column] = list(feature["names"])
    return names


def num_rows(path: str) -> int | None:
    """The rows of a Parquet file, from its footer (no data read); None for other formats,
    whose rows are only known by reading them."""
    if not os.fspath(path).lower().endswith(".parquet"):
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    with epath.Path(path).open("rb") as f:
        try:
            return pq.ParquetFile(f).metadata.num_rows
        except pa.ArrowException as e:
            raise ValueError(f"{path}: not a readable Parquet file: {e}") from e


def _schema(path: str):
    """The Arrow schema of a Parquet or Arrow IPC file (its footer or first message only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with epath.Path(path).open("rb") as f:
        try:
            if path.lower().endswith(".parquet"):
                return pq.ParquetFile(f).schema_arrow
            is_file_format = f.read(len(_ARROW_FILE_MAGIC)) == _ARROW_FILE_MAGIC
            f.seek(0)
            return (pa.ipc.open_file(f) if is_file_format else pa.ipc.open_stream(f)).schema
        except pa.ArrowException as e:
            raise ValueError(f"{path}: not a readable Parquet/Arrow file: {e}") from e


def check_columns(path: str, wanted: Sequence[str]) -> None:
    """Raises ValueError naming `path`, the columns missing and those found, unless the file has
    every column of `wanted` (a file without rows, which shows no columns, passes)."""
    found = column_names(path)
    error = _missing(path, wanted, found) if found else None
    if error is not None:
        raise error


def _missing(path: str, wanted: Sequence[str], found: Sequence[str]) -> ValueError | None:
    missing = [c for c in wanted if c not in found]
    if not missing:
        return None
    return ValueError(f"{path}: no column(s) {missing}; the columns are {list(found)}")


def _damage_named(path: str, kind: str, batches: Iterator[dict]) -> Iterator[dict]:
    """`batches`, with pyarrow's errors (which do not name the file) raised naming it."""
    import pyarrow as pa

    try:
        yield from batches
    except pa.ArrowException as e:
        raise ValueError(f"{path}: not a readable {kind} file (damaged or truncated?): {e}") from e


def _parquet_batches(path: str, columns: list[str], batch_rows: int) -> Iterator[dict]:
    import pyarrow.parquet as pq

    with epath.Path(path).open("rb") as f:
        # pre_buffer=True (pyarrow's default) reads every row group asked for up front: the whole
        # file for iter_batches (benchmarks/table_read.py: a 200 MB file raises the peak resident
        # memory by 260 MB with it, by 90 MB without).
        parquet = pq.ParquetFile(f, pre_buffer=False)
        error = _missing(path, columns, parquet.schema_arrow.names)
        if error:
            raise error
        yield from _rebatched(
            parquet.iter_batches(batch_size=batch_rows, columns=columns), columns, batch_rows
        )


def _arrow_batches(path: str, columns: list[str], batch_rows: int) -> Iterator[dict]:
    import pyarrow as pa

    with epath.Path(path).open("rb") as f:
        is_file_format = f.read(len(_ARROW_FILE_MAGIC)) == _ARROW_FILE_MAGIC
        f.seek(0)
        if is_file_format:
            reader = pa.ipc.open_file(f)
            names = reader.schema.names
            record_batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            reader = pa.ipc.open_stream(f)
            names = reader.schema.names
            record_batches = iter(reader)
        error = _missing(path, columns, names)
        if error:
            raise error
        selected = (b.select(columns) for b in record_batches)
        yield from _rebatched(selected, columns, batch_rows)


def _rebatched(record_batches: Iterable, columns: list[str], batch_rows: int) -> Iterator[dict]:
    """Arrow record batches regrouped into batches of exactly `batch_rows` rows (bar the last)."""
    import pyarrow as pa

    pending, num_pending = [], 0
    for record_batch in record_batches:
        pending.append(record_batch)
        num_pending += record_batch.num_rows
        while num_pending >= batch_rows:
            table = pa.Table.from_batches(pending)  # slices are views: no copy
            yield _to_columns(table.slice(0, batch_rows), columns)
            rest = table.slice(batch_rows)
            pending, num_pending = rest.to_batches(), rest.num_rows
    if num_pending:
        yield _to_columns(pa.Table.from_batches(pending), columns)


def _to_columns(table, columns: list[str]) -> dict[str, list]:
    return {c: table.column(c).to_pylist() for c in columns}


def _chunked(rows: Iterator[dict], columns: list[str], batch_rows: int) -> Iterator[dict]:
    """Row dicts grouped into column batches of `batch_rows` rows (bar the last)."""
    batch = {c: [] for c in columns}
    size = 0
    for row in rows:
        for c in columns:
            batch[c].append(row[c])
        size += 1
        if size == batch_rows:
            yield batch
            batch, size = {c: [] for c in columns}, 0
    if size:
        yield batch


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end) of a UTF-8 file, read as it streams."""
    with epath.Path(path).open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{number}: not UTF-8 text (invalid byte at column {e.start + 1})"
                ) from None
            yield number, line.rstrip("\r\n")


def _text_rows(path: str, columns: list[str]) -> Iterator[dict]:
    error = _missing(path, columns, [TEXT_COLUMN])
    if error:
        raise ValueError(f"{error} (a text file has one row per line in {TEXT_COLUMN!r})")
    for _, line in _lines(path):
        yield {TEXT_COLUMN: line}


def json_object(line: str, where: str) -> dict:
    """The object of one JSONL line; ValueError naming `where` ("path:line") where it holds
    none (not JSON, or JSON of another kind)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not a JSON object: {e}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {record!r:.40}")
    return record


def _json_rows(path: str, columns: list[str]) -> Iterator[dict]:
    for number, line in _lines(path):
        if not line.strip():
            continue
        record = json_object(line, f"{path}:{number}")
        error = _missing(f"{path}:{number}", columns, list(record))
        if error:
            raise error
        yield record


def _csv_rows(path: str, columns: list[str], *, tsv: bool) -> Iterator[dict]:
    lift_csv_field_limit()
    with epath.Path(path).open("rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        if tsv:
            reader = csv.reader(text, delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            reader = csv.reader(text)
        try:
            header = next(reader, None)
            if header is None:
                raise ValueError(f"{path} is empty (no header row)")
            error = _missing(path, columns, header)
            if error:
                raise error
            index = [header.index(c) for c in columns]
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise ValueError(
                        f"{path}:{reader.line_num}: {len(row)} field(s), but the header has "
                        f"{len(header)}"
                    )
                yield {c: row[i] for c, i in zip(columns, index)}
        except (csv.Error, UnicodeDecodeError) as e:
            raise ValueError(f"{path}:{reader.line_num + 1}: unreadable row: {e}") from None


def lift_csv_field_limit() -> None:
    """Lets a CSV field be as long as a file (a long document is legitimate input; the csv
    module's 128 KB limit is process-wide)."""
    limit = sys.maxsize
    while limit > csv.field_size_limit():
        try:
            csv.field_size_limit(limit)
            return
        except OverflowError:  # a C long of 32 bits (Windows)
            limit //= 2
