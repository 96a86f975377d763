"""Inference over a corpus as a job: any registered command with a bulk form
(`commands.BulkForm`) over many input shards, on many hosts (docs/inference.md). This module
names no command: each one's settings, model, step and output columns are its own module's
(`bert_jax.inference.commands`).

    python -m bert_jax.inference embed --model DIR --input 'corpus/*.parquet' \\
        --text_column=text --id_column=id --output emb/
    python -m bert_jax.inference rerank --model ce-dir --input 'pairs/*.parquet' \\
        --query_column=q --text_column=p --id_column=id --output scores/

Inputs: what `data.tables` reads (a text file: one row a line in the column "text"), as a glob, a
folder or file names, local or on a bucket. Each input shard gives one output shard,
`OUT/<its path under the inputs' common folder>.parquet` (the input's suffix replaced), whose rows
are the input's in order:

    <id column>     the input's --id_column, its name and values   (or, without --id_column:)
    file, row       string: the input file; int64: the row's index in it, from 0
    ...             the command's own columns (`Rows.columns`), as its module's docstring
                    in `bert_jax.inference.commands` describes them

The file's metadata (key "bert_jax") holds the job's settings as used and its input's size and
SHA-256 (`input_fingerprint`). OUT/_job.json holds the settings once the first input's columns and
the model are checked: a rerun with other settings stops naming them, unless no shard is finished.
A shard is streamed to a temporary file and renamed when complete, so one that exists is whole; a
rerun skips those whose input is unchanged (each input is read once more to hash it). One job per
folder (OUT/run.lock); a killed job's temporary files are removed by the next.

Many processes (train.py's flags): process 0 lists the inputs and checks the settings; each
process checks every n-th finished shard's input, writes every n-th shard to do, on a mesh of its
own devices, and waits for no other until the end. A failure anywhere ends every process
(`parallel.multihost.guard`); finished shards stay. Rows are read `chunk_rows` at a time, the next
chunk by a background thread. A null, empty or non-string text is an error naming the file, row,
id and column; nothing of that shard is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tqdm
from absl import logging
from jax.sharding import Mesh

from bert_jax import paths
from bert_jax.data import batching, tables, text_io
from bert_jax.data.sentence_features import encode_texts
from bert_jax.inference import batches, commands
from bert_jax.parallel import multihost, sharding
from bert_jax.training import run_lock

JOB_RECORD = "_job.json"  # "_": not a data file to `tables.expand_inputs`
METADATA_KEY = b"bert_jax"
FINGERPRINT = "input_fingerprint"  # the shard metadata's record of its input
# Settings of every command that change what a row holds, beside the command's own
# (`BulkForm.settings`): a rerun must keep them (batch size and the processes may change: they
# change no row beyond float rounding).
RECORDED = ("command", "model", "text_column", "id_column")


@dataclasses.dataclass(frozen=True)
class Job:
    """What to run over which files.

    Attributes:
      command: the name of a registered command with a bulk form (`commands.bulk_form`).
      model: the checkpoint (any family; `loading.load`).
      input: a glob, folder or file names (comma-separated), local or gs://.
      output: the output folder, local or gs://.
      text_column: the text of each row ("text" for text files; a pair's second text, as the
        command's `BulkForm.text_columns` says).
      id_column: the column identifying rows, copied to the output; None: file and row.
      options: the command's own settings by name (`BulkForm.settings`; one left out is None),
        e.g. {"pooling": "mean"}.
      batch_size: rows per batch on this process (rounded up to a multiple of its devices).
      max_seq_length: tokens kept per row (longer rows are truncated, and counted); at most the
        model's max_sequence_length; None: the command's default (its `BulkForm.load`).
      chunk_rows: rows read and tokenized at a time (packing and length grouping happen within
        a chunk).
      pack: put the rows of a chunk several to a packed row (`batches.pack_texts`); the same
        outputs within float32 rounding, so a rerun may change it.
      progress: show a progress bar on process 0.
    """

    command: str
    model: str
    input: str
    output: str
    text_column: str = tables.TEXT_COLUMN
    id_column: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 64
    max_seq_length: int | None = None
    chunk_rows: int = 4096
    pack: bool = True
    progress: bool = True

    @property
    def form(self) -> commands.BulkForm:
        """The command's bulk form; ValueError for a command without one."""
        return commands.bulk_form(self.command)

    def record(self) -> dict:
        """The settings a rerun must keep (RECORDED, the command's own, max_seq_length), as
        given, as JSON values (`_Model.record`: as used)."""
        out = {k: getattr(self, k) for k in RECORDED}
        out["model"] = os.fspath(paths.as_path(self.model))  # absolute: the same from anywhere
        for name in self.form.settings:
            value = self.options.get(name)
            out[name] = list(value) if isinstance(value, tuple) else value
        out["max_seq_length"] = self.max_seq_length
        return out

    def text_columns(self) -> tuple[str, str | None]:
        """The columns of each row's first and second text (None: single texts)."""
        return self.form.text_columns(self.text_column, self.options)

    def check(self) -> None:
        """Raises ValueError for a setting the command does not take, or a missing one."""
        form = self.form
        if self.batch_size < 1 or self.chunk_rows < 1:
            raise ValueError(
                f"batch_size and chunk_rows must be >= 1: {self.batch_size}, {self.chunk_rows}"
            )
        unknown = [name for name in self.options if name not in form.settings]
        if unknown:
            raise ValueError(
                f"{self.command} takes no setting {unknown[0]!r}; its settings: "
                + (", ".join(form.settings) or "none")
            )
        form.check(self.options)


@dataclasses.dataclass(frozen=True)
class Summary:
    """What a job did, all processes together.

    Attributes:
      rows, tokens: rows written and their tokens (after truncation, padding not counted).
      shards, skipped: output shards written now, and those a previous run had written.
      seconds: process 0's time from its first shard to the end (compiles included).
      output: the output folder; processes, devices: the processes and all their devices.
    """

    rows: int
    tokens: int
    shards: int
    skipped: int
    seconds: float
    output: str
    processes: int
    devices: int

    def line(self, command: str) -> str:
        """One line: rows, rows/s, tokens/s, and where the files are."""
        seconds = max(self.seconds, 1e-9)
        skipped = f" ({self.skipped} done before, skipped)" if self.skipped else ""
        return (
            f"{command}: {self.rows:,} rows, {self.tokens:,} tokens in {self.seconds:.1f} s: "
            f"{self.rows / seconds:,.1f} rows/s, {self.tokens / seconds:,.0f} tokens/s on "
            f"{self.processes} process(es) x {self.devices // self.processes} device(s); "
            f"{self.shards} shard(s) written{skipped} to {self.output}"
        )


def output_names(inputs: Sequence[str]) -> list[str]:
    """Each input's output shard, relative to the output folder: its path under the inputs'
    common folder with the suffix ".parquet" (in place of its own).

    Raises:
      ValueError: two inputs that would write the same shard (e.g. a.jsonl and a.parquet).
    """
    parts = [p.split("/") for p in inputs]
    common = 0
    while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
        common += 1
    names = []
    for p in parts:
        rel = "/".join(p[common:])
        stem, dot, suffix = rel.rpartition(".")
        names.append((stem if dot and "/" not in suffix else rel) + ".parquet")
    seen: dict[str, str] = {}
    for source, name in zip(inputs, names):
        if name in seen:
            raise ValueError(
                f"inputs {seen[name]} and {source} would both be written to {name}; rename one"
            )
        seen[name] = source
    return names


def _check_record(out_dir, record: dict) -> None:
    """Writes OUT/_job.json (`record`: the settings as used), or checks that an earlier run
    there had the same settings; one with other settings that finished no shard is replaced."""
    path = out_dir / JOB_RECORD
    if path.exists():
        before = json.loads(path.read_text())
        changed = {k: (before.get(k), v) for k, v in record.items() if before.get(k) != v}
        if not changed:
            return
        diff = "; ".join(f"{k}: {a!r} before, {b!r} now" for k, (a, b) in changed.items())
        if _has_shards(out_dir):
            raise ValueError(
                f"{out_dir} holds the output of a job with other settings ({diff}); use "
                "another --output, or remove that folder to start over"
            )
        logging.warning("%s: the job there before (%s) finished no shard; replacing it", path, diff)
    paths.write_text_whole(path, json.dumps(record, indent=1) + "\n")


def _has_shards(out_dir) -> bool:
    """Whether `out_dir` holds a finished output shard (temporary files end in .tmp)."""
    return any(
        not name.startswith(".") and name.endswith(".parquet")
        for _, _, files in out_dir.walk()
        for name in files
    )


def _input_change(source: str, target) -> str | None:
    """Why the finished shard `target` no longer matches its input `source` (a sentence naming
    the file), or None when it does."""
    with target.open("rb") as f:
        try:
            metadata = pq.ParquetFile(f).schema_arrow.metadata or {}
        except pa.ArrowException as e:
            raise ValueError(f"{target}: not a readable Parquet file ({e}); remove it") from e
    recorded = json.loads(metadata.get(METADATA_KEY, b"{}")).get(FINGERPRINT)
    if recorded is None:
        return f"{source}: its shard {target} records no fingerprint of it; writing it again"
    if recorded != text_io.file_identity(source):
        return f"{source} changed since its shard {target} was written; writing it again"
    return None


def _remove_partial_files(out_dir) -> None:
    """Removes the temporary files of shards a killed job was writing (local folders only: a
    bucket's objects appear whole)."""
    if paths.is_url(out_dir):
        return
    for folder, _, files in os.walk(os.fspath(out_dir)):
        for name in files:
            if name.startswith(".") and name.endswith(".tmp"):
                logging.info("removing %s, left by a job that was stopped", name)
                os.remove(os.path.join(folder, name))


class _Model:
    """The job's model on this process's devices: `run(texts, texts_b)` -> outputs, tokens."""

    def __init__(self, job: Job):
        # The command's model, step and columns (`BulkForm.load`).
        self.rows = job.form.load(job.model, job.options, job.max_seq_length)
        self.config, self.tokenizer, self.job = self.rows.config, self.rows.tokenizer, job
        # A mesh of this process's own devices: rows are independent, so each process runs its
        # shards alone; the batch is split over the devices, the parameters replicated.
        devices = np.asarray(jax.local_devices()).reshape(-1, 1, 1)
        self.mesh = Mesh(devices, sharding.MESH_AXES)
        num_devices = devices.size
        self.batch_size = -(-job.batch_size // num_devices) * num_devices
        if self.batch_size != job.batch_size:
            logging.info(
                "batch size %d -> %d: a multiple of the %d devices",
                job.batch_size,
                self.batch_size,
                num_devices,
            )
        self.params = jax.device_put(self.rows.params, sharding.replicated(self.mesh))
        step = self.rows.step

        def placed_step(params, batch):
            return step(params, jax.device_put(batch, sharding.batch_shardings(batch, self.mesh)))

        self.step = placed_step
        wanted_length = self.rows.max_seq_length
        self.max_seq_length = min(wanted_length, self.config.max_sequence_length)
        if self.max_seq_length < wanted_length:
            logging.info(
                "max_seq_length %d -> %d: the longest row the model takes",
                wanted_length,
                self.max_seq_length,
            )
        self.buckets = batches.inference_buckets(self.max_seq_length)
        self.truncated = 0
        self.used = {**self.rows.used, "max_seq_length": self.max_seq_length}

    def record(self) -> dict:
        """The settings a rerun must keep, as used: `Job.record` with the model's defaults in
        place of the options left unset (a rerun that spells them out is the same job)."""
        return {**self.job.record(), **self.used}

    def encode(self, texts: list[str], texts_b: list[str] | None) -> dict[str, np.ndarray]:
        """Token features of one chunk (`batches.features`' keys), on the reading thread."""
        if self.rows.prompt:
            texts = [self.rows.prompt + text for text in texts]
        encoded, stats = encode_texts(self.tokenizer, texts, texts_b, self.max_seq_length)
        self.truncated += stats.truncated
        encoded["example_weights"] = np.ones(len(texts), np.float32)
        return encoded

    def run(self, encoded: dict[str, np.ndarray]) -> np.ndarray:
        """The step's output for every row of `encoded`, in order: float32 [N, ...] (the
        command's `Rows.step`: [N, P, E] pooled states, [N, num_labels] logits).

        Packed (`Job.pack`): the chunk's rows go several to a packed row, and a batch is the
        rows of about B texts, a multiple of the devices. Else the rows run longest first, B at a
        time, each batch cut to its bucket: neighbours in length share a batch, and only the last
        batch (the shortest rows) is filled up to B.
        """
        if self.job.pack:
            return batches.run_batched(
                self.step,
                self.params,
                encoded,
                batch_size=self.batch_size,
                buckets=self.buckets,
                progress=False,
                desc=self.job.command,
                max_segments=batches.MAX_SEGMENTS,
                row_multiple=self.mesh.devices.size,
            )
        order = np.argsort(-batching.row_lengths(encoded), kind="stable")
        out = batches.run_batched(
            self.step,
            self.params,
            {k: v[order] for k, v in encoded.items()},
            batch_size=self.batch_size,
            buckets=self.buckets,
            progress=False,
            desc=self.job.command,
            group_by_length=False,
        )
        result = np.empty_like(out)
        result[order] = out
        return result


def _texts(path: str, first: int, values: list, column: str, ids: list | None) -> list[str]:
    """The column's values, checked: ValueError naming the file and row of a null, empty or
    non-string one."""
    for i, text in enumerate(values):
        if isinstance(text, str) and text.strip():
            continue
        if text is None:
            what = "a null"
        elif isinstance(text, str):
            what = "an empty text" if not text else "only white space"
        else:
            what = f"a {type(text).__name__} ({text!r:.40}), not text,"
        row = f"row {first + i}" + (f" (id {ids[i]!r})" if ids is not None else "")
        raise ValueError(
            f"{path}: {row} has {what} in column {column!r}; every row needs a text: drop or "
            "fill such rows (nothing of this file was written; finished shards are kept)"
        )
    return values


def _chunks(job: Job, model: _Model, path: str) -> Iterator[tuple[int, list | None, dict]]:
    """(first row, ids or None, encoded features) of each chunk of one input file."""
    column_a, column_b = job.text_columns()
    columns = list(dict.fromkeys(c for c in (column_a, column_b, job.id_column) if c))
    for first, values in tables.iter_column_batches(path, columns, batch_rows=job.chunk_rows):
        ids = values.get(job.id_column) if job.id_column else None
        if ids is not None and None in ids:
            row = first + ids.index(None)
            raise ValueError(f"{path}: row {row} has no id (null) in column {job.id_column!r}")
        texts = _texts(path, first, values[column_a], column_a, ids)
        texts_b = _texts(path, first, values[column_b], column_b, ids) if column_b else None
        yield first, ids, model.encode(texts, texts_b)


def _prefetched(items: Iterable, size: int = 2) -> Iterator:
    """`items`, produced by a background thread up to `size` ahead (its errors raised here)."""
    q: queue.Queue = queue.Queue(size)
    stop, end = threading.Event(), object()

    def produce():
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((end, None))
        except BaseException as e:  # noqa: BLE001  (raised again in the consumer)
            q.put((end, e))

    thread = threading.Thread(target=produce, name="bulk-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if error is not None:
                raise error
            if item is end:
                return
            yield item
    finally:
        stop.set()


class _ShardWriter:
    """Output tables of one shard (module docstring's columns), with one schema throughout."""

    def __init__(self, job: Job, model: _Model, source: str, fingerprint: dict):
        self.job, self.source, self.rows = job, source, model.rows
        meta = {**model.record(), "input": source, FINGERPRINT: fingerprint, **model.rows.metadata}
        self.metadata = {METADATA_KEY: json.dumps(meta).encode()}
        self.schema: pa.Schema | None = None

    def columns(self, first: int, ids: list | None, out: np.ndarray) -> dict[str, pa.Array]:
        n = len(out)
        if self.job.id_column:
            id_type = self.schema.field(0).type if self.schema is not None else None
            try:
                cols = {self.job.id_column: pa.array(ids, type=id_type)}
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise ValueError(
                    f"{self.source}: the ids of rows {first}.. (column {self.job.id_column!r}) "
                    f"do not have one type with the rows before: {e}"
                ) from None
        else:
            cols = {
                "file": pa.array([self.source] * n, pa.string()),
                "row": pa.array(np.arange(first, first + n, dtype=np.int64)),
            }
        return {**cols, **self.rows.columns(out)}

    def table(self, first: int, ids: list | None, out: np.ndarray) -> pa.Table:
        cols = self.columns(first, ids, out)
        if self.schema is None:
            fields = [pa.field(k, v.type) for k, v in cols.items()]
            self.schema = pa.schema(fields, metadata=self.metadata)
        return pa.Table.from_arrays(list(cols.values()), schema=self.schema)

    def empty_table(self) -> pa.Table:
        """A table of no rows (an input file without rows still gets its output shard)."""
        ids = [] if self.job.id_column else None  # of type null: no row to tell its type
        return self.table(0, ids, np.zeros((0, *self.rows.row_shape), np.float32))


def _write_shard(job: Job, model: _Model, source: str, target, advance: Callable) -> tuple:
    """Runs the model over `source`'s rows into the Parquet file `target`, written whole;
    returns (rows, tokens). `advance(rows)` is called after each chunk."""
    counts = [0, 0]
    # Hashed before it is read: an input changed meanwhile differs from it on the next run.
    shard = _ShardWriter(job, model, source, text_io.file_identity(source))

    def write(local_path: str) -> None:
        writer = None
        try:
            for first, ids, encoded in _prefetched(_chunks(job, model, source)):
                table = shard.table(first, ids, model.run(encoded))
                if writer is None:
                    writer = pq.ParquetWriter(local_path, shard.schema)
                writer.write_table(table)
                counts[0] += len(table)
                counts[1] += int(encoded["attention_mask"].sum())
                advance(len(table))
            if writer is None:
                table = shard.empty_table()
                writer = pq.ParquetWriter(local_path, table.schema)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()

    target.parent.mkdir(parents=True, exist_ok=True)
    paths.write_file_whole(target, write)
    return tuple(counts)


def _known_rows(files: Sequence[str]) -> int | None:
    """The rows of `files` when all are Parquet (`tables.num_rows`: their footers), for the
    bar's total; None when any is of a format only counted by reading it."""
    counts = [tables.num_rows(f) for f in files]
    return None if not counts or None in counts else sum(counts)


def _plan(job: Job, model: _Model, out_dir) -> tuple[list[tuple[str, str]], int]:
    """The (input, output name) pairs still to do, the same on every process, and how many
    were done before: process 0 lists the inputs, checks the columns and settings and finds the
    finished shards; the processes check those shards' inputs, every n-th each."""
    text = "[]"
    me, num_processes = jax.process_index(), jax.process_count()
    if me == 0:
        inputs = tables.expand_inputs(job.input)
        names = output_names(inputs)
        # One input's columns, before anything is written: a corpus's files share them.
        tables.check_columns(inputs[0], [c for c in (*job.text_columns(), job.id_column) if c])
        _check_record(out_dir, model.record())  # the settings, once they are checked
        _remove_partial_files(out_dir)
        text = json.dumps([(i, n, (out_dir / n).exists()) for i, n in zip(inputs, names)])
    shards = json.loads(multihost.broadcast("bulk_plan", text))
    finished = [(i, n) for i, n, exists in shards if exists][me::num_processes]
    mine = [(i, why) for i, n in finished if (why := _input_change(i, out_dir / n))]
    changed = dict(
        x
        for part in multihost.all_gather("bulk_changed", json.dumps(mine))
        for x in json.loads(part)
    )
    if me == 0:
        for why in changed.values():
            logging.warning("%s", why)
    todo = [(i, n) for i, n, exists in shards if not exists or i in changed]
    return todo, len(shards) - len(todo)


def run(job: Job) -> Summary:
    """Runs `job` on this process (its share of the shards); every process calls it.

    Returns:
      The whole job's `Summary` (every process's counts), the same on every process.

    Raises:
      ValueError: a bad setting, a missing column or a bad input row (naming the file and
        row), a rerun with other settings over finished shards; FileNotFoundError: no input
        files.
    """
    job.check()
    tables.check_apart({"--output": [job.output]}, {"--input": job.input})
    model = _Model(job)  # errors in the model or settings before anything is written
    out_dir = paths.as_path(job.output)
    me, n = jax.process_index(), jax.process_count()
    with run_lock.hold(out_dir, flag="--output"):
        todo, skipped = _plan(job, model, out_dir)
        mine = todo[me::n]
        logging.info(
            "process %d: %d of the %d shard(s) to write (%d done before)",
            me,
            len(mine),
            len(todo),
            skipped,
        )
        start = time.perf_counter()
        show = job.progress and me == 0
        total = _known_rows([source for source, _ in mine]) if show else None
        rows = tokens = 0
        # Closed on an error too: the bar's last line comes before the command's `error: ...`.
        with tqdm.tqdm(
            total=total, unit=" rows", desc=job.command, disable=not show, dynamic_ncols=True
        ) as bar:
            for k, (source, name) in enumerate(mine):
                bar.set_postfix_str(f"shard {k + 1}/{len(mine)}")
                r, t = _write_shard(job, model, source, out_dir / name, bar.update)
                rows, tokens = rows + r, tokens + t
                logging.info("wrote %s (%d rows)", out_dir / name, r)
        mine_done = json.dumps([rows, tokens, len(mine)])
        counts = np.array([json.loads(x) for x in multihost.all_gather("bulk_end", mine_done)])
        seconds = time.perf_counter() - start
    if model.truncated:
        logging.warning(
            "process %d: %d row(s) longer than %d tokens were truncated",
            me,
            model.truncated,
            model.max_seq_length,
        )
    total = counts.sum(0)
    return Summary(
        int(total[0]),
        int(total[1]),
        int(total[2]),
        skipped,
        seconds,
        os.fspath(out_dir),
        n,
        jax.device_count(),
    )
