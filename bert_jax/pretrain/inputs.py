"""Input iterators for `train.py`, from the experiment config.

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


def _default_build_dir(config, workdir: str) -> str:
    out_dir = config.data.build_dir or os.path.join(os.fspath(workdir), "data")
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


def ensure_default_corpus(config, workdir: str) -> str:
    """Builds the default corpus's shards once (process 0; the others wait) and returns the dir.

    Raises ValueError on every process when the hosts do not share the build directory."""
    out_dir = _default_build_dir(config, workdir)
    require_shared_directory(out_dir)
    if jax.process_index() == 0:
        options = build.PretrainingOptions(
            max_seq_length=config.data.max_seq_length,
            max_predictions_per_seq=config.data.max_predictions_per_seq,
            masked_lm_prob=config.data.masked_lm_prob,
            next_sentence_prediction=config.job == "pretraining",
            static_masking=not config.data.dynamic_masking,
            dupe_factor=5,
            full_sentences=config.data.get("full_sentences", False),
        )
        build.build_default_corpus_shards(
            out_dir,
            options=options,
            progress=True,
            tokenizer_kind=config.data.get("vocab_kind", "wordpiece"),
        )
    # A failure of process 0's build reaches the others through parallel.multihost's watcher.
    multihost.barrier("default-corpus-built", timeout_s=BUILD_TIMEOUT_S)
    return out_dir


def pretraining_inputs(config, workdir: str, mesh: jax.sharding.Mesh) -> PretrainingInputs:
    """The train iterator and held-out eval batches for a pretraining config, holding this
    host's rows of every global batch of `mesh` (see `sharding.global_batch_from_local`)."""
    data = config.data
    info = pipeline.load_data_info(_record_paths(config, workdir))
    _check_records(config, info)
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
        _target_log_frequencies, config, info, train_files, common
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


def _record_paths(config, workdir: str):
    """The record files or build directories of the config's data source: the default corpus
    (built here once) or `data.paths`."""
    data = config.data
    if data.source == "default":
        return ensure_default_corpus(config, workdir)
    if data.source == "records":
        if not data.paths:
            raise ValueError("config.data.paths is empty: give a build directory or record files")
        return data.paths  # local or URLs (TFRecord; ArrayRecord must be local or mounted)
    raise ValueError(f"config.data.source={data.source!r}: expected 'default' or 'records'")


def _check_records(config, info: pipeline.DataInfo) -> None:
    """Refuses records that do not fit the config: another sequence length, another vocabulary
    size, or no next-sentence labels for the NSP objective."""
    data = config.data
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
    config,
    info: pipeline.DataInfo,
    train_files: list,
    common: dict,
    vocab_size: int,
    num_predictions: int = 100_000,
) -> np.ndarray:
    """[vocab_size] float32 log frequencies of the masked tokens of about `num_predictions`
    training predictions (at most about an epoch), add-0.5 smoothed: whole global batches of a
    stream of their own (`common`: the loader's settings), so every host counts the same tokens."""
    loader = pipeline.make_pretraining_loader(
        train_files, seed=config.data.seed + 2, **{**common, "host_rows": None}, shard_index=0,
        shard_count=1,
    )  # fmt: skip
    per_batch = config.global_batch_size * info.max_predictions_per_seq
    num_batches = min(
        -(-num_predictions // per_batch), info.num_records // config.global_batch_size + 1
    )
    counts = np.zeros(vocab_size)
    for _ in range(num_batches):
        batch = next(loader)
        np.add.at(counts, batch["masked_lm_ids"], batch["masked_lm_weights"])
    return np.log((counts + 0.5) / (counts.sum() + 0.5 * vocab_size)).astype(np.float32)
