"""Dynamic masked-LM masking of whole batches, vectorized with numpy.

`mask_batch` applies the original's masking rule (`examples.create_masked_lm_predictions`;
docs/data.md, "Example creation") to a batch of unmasked examples at load time.

Random numbers are a counter-based hash (splitmix64) of (seed, example id, position, stream), not
a sequential generator. An example's masks therefore depend only on the seed and its example id,
not on the batch it lands in, the batch size, the number of hosts or of worker processes; the
input pipeline passes the example's position in the global epoch-by-epoch stream as its id, so
every epoch gets new masks and a resumed run gets the same ones.

Shapes: B batch, L max_seq_length, P max_predictions_per_seq.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_jax.pretrain.data.examples import VocabInfo

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_STREAM_ORDER, _STREAM_ACTION, _STREAM_TOKEN = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    """The masked-LM rule.

    Attributes:
      vocab: special ids, vocabulary size, "##" table.
      masked_lm_prob: fraction of tokens to predict.
      max_predictions_per_seq: P.
      whole_word_mask: mask all pieces of a word together.
    """

    vocab: VocabInfo
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_mask: bool = False

    def __post_init__(self):
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob={self.masked_lm_prob!r}: must be in (0, 1)")
        if self.max_predictions_per_seq < 1:
            raise ValueError(
                f"max_predictions_per_seq={self.max_predictions_per_seq}: must be >= 1"
            )


def _mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer (a bijection on uint64 with good avalanche)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _example_keys(seed: int, example_ids: np.ndarray) -> np.ndarray:
    """uint64 [B]: one key per example from the seed and its id."""
    seed_key = _mix(np.asarray([seed & 0xFFFFFFFFFFFFFFFF], np.uint64) + _GOLDEN)
    ids = np.asarray(example_ids, np.int64).astype(np.uint64)
    return _mix(seed_key ^ _mix(ids * _GOLDEN + _GOLDEN))


def _uniform(keys: np.ndarray, positions: np.ndarray, stream: int) -> np.ndarray:
    """float64 uniforms in [0, 1) for (example key, position, stream); shapes broadcast."""
    counter = keys + (positions.astype(np.uint64) * np.uint64(4) + np.uint64(stream)) * _GOLDEN
    return (_mix(counter) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def unmask(
    input_ids: np.ndarray,
    masked_lm_positions: np.ndarray,
    masked_lm_ids: np.ndarray,
    masked_lm_weights: np.ndarray,
) -> np.ndarray:
    """The original tokens of statically masked examples.

    Args:
      input_ids: int [B, L], with masks applied.
      masked_lm_positions: int [B, P].
      masked_lm_ids: int [B, P], the original ids at those positions.
      masked_lm_weights: float [B, P], > 0 for real predictions.

    Returns:
      int32 [B, L] with each prediction's original id put back.
    """
    out = np.array(input_ids, dtype=np.int32, copy=True)
    rows, slots = np.nonzero(masked_lm_weights > 0)
    out[rows, masked_lm_positions[rows, slots]] = masked_lm_ids[rows, slots]
    return out


def mask_batch(
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    example_ids: np.ndarray,
    seed: int,
    spec: MaskingSpec,
) -> dict[str, np.ndarray]:
    """Chooses masked-LM predictions for a batch of unmasked examples.

    Args:
      input_ids: int [B, L], original token ids.
      attention_mask: int [B, L], 1 for real tokens.
      example_ids: int [B], distinct per example and per epoch (seeds its masks).
      seed: the run's seed.
      spec: the masking rule.

    Returns:
      input_ids int32 [B, L] (masked), masked_lm_positions int32 [B, P], masked_lm_ids int32
      [B, P], masked_lm_weights float32 [B, P] (padded slots 0).
    """
    ids = np.asarray(input_ids)
    vocab = spec.vocab
    valid = np.asarray(attention_mask) > 0
    cand = valid & (ids != vocab.cls_id) & (ids != vocab.sep_id) & (ids != vocab.pad_id)
    # np.rint rounds half to even, as Python's round() in the original.
    num_to_predict = np.minimum(
        spec.max_predictions_per_seq,
        np.maximum(1, np.rint(valid.sum(axis=1) * spec.masked_lm_prob).astype(np.int64)),
    )
    starts = _word_starts(ids, cand, spec)
    keys = _example_keys(seed, example_ids)
    order = _shuffled_word_starts(keys, starts)
    if spec.whole_word_mask:
        selected = _select_whole_words(cand, starts, order, num_to_predict)
    else:
        take = np.minimum(num_to_predict, starts.sum(axis=1))
        selected = _select_tokens(order, take, spec.max_predictions_per_seq)
    return _apply_masks(ids, selected, keys, spec)


def _word_starts(ids: np.ndarray, cand: np.ndarray, spec: MaskingSpec) -> np.ndarray:
    """bool [B, L]: the candidates that start a word (every candidate without whole-word masking).

    A "##" piece continues the word of the candidate before it, if there is one.
    """
    if not spec.whole_word_mask:
        return cand
    clipped = np.clip(ids, 0, spec.vocab.vocab_size - 1)
    continuation = spec.vocab.continuation[clipped] & cand
    seen_before = (np.cumsum(cand, axis=1) - cand) > 0
    return cand & ~(continuation & seen_before)


def _shuffled_word_starts(keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """int [B, L]: positions in a random order per example, word starts first."""
    positions = np.arange(starts.shape[1])
    order_keys = np.where(starts, _uniform(keys[:, None], positions[None, :], _STREAM_ORDER), 2.0)
    return np.argsort(order_keys, axis=1, kind="stable")


def _select_tokens(order: np.ndarray, take: np.ndarray, num_slots: int) -> np.ndarray:
    """bool [B, L]: the first `take[b]` positions of `order[b]` (`take` <= P)."""
    num_rows, length = order.shape
    ranks = np.arange(min(num_slots, length))
    chosen_rows, chosen_ranks = np.nonzero(ranks[None, :] < take[:, None])
    selected = np.zeros((num_rows, length), bool)
    selected[chosen_rows, order[chosen_rows, chosen_ranks]] = True
    return selected


def _select_whole_words(
    cand: np.ndarray, starts: np.ndarray, order: np.ndarray, num_to_predict: np.ndarray
) -> np.ndarray:
    """bool [B, L]: whole words taken in `order`, skipping any that would overshoot
    `num_to_predict`, as the original."""
    num_rows, length = cand.shape
    rows = np.arange(num_rows)
    num_words = starts.sum(axis=1)
    word_id = np.cumsum(starts, axis=1) - 1  # [B, L], the word of each candidate position
    flat_word = (rows[:, None] * length + np.maximum(word_id, 0))[cand]
    word_len = np.bincount(flat_word, minlength=num_rows * length).reshape(num_rows, length)
    taken_words = np.zeros((num_rows, length), bool)
    count = np.zeros(num_rows, np.int64)
    for rank in range(int(num_words.max(initial=0))):
        active = (rank < num_words) & (count < num_to_predict)
        if not active.any():
            break
        wid = word_id[rows, order[:, rank]]
        size = word_len[rows, wid]
        fits = active & (count + size <= num_to_predict)  # Else skip this word, as the original.
        count += np.where(fits, size, 0)
        taken_words[rows[fits], wid[fits]] = True
    return cand & taken_words[rows[:, None], np.maximum(word_id, 0)]


def _apply_masks(
    ids: np.ndarray, selected: np.ndarray, keys: np.ndarray, spec: MaskingSpec
) -> dict[str, np.ndarray]:
    """Replaces the selected positions (80% [MASK], 10% kept, 10% random) and lists them in
    increasing order; returns `mask_batch`'s dict."""
    num_rows, num_slots = ids.shape[0], spec.max_predictions_per_seq
    sel_rows, sel_pos = np.nonzero(selected)  # Row-major: positions increase within a row.
    per_row = np.bincount(sel_rows, minlength=num_rows)
    first = np.cumsum(per_row) - per_row
    slot = np.arange(sel_rows.size) - first[sel_rows]
    original = ids[sel_rows, sel_pos]
    action = _uniform(keys[sel_rows], sel_pos, _STREAM_ACTION)
    random_ids = np.floor(_uniform(keys[sel_rows], sel_pos, _STREAM_TOKEN) * spec.vocab.vocab_size)
    replacement = np.where(
        action < 0.8,
        spec.vocab.mask_id,
        np.where(action < 0.9, original, random_ids.astype(np.int64)),
    )

    out_ids = ids.astype(np.int32, copy=True)
    out_ids[sel_rows, sel_pos] = replacement
    masked_positions = np.zeros((num_rows, num_slots), np.int32)
    masked_ids = np.zeros((num_rows, num_slots), np.int32)
    weights = np.zeros((num_rows, num_slots), np.float32)
    masked_positions[sel_rows, slot] = sel_pos
    masked_ids[sel_rows, slot] = original
    weights[sel_rows, slot] = 1.0
    return {
        "input_ids": out_ids,
        "masked_lm_positions": masked_positions,
        "masked_lm_ids": masked_ids,
        "masked_lm_weights": weights,
    }
