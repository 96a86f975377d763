"""Input iterators for `train.py`, from the experiment config, and the job's data block typed
(`PretrainData`: `config.data`, parsed and checked once).

Pretraining: the default corpus (built once into `data.build_dir`, idempotent) or existing shards
(`data.paths`); the last `data.num_eval_shards` shards are held out for evaluation. Each process
reads the rows of every global batch that its devices hold (`sharding.host_batch_rows`), so hosts
that share a batch shard read the same rows.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator

import jax
import numpy as np
from absl import logging

from bert_jax.parallel import multihost, sharding
from bert_jax.paths import is_url
from bert_jax.pretrain.data import build, pipeline
from bert_jax.pretrain.data.default_corpus import TOKENIZER_KINDS
from bert_jax.training.text_job import whole_number

SOURCES = ("default", "records")


@dataclasses.dataclass(frozen=True)
class PretrainData:
    """The pretraining jobs' block (`config.data`), typed and checked once (`parse`; the
    comments in configs/pretrain.py say what each does).

    Attributes:
      source: "default" (the embedded corpus, built into `build_dir`) or "records" (`paths`).
      paths, build_dir, tokenizer: where the records are, where the default corpus is built
        ("": <workdir>/data), the vocabulary of dynamic masking ("": the build's).
      max_seq_length, max_predictions_per_seq, masked_lm_prob: L, P and the share masked.
      dynamic_masking, pack_sequences, full_sentences: booleans; max_segments: S (>= 1).
      num_eval_shards, worker_count, seed: the shards held out, grain's worker processes and
        the data order's seed (each >= 0).
      vocab_kind: the default corpus's kind of vocabulary (`default_corpus.TOKENIZER_KINDS`).
    """

    source: str
    paths: str
    build_dir: str
    tokenizer: str
    max_seq_length: int
    max_predictions_per_seq: int
    masked_lm_prob: float
    dynamic_masking: bool
    num_eval_shards: int
    worker_count: int
    pack_sequences: bool
    max_segments: int
    full_sentences: bool
    vocab_kind: str
    seed: int

    @classmethod
    def parse(cls, config) -> PretrainData:
        """`config.data`, each value checked: ValueError naming the key (`config.data.X=...`)."""
        d = config.data
        choices = {"source": SOURCES, "vocab_kind": TOKENIZER_KINDS}
        for key, known in choices.items():
            if d.get(key, known[0]) not in known:
                raise ValueError(f"config.data.{key}={d[key]!r}: expected one of {known}")
        for key in ("dynamic_masking", "pack_sequences", "full_sentences"):
            if d.get(key, False) not in (True, False, 0, 1):
                raise ValueError(f"config.data.{key}={d[key]!r}: expected true or false")
        prob = d.masked_lm_prob
        if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 < prob <= 1:
            raise ValueError(f"config.data.masked_lm_prob={prob!r}: expected a number in (0, 1]")
        counts = {"max_seq_length": 2, "max_predictions_per_seq": 1, "max_segments": 1}
        counts.update(num_eval_shards=0, worker_count=0, seed=0)
        return cls(
            source=d.source,
            paths=str(d.paths),
            build_dir=str(d.build_dir),
            tokenizer=str(d.tokenizer),
            masked_lm_prob=float(prob),
            dynamic_masking=bool(d.dynamic_masking),
            pack_sequences=bool(d.pack_sequences),
            full_sentences=bool(d.get("full_sentences", False)),
            vocab_kind=d.get("vocab_kind", TOKENIZER_KINDS[0]),
            **{key: whole_number(d, "data", key, least) for key, least in counts.items()},
        )


@dataclasses.dataclass
class PretrainingInputs:
    """train: a checkpointable grain iterator of this host's batches; eval_batches(n): the same n
    held-out batches every call (None without held-out shards); info: the shards' DataInfo;
    tokenizer_path: the vocabulary the ids come from (None if unknown);
    target_log_frequencies(V): [V] float32 log frequencies of the training masked tokens (the
    same on every host), from about 100k predictions (at most about an epoch)."""

    train: Iterator
    eval_batches: Callable[[int], list] | None
    info: pipeline.DataInfo
    tokenizer_path: str | None
    target_log_frequencies: Callable[[int], np.ndarray] | None = None


def _default_build_dir(data: PretrainData, workdir: str) -> str:
    out_dir = data.build_dir or os.path.join(os.fspath(workdir), "data")
    if is_url(out_dir):  # the build writes through local files (os, ArrayRecord's writer)
        raise ValueError(
            f"the default corpus cannot be built into {out_dir}: its shards are written as local "
            "files; pass a local or shared data.build_dir (--config.data.build_dir=/path), or "
            "build the records once and pass data.paths"
        )
    return out_dir


def require_shared_directory(directory: str) -> None:
    """Raises on every process unless all processes see the files process 0 writes in
    `directory` (a shared file system). A barrier (`bert_jax.parallel.multihost`); a no-op in a
    single-process run. The probe file is gone again when it returns: the directory holds only
    what it held before (the default corpus's build refuses files it did not write)."""
    if jax.process_count() == 1:
        return
    probe = os.path.join(directory, ".shared-by-all-processes")
    token = str(np.random.default_rng().integers(1, 2**31 - 1))
    token = multihost.broadcast("shared-probe-token", token)
    if jax.process_index() == 0:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "w") as f:
            f.write(token)
    multihost.barrier("shared-probe-written")
    try:
        with open(probe) as f:
            seen = f.read().strip() == token
    except OSError:
        seen = False
    seen_by = multihost.all_gather("shared-probe-read", "1" if seen else "0")
    if jax.process_index() == 0:  # every process has read it
        os.remove(probe)
    blind = [i for i, s in enumerate(seen_by) if s == "0"]
    if blind:
        raise ValueError(
            f"process(es) {blind} cannot see the files process 0 writes in {directory}: the "
            "default corpus is built once, so data.build_dir (default <workdir>/data) must be on "
            "a file system every host shares; or build the records once and pass data.paths"
        )


# The default corpus's build (process 0; the others wait for it): at most this long.
BUILD_TIMEOUT_S = 3 * 3600


def ensure_default_corpus(config, workdir: str, data: PretrainData | None = None) -> str:
    """Builds the default corpus's shards once (process 0; the others wait) and returns the dir;
    `data`: the config's block, parsed (None: parsed here).

    Raises ValueError on every process when the hosts do not share the build directory."""
    data = data or PretrainData.parse(config)
    out_dir = _default_build_dir(data, workdir)
    require_shared_directory(out_dir)
    if jax.process_index() == 0:
        options = build.PretrainingOptions(
            max_seq_length=data.max_seq_length,
            max_predictions_per_seq=data.max_predictions_per_seq,
            masked_lm_prob=data.masked_lm_prob,
            next_sentence_prediction=config.job == "pretraining",
            static_masking=not data.dynamic_masking,
            dupe_factor=5,
            full_sentences=data.full_sentences,
        )
        build.build_default_corpus_shards(
            out_dir, options=options, progress=True, tokenizer_kind=data.vocab_kind
        )
    # A failure of process 0's build reaches the others through parallel.multihost's watcher.
    multihost.barrier("default-corpus-built", timeout_s=BUILD_TIMEOUT_S)
    return out_dir


def pretraining_inputs(
    config, workdir: str, mesh: jax.sharding.Mesh, data: PretrainData | None = None
) -> PretrainingInputs:
    """The train iterator and held-out eval batches for a pretraining config, holding this
    host's rows of every global batch of `mesh` (see `sharding.global_batch_from_local`);
    `data`: the config's block as the job's check parsed it (None: parsed here)."""
    data = data or PretrainData.parse(config)
    info = pipeline.load_data_info(_record_paths(config, data, workdir))
    _check_records(config, data, info)
    files = list(info.paths)
    k = data.num_eval_shards
    if k and len(files) <= k:
        raise ValueError(f"{len(files)} shard(s) cannot hold out num_eval_shards={k}")
    train_files, eval_files = (files[:-k], files[-k:]) if k else (files, [])
    tokenizer = data.tokenizer or None
    common = dict(
        global_batch_size=config.global_batch_size,
        dynamic_masking=data.dynamic_masking if info.static_masks else True,
        tokenizer=tokenizer,
        masked_lm_prob=data.masked_lm_prob,
        host_rows=sharding.host_batch_rows(mesh, config.global_batch_size),
        pack_sequences=data.pack_sequences,
        max_segments=data.max_segments,
    )
    train = pipeline.make_pretraining_loader(
        train_files, seed=data.seed, worker_count=data.worker_count, **common
    )
    eval_batches = None
    if eval_files:

        def eval_batches(n: int) -> list:
            loader = pipeline.make_pretraining_loader(eval_files, seed=data.seed + 1, **common)
            return [next(loader) for _ in range(n)]

    target_log_frequencies = functools.partial(
        _target_log_frequencies, config.global_batch_size, info, train_files, data.seed, common
    )

    if tokenizer is None and info.metadata is not None:
        tokenizer = os.path.join(os.path.dirname(files[0]), "tokenizer.json")
    logging.info(
        "pretraining data: %d records in %d shards (%d held out), L=%d, P=%d, %s",
        info.num_records,
        len(files),
        k,
        info.max_seq_length,
        info.max_predictions_per_seq,
        f"packed, at most {data.max_segments} a row" if data.pack_sequences else "one a row",
    )
    return PretrainingInputs(train, eval_batches, info, tokenizer, target_log_frequencies)


def _record_paths(config, data: PretrainData, workdir: str):
    """The record files or build directories of the config's data source: the default corpus
    (built here once) or `data.paths`."""
    if data.source == "default":
        return ensure_default_corpus(config, workdir, data)
    if not data.paths:
        raise ValueError("config.data.paths is empty: give a build directory or record files")
    return data.paths  # local or URLs (TFRecord; ArrayRecord must be local or mounted)


def _check_records(config, data: PretrainData, info: pipeline.DataInfo) -> None:
    """Refuses records that do not fit the config: another sequence length, another vocabulary
    size, or no next-sentence labels for the NSP objective."""
    if info.max_seq_length != data.max_seq_length:
        raise ValueError(
            f"the records hold sequences of {info.max_seq_length} tokens but "
            f"config.data.max_seq_length={data.max_seq_length}"
        )
    if info.vocab_size is not None and info.vocab_size != config.model.vocab_size:
        raise ValueError(
            f"the data's tokenizer has {info.vocab_size} tokens but config.model.vocab_size="
            f"{config.model.vocab_size}; set --config.model.vocab_size={info.vocab_size}"
        )
    if config.job == "pretraining" and not info.next_sentence_prediction:
        raise ValueError("these records have no next-sentence labels; use the mlm_only=1 variant")


def _target_log_frequencies(
    global_batch_size: int,
    info: pipeline.DataInfo,
    train_files: list,
    seed: int,
    common: dict,
    vocab_size: int,
    num_predictions: int = 100_000,
) -> np.ndarray:
    """[vocab_size] float32 log frequencies of the masked tokens of about `num_predictions`
    training predictions (at most about an epoch), add-0.5 smoothed: whole global batches of a
    stream of their own (`common`: the loader's settings), so every host counts the same tokens."""
    loader = pipeline.make_pretraining_loader(
        train_files, seed=seed + 2, **{**common, "host_rows": None}, shard_index=0,
        shard_count=1,
    )  # fmt: skip
    per_batch = global_batch_size * info.max_predictions_per_seq
    num_batches = min(-(-num_predictions // per_batch), info.num_records // global_batch_size + 1)
    counts = np.zeros(vocab_size)
    for _ in range(num_batches):
        batch = next(loader)
        np.add.at(counts, batch["masked_lm_ids"], batch["masked_lm_weights"])
    return np.log((counts + 0.5) / (counts.sum() + 0.5 * vocab_size)).astype(np.float32)
