"""The pretraining shard build as an Apache Beam pipeline: any corpus, on any Beam runner.

    build_pretraining_shards_beam(
        TextFiles(("gs://bucket/corpus/*.txt",)), out_dir, tokenizer, options, num_shards=1024,
        pipeline_args=["--runner=DataflowRunner", "--project=...", "--region=...",
                       "--temp_location=gs://..."])

writes what `build.build_pretraining_shards(..., partition="hash")` writes for the same documents,
seed and shard count, record for record. The pipeline:

    read        documents: each text file whole on one worker (Beam's file systems), each table
                file streamed by row groups on one worker, one document a row, tfds examples,
                or the Shakespeare plays
    tokenize    each document's sentences to token ids; empty sentences and documents dropped
    partition   (document_key % num_shards, document); GroupByKey
    write       per shard: examples.create_hashed_shard_instances on the shard's documents, with
                the shard's seed, then build.ShardWriter.write (temporary name, rename)

so a worker holds one shard's documents, never the corpus. The launcher checks the output
directory and the plan first (a finished build returns at once), writes build.json and the
tokenizer, runs the pipeline, and writes metadata.json last from the shards' statistics and the
pipeline's counters. Counters, unreadable files, memory per worker and the differences from the
local build: docs/data.md, "Builds on many machines: Apache Beam".

Needs the `beam` extra. Nothing else in the package imports this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence

try:
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.metrics import Metrics
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions
except ImportError as e:
    raise ImportError(
        "the Beam build needs apache-beam: pip install 'bert-jax[beam]' (the `beam` extra)"
    ) from e
from absl import logging
from etils import epath

from bert_jax.data import tables
from bert_jax.pretrain.data import build, build_dir, corpus, default_corpus, sources
from bert_jax.pretrain.data.examples import (
    PretrainingOptions,
    VocabInfo,
    create_hashed_shard_instances,
    document_key,
    documents_fingerprint,
)

NAMESPACE = "bert_jax"
_FINGERPRINT_FILE = "corpus-fingerprint.json"


# ---- Sources: what to read, a name for it that needs no reading, and the documents ----


@dataclasses.dataclass(frozen=True)
class TextFiles:
    """Text files and globs (blank lines separate documents; a file ends its last document).

    Attributes:
      patterns: paths or globs, local or any Beam file system (gs://...); compressed files
        (.gz, .bz2, ...) are read through.
      split_sentences: split lines into sentences (False: one sentence a line).
    """

    patterns: tuple[str, ...]
    split_sentences: bool = True

    def paths(self) -> list[tuple[str, int]]:
        """(path, size in bytes) of every matched file, sorted; raises if a pattern matches none."""
        found = {}
        for pattern, match in zip(self.patterns, FileSystems.match(list(self.patterns))):
            if not match.metadata_list:
                raise FileNotFoundError(f"no file matches {pattern!r}")
            found.update((m.path, m.size_in_bytes) for m in match.metadata_list)
        given = [p for p in found if p.lower().endswith((".parquet", ".arrow"))]
        if given:
            raise ValueError(f"{given[0]} is a table, not text: read tables with TableFiles")
        return sorted(found.items())

    def source_id(self) -> str:
        return _listing_id("files", (self.split_sentences,), self.paths())

    def expand(self, pipeline):
        return _read_listed(pipeline, self, ("Files", "Read"), _read_text_file)


@dataclasses.dataclass(frozen=True)
class TableFiles:
    """Tables, one document a row (`sources.table_documents`): Parquet files, `datasets`
    directories, JSONL/CSV, as `bert_jax.data.tables.expand_inputs` finds them.

    Attributes:
      patterns: files, globs or directories, local or gs:// (read through etils.epath, so the
        workers need its file system: gcsfs, or TensorFlow, for gs://).
      text_column: the column holding each document's text.
      split_sentences: split lines into sentences (False: one sentence a line).
    """

    patterns: tuple[str, ...]
    text_column: str = "text"
    split_sentences: bool = True

    def paths(self) -> list[tuple[str, int]]:
        """(path, size in bytes) of every data file, sorted; raises if a pattern matches none."""
        paths = tables.expand_inputs(",".join(self.patterns))
        return [(p, epath.Path(p).stat().length) for p in paths]

    def source_id(self) -> str:
        return _listing_id("tables", (self.text_column, self.split_sentences), self.paths())

    def expand(self, pipeline):
        return _read_listed(
            pipeline, self, ("Tables", "ReadRows"), _read_table_file, self.text_column
        )


@dataclasses.dataclass(frozen=True)
class Tfds:
    """A prepared tensorflow-datasets text dataset (needs the `tf` extra on every worker)."""

    name: str
    split: str = "train"
    data_dir: str | None = None
    text_key: str = "text"

    def source_id(self) -> str:
        return f"tfds:{self.name}:{self.split}:{self.text_key}"

    def expand(self, pipeline):
        import tensorflow_datasets as tfds

        builder = tfds.builder(self.name, data_dir=self.data_dir)
        if not builder.is_prepared():
            raise FileNotFoundError(
                f"tfds dataset {self.name!r} is not prepared in {builder.data_dir!r}; prepare it "
                "with `tfds build` first"
            )
        if self.text_key not in builder.info.features:
            raise KeyError(
                f"tfds dataset {self.name!r} has no feature {self.text_key!r}; it has "
                f"{list(builder.info.features)}"
            )
        return (
            pipeline
            | "ReadTfds" >> tfds.beam.ReadFromTFDS(builder, split=self.split)
            | "Text" >> beam.FlatMap(_tfds_document, self.text_key, f"tfds:{self.name}")
        )


@dataclasses.dataclass(frozen=True)
class DefaultCorpus:
    """The Shakespeare plays of `default_corpus.default_corpus_documents` (one element per play)."""

    def source_id(self) -> str:
        return default_corpus.default_corpus_version()

    def expand(self, pipeline):
        paths = [str(p) for p in default_corpus.default_corpus_files()]
        return _read_each(pipeline, ("Plays", "Read"), paths, _read_play)


def _listing_id(kind: str, settings: tuple, paths: list[tuple[str, int]]) -> str:
    """ "<kind>:<hash>" of the settings and the (path, size) listing: a new name when either
    changes, with no file read."""
    listing = "".join(f"{p}\t{n}\n" for p, n in paths)
    text = "".join(f"{setting}\n" for setting in settings) + listing
    return f"{kind}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _read_each(pipeline, labels: tuple[str, str], paths: list[str], read_fn, *args, **kwargs):
    """The documents `read_fn(path, *args, **kwargs)` gives of each path, the paths spread over
    the workers; `labels` name the two steps."""
    create, read = labels
    return (
        pipeline
        | create >> beam.Create(paths, reshuffle=True)
        | read >> beam.FlatMap(read_fn, *args, **kwargs)
    )


def _read_listed(pipeline, source, labels: tuple[str, str], read_fn, *args):
    """`_read_each` over the files a `TextFiles` or `TableFiles` source lists (its `paths()`):
    the documents `read_fn(path, *args, split_sentences=source.split_sentences)` gives of each."""
    paths = [p for p, _ in source.paths()]
    return _read_each(
        pipeline, labels, paths, read_fn, *args, split_sentences=source.split_sentences
    )


def _count(namespace: str, counts: dict) -> None:
    """Adds each count to the Beam counter `namespace/name`."""
    for name, value in counts.items():
        if value:
            Metrics.counter(NAMESPACE, f"{namespace}/{name}").inc(int(value))


def _read_text_file(path: str, split_sentences: bool):
    """The documents of one file; an undecodable file is skipped and counted, never fatal."""
    stats = sources.SourceStats()
    try:
        with FileSystems.open(path) as f:
            yield from sources.file_documents(f, path, split_sentences=split_sentences, stats=stats)
    except ValueError as e:  # Looks binary: nothing was yielded.
        logging.warning("skipped %s: %s", path, e)
        stats.skipped_files.append(path)
        stats.skipped_lines += _count_lines(path)
    except (OSError, EOFError) as e:
        logging.warning("skipped the rest of %s after %d documents: %s", path, stats.documents, e)
        stats.skipped_files.append(path)
    _count("source", stats.to_dict())


def _read_table_file(path: str, text_column: str, split_sentences: bool):
    """The documents of one table file, one a row; a missing column or a non-text value stops
    the pipeline with the file named (a wrong --text_column, not damage to skip)."""
    stats = sources.SourceStats()
    yield from sources.table_file_documents(
        path, text_column, split_sentences=split_sentences, stats=stats
    )
    if stats.empty_rows:
        logging.warning(
            "%s: %d null or blank rows, e.g. %s",
            path,
            stats.empty_rows,
            ", ".join(stats.empty_row_examples),
        )
    _count("source", stats.to_dict())


def _count_lines(path: str) -> int:
    """Lines of a file (a last line without a newline counts), read in 8 MiB blocks."""
    lines, last = 0, b"\n"
    try:
        with FileSystems.open(path) as f:
            while block := f.read(8 << 20):
                lines += block.count(b"\n")
                last = block[-1:]
    except (OSError, EOFError):
        pass
    return lines + (last != b"\n")


def _tfds_document(example: dict, text_key: str, where: str):
    stats = sources.SourceStats()
    document = sources.text_document(example[text_key], where, stats)
    _count("source", stats.to_dict())
    if document:
        yield document


def _read_play(path: str):
    stats = sources.SourceStats()
    document = default_corpus.default_corpus_document(path, stats)
    _count("source", stats.to_dict())
    if document:
        yield document


# ---- Tokenize, partition, write ----


class _Tokenize(beam.DoFn):
    """Document (sentences) -> (shard, (key, token-id sentences)); empty ones dropped, counted."""

    def __init__(self, tokenizer, num_shards: int):
        self._tokenizer = tokenizer
        self._num_shards = num_shards

    def process(self, document: sources.Document):
        stats = corpus.CorpusStats()
        kept = corpus.keep_nonempty_sentences(self._tokenizer.encode_batch(document), stats)
        if kept:
            stats.documents, stats.sentences = 1, len(kept)
            stats.tokens = sum(map(len, kept))
        _count("corpus", {k: getattr(stats, k) for k in _corpus_counts()})
        if kept:
            key = document_key(kept)
            yield key % self._num_shards, (key, kept)


class _WriteShard(beam.DoFn):
    """(shard, documents) -> (shard, statistics): a finished shard is reused, not rewritten."""

    def __init__(self, out_dir, tokenizer, options, num_shards, record_format):
        self._out_dir = out_dir
        self._tokenizer = tokenizer
        self._options = options
        self._num_shards = num_shards
        self._record_format = record_format

    def setup(self):
        self._vocab = VocabInfo.from_tokenizer(self._tokenizer)

    def process(self, element):
        shard_index, entries = element
        name = build_dir.shard_name(shard_index, self._num_shards, self._record_format)
        stats = build_dir.finished_shard_stats(self._out_dir, name)
        if stats is None:
            # Flat arrays: 4 bytes a token while the examples are made (lists cost ~36).
            shard = corpus.from_documents([e[1] for e in entries if e is not None])
            instances = create_hashed_shard_instances(
                shard.documents(), self._options, self._vocab, shard_index, self._num_shards
            )
            writer = build.ShardWriter(
                self._out_dir, self._num_shards, self._options, self._vocab, self._record_format
            )
            stats = writer.write(instances, shard_index)
        _count("shards", {"instances": stats["num_records"], "tokens": stats["tokens"]})
        yield shard_index, stats


def _write_fingerprint(total: int, out_dir: str) -> None:
    path = os.fspath(epath.Path(out_dir) / build_dir.TMP_DIR / _FINGERPRINT_FILE)
    build_dir.write_json(path, {"fingerprint": documents_fingerprint([total])})


# ---- The launcher ----


def build_pretraining_shards_beam(
    source: TextFiles | TableFiles | Tfds | DefaultCorpus,
    out_dir: str | os.PathLike,
    tokenizer,
    options: PretrainingOptions | None = None,
    *,
    num_shards: int = 8,
    record_format: str = "array_record",
    pipeline_args: Sequence[str] = ("--runner=DirectRunner",),
) -> dict:
    """Builds (or finishes, or reuses) hash-partitioned pretraining shards with Apache Beam.

    Args:
      source: what to read: `TextFiles`, `TableFiles`, `Tfds` or `DefaultCorpus`.
      out_dir: the output directory, local (or mounted on every worker) or a URL that every
        worker can write (gs://..., through `etils.epath`); created; must hold nothing but this
        build's files.
      tokenizer: a `tokenization.SubwordTokenizer` (pickled to the workers); saved into
        `out_dir`.
      options: the example recipe; default `PretrainingOptions()`.
      num_shards: how many shards (a shard is made of whole documents: some may be empty).
      record_format: "array_record" or "tfrecord".
      pipeline_args: Beam's pipeline options, e.g. ["--runner=DataflowRunner", "--project=p",
        "--region=r", "--temp_location=gs://b/tmp"] or ["--runner=DirectRunner",
        "--direct_num_workers=8", "--direct_running_mode=multi_processing"].

    Returns:
      The metadata (also in `out_dir/metadata.json`), as `build.build_pretraining_shards`
      returns it; "corpus" and "source" hold the pipeline's counters.

    Raises:
      build_dir.OutputDirectoryError: `out_dir` holds other data or a build with other settings.
      FileNotFoundError: a pattern matches no file.
      ValueError: bad arguments, or the corpus has no text.
      RuntimeError: the pipeline failed (finished shards are kept; rerun to finish).
    """
    out_dir = os.fspath(out_dir)
    options = options or PretrainingOptions()
    build.check_build_args(num_shards, record_format, "hash")
    build_dir.check_output_dir(out_dir)
    build_dir.check_existing_tokenizer(out_dir, tokenizer)
    plan = build_dir.build_plan(
        options, tokenizer, source.source_id(), num_shards, record_format, "hash"
    )
    done = build_dir.finished_build(out_dir, plan)
    if done is not None:
        return done
    build_dir.start_build(out_dir, plan, tokenizer)

    counters = _run_pipeline(
        source, out_dir, tokenizer, options, num_shards, record_format, pipeline_args
    )
    shard_stats, corpus_stats, source_stats = _build_stats(
        out_dir, num_shards, record_format, counters
    )
    return build_dir.finish_build(
        out_dir, plan, shard_stats, options, tokenizer, corpus_stats, source_stats
    )


def _run_pipeline(source, out_dir, tokenizer, options, num_shards, record_format, pipeline_args):
    """Runs the pipeline (tokenize, group by shard, write each shard; the corpus fingerprint
    beside them) and returns its counters."""
    pipeline = beam.Pipeline(options=PipelineOptions(list(pipeline_args)))
    keyed = source.expand(pipeline) | "Tokenize" >> beam.ParDo(_Tokenize(tokenizer, num_shards))
    every_shard = pipeline | "EveryShard" >> beam.Create([(s, None) for s in range(num_shards)])
    _ = (
        (keyed, every_shard)
        | "Merge" >> beam.Flatten()
        | "Partition" >> beam.GroupByKey()
        | "Write" >> beam.ParDo(_WriteShard(out_dir, tokenizer, options, num_shards, record_format))
    )
    _ = (
        keyed
        | "Keys" >> beam.Map(lambda element: element[1][0])
        | "Sum" >> beam.CombineGlobally(sum)
        | "Fingerprint" >> beam.Map(_write_fingerprint, out_dir)
    )
    result = pipeline.run()
    state = result.wait_until_finish()
    if state != "DONE":
        raise RuntimeError(f"the Beam pipeline ended {state}; finished shards are kept, rerun")
    counters = _counters(result)
    logging.info("counters: %s", counters)
    return counters


def _build_stats(out_dir: str, num_shards: int, record_format: str, counters: dict):
    """(shard stats by index, corpus stats, source stats) of a finished pipeline, from the
    shards' stats files and the runner's counters; stops on a corpus with no text."""
    shard_stats = {}
    for index in range(num_shards):
        name = build_dir.shard_name(index, num_shards, record_format)
        shard_stats[index] = build_dir.read_json(build_dir.shard_stats_path(out_dir, name))
    corpus_stats = {k: counters.get(f"corpus/{k}", 0) for k in _corpus_counts()}
    corpus_stats["fingerprint"] = build_dir.read_json(
        os.fspath(epath.Path(out_dir) / build_dir.TMP_DIR / _FINGERPRINT_FILE)
    )["fingerprint"]
    if corpus_stats["documents"] == 0:
        raise ValueError("the corpus has no text: every document was empty or skipped")
    source_stats = {k: counters.get(f"source/{k}", 0) for k in sources.SourceStats().to_dict()}
    if source_stats["skipped_files"]:
        logging.warning(
            "skipped %d undecodable file(s), %d lines (the log names them)",
            source_stats["skipped_files"],
            source_stats["skipped_lines"],
        )
    empty = [i for i, s in shard_stats.items() if s["num_records"] == 0]
    if empty:
        logging.warning("%d of %d shards have no documents: %s", len(empty), num_shards, empty)
    return shard_stats, corpus_stats, source_stats


def _corpus_counts() -> list[str]:
    """The counted fields of `corpus.CorpusStats` (all but the fingerprint)."""
    return [f.name for f in dataclasses.fields(corpus.CorpusStats) if f.name != "fingerprint"]


def _counters(result) -> dict[str, int]:
    """The pipeline's counters in our namespace, by name (committed values where the runner
    reports them, else attempted)."""
    query = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    counters: dict[str, int] = {}
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + value
    return counters
