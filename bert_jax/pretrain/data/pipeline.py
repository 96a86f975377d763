"""The pretraining input pipeline on grain: deterministic, host-sharded, checkpointable.

    loader = make_pretraining_loader("data/shakespeare", global_batch_size=256, seed=0)
    batch = next(loader)        # dict of host-side numpy arrays
    state = loader.get_state()  # JSON-able; loader.set_state(state) resumes exactly there

Each batch holds this host's B = global_batch_size / shard_count examples with the keys, shapes
and dtypes of `batch_layout.PRETRAINING_BATCH` (input_ids, token_type_ids, attention_mask [B, L];
masked_lm_positions, masked_lm_ids, masked_lm_weights [B, P]; next_sentence_labels [B]); with
`pack_sequences=True`, of `batch_layout.PACKED_PRETRAINING_BATCH` (segment_ids, position_ids
[B, L]; cls_positions, next_sentence_labels, next_sentence_weights [B, S]; predictions [B, P_row]).
How grain shuffles, splits the stream across hosts and workers, masks and packs, and checkpointing
with Orbax: docs/data.md, "The input pipeline" and "Packing".
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import grain
import numpy as np
from etils import epath

from bert_jax.paths import is_url
from bert_jax.pretrain.data import build_dir, features, masking, packing, records
from bert_jax.pretrain.data.examples import VocabInfo


@dataclasses.dataclass(frozen=True)
class DataInfo:
    """What the training code needs to know about a set of pretraining shards.

    Attributes:
      paths: the record files.
      record_format: "array_record" or "tfrecord".
      num_records: N, examples per epoch (all hosts together).
      max_seq_length: L.
      max_predictions_per_seq: P.
      next_sentence_prediction: whether next_sentence_labels mean anything (False: MLM-only data,
        labels all 0; the training code should skip the NSP loss).
      static_masks: whether the records carry masks (False: dynamic masking is required).
      vocab_size: V, if known (from a build's metadata), else None.
      metadata: the build's metadata.json, if any.
    """

    paths: tuple[str, ...]
    record_format: str
    num_records: int
    max_seq_length: int
    max_predictions_per_seq: int
    next_sentence_prediction: bool
    static_masks: bool
    vocab_size: int | None
    metadata: dict | None = None

    def steps_per_epoch(self, global_batch_size: int) -> int:
        """Full global batches per epoch, unpacked (packed rows hold several examples each)."""
        return self.num_records // global_batch_size


def _resolve(paths) -> tuple[list[str], dict | None, str | None]:
    """(record files, build metadata or None, build directory or None); URLs stay URLs."""
    if isinstance(paths, (str, os.PathLike)) and epath.Path(paths).is_dir():
        directory = os.fspath(paths)
        try:
            metadata = build_dir.read_metadata(directory)
        except FileNotFoundError:
            if (epath.Path(directory) / build_dir.BUILD_FILE).exists():
                raise FileNotFoundError(
                    f"{directory} holds an unfinished build (no {build_dir.METADATA_FILE}); run "
                    "the build again to finish it"
                ) from None
            raise FileNotFoundError(
                f"{directory} is not a pretraining build (no {build_dir.METADATA_FILE}); pass the "
                "record files themselves"
            ) from None
        files = [os.path.join(directory, s["path"]) for s in metadata["shards"]]
        return files, metadata, directory
    files = records.expand_paths(paths)
    directories = {os.path.dirname(f if is_url(f) else os.path.abspath(f)) for f in files}
    if len(directories) == 1:
        directory = directories.pop()
        if (epath.Path(directory) / build_dir.METADATA_FILE).is_file():
            metadata = build_dir.read_metadata(directory)
            listed = {s["path"] for s in metadata["shards"]}
            if all(os.path.basename(f) in listed for f in files):
                return files, metadata, directory
    return files, None, None


def load_data_info(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> DataInfo:
    """Describes shards: counts, lengths, whether NSP labels and masks are present.

    Args:
      paths: a build directory, or record files/globs.

    Raises:
      FileNotFoundError: nothing there, or an unfinished build.
      records.RecordFileError: unreadable, mixed-format or empty record files.
    """
    files, metadata, _ = _resolve(paths)
    return _data_info(records.open_data_source(files), files, metadata)


def _data_info(source, files: list[str], metadata: dict | None) -> DataInfo:
    """`source`: the opened record files `files`."""
    if len(source) == 0:
        raise records.RecordFileError(f"no records in {', '.join(files[:3])}")
    seq_len, num_predictions = features.infer_lengths(source[0])
    if metadata is not None:
        options = metadata["options"]
        nsp, static = options["next_sentence_prediction"], options["static_masking"]
        vocab_size = metadata["tokenizer"]["vocab_size"]
        record_format = metadata["record_format"]
    else:
        nsp, static, vocab_size = True, True, None
        record_format = records.detect_format(files[0])
    return DataInfo(
        paths=tuple(files),
        record_format=record_format,
        num_records=len(source),
        max_seq_length=seq_len,
        max_predictions_per_seq=num_predictions,
        next_sentence_prediction=nsp,
        static_masks=static,
        vocab_size=vocab_size,
        metadata=metadata,
    )


class _WithStreamIndex(grain.experimental.MapWithIndexTransform):
    """Pairs each record key with its position in the global stream."""

    def map_with_index(self, index: int, element: int) -> tuple[int, int]:
        return index, element


class _HostRows(grain.transforms.Map):
    """Keeps the given rows of a global batch of (stream positions, keys), in that order."""

    def __init__(self, rows: np.ndarray):
        self._rows = rows

    def map(self, element: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        stream_ids, keys = element
        return stream_ids[self._rows], keys[self._rows]


class _ReadBatch(grain.transforms.Map):
    """Reads, decodes and (optionally) masks a batch of records given their keys."""

    def __init__(self, source, info: DataInfo, spec: masking.MaskingSpec | None, seed: int):
        self._source = source
        self._seq_len = info.max_seq_length
        self._num_predictions = info.max_predictions_per_seq
        self._spec = spec
        self._seed = seed
        self._nsp = info.next_sentence_prediction

    def map(self, element: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
        stream_ids, keys = element
        raw = self._source.__getitems__([int(k) for k in keys])
        batch = features.decode_batch(raw, self._seq_len, self._num_predictions)
        if self._spec is not None:
            original = masking.unmask(
                batch["input_ids"],
                batch["masked_lm_positions"],
                batch["masked_lm_ids"],
                batch["masked_lm_weights"],
            )
            batch.update(
                masking.mask_batch(
                    original, batch["attention_mask"], stream_ids, self._seed, self._spec
                )
            )
        if not self._nsp:
            batch["next_sentence_labels"][:] = 0
        return batch


def _vocab_info(tokenizer, directory: str | None) -> VocabInfo | None:
    from bert_jax import tokenization

    if tokenizer is None and directory is not None:
        if (epath.Path(directory) / "tokenizer.json").is_file():
            tokenizer = os.path.join(directory, "tokenizer.json")
    if tokenizer is None:
        return None
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = tokenization.load_tokenizer(tokenizer)
    return VocabInfo.from_tokenizer(tokenizer)


def make_pretraining_dataset(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    batch_size: int | None = None,
    global_batch_size: int | None = None,
    seed: int = 0,
    num_epochs: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    host_rows: Sequence[int] | None = None,
    shuffle: bool = True,
    dynamic_masking: bool | None = None,
    tokenizer=None,
    masked_lm_prob: float | None = None,
    whole_word_mask: bool | None = None,
    worker_count: int = 0,
    worker_buffer_size: int = 2,
    read_threads: int = 2,
    prefetch_batches: int = 4,
    pack_sequences: bool = False,
    max_segments: int = 4,
    num_packing_bins: int = 128,
) -> grain.IterDataset:
    """A grain dataset of pretraining batches (keys and shapes in the module docstring).

    Args:
      paths: a build directory, or ArrayRecord/TFRecord files or globs (one format).
      batch_size: B, examples per batch on this host; or give
      global_batch_size: examples per step over all hosts (B = global / shard_count).
      seed: seeds the shuffle and the dynamic masks, in [0, 2**32).
      num_epochs: passes over the data; None repeats forever. The last partial global batch is
        dropped, so every host yields the same number of batches.
      shard_index, shard_count: this host's part and the number of parts; default
        `jax.process_index()` and `jax.process_count()`.
      host_rows: instead of shard_index/shard_count, the rows of each global batch this host
        reads, in order (`sharding.host_batch_rows`); needs global_batch_size.
      shuffle: shuffle globally, reshuffled every epoch; False reads in stored order.
      dynamic_masking: draw new masks each epoch; default: only if the records have none.
        Static masks are undone first, so original TFRecords can be re-masked.
      tokenizer: for dynamic masking: a `tokenization.SubwordTokenizer` or a tokenizer file
        path; default the build directory's tokenizer.json.
      masked_lm_prob, whole_word_mask: for dynamic masking; default the build's (or 0.15, False).
      worker_count: processes that read, decode and mask (0: in this process).
      worker_buffer_size: batches each worker keeps ready.
      read_threads, prefetch_batches: threads reading ahead in each process, and the batches
        they read ahead.
      pack_sequences: pack several examples into each row (see `packing`). Each host packs its
        own examples, so the rows depend on shard_count (the examples and masks do not).
      max_segments: S, the most sequences in a packed row.
      num_packing_bins: rows the packer keeps open; more pack tighter (docs/data.md).

    Returns:
      A `grain.IterDataset` of batches; `make_pretraining_loader` iterates it.

    Raises:
      ValueError: inconsistent arguments (messages say which).
      FileNotFoundError, records.RecordFileError: missing or unreadable data.
    """
    files, metadata, directory = _resolve(paths)
    source = records.open_data_source(files)  # once: opening scans every TFRecord file
    info = _data_info(source, files, metadata)
    global_batch, host_rows = _host_rows(
        batch_size, global_batch_size, shard_index, shard_count, host_rows
    )
    _check_reading(seed, num_epochs, worker_count)
    spec = _masking_spec(
        info, directory, dynamic_masking, tokenizer, masked_lm_prob, whole_word_mask
    )
    ds = _host_keys(len(source), seed, shuffle, num_epochs, global_batch, host_rows)
    ds = ds.map(_ReadBatch(source, info, spec, seed))
    ds = _read_ahead(ds, read_threads, prefetch_batches, worker_count, worker_buffer_size)
    if pack_sequences:  # In this process, after the workers (see `_packed`).
        ds = _packed(ds, info, spec, len(host_rows), max_segments, num_packing_bins)
    return ds


def _check_reading(seed: int, num_epochs: int | None, worker_count: int) -> None:
    """Raises ValueError on a seed, epoch count or worker count out of range."""
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed={seed}: must be in [0, 2**32)")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs={num_epochs}: must be >= 1 or None (forever)")
    if worker_count < 0:
        raise ValueError(f"worker_count={worker_count}: must be >= 0")


def _read_ahead(
    ds: grain.MapDataset,
    read_threads: int,
    prefetch_batches: int,
    worker_count: int,
    worker_buffer_size: int,
) -> grain.IterDataset:
    """`ds` read ahead by threads, in `worker_count` processes when > 0."""
    iter_ds = ds.to_iter_dataset(
        grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=prefetch_batches)
    )
    if worker_count > 0:
        iter_ds = _in_worker_processes(iter_ds, worker_count, worker_buffer_size)
    return iter_ds


def _host_rows(
    batch_size: int | None,
    global_batch_size: int | None,
    shard_index: int | None,
    shard_count: int | None,
    host_rows: Sequence[int] | None,
) -> tuple[int, np.ndarray]:
    """(G, the rows of each global batch this host reads, int64 [B]) from
    `make_pretraining_dataset`'s arguments, which it checks."""
    if host_rows is not None:
        if global_batch_size is None or {batch_size, shard_index, shard_count} != {None}:
            raise ValueError(
                "host_rows goes with global_batch_size, not with batch_size, shard_index or "
                "shard_count"
            )
        host_rows = np.asarray(host_rows, np.int64)
        if host_rows.ndim != 1 or not host_rows.size or np.unique(host_rows).size != host_rows.size:
            raise ValueError(f"host_rows must be distinct row indices, got {host_rows[:10]}")
        if host_rows.min() < 0 or host_rows.max() >= global_batch_size:
            raise ValueError(
                f"host_rows must lie in [0, global_batch_size={global_batch_size}), got "
                f"{host_rows.min()}..{host_rows.max()}"
            )
        return global_batch_size, host_rows  # The global batch is formed whole, then sliced.
    if shard_index is None or shard_count is None:
        import jax

        shard_index = jax.process_index() if shard_index is None else shard_index
        shard_count = jax.process_count() if shard_count is None else shard_count
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} is not in [0, shard_count={shard_count})")
    if (batch_size is None) == (global_batch_size is None):
        raise ValueError("give exactly one of batch_size (per host) and global_batch_size")
    if global_batch_size is not None:
        if global_batch_size % shard_count:
            raise ValueError(
                f"global_batch_size={global_batch_size} is not divisible by "
                f"shard_count={shard_count}"
            )
        batch_size = global_batch_size // shard_count
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be >= 1")
    host_rows = np.arange(shard_index * batch_size, (shard_index + 1) * batch_size)
    return batch_size * shard_count, host_rows


def _masking_spec(
    info: DataInfo,
    directory: str | None,
    dynamic_masking: bool | None,
    tokenizer,
    masked_lm_prob: float | None,
    whole_word_mask: bool | None,
) -> masking.MaskingSpec | None:
    """The dynamic masking rule (None: keep the records' masks), the build's settings filling
    in the arguments left None."""
    if dynamic_masking is None:
        dynamic_masking = not info.static_masks
    if not dynamic_masking and not info.static_masks:
        raise ValueError(
            "these records carry no masks (built with static_masking=False); use "
            "dynamic_masking=True"
        )
    if not dynamic_masking:
        return None
    vocab = _vocab_info(tokenizer, directory)
    if vocab is None:
        raise ValueError(
            "dynamic masking needs the vocabulary: pass tokenizer= (a vocab.txt or "
            "tokenizer.json path, or a tokenizer)"
        )
    options = (info.metadata or {}).get("options", {})
    return masking.MaskingSpec(
        vocab=vocab,
        masked_lm_prob=masked_lm_prob or options.get("masked_lm_prob", 0.15),
        max_predictions_per_seq=info.max_predictions_per_seq,
        whole_word_mask=(
            whole_word_mask
            if whole_word_mask is not None
            else options.get("whole_word_mask", False)
        ),
    )


def _host_keys(
    num_records: int,
    seed: int,
    shuffle: bool,
    num_epochs: int | None,
    global_batch: int,
    host_rows: np.ndarray,
) -> grain.MapDataset:
    """Batches of (stream positions, record keys), int [B] each: this host's rows of every global
    batch of the (shuffled, repeated) stream, cut to whole global batches if num_epochs is set."""
    ds = grain.MapDataset.range(num_records)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs).map_with_index(_WithStreamIndex())
    if num_epochs is not None:
        usable = len(ds) // global_batch * global_batch
        if usable == 0:
            raise ValueError(
                f"{len(ds)} examples in {num_epochs} epoch(s) make no global batch of "
                f"{global_batch}"
            )
        ds = ds[:usable]
    ds = ds.batch(global_batch, drop_remainder=True)
    return ds.map(_HostRows(host_rows))


def _in_worker_processes(
    iter_ds: grain.IterDataset, worker_count: int, worker_buffer_size: int
) -> grain.IterDataset:
    """`iter_ds` run in `worker_count` processes (batches are formed before the split)."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        # grain's worker processes read absl flags; outside an absl app (tests, notebooks)
        # nothing has parsed them, so take their defaults.
        flags.FLAGS.mark_as_parsed()
    return iter_ds.mp_prefetch(
        grain.MultiprocessingOptions(
            num_workers=worker_count, per_worker_buffer_size=worker_buffer_size
        )
    )


def _packed(
    iter_ds: grain.IterDataset,
    info: DataInfo,
    spec: masking.MaskingSpec | None,
    batch_size: int,
    max_segments: int,
    num_packing_bins: int,
) -> grain.IterDataset:
    """`iter_ds`'s examples packed into rows of B = `batch_size` (see `packing`).

    Runs in this process, after the workers: the packer's rows then depend on the stream of
    examples only, not on how the reading was split across workers.
    """
    options = (info.metadata or {}).get("options", {})
    tokenizer_ids = (info.metadata or {}).get("tokenizer", {})
    if spec is not None:
        masked_lm_prob = spec.masked_lm_prob
    elif options.get("static_masking"):  # This library's build: masked by the same rule.
        masked_lm_prob = options["masked_lm_prob"]
    else:  # Foreign records: masked with an unknown probability.
        masked_lm_prob = None
    return packing.pack_pretraining_batches(
        iter_ds,
        batch_size=batch_size,
        max_seq_length=info.max_seq_length,
        max_segments=max_segments,
        max_predictions=packing.max_predictions_per_row(
            info.max_seq_length,
            max_segments,
            info.max_predictions_per_seq,
            masked_lm_prob,
        ),
        num_packing_bins=num_packing_bins,
        pad_id=spec.vocab.pad_id if spec else tokenizer_ids.get("pad_id", 0),
    )


def make_pretraining_loader(
    paths: str | os.PathLike | Sequence[str | os.PathLike], **kwargs
) -> grain.DatasetIterator:
    """`iter(make_pretraining_dataset(paths, **kwargs))`: with `get_state()`/`set_state()`."""
    return iter(make_pretraining_dataset(paths, **kwargs))
