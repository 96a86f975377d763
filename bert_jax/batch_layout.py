"""The pretraining batch: its keys, shapes and dtypes, declared once.

The pipeline (`pretrain.data.features` decodes, `pretrain.data.packing` packs) makes host-side
numpy batches of this layout, the pretraining objective (`objectives.pretraining_objective`)
reads them, and `pretrain.run.pretraining_batch` lowers the step with its shapes. Numpy only: the
data modules import it with no framework.

Axes: B rows (this host's share of the global batch, or the global batch), L tokens a row
(`max_seq_length`), P prediction slots a row (`max_predictions_per_seq`; packed rows:
`packing.max_predictions_per_row`), S sequences a packed row (`max_segments`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Field(NamedTuple):
    """One key of a batch: its axes (letters above), numpy dtype and what it holds."""

    axes: str
    dtype: type
    meaning: str


# One sequence pair a row (google-research/bert's features, Hugging Face names).
PRETRAINING_BATCH = {
    "input_ids": Field("BL", np.int32, "token ids, [PAD] past the end (masked)"),
    "token_type_ids": Field("BL", np.int32, "0 for [CLS] A [SEP], 1 for B [SEP], 0 padding"),
    "attention_mask": Field("BL", np.int32, "1 real token, 0 padding"),
    "masked_lm_positions": Field("BP", np.int32, "positions of the predictions, 0 in padded slots"),
    "masked_lm_ids": Field("BP", np.int32, "original token ids there, 0 in padded slots"),
    "masked_lm_weights": Field("BP", np.float32, "1.0 real prediction, 0.0 padded slot"),
    "next_sentence_labels": Field(
        "B", np.int32, "0 = B follows A, 1 = B is random (all 0 when MLM-only)"
    ),
}

# Several sequences a row (`pack_sequences`), apart by segment ids; predictions in ROW
# coordinates, increasing; NSP per sequence.
PACKED_PRETRAINING_BATCH = {
    "input_ids": Field("BL", np.int32, "the packed sequences' tokens, [PAD] after the last"),
    "token_type_ids": Field("BL", np.int32, "each sequence's own 0 (A) / 1 (B), 0 padding"),
    "attention_mask": Field("BL", np.int32, "1 real token, 0 padding"),
    "segment_ids": Field("BL", np.int32, "0 padding, 1..S which packed sequence"),
    "position_ids": Field("BL", np.int32, "0, 1, ... restarting at each sequence's [CLS]"),
    "cls_positions": Field("BS", np.int32, "index of each sequence's [CLS] (0 if empty)"),
    "next_sentence_labels": Field("BS", np.int32, "each sequence's NSP label (0 in empty slots)"),
    "next_sentence_weights": Field("BS", np.float32, "1.0 per sequence, 0.0 per empty slot"),
    "masked_lm_positions": Field("BP", np.int32, "predictions in row coordinates, increasing"),
    "masked_lm_ids": Field("BP", np.int32, "original ids there"),
    "masked_lm_weights": Field("BP", np.float32, "1.0 real prediction, 0.0 padded slot"),
}


def pretraining_shapes(packed: bool, **sizes: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{key: (shape, dtype)} of a pretraining batch (`PACKED_PRETRAINING_BATCH` if `packed`, else
    `PRETRAINING_BATCH`) with the axes' sizes, e.g. `pretraining_shapes(False, B=3, L=7, P=2)` (S
    only for packed rows)."""
    layout = PACKED_PRETRAINING_BATCH if packed else PRETRAINING_BATCH
    return {k: (tuple(sizes[a] for a in f.axes), np.dtype(f.dtype)) for k, f in layout.items()}
