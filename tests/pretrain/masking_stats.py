"""Checks shared by the static (build-time) and dynamic (load-time) masking tests."""

import numpy as np


def check_masking_statistics(
    originals, outputs, positions_list, vocab, masked_lm_prob, max_predictions
):
    """Asserts the original's masking rule over many examples.

    Args:
      originals: token-id lists before masking (with [CLS]/[SEP]).
      outputs: the same after masking.
      positions_list: masked positions per example.
      vocab: a VocabInfo.
      masked_lm_prob, max_predictions: the rule's parameters.
    """
    counts = {"mask": 0, "keep": 0, "random": 0}
    total_masked = total_tokens = 0
    for original, output, positions in zip(originals, outputs, positions_list):
        original, output = np.asarray(original), np.asarray(output)
        positions = list(positions)
        assert positions == sorted(set(positions))
        expected = min(max_predictions, max(1, int(round(len(original) * masked_lm_prob))))
        candidates = np.sum(~np.isin(original, [vocab.cls_id, vocab.sep_id, vocab.pad_id]))
        assert len(positions) <= expected
        if candidates >= expected and not vocab.continuation.any():
            assert len(positions) == expected
        for p in positions:
            assert original[p] not in (vocab.cls_id, vocab.sep_id, vocab.pad_id)
            if output[p] == vocab.mask_id:
                counts["mask"] += 1
            elif output[p] == original[p]:
                counts["keep"] += 1
            else:
                counts["random"] += 1
        unmasked = np.setdiff1d(np.arange(len(original)), positions)
        np.testing.assert_array_equal(output[unmasked], original[unmasked])
        total_masked += len(positions)
        total_tokens += len(original)
    n = sum(counts.values())
    assert n > 2000, n
    # Binomial tolerances of about 4 standard deviations.
    assert abs(counts["mask"] / n - 0.8) < 4 * np.sqrt(0.16 / n) + 0.002, counts
    assert abs(counts["keep"] / n - 0.1) < 4 * np.sqrt(0.09 / n) + 0.002, counts
    assert abs(counts["random"] / n - 0.1) < 4 * np.sqrt(0.09 / n) + 0.002, counts
    assert abs(total_masked / total_tokens - masked_lm_prob) < 0.01, total_masked / total_tokens


def check_whole_words(originals, positions_list, vocab):
    """Asserts that a word's pieces ("##" continuations after a start) are masked all or none."""
    words_checked = 0
    for original, positions in zip(originals, positions_list):
        chosen = set(positions)
        word = []
        for i, token in enumerate(list(original) + [vocab.cls_id]):
            special = token in (vocab.cls_id, vocab.sep_id, vocab.pad_id)
            if word and (special or not vocab.continuation[token]):
                flags = {p in chosen for p in word}
                assert len(flags) == 1, (original, positions, word)
                words_checked += len(word) > 1
                word = []
            if not special:
                word.append(i)
    assert words_checked > 100
