"""Dynamic (load-time) masking: the original's rule, vectorized and keyed per example."""

import numpy as np
import pytest

from bert_jax.pretrain.data import masking
from bert_jax.pretrain.data.examples import PretrainingOptions, create_shard_instances
from tests.pretrain.examples_test import synthetic_documents, synthetic_vocab
from tests.pretrain.masking_stats import check_masking_statistics, check_whole_words


def unmasked_batch(num_docs=150, max_seq_length=128, seed=0):
    """(input_ids [B, L], attention_mask [B, L], token lists) of unmasked synthetic examples."""
    options = PretrainingOptions(max_seq_length=max_seq_length, dupe_factor=1, static_masking=False)
    instances = create_shard_instances(
        synthetic_documents(num_docs, 20, seed=seed), options, synthetic_vocab()
    )
    ids = np.zeros((len(instances), max_seq_length), np.int32)
    attention = np.zeros_like(ids)
    for row, inst in enumerate(instances):
        ids[row, : len(inst.tokens)] = inst.tokens
        attention[row, : len(inst.tokens)] = 1
    return ids, attention, [inst.tokens for inst in instances]


@pytest.mark.parametrize("whole_word", [False, True])
def test_dynamic_masking_statistics(whole_word):
    vocab = synthetic_vocab(continuation=whole_word)
    ids, attention, tokens = unmasked_batch()
    spec = masking.MaskingSpec(vocab, 0.15, 20, whole_word)
    out = masking.mask_batch(ids, attention, np.arange(len(ids)), seed=7, spec=spec)
    assert out["input_ids"].dtype == np.int32 and out["masked_lm_weights"].dtype == np.float32
    positions = [
        out["masked_lm_positions"][r][out["masked_lm_weights"][r] > 0].tolist()
        for r in range(len(ids))
    ]
    outputs = [out["input_ids"][r, : len(t)] for r, t in enumerate(tokens)]
    check_masking_statistics(tokens, outputs, positions, vocab, 0.15, 20)
    for r in range(len(ids)):
        n = len(positions[r])
        np.testing.assert_array_equal(out["masked_lm_ids"][r, :n], ids[r, positions[r]])
        assert not out["masked_lm_positions"][r, n:].any() and not out["masked_lm_ids"][r, n:].any()
        assert (out["input_ids"][r, len(tokens[r]) :] == 0).all()  # Padding untouched.
    if whole_word:
        check_whole_words(tokens, positions, vocab)


def test_masks_depend_only_on_seed_and_example_id():
    ids, attention, _ = unmasked_batch(num_docs=20)
    spec = masking.MaskingSpec(synthetic_vocab(), 0.15, 20, True)
    example_ids = np.arange(100, 100 + len(ids))
    whole = masking.mask_batch(ids, attention, example_ids, 3, spec)
    again = masking.mask_batch(ids, attention, example_ids, 3, spec)
    for key in whole:
        np.testing.assert_array_equal(whole[key], again[key])
    # The same example masked alone, or in a reversed batch, gets the same masks.
    row = masking.mask_batch(ids[5:6], attention[5:6], example_ids[5:6], 3, spec)
    reversed_ = masking.mask_batch(ids[::-1], attention[::-1], example_ids[::-1], 3, spec)
    for key in whole:
        np.testing.assert_array_equal(row[key][0], whole[key][5])
        np.testing.assert_array_equal(reversed_[key][::-1], whole[key])
    # Another epoch (another example id) or another seed gives other masks.
    other_epoch = masking.mask_batch(ids, attention, example_ids + len(ids), 3, spec)
    other_seed = masking.mask_batch(ids, attention, example_ids, 4, spec)
    for other in (other_epoch, other_seed):
        same = (other["masked_lm_positions"] == whole["masked_lm_positions"]).all(axis=1)
        assert same.mean() < 0.1


def test_unmask_restores_the_original():
    ids, attention, _ = unmasked_batch(num_docs=20)
    spec = masking.MaskingSpec(synthetic_vocab(), 0.15, 20)
    out = masking.mask_batch(ids, attention, np.arange(len(ids)), 0, spec)
    restored = masking.unmask(
        out["input_ids"], out["masked_lm_positions"], out["masked_lm_ids"], out["masked_lm_weights"]
    )
    np.testing.assert_array_equal(restored, ids)


def test_whole_word_greedy_skips_words_that_overshoot():
    vocab = synthetic_vocab()  # ids >= 600 are "##" pieces.
    # [CLS] w(3 pieces) w(1) w(3 pieces) w(1) [SEP] : 10 tokens -> round(10 * 0.2) = 2 predictions.
    row = [2, 10, 600, 601, 11, 12, 602, 603, 13, 3]
    ids = np.array([row] * 400, np.int32)
    attention = np.ones_like(ids)
    spec = masking.MaskingSpec(vocab, 0.2, 5, whole_word_mask=True)
    out = masking.mask_batch(ids, attention, np.arange(400), 0, spec)
    counts = out["masked_lm_weights"].sum(axis=1)
    # Only the two one-piece words fit a budget of 2 (a 3-piece word would overshoot), so every
    # row masks exactly positions 4 and 8 whatever order the words were drawn in.
    assert (counts == 2).all()
    assert (out["masked_lm_positions"][:, :2] == [4, 8]).all()


def test_num_to_predict_rounds_and_caps():
    vocab = synthetic_vocab(continuation=False)
    lengths = np.array([3, 10, 50, 128, 17])  # round(17 * .15) = round(2.55) = 3; 128 -> cap 10.
    ids = np.zeros((len(lengths), 128), np.int32)
    for r, n in enumerate(lengths):
        ids[r, :n] = 20
        ids[r, 0], ids[r, n - 1] = 2, 3
    attention = (ids > 0).astype(np.int32)
    spec = masking.MaskingSpec(vocab, 0.15, 10)
    out = masking.mask_batch(ids, attention, np.arange(len(lengths)), 0, spec)
    np.testing.assert_array_equal(out["masked_lm_weights"].sum(axis=1), [1, 2, 8, 10, 3])
