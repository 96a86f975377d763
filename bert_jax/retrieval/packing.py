"""Packed contrastive batches: the texts of a global batch of pairs (anchors, positives, hard
negatives) several to a row of L tokens, so that the encoder works on their tokens rather than
on [PAD] (short queries and passages fill a fraction of a padded row).

    batches = PackedBatches(epoch_iterator, max_segments=S, row_multiple=m, host_rows=rows_of)

A packed batch of B pairs of T texts (`pack_pairs`) has the layout `batch_layout.PACKED_TEXTS`:
every key led by the R rows (so the rows shard over the mesh's batch axes as any batch does),
the texts' tokens, segment_ids and position_ids [R, L], each slot's start (cls_positions) and
text (text_index: b * T + t, -1 an empty slot) [R, S]. With `anchors_apart` (an inference-free
SPLADE model's batches: its anchors run through no model) the rows hold the positives and
negatives only, and the anchors come whole beside them, [B, L] (`batch_layout.ANCHORS`).

The texts go into rows best-fit decreasing (`batching.pack`, fine-tuning's packer, at most S a
row); a text never spans rows and texts longer than L were cut when featurized, so a batch
always fits: at worst one text a row (R = B T), never a text dropped. R is then rounded up to a
multiple of `row_step` (empty rows last), so a run compiles few shapes (at most
`ROW_SIZES`) and the rows split evenly over the data-parallel devices and GradCache chunks.
The packing is a function of the global batch alone: every host computes the same and feeds the
rows `host_rows(R)` names (`sharding.host_batch_rows`), so all hosts agree on R at every step.
The objective pools each slot from its own tokens and puts the slots back in [B, T] order
(`contrastive.ContrastiveObjective.texts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from bert_jax import batch_layout
from bert_jax.data import batching

ROW_SIZES = 16  # a run's row counts are multiples of about B T / ROW_SIZES: at most this many
# The [R, L] keys of a packed batch (`batch_layout.PACKED_TEXTS`).
TOKEN_KEYS = tuple(k for k, f in batch_layout.PACKED_TEXTS.items() if f.axes == "RL")
ANCHOR_KEYS = tuple(batch_layout.ANCHORS)  # the anchors' [B, L] tokens, with anchors_apart


def row_step(num_texts: int, row_multiple: int = 1) -> int:
    """The granularity of the row count for `num_texts` texts a batch: a multiple of
    `row_multiple` (data-parallel devices x GradCache chunks) near num_texts / ROW_SIZES."""
    if row_multiple < 1:
        raise ValueError(f"row_multiple={row_multiple}: expected >= 1")
    return row_multiple * max(1, -(-num_texts // (ROW_SIZES * row_multiple)))


def pack_pairs(
    batch: Mapping[str, np.ndarray],
    *,
    max_segments: int,
    row_multiple: int = 1,
    keep: tuple[str, ...] = (),
    anchors_apart: bool = False,
) -> dict[str, np.ndarray]:
    """Packs one global batch of pairs (keys and shapes in the module docstring).

    Args:
      batch: input_ids, token_type_ids, attention_mask int32 [B, T, L'] (`pairs.featurize_pairs`'
        rows, or a reranker's groups of T pairs, L' <= L); other keys are ignored but `keep`.
      max_segments: S, the most texts in one row.
      row_multiple: R is a multiple of `row_step(B T, row_multiple)`.
      keep: keys led by the B pairs (a reranker's labels [B], example_weights [B],
        teacher_scores [B, T]), passed on as they are.
      anchors_apart: text 0 of each pair is not packed: its tokens come as anchor_ids and
        anchor_mask [B, L'] (the rows' count a multiple of `row_step(B (T - 1), row_multiple)`).

    Returns:
      The packed batch, rows of L' tokens, the `keep` keys and with `anchors_apart` the anchors.
    """
    ids = np.asarray(batch["input_ids"])
    if ids.ndim != 3:
        raise ValueError(f"expected pairs [B, T, L], got input_ids of shape {ids.shape}")
    b, t, length = ids.shape
    first = 1 if anchors_apart else 0  # the first text of a pair that goes into the rows
    texts = {k: np.asarray(batch[k])[:, first:].reshape(-1, length) for k in TOKEN_KEYS[:3]}
    index = np.arange(b * t, dtype=np.int32).reshape(b, t)  # text b * T + t
    texts["labels"] = index[:, first:].reshape(-1)
    texts["example_weights"] = np.ones(b * (t - first), np.float32)
    packed, info = batching.pack(texts, max_segments=max_segments, max_seq_length=length)
    step = row_step(b * (t - first), row_multiple)
    rows = -(-info.num_rows // step) * step
    out = {k: packed[k] for k in (*TOKEN_KEYS, "cls_positions")}
    out["text_index"] = np.where(packed["example_weights"] > 0, packed["labels"], -1)
    empty = {k: -1 if k == "text_index" else 0 for k in out}
    pad = [(0, rows - info.num_rows), (0, 0)]
    out = {k: np.pad(v.astype(np.int32), pad, constant_values=empty[k]) for k, v in out.items()}
    if anchors_apart:
        out["anchor_ids"] = ids[:, 0].astype(np.int32)
        out["anchor_mask"] = np.asarray(batch["attention_mask"])[:, 0].astype(np.int32)
    return out | {k: np.asarray(batch[k]) for k in keep}


class PackedBatches:
    """An `batching.EpochIterator` of whole global batches of pairs [B, T, L], packed
    (`pack_pairs`), each host given its rows: the same steps, pairs and checkpointable position
    as the iterator's.

    Args:
      batches: yields every row of each global batch (no host_rows, one shard).
      max_segments, row_multiple, keep, anchors_apart: as `pack_pairs` takes them.
      host_rows: R -> the rows of a packed batch of R rows this process feeds, in order
        (`functools.partial(sharding.host_batch_rows, mesh)`), and its share of the B pairs of
        the `keep` keys (and the anchors); None: all of them.
    """

    def __init__(
        self,
        batches: batching.EpochIterator,
        *,
        max_segments: int,
        row_multiple: int = 1,
        host_rows: Callable[[int], np.ndarray] | None = None,
        keep: tuple[str, ...] = (),
        anchors_apart: bool = False,
    ):
        self._batches, self._host_rows, self._keep = batches, host_rows, keep
        self._max_segments, self._row_multiple = max_segments, row_multiple
        self._anchors_apart = anchors_apart
        self._per_pair = keep + (ANCHOR_KEYS if anchors_apart else ())  # keys led by B
        self.steps_per_epoch = batches.steps_per_epoch

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        packed = pack_pairs(
            next(self._batches),
            max_segments=self._max_segments,
            row_multiple=self._row_multiple,
            keep=self._keep,
            anchors_apart=self._anchors_apart,
        )
        if self._host_rows is None:
            return packed
        rows = self._host_rows(len(packed["input_ids"]))
        pairs = self._host_rows(len(packed[self._per_pair[0]])) if self._per_pair else None
        return {k: v[pairs if k in self._per_pair else rows] for k, v in packed.items()}

    def get_state(self) -> bytes:
        return self._batches.get_state()

    def set_state(self, state: bytes) -> None:
        self._batches.set_state(state)

    def start_prefetch(self) -> None:
        """Part of grain's checkpoint protocol; batches are made on demand."""


def epoch_batches(
    features: Mapping[str, np.ndarray],
    global_batch_size: int,
    block,
    seed: int,
    *,
    row_multiple: int = 1,
    host_rows: Callable[[int], np.ndarray] | None = None,
    keep: tuple[str, ...] = (),
    anchors_apart: bool = False,
):
    """One seed's batches of groups of texts (the embedding job's pairs, the reranker's rows):
    `block.num_epochs` epochs of shuffled global batches, not grouped by length (that would
    make a batch's in-batch negatives alike in length). With `block.pack` each batch's texts are
    packed several to a row (`PackedBatches`: at most `block.max_segments` a row, the row count a
    multiple of `row_multiple`, the `keep` keys left [B]; with `anchors_apart` the anchors
    beside the rows, [B, L]); else each is cut to the 32-token bucket of its longest text.

    Args:
      features: input_ids, token_type_ids, attention_mask int32 [N, T, L] and per-group keys.
      block: the job's shared settings (`num_epochs`, `pack`, `max_segments`: a
        `training.text_job.TextJob`).
      host_rows: R -> this process's rows of a batch of R rows, in order
        (`functools.partial(sharding.host_batch_rows, mesh)`); None: all of them.
    """
    pack = block.pack
    batches = batching.EpochIterator(
        features,
        global_batch_size,
        num_epochs=block.num_epochs,
        seed=seed,
        bucket_boundaries=None
        if pack
        else batching.length_buckets(features["input_ids"].shape[-1]),
        host_rows=None if pack or host_rows is None else host_rows(global_batch_size),
    )
    if not pack:
        return batches
    return PackedBatches(
        batches,
        max_segments=block.max_segments,
        row_multiple=row_multiple,
        host_rows=host_rows,
        keep=keep,
        anchors_apart=anchors_apart,
    )
