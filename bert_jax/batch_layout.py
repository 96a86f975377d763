"""Every training batch's keys, shapes and dtypes, declared once: pretraining, fine-tuning (by
objective), contrastive pairs and the reranker's groups, padded or packed.

The data make host-side numpy batches of these layouts (`pretrain.data.features` and
`pretrain.data.packing`, the fine-tuning tasks, `retrieval.pairs` and `retrieval.packing`,
`rerank.data`), the objectives read them, and `--mode=compile` lowers each job's step with their
shapes (`shapes`, `abstract_batch`). Numpy only at import: the data modules import it with no
framework.

Axes: B rows (this host's share of the global batch, or the global batch; the pairs of a
contrastive batch, the groups of a reranker's), L tokens a row (`max_seq_length`), P prediction
slots a row (`max_predictions_per_seq`; packed rows: `packing.max_predictions_per_row`), S
sequences a packed row (`max_segments`), R packed rows, C choices (multiple choice), T texts a
pair (anchor, positive, hard negatives), G pairs a reranker's group (the positive, then its
negatives).
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


def _tokens(axes: str) -> dict[str, Field]:
    """The model inputs of unpacked texts of `axes` (the last one L)."""
    return {
        "input_ids": Field(axes, np.int32, "token ids, [PAD] past the end"),
        "token_type_ids": Field(axes, np.int32, "0 first text, 1 second text of a pair"),
        "attention_mask": Field(axes, np.int32, "1 real token, 0 padding"),
    }


# Texts (or pairs) packed several to a row (`retrieval.packing`): R rows of S slots.
PACKED_TEXTS = {
    **_tokens("RL"),
    "segment_ids": Field("RL", np.int32, "0 padding, 1..S the text's slot"),
    "position_ids": Field("RL", np.int32, "0, 1, ... restarting at each text"),
    "cls_positions": Field("RS", np.int32, "where each slot's text begins"),
    "text_index": Field("RS", np.int32, "b * T + t (or b * G + g) of the slot's text, -1 empty"),
}
# A packed contrastive batch's anchors, beside its rows when they run through no model (an
# inference-free SPLADE model's queries: `retrieval.packing.pack_pairs(anchors_apart=True)`).
ANCHORS = {
    "anchor_ids": Field("BL", np.int32, "text 0 of each pair, [PAD] past the end"),
    "anchor_mask": Field("BL", np.int32, "1 real token, 0 padding"),
}
EXAMPLE_WEIGHTS = {"example_weights": Field("B", np.float32, "1.0 a real row, 0.0 padding")}

# A padded fine-tuning batch: the inputs, example_weights and the targets of each objective.
FINETUNE_TARGETS = {
    "classification": {"labels": Field("B", np.int32, "the class id")},
    "regression": {"labels": Field("B", np.float32, "the target value")},
    "token_classification": {
        "labels": Field("BL", np.int32, "each token's tag id"),
        "label_weights": Field("BL", np.float32, "1.0 a word's first sub-token, else 0.0"),
    },
    "question_answering": {
        "start_positions": Field("B", np.int32, "the answer's first token"),
        "end_positions": Field("B", np.int32, "the answer's last token"),
    },
    "multiple_choice": {"labels": Field("B", np.int32, "the right choice")},
}

# Contrastive pairs (`retrieval.pairs`): text 0 the anchor, 1 the positive, 2.. hard negatives.
CONTRASTIVE_BATCH = _tokens("BTL")

# The reranker's groups (`rerank.data`): G (query, passage) pairs a row, and each loss's targets.
RERANK_TARGETS = {
    "bce": {"labels": Field("B", np.float32, "the pair's relevance label")},
    "listwise": {},
    "margin_mse": {"teacher_scores": Field("BG", np.float32, "the teacher's score of each pair")},
}


def finetune_layout(objective: str) -> dict[str, Field]:
    """A padded fine-tuning batch of `objective` (a key of `FINETUNE_TARGETS`; multiple choice's
    inputs [B, C, L])."""
    if objective not in FINETUNE_TARGETS:
        raise ValueError(f"no fine-tuning batch for objective {objective!r}")
    tokens = _tokens("BCL" if objective == "multiple_choice" else "BL")
    return {**tokens, **EXAMPLE_WEIGHTS, **FINETUNE_TARGETS[objective]}


def contrastive_layout(packed: bool, anchors_apart: bool = False) -> dict[str, Field]:
    """A contrastive batch: B pairs of T texts [B, T, L], or their texts packed (R rows; with
    `anchors_apart` texts 1.. only, the anchors [B, L] beside them)."""
    if not packed:
        return dict(CONTRASTIVE_BATCH)
    return {**PACKED_TEXTS, **(ANCHORS if anchors_apart else {})}


def rerank_layout(loss: str, packed: bool) -> dict[str, Field]:
    """A reranker's batch for `loss` (a key of `RERANK_TARGETS`): B groups of G pairs
    [B, G, L], or their pairs packed (R rows; the per-group keys stay [B] / [B, G])."""
    tokens = PACKED_TEXTS if packed else _tokens("BGL")
    return {**tokens, **EXAMPLE_WEIGHTS, **RERANK_TARGETS[loss]}


def shapes(layout: dict[str, Field], **sizes: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{key: (shape, dtype)} of `layout` with the axes' sizes, e.g. `shapes(PRETRAINING_BATCH,
    B=3, L=7, P=2)`."""
    return {k: (tuple(sizes[a] for a in f.axes), np.dtype(f.dtype)) for k, f in layout.items()}


def abstract_batch(layout: dict[str, Field], **sizes: int) -> dict:
    """`shapes` as jax.ShapeDtypeStruct: what a step is lowered with (jax is imported here, so
    that the data modules importing this one stay framework-free)."""
    import jax

    return {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in shapes(layout, **sizes).items()}


def pretraining_shapes(packed: bool, **sizes: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{key: (shape, dtype)} of a pretraining batch (`PACKED_PRETRAINING_BATCH` if `packed`, else
    `PRETRAINING_BATCH`) with the axes' sizes, e.g. `pretraining_shapes(False, B=3, L=7, P=2)` (S
    only for packed rows)."""
    return shapes(PACKED_PRETRAINING_BATCH if packed else PRETRAINING_BATCH, **sizes)
