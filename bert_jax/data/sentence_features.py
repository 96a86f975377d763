"""Sentence (pair) examples as features: one row per example, [CLS] A [SEP] (B [SEP]) as
google-research/bert's `run_classifier.py` (pairs truncated longest-first, one token at a time):

    input_ids       int32   [N, L]   0 ([PAD]) past the end
    token_type_ids  int32   [N, L]   0 for [CLS] A [SEP], 1 for B [SEP], 0 for padding
    attention_mask  int32   [N, L]   1 for real tokens
    labels          int32   [N]      class id; -1 where the split has no labels (GLUE test)
                    float32 [N]      for regression; nan where the split has no labels
    example_weights float32 [N]      1.0 (`batching.batches` adds 0.0 fillers)

Texts longer than `max_seq_length` are truncated and counted (`FeatureStats`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from absl import logging

from bert_jax import tokenization
from bert_jax.data.text_io import TextDataset, TextExample


@dataclasses.dataclass
class FeatureStats:
    """Counts of one featurization.

    Attributes:
      examples: examples featurized (one feature row each).
      truncated: examples longer than max_seq_length, truncated to fit.
      longest: the most tokens an example had before truncation, [CLS]/[SEP] included.
      mean_length: the mean length in tokens after truncation.
    """

    examples: int = 0
    truncated: int = 0
    longest: int = 0
    mean_length: float = 0.0

    def log(self, what: str = "examples") -> None:
        """Logs the counts, with a warning for truncated examples."""
        logging.info(
            "featurized %d %s, mean length %.1f tokens, longest %d",
            self.examples,
            what,
            self.mean_length,
            self.longest,
        )
        if self.truncated:
            logging.warning(
                "%d of %d %s were longer than max_seq_length and truncated",
                self.truncated,
                self.examples,
                what,
            )

    def to_dict(self) -> dict:
        """The counts as a JSON-able dict."""
        return dataclasses.asdict(self)


def truncated_pair_lengths(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    """The lengths `run_classifier._truncate_seq_pair` leaves: it pops the longer text's last
    token (B's on ties) until the pair fits in `max_tokens`."""
    if len_a + len_b <= max_tokens:
        return len_a, len_b
    if len_a > len_b and max_tokens - len_b >= len_b:
        return max_tokens - len_b, len_b
    if len_b >= len_a and max_tokens - len_a >= len_a:
        return len_a, max_tokens - len_a
    return (max_tokens + 1) // 2, max_tokens // 2


def encode_texts(
    tokenizer: tokenization.SubwordTokenizer,
    texts_a: Sequence[str],
    texts_b: Sequence[str] | None,
    max_seq_length: int,
) -> tuple[dict[str, np.ndarray], FeatureStats]:
    """[CLS] A [SEP] (B [SEP]) rows, truncated longest-first to `max_seq_length`, laid out as the
    tokenizer's family does (`tokenization.SubwordTokenizer.build_inputs`: RoBERTa's
    `<s> A </s></s> B </s>`, token types all 0).

    Args:
      tokenizer: the tokenizer (any kind).
      texts_a: N first texts.
      texts_b: N second texts, or None for single texts.
      max_seq_length: L, the row length.

    Returns:
      ({"input_ids", "token_type_ids", "attention_mask"}: int32 [N, L]), and the counts.
    """
    num_special = tokenizer.num_special_tokens(pair=texts_b is not None)
    if max_seq_length <= num_special:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text")
    ids_a = tokenizer.encode_batch(list(texts_a))
    ids_b = tokenizer.encode_batch(list(texts_b)) if texts_b is not None else None
    n = len(ids_a)
    input_ids = np.full((n, max_seq_length), tokenizer.pad_id, dtype=np.int32)
    token_type_ids = np.zeros((n, max_seq_length), dtype=np.int32)
    attention_mask = np.zeros((n, max_seq_length), dtype=np.int32)
    stats = FeatureStats(examples=n)
    total = 0
    budget = max_seq_length - num_special
    for i in range(n):
        a = ids_a[i]
        b = ids_b[i] if ids_b is not None else []
        stats.longest = max(stats.longest, len(a) + len(b) + num_special)
        if ids_b is not None:
            len_a, len_b = truncated_pair_lengths(len(a), len(b), budget)
        else:
            len_a, len_b = min(len(a), budget), 0
        if len_a < len(a) or len_b < len(b):
            stats.truncated += 1
        row, types = tokenizer.build_inputs(a[:len_a], b[:len_b] if ids_b is not None else None)
        input_ids[i, : len(row)] = row
        token_type_ids[i, : len(row)] = types
        attention_mask[i, : len(row)] = 1
        total += len(row)
    stats.mean_length = total / n if n else 0.0
    features = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
    }
    return features, stats


def featurize(
    examples: Sequence[TextExample],
    tokenizer: tokenization.SubwordTokenizer,
    task: str | TextDataset,
    max_seq_length: int,
) -> tuple[dict[str, np.ndarray], FeatureStats]:
    """Features of sequence classification/regression examples (keys in the module docstring).

    Args:
      examples: N examples of `task` (1 or 2 texts each, as `task.text_keys`).
      tokenizer: the WordPiece tokenizer.
      task: the task (decides int or float labels).
      max_seq_length: L; longer examples are truncated and counted in the stats.

    Returns:
      (features with leading axis N, counts).
    """
    if not isinstance(task, TextDataset):
        raise TypeError(
            f"featurize needs a TextDataset, got {task!r}; for a GLUE name use glue.get_dataset"
        )
    if not examples:
        raise ValueError("no examples to featurize")
    num_texts = len(task.text_keys)
    for example in examples:
        if len(example.texts) != num_texts:
            raise ValueError(
                f"example {example.guid!r} has {len(example.texts)} text(s), task {task.name!r} "
                f"takes {num_texts}"
            )
    texts_b = [e.texts[1] for e in examples] if num_texts == 2 else None
    features, stats = encode_texts(
        tokenizer, [e.texts[0] for e in examples], texts_b, max_seq_length
    )
    if task.is_regression:
        labels = np.array(
            [np.nan if e.label is None else e.label for e in examples], dtype=np.float32
        )
    else:
        labels = np.array([-1 if e.label is None else e.label for e in examples], dtype=np.int32)
        if labels.max() >= task.num_labels:
            bad = next(e for e in examples if e.label is not None and e.label >= task.num_labels)
            raise ValueError(
                f"example {bad.guid!r}: label id {bad.label} >= num_labels={task.num_labels}"
            )
    features["labels"] = labels
    features["example_weights"] = np.ones(len(examples), dtype=np.float32)
    return features, stats
