"""Batches of fine-tuning features: dynamic padding, length buckets, fillers, and packing.

Every featurizer (`glue`, `squad`, `ner`, `swag`, `shakespeare`) returns *features*: a dict of
host-side numpy arrays sharing a leading axis N (one row per example or window), padded to
`max_seq_length` on the token axis, with the real tokens first. `batches` cuts them into batches
of B rows; `pack` puts several short examples into each row first.

Dimensions: N examples, R packed rows, B batch, L tokens, S examples per packed row, C choices.

`batches` yields dicts with the same keys, each batch's token axis cut to a length bucket, the
last one completed by 0-weight fillers (docs/finetune_data.md, "Batches"). Token-axis keys:
`input_ids`, `token_type_ids`, `attention_mask`, `segment_ids`, `position_ids`, `label_weights`,
and `labels` when `label_weights` is present (token classification). Every other key is per row
(or per packed slot) and is never cut.

`pack(features, max_segments=S)` packs sequence- or token-classification rows into rows of L
tokens, best-fit decreasing (docs/finetune_data.md, "Packing"):

    input_ids, token_type_ids, attention_mask   int32   [R, L]   each example's tokens, in a row
    segment_ids                                 int32   [R, L]   0 = padding, 1..S = which example
    position_ids                                int32   [R, L]   0, 1, ... restarting per example
    cls_positions                               int32   [R, S]   where each example starts ([CLS])
                                                                 (0 for empty slots)
    example_weights                             float32 [R, S]   the example's weight, 0.0 if empty
    labels                                      int32/float32 [R, S]  sequence classification
                                                int32   [R, L]   token classification, with
    label_weights                               float32 [R, L]

The model must keep attention within a segment (`segment_ids[q] == segment_ids[k] != 0`), take
positions from `position_ids`, and read each example's output at `cls_positions`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from absl import logging

Features = dict[str, np.ndarray]

_TOKEN_KEYS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "segment_ids",
    "position_ids",
    "label_weights",
)
_WEIGHT_KEYS = ("example_weights", "label_weights")


def token_keys(features: Mapping[str, np.ndarray]) -> list[str]:
    """The keys whose last axis is the token axis L (see the module docstring)."""
    keys = [k for k in _TOKEN_KEYS if k in features]
    if "label_weights" in features and "labels" in features:
        keys.append("labels")
    return keys


def num_rows(features: Mapping[str, np.ndarray]) -> int:
    """N, the common leading size of the arrays; ValueError if they disagree."""
    sizes = {k: np.shape(v)[0] for k, v in features.items()}
    if not sizes:
        raise ValueError("no features")
    if len(set(sizes.values())) != 1:
        raise ValueError(f"feature arrays disagree on the number of rows: {sizes}")
    return next(iter(sizes.values()))


def row_lengths(features: Mapping[str, np.ndarray]) -> np.ndarray:
    """int [N]: real tokens per row (the longest choice for multiple choice [N, C, L])."""
    mask = np.asarray(features["attention_mask"])
    lengths = mask.sum(axis=-1)
    while lengths.ndim > 1:
        lengths = lengths.max(axis=-1)
    return lengths


def length_buckets(max_seq_length: int, step: int = 32) -> tuple[int, ...]:
    """(step, 2 step, ..., max_seq_length): bucket boundaries for dynamic padding."""
    if step <= 0 or max_seq_length <= 0:
        raise ValueError("step and max_seq_length must be positive")
    return tuple(range(step, max_seq_length, step)) + (max_seq_length,)


def num_batches(num_examples: int, batch_size: int, drop_remainder: bool = False) -> int:
    """How many batches `batches` yields for `num_examples` rows (with or without buckets)."""
    return num_examples // batch_size if drop_remainder else -(-num_examples // batch_size)


def _plan(
    lengths: np.ndarray,
    batch_size: int,
    bounds: np.ndarray | None,
    shuffle: bool,
    seed: int,
    group_by_length: bool,
) -> list[np.ndarray]:
    """The row indices of each batch; only the last may be short."""
    n = len(lengths)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n) if shuffle else np.arange(n)
    if not group_by_length:
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    bucket_of = np.searchsorted(bounds, lengths[order], side="left")
    full, leftovers = [], []
    for bucket in range(len(bounds)):
        members = order[bucket_of == bucket]
        num_full = len(members) // batch_size * batch_size
        full.extend(members[i : i + batch_size] for i in range(0, num_full, batch_size))
        leftovers.append(members[num_full:])
    rest = np.concatenate(leftovers)  # Grouped by bucket, so neighbours have similar lengths.
    tail = [rest[i : i + batch_size] for i in range(0, len(rest), batch_size)]
    if tail and len(tail[-1]) < batch_size:
        full.extend(tail[:-1])
        last = [tail[-1]]
    else:
        full.extend(tail)
        last = []
    if shuffle:
        full = [full[i] for i in rng.permutation(len(full))]
    return full + last


def batches(
    features: Mapping[str, np.ndarray],
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    drop_remainder: bool = False,
    bucket_boundaries: Sequence[int] | None = None,
    group_by_length: bool = False,
    return_indices: bool = False,
) -> Iterator[dict[str, np.ndarray]] | Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """One epoch of fixed-size batches (arguments are checked here, batches made lazily).

    Args:
      features: arrays with a common leading axis N (from a featurizer or `pack`).
      batch_size: B, rows per batch.
      shuffle: shuffle the rows (and, with `group_by_length`, the batches); use a new `seed`
        for each epoch.
      seed: the shuffle's seed.
      drop_remainder: drop (and log) the last batch if it has fewer than B real rows (training);
        otherwise (evaluation) it is completed with weight-0 fillers.
      bucket_boundaries: token-axis sizes a batch may be cut to (dynamic padding); the features'
        own length L is always one of them. None keeps L.
      group_by_length: draw each batch from one length bucket (needs bucket_boundaries).
      return_indices: also yield int64 [B], each row's index into the features (-1 for fillers).

    Returns:
      An iterator of {key: [B, ...] array}; token-axis keys are [B, L_b] (or [B, C, L_b]) with
      L_b the batch's bucket. With `return_indices`, of (batch, indices).
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    features = {k: np.asarray(v) for k, v in features.items()}
    n = num_rows(features)
    if "example_weights" not in features:
        raise ValueError("features need 'example_weights' (fillers get weight 0.0)")
    seq_keys = token_keys(features)
    max_len = features["input_ids"].shape[-1]
    lengths = row_lengths(features)
    bounds = None
    if bucket_boundaries is not None:
        bounds = np.array(sorted({min(int(b), max_len) for b in bucket_boundaries} | {max_len}))
        if bounds[0] <= 0:
            raise ValueError(f"bucket boundaries must be positive: {bucket_boundaries}")
    elif group_by_length:
        raise ValueError("group_by_length needs bucket_boundaries")
    plan = _plan(lengths, batch_size, bounds, shuffle, seed, group_by_length)
    if drop_remainder and plan and len(plan[-1]) < batch_size:
        logging.info("drop_remainder: dropping the last %d of %d rows", len(plan[-1]), n)
        plan = plan[:-1]
    return _iterate(features, plan, lengths, bounds, batch_size, seq_keys, return_indices)


def _iterate(features, plan, lengths, bounds, batch_size, seq_keys, return_indices):
    """Gathers, cuts and fills the planned batches (a generator, so `batches` checks eagerly)."""
    max_len = features["input_ids"].shape[-1]
    for idx in plan:
        width = max_len
        if bounds is not None:
            width = int(bounds[np.searchsorted(bounds, lengths[idx].max(), side="left")])
        num_fillers = batch_size - len(idx)
        gather = np.concatenate([idx, np.full(num_fillers, idx[0], dtype=idx.dtype)])
        batch = {}
        for key, array in features.items():
            values = array[gather]
            if key in seq_keys:
                values = values[..., :width]
            if num_fillers and key in _WEIGHT_KEYS:
                values[len(idx) :] = 0
            batch[key] = values
        if return_indices:
            indices = np.concatenate([idx, np.full(num_fillers, -1)]).astype(np.int64)
            yield batch, indices
        else:
            yield batch


def unbatch(
    outputs: Sequence[np.ndarray], indices: Sequence[np.ndarray], num_examples: int
) -> np.ndarray:
    """Per-batch outputs back in feature order, fillers dropped.

    Args:
      outputs: one array [B, ...] per batch (e.g. logits); arrays of token-axis outputs may
        differ in their second axis (dynamic padding) and are zero-padded to the widest.
      indices: the matching int [B] indices from `batches(..., return_indices=True)`.
      num_examples: N.

    Returns:
      [N, ...], row i the output of feature row i.

    Raises:
      ValueError: a row is missing or appears twice.
    """
    outputs = [np.asarray(o) for o in outputs]
    if not outputs:
        raise ValueError("no outputs")
    trailing = list(outputs[0].shape[1:])
    if len(trailing) >= 1 and any(o.shape[2:] != outputs[0].shape[2:] for o in outputs):
        raise ValueError("outputs differ beyond their second axis")
    if trailing:
        trailing[0] = max(o.shape[1] for o in outputs)
    result = np.zeros([num_examples, *trailing], dtype=outputs[0].dtype)
    seen = np.zeros(num_examples, dtype=np.int64)
    for output, idx in zip(outputs, indices):
        idx = np.asarray(idx)
        real = idx >= 0
        if output.ndim >= 2:
            result[idx[real], : output.shape[1]] = output[real]
        else:
            result[idx[real]] = output[real]
        np.add.at(seen, idx[real], 1)
    if np.any(seen != 1):
        bad = np.flatnonzero(seen != 1)
        raise ValueError(f"{len(bad)} rows appear {seen[bad[0]]} times, not once (e.g. {bad[0]})")
    return result


class EpochIterator:
    """Training batches for `num_epochs` epochs, reshuffled each epoch, resumable.

    Each global batch of `batch_size` rows is planned as `batches(..., drop_remainder=True)`
    plans it (seed + epoch); process `shard_index` of `shard_count` gets the contiguous slice
    [shard_index * B/shard_count, ...) of its rows (or the rows `host_rows` names, in that order:
    `sharding.host_batch_rows(mesh, B)`, which hosts sharing a batch shard share), cut to the
    token width the whole global batch needs, so every host compiles the same shapes and the
    assembled batch is the planned one.

    The position is (epoch, batch); `get_state()`/`set_state()` exchange it as JSON bytes, the
    protocol grain's Orbax checkpoint handler uses, so `loop.SaveCheckpoint` saves it with the
    model.
    """

    def __init__(
        self,
        features: Mapping[str, np.ndarray],
        batch_size: int,
        *,
        num_epochs: int,
        seed: int = 0,
        bucket_boundaries: Sequence[int] | None = None,
        group_by_length: bool = False,
        shard_index: int = 0,
        shard_count: int = 1,
        host_rows: Sequence[int] | None = None,
    ):
        if host_rows is not None:
            host_rows = np.asarray(host_rows, np.int64)
            if host_rows.ndim != 1 or not host_rows.size or host_rows.min() < 0:
                raise ValueError(f"host_rows must be row indices, got {host_rows[:10]}")
            if host_rows.max() >= batch_size or np.unique(host_rows).size != host_rows.size:
                raise ValueError(
                    f"host_rows must be distinct rows of the batch of {batch_size}, got "
                    f"{host_rows[:10]}"
                )
        if batch_size % shard_count:
            raise ValueError(f"batch_size={batch_size} does not split over {shard_count} processes")
        if "example_weights" not in features:
            raise ValueError("features need 'example_weights'")
        self._features = {k: np.asarray(v) for k, v in features.items()}
        self._batch_size, self._num_epochs, self._seed = batch_size, num_epochs, seed
        self._group = group_by_length
        self._lengths = row_lengths(self._features)
        max_len = self._features["input_ids"].shape[-1]
        self._bounds = None
        if bucket_boundaries is not None:
            self._bounds = np.array(
                sorted({min(int(b), max_len) for b in bucket_boundaries} | {max_len})
            )
        self._seq_keys = token_keys(self._features)
        per_host = batch_size // shard_count
        self._rows = (
            slice(shard_index * per_host, (shard_index + 1) * per_host)
            if host_rows is None
            else host_rows
        )
        self._epoch, self._index, self._plan = 0, 0, None
        self.steps_per_epoch = len(self._epoch_plan(0))
        if self.steps_per_epoch == 0:
            raise ValueError(f"{num_rows(self._features)} examples make no batch of {batch_size}")

    def _epoch_plan(self, epoch: int) -> list[np.ndarray]:
        plan = _plan(
            self._lengths, self._batch_size, self._bounds, True, self._seed + epoch, self._group
        )
        return [idx for idx in plan if len(idx) == self._batch_size]

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            if self._epoch >= self._num_epochs:
                raise StopIteration
            if self._plan is None:
                self._plan = self._epoch_plan(self._epoch)
            if self._index < len(self._plan):
                idx = self._plan[self._index]
                self._index += 1
                break
            self._epoch, self._index, self._plan = self._epoch + 1, 0, None
        width = self._features["input_ids"].shape[-1]
        if self._bounds is not None:
            width = int(self._bounds[np.searchsorted(self._bounds, self._lengths[idx].max())])
        mine = idx[self._rows]
        return {
            k: (v[mine][..., :width] if k in self._seq_keys else v[mine])
            for k, v in self._features.items()
        }

    def get_state(self) -> bytes:
        return json.dumps({"epoch": self._epoch, "batch": self._index}).encode()

    def set_state(self, state: bytes) -> None:
        position = json.loads(state)
        self._epoch, self._index, self._plan = position["epoch"], position["batch"], None

    def start_prefetch(self) -> None:
        """Part of grain's checkpoint protocol; batches are made on demand."""


# ---- Packing ----


@dataclasses.dataclass
class PackingInfo:
    """Where `pack` put each example.

    Attributes:
      example_row: int32 [N], the packed row of each example.
      example_slot: int32 [N], its slot (segment id - 1) in that row.
      example_start: int32 [N], the position of its first token ([CLS]) in the row.
      example_length: int32 [N], its number of tokens.
      num_rows: R.
      max_seq_length: L.
      max_segments: S.
    """

    example_row: np.ndarray
    example_slot: np.ndarray
    example_start: np.ndarray
    example_length: np.ndarray
    num_rows: int
    max_seq_length: int
    max_segments: int

    @property
    def efficiency(self) -> float:
        """Real tokens / token slots (R * L) of the packed rows."""
        return float(self.example_length.sum()) / max(1, self.num_rows * self.max_seq_length)

    def example_index(self) -> np.ndarray:
        """int32 [R, S]: the example in each slot, -1 for empty slots."""
        index = np.full((self.num_rows, self.max_segments), -1, dtype=np.int32)
        index[self.example_row, self.example_slot] = np.arange(len(self.example_row))
        return index

    def to_dict(self) -> dict:
        """Counts as a JSON-able dict."""
        n = len(self.example_row)
        return {
            "examples": n,
            "rows": self.num_rows,
            "examples_per_row": n / max(1, self.num_rows),
            "efficiency": self.efficiency,
        }

    def log(self) -> None:
        """Logs the packing."""
        d = self.to_dict()
        logging.info(
            "packed %d examples into %d rows of %d tokens (%.2f per row), efficiency %.3f",
            d["examples"],
            d["rows"],
            self.max_seq_length,
            d["examples_per_row"],
            d["efficiency"],
        )


def _assign_rows(
    lengths: np.ndarray, max_seq_length: int, max_segments: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Best-fit decreasing: (row, slot, start) per example and the number of rows."""
    n = len(lengths)
    row_of = np.empty(n, dtype=np.int32)
    slot_of = np.empty(n, dtype=np.int32)
    start_of = np.empty(n, dtype=np.int32)
    # Open rows by remaining capacity: open_rows[c] is a stack of row ids with c free tokens.
    open_rows: list[list[int]] = [[] for _ in range(max_seq_length + 1)]
    has_open = np.zeros(max_seq_length + 1, dtype=bool)
    used: list[int] = []  # Tokens used per row.
    count: list[int] = []  # Examples per row.
    for i in np.argsort(-lengths, kind="stable"):
        length = int(lengths[i])
        candidates = np.flatnonzero(has_open[length:])
        if len(candidates):
            capacity = length + int(candidates[0])
            row = open_rows[capacity].pop()
            has_open[capacity] = bool(open_rows[capacity])
        else:
            row = len(used)
            used.append(0)
            count.append(0)
        row_of[i], slot_of[i], start_of[i] = row, count[row], used[row]
        used[row] += length
        count[row] += 1
        remaining = max_seq_length - used[row]
        if remaining > 0 and count[row] < max_segments:
            open_rows[remaining].append(row)
            has_open[remaining] = True
    return row_of, slot_of, start_of, len(used)


def pack(
    features: Mapping[str, np.ndarray],
    *,
    max_segments: int,
    max_seq_length: int | None = None,
) -> tuple[Features, PackingInfo]:
    """Packs sequence- or token-classification rows, several examples per row.

    Args:
      features: unpacked features from `sentence_features.featurize`, `shakespeare` or
        `ner.featurize` ([N, L0] token arrays, `labels` [N] or [N, L0], `example_weights` [N]).
      max_segments: S, the most examples in one row.
      max_seq_length: L, the packed row length (default L0). It must hold the longest example:
        featurize with a `max_seq_length` no larger, so truncation happens (and is counted)
        there.

    Returns:
      (packed features [R, ...] as in the module docstring, where each example went).
    """
    features = {k: np.asarray(v) for k, v in features.items()}
    n = num_rows(features)
    token_level = _check_packable(features, max_segments)
    length = max_seq_length or features["input_ids"].shape[1]
    lengths = row_lengths(features).astype(np.int64)
    _check_lengths(lengths, length, n)
    row_of, slot_of, start_of, r = _assign_rows(lengths, length, max_segments)
    info = PackingInfo(row_of, slot_of, start_of, lengths.astype(np.int32), r, length, max_segments)
    return _scatter(features, info, lengths, token_level), info


def _check_packable(features: Features, max_segments: int) -> bool:
    """Raises ValueError on features `pack` cannot pack; whether their labels are per token."""
    if "segment_ids" in features:
        raise ValueError("these features are already packed")
    if features["input_ids"].ndim != 2:
        raise ValueError("only [N, L] features pack (not multiple choice)")
    required = {"input_ids", "token_type_ids", "attention_mask", "labels", "example_weights"}
    missing = required - set(features)
    if missing:
        raise ValueError(f"features lack {sorted(missing)}")
    if max_segments < 1:
        raise ValueError("max_segments must be >= 1")
    token_level = "label_weights" in features
    extra = set(features) - required - {"label_weights"}
    if extra:
        raise ValueError(f"cannot pack the per-example key(s) {sorted(extra)}")
    return token_level


def _check_lengths(lengths: np.ndarray, length: int, n: int) -> None:
    """Raises ValueError if one of the `n` examples is empty or longer than a row of `length`."""
    if n and lengths.max() > length:
        longest = int(np.argmax(lengths))
        raise ValueError(
            f"example {longest} has {lengths[longest]} tokens > max_seq_length={length}; "
            "featurize with max_seq_length <= the packed length"
        )
    if n and lengths.min() == 0:
        raise ValueError(f"example {int(np.argmin(lengths))} has no tokens")


def _scatter(
    features: Features, info: PackingInfo, lengths: np.ndarray, token_level: bool
) -> Features:
    """The packed features: every example's tokens and per-example values moved to its slot."""
    row_of, slot_of, start_of = info.example_row, info.example_slot, info.example_start
    r, length, max_segments = info.num_rows, info.max_seq_length, info.max_segments
    # Scatter every token: example i's token j goes to (row_of[i], start_of[i] + j).
    example, token = np.nonzero(np.arange(features["input_ids"].shape[1]) < lengths[:, None])
    rows, cols = row_of[example], start_of[example] + token
    packed: Features = {}
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        packed[key] = np.zeros((r, length), dtype=np.int32)
        packed[key][rows, cols] = features[key][example, token]
    packed["segment_ids"] = np.zeros((r, length), dtype=np.int32)
    packed["segment_ids"][rows, cols] = slot_of[example] + 1
    packed["position_ids"] = np.zeros((r, length), dtype=np.int32)
    packed["position_ids"][rows, cols] = token
    packed["cls_positions"] = np.zeros((r, max_segments), dtype=np.int32)
    packed["cls_positions"][row_of, slot_of] = start_of
    packed["example_weights"] = np.zeros((r, max_segments), dtype=np.float32)
    packed["example_weights"][row_of, slot_of] = features["example_weights"]
    labels = features["labels"]
    if token_level:
        packed["labels"] = np.zeros((r, length), dtype=labels.dtype)
        packed["labels"][rows, cols] = labels[example, token]
        packed["label_weights"] = np.zeros((r, length), dtype=np.float32)
        packed["label_weights"][rows, cols] = features["label_weights"][example, token]
    else:
        packed["labels"] = np.zeros((r, max_segments), dtype=labels.dtype)
        packed["labels"][row_of, slot_of] = labels
    return packed


def unpack_examples(values: np.ndarray, info: PackingInfo) -> np.ndarray:
    """Per-slot outputs [R, S, ...] (e.g. logits at `cls_positions`) -> per example [N, ...]."""
    values = np.asarray(values)
    if values.shape[:2] != (info.num_rows, info.max_segments):
        raise ValueError(
            f"expected [R={info.num_rows}, S={info.max_segments}, ...], got {values.shape}"
        )
    return values[info.example_row, info.example_slot]


def unpack_tokens(values: np.ndarray, info: PackingInfo, width: int | None = None) -> np.ndarray:
    """Per-token outputs [R, L', ...] of packed rows -> [N, width, ...], each example's tokens
    from position 0 as in the unpacked features (zeros past its length).

    Args:
      values: [R, L', ...] with L' >= the end of every example (dynamic padding may cut L).
      info: from `pack`.
      width: the output token axis (default: the longest example).
    """
    values = np.asarray(values)
    if values.shape[0] != info.num_rows:
        raise ValueError(f"expected {info.num_rows} rows, got {values.shape[0]}")
    width = width or int(info.example_length.max())
    out = np.zeros((len(info.example_row), width, *values.shape[2:]), dtype=values.dtype)
    example, token = np.nonzero(np.arange(width) < info.example_length[:, None])
    out[example, token] = values[info.example_row[example], info.example_start[example] + token]
    return out
