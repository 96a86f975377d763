"""The pretraining record layout (google-research/bert's) and the batch the training step takes.

Each record is a `tf.train.Example` with the original's features, padded to fixed lengths:

    input_ids             int64 [L]   token ids, 0 ([PAD]) past the end; masked if masks are static
    input_mask            int64 [L]   1 for real tokens, 0 for padding
    segment_ids           int64 [L]   0 for [CLS] A [SEP], 1 for B [SEP], 0 for padding
    masked_lm_positions   int64 [P]   positions of the predictions, 0 in padded slots
    masked_lm_ids         int64 [P]   original token ids there, 0 in padded slots
    masked_lm_weights     float [P]   1.0 per real prediction, 0.0 per padded slot
    next_sentence_labels  int64 [1]   0 = B follows A, 1 = B is random

Records made for dynamic masking have no predictions (all P weights 0). Files written by
google-research/bert's or NVIDIA's scripts read as they are.

`decode_batch` turns B records into the batch (host-side numpy, Hugging Face names: segment_ids
become token_type_ids, input_mask attention_mask), whose keys, shapes and dtypes
`bert_jax.batch_layout.PRETRAINING_BATCH` declares.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bert_jax.batch_layout import PRETRAINING_BATCH
from bert_jax.pretrain.data import example_proto
from bert_jax.pretrain.data.examples import TrainingInstance

# Record feature -> batch key.
_RENAMES = {
    "input_ids": "input_ids",
    "segment_ids": "token_type_ids",
    "input_mask": "attention_mask",
    "masked_lm_positions": "masked_lm_positions",
    "masked_lm_ids": "masked_lm_ids",
    "masked_lm_weights": "masked_lm_weights",
    "next_sentence_labels": "next_sentence_labels",
}


def instance_to_example(
    instance: TrainingInstance, max_seq_length: int, max_predictions_per_seq: int, pad_id: int = 0
) -> bytes:
    """Serializes one instance in the original feature layout, padded to L and P.

    Raises:
      ValueError: the instance is longer than L or has more than P predictions.
    """
    n = len(instance.tokens)
    num_predictions = len(instance.masked_lm_positions)
    if n > max_seq_length or num_predictions > max_predictions_per_seq:
        raise ValueError(
            f"instance of {n} tokens / {num_predictions} predictions exceeds "
            f"max_seq_length={max_seq_length} / max_predictions_per_seq={max_predictions_per_seq}"
        )
    pad = max_seq_length - n
    pad_p = max_predictions_per_seq - num_predictions
    # The original's order. (TensorFlow's own serializer orders a map by a per-process hash, so
    # two runs of the original differ in bytes but not in content.)
    features = {
        "input_ids": [*instance.tokens, *([pad_id] * pad)],
        "input_mask": [1] * n + [0] * pad,
        "segment_ids": [*instance.segment_ids, *([0] * pad)],
        "masked_lm_positions": [*instance.masked_lm_positions, *([0] * pad_p)],
        "masked_lm_ids": [*instance.masked_lm_ids, *([0] * pad_p)],
        "masked_lm_weights": [1.0] * num_predictions + [0.0] * pad_p,
        "next_sentence_labels": [1 if instance.is_random_next else 0],
    }
    return example_proto.encode_example(features)


def record_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict[str, tuple[str, int]]:
    """The fixed-length spec of a record for `example_proto.decode_fixed_batch`."""
    return {
        "input_ids": ("int64", max_seq_length),
        "input_mask": ("int64", max_seq_length),
        "segment_ids": ("int64", max_seq_length),
        "masked_lm_positions": ("int64", max_predictions_per_seq),
        "masked_lm_ids": ("int64", max_predictions_per_seq),
        "masked_lm_weights": ("float", max_predictions_per_seq),
        "next_sentence_labels": ("int64", 1),
    }


def infer_lengths(record: bytes) -> tuple[int, int]:
    """(L, P) of a record, from its input_ids and masked_lm_positions.

    Raises:
      example_proto.ExampleDecodeError: the record lacks a pretraining feature.
    """
    decoded = example_proto.decode_example(record)
    missing = [name for name in _RENAMES if name not in decoded]
    if missing:
        raise example_proto.ExampleDecodeError(
            f"not a BERT pretraining record: no feature(s) {missing} (it has {sorted(decoded)})"
        )
    return len(decoded["input_ids"]), len(decoded["masked_lm_positions"])


def decode_batch(
    records: Sequence[bytes], max_seq_length: int, max_predictions_per_seq: int
) -> dict[str, np.ndarray]:
    """Decodes B records into the training batch (`batch_layout.PRETRAINING_BATCH`)."""
    raw = example_proto.decode_fixed_batch(
        records, record_spec(max_seq_length, max_predictions_per_seq)
    )
    batch = {}
    for feature, key in _RENAMES.items():
        value = raw[feature]
        batch[key] = value.astype(PRETRAINING_BATCH[key].dtype)
    batch["next_sentence_labels"] = batch["next_sentence_labels"][:, 0]
    return batch
