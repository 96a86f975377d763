"""Sequence packing for pretraining: several examples per row of L tokens, apart by segment ids.

`pack_pretraining_batches` turns the pipeline's stream of (decoded, masked) batches of examples
into batches of packed rows. Each host batch then holds B rows (S = max_segments, P_row =
`max_predictions_per_row(...)`), with the keys, shapes and dtypes that
`bert_jax.batch_layout.PACKED_PRETRAINING_BATCH` declares (P = P_row): segment_ids and
position_ids [B, L] beside the tokens, cls_positions, next_sentence_labels and
next_sentence_weights [B, S], and the predictions in ROW coordinates, increasing.

How (the packing itself is grain's; docs/data.md, "Packing"): the pipeline masks examples as
without packing (masks keyed on stream position, so the same on any number of hosts or workers);
`_ToSequences` cuts each to its n real tokens, its predictions as per-token labels (-1: none);
`grain.experimental.BestFitPackIterDataset` puts each into the open row it fills best (at most S
a row, `num_packing_bins` rows open); `batch(B, batch_fn=_Assemble)` stacks B rows and derives
[CLS] positions, per-sequence NSP labels and the predictions in row coordinates. A last, short
batch of a finite run is filled with empty rows (all weights 0).

No prediction is dropped. With masking probability p, a sequence of n tokens has
`min(P, max(1, round(p * n)))` predictions, at most p * n + 1, so a row of at most L tokens and S
sequences has at most floor(p * L) + S; P_row is that bound, or S * P if smaller (or if p is
unknown, as for foreign statically masked records). `_Assemble` raises, rather than drop, if a row
ever exceeds it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import grain
import numpy as np

# The packer lays out one per-token feature, [n, 3] columns (input id, token type, masked LM label:
# the original id if predicted, else -1), and adds "tokens_segment_ids" and "tokens_positions".
# One feature of three columns costs the packer about a third less time than three features.
_TOKENS = "tokens"


def max_predictions_per_row(
    max_seq_length: int,
    max_segments: int,
    max_predictions_per_seq: int,
    masked_lm_prob: float | None = None,
) -> int:
    """P_row: the most predictions a packed row can hold (see the module docstring).

    Args:
      max_seq_length: L.
      max_segments: S, sequences per row.
      max_predictions_per_seq: P, the cap of one sequence.
      masked_lm_prob: p of the per-sequence rule, or None if unknown (then S * P).
    """
    bound = max_segments * max_predictions_per_seq
    if masked_lm_prob is not None:
        # The 1e-9 only guards against p * L landing a rounding error below an integer.
        bound = min(bound, math.floor(masked_lm_prob * max_seq_length + 1e-9) + max_segments)
    return bound


class _ToSequences(grain.experimental.FlatMapTransform):
    """A batch of padded examples -> one variable-length sequence per example, for the packer."""

    max_fan_out = 1 << 20  # Read only by MapDataset flat maps; here batches may be any size.

    def flat_map(self, batch: Mapping[str, np.ndarray]) -> list[dict]:
        mask = batch["attention_mask"]
        lengths = mask.sum(axis=1)
        if not np.array_equal(mask > 0, np.arange(mask.shape[1]) < lengths[:, None]):
            raise ValueError("packing needs every record's real tokens first, then padding")
        labels = np.full(mask.shape, -1, np.int32)
        rows, slots = np.nonzero(batch["masked_lm_weights"] > 0)
        labels[rows, batch["masked_lm_positions"][rows, slots]] = batch["masked_lm_ids"][
            rows, slots
        ]
        tokens = np.stack([batch["input_ids"], batch["token_type_ids"], labels], axis=-1)
        nsp = batch["next_sentence_labels"]
        return [
            {_TOKENS: tokens[i, :n], "next_sentence_labels": nsp[i]}
            for i, n in enumerate(lengths.tolist())
        ]


class _Assemble:
    """grain batch_fn: up to B packed rows -> the packed batch contract (module docstring)."""

    def __init__(self, batch_size: int, max_segments: int, max_predictions: int, pad_id: int):
        self._batch_size = batch_size
        self._max_segments = max_segments
        self._max_predictions = max_predictions
        self._pad_id = pad_id

    def __call__(self, rows: Sequence[Mapping]) -> dict[str, np.ndarray]:
        num_rows, num_slots = self._batch_size, self._max_segments

        def stack(key):  # Rows past the packer's (a last, short batch) stay empty.
            first = rows[0][key]
            out = np.zeros((num_rows, *first.shape), np.int32)
            out[: len(rows)] = np.stack([r[key] for r in rows])
            return out

        tokens = stack(_TOKENS)  # [B, L, 3], zeros in padding
        segment_ids = stack(f"{_TOKENS}_segment_ids")
        position_ids = stack(f"{_TOKENS}_positions")
        real = segment_ids > 0
        input_ids = np.where(real, tokens[..., 0], self._pad_id).astype(np.int32)
        labels = np.where(real, tokens[..., 2], -1)

        # Segment s of a row is one contiguous run starting at its [CLS], where its position is 0.
        cls_positions = np.zeros((num_rows, num_slots), np.int32)
        rows_idx, starts = np.nonzero((position_ids == 0) & (segment_ids > 0))
        cls_positions[rows_idx, segment_ids[rows_idx, starts] - 1] = starts
        nsp_labels = np.zeros((num_rows, num_slots), np.int32)
        nsp_weights = np.zeros((num_rows, num_slots), np.float32)
        for r, row in enumerate(rows):
            nsp = row["next_sentence_labels"]  # The packer's list, in segment order.
            nsp_labels[r, : len(nsp)] = nsp
            nsp_weights[r, : len(nsp)] = 1.0

        pred_rows, pred_pos = np.nonzero(labels >= 0)  # Row-major: positions increase in a row.
        per_row = np.bincount(pred_rows, minlength=num_rows)
        if per_row.max(initial=0) > self._max_predictions:
            raise ValueError(
                f"a packed row holds {per_row.max()} predictions, more than max_predictions_"
                f"per_row={self._max_predictions}; the records were masked with a higher "
                "masked_lm_prob than the loader assumes"
            )
        slot = np.arange(pred_rows.size) - (np.cumsum(per_row) - per_row)[pred_rows]
        masked_positions = np.zeros((num_rows, self._max_predictions), np.int32)
        masked_ids = np.zeros((num_rows, self._max_predictions), np.int32)
        masked_weights = np.zeros((num_rows, self._max_predictions), np.float32)
        masked_positions[pred_rows, slot] = pred_pos
        masked_ids[pred_rows, slot] = labels[pred_rows, pred_pos]
        masked_weights[pred_rows, slot] = 1.0
        return {
            "input_ids": input_ids,
            "token_type_ids": np.ascontiguousarray(tokens[..., 1]),
            "attention_mask": real.astype(np.int32),
            "segment_ids": segment_ids,
            "position_ids": position_ids,
            "cls_positions": cls_positions,
            "next_sentence_labels": nsp_labels,
            "next_sentence_weights": nsp_weights,
            "masked_lm_positions": masked_positions,
            "masked_lm_ids": masked_ids,
            "masked_lm_weights": masked_weights,
        }


def pack_pretraining_batches(
    batches: grain.IterDataset,
    *,
    batch_size: int,
    max_seq_length: int,
    max_segments: int,
    max_predictions: int,
    num_packing_bins: int,
    pad_id: int = 0,
) -> grain.IterDataset:
    """Packs a stream of example batches (`features.decode_batch` layout) into batches of rows.

    Args:
      batches: an IterDataset of example batches (any number of examples each), masked.
      batch_size: B, rows per output batch.
      max_seq_length: L, tokens per row.
      max_segments: S, sequences per row.
      max_predictions: P_row (`max_predictions_per_row`).
      num_packing_bins: rows the packer keeps open; more pack tighter.
      pad_id: the [PAD] id after a row's last sequence.

    Returns:
      An IterDataset of packed batches (keys and shapes in the module docstring), checkpointable
      with the rest of the pipeline.
    """
    if max_segments < 1:
        raise ValueError(f"max_segments={max_segments}: must be >= 1")
    if num_packing_bins < 1:
        raise ValueError(f"num_packing_bins={num_packing_bins}: must be >= 1")
    sequences = grain.experimental.FlatMapIterDataset(batches, _ToSequences())
    packed = grain.experimental.BestFitPackIterDataset(
        sequences,
        length_struct={_TOKENS: max_seq_length},
        num_packing_bins=num_packing_bins,
        shuffle_bins=False,  # The examples arrive shuffled already.
        meta_features=("next_sentence_labels",),
        max_sequences_per_bin=max_segments,
    )
    return packed.batch(
        batch_size, batch_fn=_Assemble(batch_size, max_segments, max_predictions, pad_id)
    )


def sequence_lengths(batch: Mapping[str, np.ndarray]) -> np.ndarray:
    """The real length of every sequence of a batch, packed or not: int64 [num_sequences].

    For FLOP counts: a packed row's attention costs sum(n_i^2), not L^2.
    """
    mask = np.asarray(batch["attention_mask"])
    if "segment_ids" not in batch:
        return mask.sum(axis=-1).astype(np.int64)
    segment_ids = np.asarray(batch["segment_ids"])
    slots = np.asarray(batch["cls_positions"]).shape[-1] + 1
    flat = segment_ids + slots * np.arange(segment_ids.shape[0])[:, None]
    counts = np.bincount(flat[mask > 0], minlength=segment_ids.shape[0] * slots)
    counts = counts.reshape(-1, slots)[:, 1:]
    return counts[counts > 0].astype(np.int64)
