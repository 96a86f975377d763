"""Batching: fillers, dynamic padding, length buckets, unbatching, and packing."""

import numpy as np
import pytest

from bert_jax.data import batching

CLS, SEP = 101, 102


def _features(lengths, max_len=23, token_level=False, seed=0):
    """Rows [CLS] w.. [SEP] of the given lengths; token ids encode (row, position)."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    ids = np.zeros((n, max_len), np.int32)
    types = np.zeros((n, max_len), np.int32)
    mask = np.zeros((n, max_len), np.int32)
    for i, length in enumerate(lengths):
        ids[i, :length] = 1000 + 100 * i + np.arange(length)
        ids[i, 0], ids[i, length - 1] = CLS, SEP
        types[i, length // 2 : length] = 1
        mask[i, :length] = 1
    features = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if token_level:
        features["labels"] = (rng.integers(1, 5, (n, max_len)) * mask).astype(np.int32)
        features["label_weights"] = (rng.random((n, max_len)) < 0.6) * mask.astype(np.float32)
    else:
        features["labels"] = rng.integers(0, 3, n).astype(np.int32)
    features["example_weights"] = np.ones(n, np.float32)
    return features


def test_batches_cover_every_row_once_and_fill_the_last_batch():
    features = _features([5, 7, 3, 9, 4, 6, 8, 2, 5, 7])
    batches = list(batching.batches(features, 4, return_indices=True))
    assert len(batches) == batching.num_batches(10, 4) == 3
    for batch, _ in batches:
        assert {k: v.shape for k, v in batch.items()} == {
            "input_ids": (4, 23),
            "token_type_ids": (4, 23),
            "attention_mask": (4, 23),
            "labels": (4,),
            "example_weights": (4,),
        }
        assert batch["input_ids"].dtype == np.int32
        assert batch["example_weights"].dtype == np.float32
    indices = np.concatenate([idx for _, idx in batches])
    np.testing.assert_array_equal(indices, [*range(10), -1, -1])
    last, _ = batches[-1]
    np.testing.assert_array_equal(last["example_weights"], [1, 1, 0, 0])
    # Fillers repeat a real row (so attention is well defined) with weight 0.
    np.testing.assert_array_equal(last["input_ids"][2], features["input_ids"][8])
    assert last["attention_mask"][2:].sum(axis=1).min() > 0
    # drop_remainder drops the short batch instead.
    dropped = list(batching.batches(features, 4, drop_remainder=True))
    assert len(dropped) == batching.num_batches(10, 4, drop_remainder=True) == 2


def test_shuffle_is_deterministic_per_seed():
    features = _features(list(range(3, 23)))

    def order(seed):
        return np.concatenate(
            [
                i
                for _, i in batching.batches(
                    features, 6, shuffle=True, seed=seed, return_indices=True
                )
            ]
        )

    np.testing.assert_array_equal(order(3), order(3))
    assert not np.array_equal(order(3), order(4))
    assert sorted(order(3)[order(3) >= 0]) == list(range(20))


def test_dynamic_padding_cuts_each_batch_to_its_bucket():
    lengths = [5, 7, 3, 9, 20, 6, 8, 2, 15, 7, 4]
    features = _features(lengths)
    bounds = batching.length_buckets(23, step=8)
    assert bounds == (8, 16, 23)
    for batch, idx in batching.batches(features, 3, bucket_boundaries=bounds, return_indices=True):
        longest = max(lengths[i] for i in idx if i >= 0)
        width = min(b for b in bounds if b >= longest)
        assert batch["input_ids"].shape == (3, width)
        real = idx[idx >= 0]
        np.testing.assert_array_equal(
            batch["input_ids"][: len(real)], features["input_ids"][real, :width]
        )
        assert batch["labels"].shape == (3,)  # Per-example keys are never cut.


def test_group_by_length_draws_batches_from_one_bucket():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 24, 101).tolist()
    features = _features(lengths, max_len=24)
    bounds = (6, 12, 18, 24)
    bucket = np.searchsorted(bounds, lengths)
    seen = []
    batches = list(
        batching.batches(
            features,
            8,
            shuffle=True,
            seed=1,
            bucket_boundaries=bounds,
            group_by_length=True,
            return_indices=True,
        )
    )
    assert len(batches) == batching.num_batches(101, 8)
    mixed = 0
    for batch, idx in batches:
        real = idx[idx >= 0]
        seen.extend(real.tolist())
        mixed += len(set(bucket[real])) > 1
        assert batch["input_ids"].shape[1] == bounds[bucket[real].max()]
    # Only the batches made of each bucket's leftovers may mix buckets.
    assert mixed <= len(bounds)
    assert sorted(seen) == list(range(101))
    # Shuffled batch order: the widths do not come out sorted.
    widths = [b["input_ids"].shape[1] for b, _ in batches]
    assert widths != sorted(widths)
    with pytest.raises(ValueError, match="needs bucket_boundaries"):
        batching.batches(features, 8, group_by_length=True)


def test_multiple_choice_and_token_classification_batches():
    features = _features([4, 6, 9, 5, 3, 8], token_level=True)
    batches = list(batching.batches(features, 4, bucket_boundaries=(8, 16)))
    first, last = batches
    assert first["labels"].shape == first["label_weights"].shape == (4, 16)
    assert last["labels"].shape == (4, 8)
    np.testing.assert_array_equal(last["label_weights"][2:], 0)  # Fillers carry no labels.
    np.testing.assert_array_equal(last["example_weights"], [1, 1, 0, 0])

    choices = {
        key: np.stack([value, value[::-1]], axis=1)
        for key, value in _features([4, 6, 9, 5]).items()
        if key in ("input_ids", "token_type_ids", "attention_mask")
    }
    choices["labels"] = np.array([0, 1, 1, 0], np.int32)
    choices["example_weights"] = np.ones(4, np.float32)
    (batch,) = batching.batches(choices, 4, bucket_boundaries=(8, 16))
    assert batch["input_ids"].shape == (4, 2, 16)  # The longest choice has 9 tokens.
    assert batch["labels"].shape == (4,)


def test_unbatch_restores_feature_order():
    features = _features(list(range(2, 22)))
    outputs, indices = [], []
    for batch, idx in batching.batches(
        features,
        6,
        shuffle=True,
        seed=0,
        bucket_boundaries=(8, 16, 23),
        group_by_length=True,
        return_indices=True,
    ):
        outputs.append(batch["input_ids"].astype(np.float32))  # Token-level, widths differ.
        indices.append(idx)
    restored = batching.unbatch(outputs, indices, 20)
    np.testing.assert_array_equal(restored, features["input_ids"][:, : restored.shape[1]])
    with pytest.raises(ValueError, match="not once"):
        batching.unbatch(outputs[:-1], indices[:-1], 20)


def _check_packed_rows(packed, info, features):
    """No two examples share a token slot; each example's tokens, types, positions are intact."""
    r, length = packed["input_ids"].shape
    s = info.max_segments
    assert packed["cls_positions"].shape == (r, s)
    assert packed["example_weights"].shape == (r, s)
    lengths = features["attention_mask"].sum(1)
    index = info.example_index()
    assert sorted(index[index >= 0].tolist()) == list(range(len(lengths)))
    for row in range(r):
        segment = packed["segment_ids"][row]
        real = packed["attention_mask"][row] == 1
        np.testing.assert_array_equal(real, segment > 0)
        # Real tokens first, examples contiguous.
        assert real.sum() == 0 or real[: real.sum()].all()
        slots = index[row]
        assert (slots[: (slots >= 0).sum()] >= 0).all()  # Filled slots come first.
        for slot, example in enumerate(slots):
            if example < 0:
                assert packed["example_weights"][row, slot] == 0
                continue
            where = np.flatnonzero(segment == slot + 1)
            n = lengths[example]
            assert len(where) == n and np.all(np.diff(where) == 1)
            start = packed["cls_positions"][row, slot]
            assert where[0] == start and packed["input_ids"][row, start] == CLS
            np.testing.assert_array_equal(packed["position_ids"][row, where], np.arange(n))
            np.testing.assert_array_equal(
                packed["input_ids"][row, where], features["input_ids"][example, :n]
            )
            np.testing.assert_array_equal(
                packed["token_type_ids"][row, where], features["token_type_ids"][example, :n]
            )
            assert packed["example_weights"][row, slot] == 1
        assert packed["segment_ids"][row].max() <= s
    assert info.efficiency == pytest.approx(lengths.sum() / (r * length))


@pytest.mark.parametrize("max_segments", [1, 3, 8])
def test_pack_sequence_classification(max_segments):
    rng = np.random.default_rng(max_segments)
    lengths = rng.integers(3, 24, 57).tolist()
    features = _features(lengths, max_len=23)
    packed, info = batching.pack(features, max_segments=max_segments, max_seq_length=32)
    assert packed["input_ids"].shape == (info.num_rows, 32)
    _check_packed_rows(packed, info, features)
    np.testing.assert_array_equal(
        batching.unpack_examples(packed["labels"], info), features["labels"]
    )
    if max_segments == 1:
        assert info.num_rows == 57
    else:
        # Packing beats one example per row, and rows are well filled.
        assert info.num_rows < 57 and info.efficiency > 0.75
    assert info.to_dict()["examples"] == 57
    # Packed rows batch like any other features; per-slot keys are never cut.
    batch = next(batching.batches(packed, 4, bucket_boundaries=(16, 32)))
    assert batch["labels"].shape == batch["cls_positions"].shape == (4, max_segments)


def test_pack_token_classification_and_unpack_tokens():
    rng = np.random.default_rng(0)
    features = _features(rng.integers(3, 20, 40).tolist(), max_len=20, token_level=True)
    packed, info = batching.pack(features, max_segments=4)
    assert packed["labels"].shape == packed["label_weights"].shape == (info.num_rows, 20)
    _check_packed_rows(packed, info, features)
    for key in ("labels", "label_weights"):
        restored = batching.unpack_tokens(packed[key], info, width=20)
        np.testing.assert_array_equal(restored, features[key])
    # Per-token outputs of the packed rows come back aligned with the unpacked rows.
    logits = np.stack([packed["input_ids"], -packed["input_ids"]], axis=-1).astype(np.float32)
    restored = batching.unpack_tokens(logits, info, width=20)
    assert restored.shape == (40, 20, 2)
    np.testing.assert_array_equal(restored[..., 0], features["input_ids"])


def test_pack_rejects_what_it_cannot_pack():
    features = _features([5, 12])
    with pytest.raises(ValueError, match="example 1 has 12 tokens > max_seq_length=10"):
        batching.pack(features, max_segments=2, max_seq_length=10)
    packed, _ = batching.pack(features, max_segments=2)
    with pytest.raises(ValueError, match="already packed"):
        batching.pack(packed, max_segments=2)
    with pytest.raises(ValueError, match="per-example key"):
        batching.pack({**features, "start_positions": np.zeros(2, np.int32)}, max_segments=2)


def test_epoch_iterator_host_rows_are_rows_of_the_planned_batch():
    features = _features([5, 7, 3, 9, 4, 6, 8, 2, 5, 7, 6, 4])
    whole = batching.EpochIterator(features, 4, num_epochs=2, seed=3)
    rows = [3, 1]
    mine = batching.EpochIterator(features, 4, num_epochs=2, seed=3, host_rows=rows)
    for a, b in zip(whole, mine, strict=True):
        for k in features:
            np.testing.assert_array_equal(b[k], a[k][rows], err_msg=k)
    with pytest.raises(ValueError, match="distinct rows of the batch of 4"):
        batching.EpochIterator(features, 4, num_epochs=1, host_rows=[3, 4])
    with pytest.raises(ValueError, match="distinct rows of the batch of 4"):
        batching.EpochIterator(features, 4, num_epochs=1, host_rows=[1, 1])
