"""Sequence packing: the packed batch contract, exact coverage, masks, resumption, efficiency, and
a packed batch's loss equal to the same sequences' loss unpacked."""

import collections
import functools
import itertools
import random

import grain
import numpy as np
import pytest

from bert_jax import batch_layout
from bert_jax.pretrain.data import build, features, packing, pipeline, records
from bert_jax.pretrain.data.examples import PretrainingOptions, VocabInfo
from tests.pretrain import pipeline_test
from tests.pretrain.conftest import EXCERPT, TESTDATA
from tests.pretrain.pipeline_test import assert_same_batches, take

L, P, S = 48, 7, 4  # max_seq_length, max_predictions_per_seq, max_segments
P_ROW = 7 + S  # floor(0.15 * 48) + S = 11 < S * P


def short_sentence_documents(num_documents=20, num_sentences=30, seed=0):
    """Documents of 1-5 word sentences cut from the excerpt, so that many examples end short
    (the excerpt's own long lines fill 40-token examples whatever short_seq_prob says)."""
    words = EXCERPT.read_text().split()
    rng = random.Random(seed)
    documents, i = [], 0
    for _ in range(num_documents):
        document = []
        for _ in range(num_sentences):
            n = rng.randint(1, 5)
            document.append(" ".join(words[i : i + n]))
            i = (i + n) % (len(words) - 5)
        documents.append(document)
    return documents


def _build(out, tokenizer, **options):
    options = PretrainingOptions(
        max_seq_length=L, max_predictions_per_seq=P, dupe_factor=2, short_seq_prob=0.5, **options
    )
    build.build_pretraining_shards(
        short_sentence_documents(),
        out,
        tokenizer,
        options,
        num_shards=2,
        num_workers=1,
        progress=False,
    )
    return out


@pytest.fixture(scope="module")
def short_build(tmp_path_factory, tiny_tokenizer):
    """Dynamic masking, half the documents aiming at random shorter lengths."""
    return _build(tmp_path_factory.mktemp("short"), tiny_tokenizer, static_masking=False)


@pytest.fixture(scope="module")
def static_short_build(tmp_path_factory, tiny_tokenizer):
    return _build(tmp_path_factory.mktemp("static_short"), tiny_tokenizer)


def loader(paths, **kwargs):
    """pipeline_test's loader (one host, seed 0, batch 4) with at most S sequences a row."""
    return pipeline_test.loader(paths, **{"max_segments": S, **kwargs})


def unpacked_sequences(batch):
    """(key, row) per example; the key holds everything a packed copy must reproduce."""
    out = []
    for r, n in enumerate(batch["attention_mask"].sum(axis=1)):
        real = batch["masked_lm_weights"][r] > 0
        key = (
            tuple(batch["input_ids"][r, :n]),
            tuple(batch["token_type_ids"][r, :n]),
            tuple(batch["masked_lm_positions"][r][real]),
            tuple(batch["masked_lm_ids"][r][real]),
            int(batch["next_sentence_labels"][r]),
        )
        out.append((key, r))
    return out


def packed_sequences(batch):
    """(key, (row, slot)) per packed sequence, predictions moved to sequence coordinates."""
    out = []
    for r in range(batch["input_ids"].shape[0]):
        seg = batch["segment_ids"][r]
        for s in range(1, batch["cls_positions"].shape[1] + 1):
            where = np.nonzero(seg == s)[0]
            if where.size == 0:
                continue
            start, stop = where[0], where[-1] + 1
            pos, weights = batch["masked_lm_positions"][r], batch["masked_lm_weights"][r]
            mine = (weights > 0) & (pos >= start) & (pos < stop)
            key = (
                tuple(batch["input_ids"][r, start:stop]),
                tuple(batch["token_type_ids"][r, start:stop]),
                tuple(pos[mine] - start),
                tuple(batch["masked_lm_ids"][r][mine]),
                int(batch["next_sentence_labels"][r, s - 1]),
            )
            out.append((key, (r, s - 1)))
    return out


def check_packed_batch(batch, vocab, batch_size, p_row):
    """Every structural promise of the packed batch contract, row by row."""
    shapes = batch_layout.pretraining_shapes(True, B=batch_size, L=L, S=S, P=p_row)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == shapes
    for r in range(batch_size):
        seg, pos, ids = batch["segment_ids"][r], batch["position_ids"][r], batch["input_ids"][r]
        m = int(batch["attention_mask"][r].sum())
        k = int(batch["next_sentence_weights"][r].sum())
        np.testing.assert_array_equal(batch["attention_mask"][r], seg > 0)
        # Sequences 1..k lie one after another from position 0 (so none overlap); padding after.
        assert (seg[m:] == 0).all() and (ids[m:] == vocab.pad_id).all()
        assert not batch["token_type_ids"][r, m:].any() and not pos[m:].any()
        if m:
            assert seg[0] == 1 and seg[m - 1] == k and set(np.diff(seg[:m])) <= {0, 1}
        assert k <= S
        starts = []
        for s in range(1, k + 1):
            where = np.nonzero(seg == s)[0]
            start, n = where[0], where.size
            starts.append(start)
            np.testing.assert_array_equal(pos[where], np.arange(n))  # Positions restart.
            assert ids[start] == vocab.cls_id and ids[start + n - 1] == vocab.sep_id
        np.testing.assert_array_equal(batch["cls_positions"][r], starts + [0] * (S - k))
        np.testing.assert_array_equal(batch["next_sentence_weights"][r], [1.0] * k + [0] * (S - k))
        assert set(batch["next_sentence_labels"][r, :k]) <= {0, 1}
        assert not batch["next_sentence_labels"][r, k:].any()
        # Predictions: first slots, increasing positions, each on a real non-special token.
        w = batch["masked_lm_weights"][r] > 0
        c = int(w.sum())
        assert w[:c].all() and not w[c:].any()
        mpos, mids = batch["masked_lm_positions"][r, :c], batch["masked_lm_ids"][r, :c]
        assert (np.diff(mpos) > 0).all() and (seg[mpos] > 0).all()
        assert not set(mpos) & set(starts)
        assert not set(mids) & {vocab.cls_id, vocab.sep_id, vocab.pad_id}
        assert not batch["masked_lm_positions"][r, c:].any()
        assert not batch["masked_lm_ids"][r, c:].any()


def epoch(it):
    return list(it)


@pytest.mark.parametrize("which", ["short_build", "static_short_build"])
def test_packed_batch_contract(which, request, tiny_tokenizer):
    build_dir = request.getfixturevalue(which)
    vocab = VocabInfo.from_tokenizer(tiny_tokenizer)
    batches = epoch(loader(build_dir, batch_size=5, num_epochs=1, pack_sequences=True))
    assert len(batches) > 3
    for batch in batches:
        check_packed_batch(batch, vocab, 5, P_ROW)
    # Packing happened: some rows hold several sequences.
    assert max(b["next_sentence_weights"].sum(axis=1).max() for b in batches) > 1


@pytest.mark.parametrize("hosts", [1, 2])
def test_packed_epoch_holds_every_example_once_with_its_unpacked_masks(short_build, hosts):
    """The packed epoch's sequences, over all hosts, are the unpacked epoch's examples, each once,
    with the same tokens, token types, masks, masked ids (the original tokens) and NSP labels."""
    unpacked = collections.Counter(
        key
        for b in epoch(loader(short_build, global_batch_size=4, num_epochs=1))
        for key, _ in unpacked_sequences(b)
    )
    per_host = []
    for host in range(hosts):
        it = loader(
            short_build,
            global_batch_size=4,
            num_epochs=1,
            shard_index=host,
            shard_count=hosts,
            pack_sequences=True,
        )
        per_host.append(
            collections.Counter(key for b in epoch(it) for key, _ in packed_sequences(b))
        )
    assert all(per_host)
    assert sum(per_host, collections.Counter()) == unpacked
    assert sum(unpacked.values()) > 100


def test_each_epoch_packs_every_record_once_with_new_masks(short_build):
    """Putting each packed sequence's masked_lm_ids back at its positions gives the records' own
    tokens: every record once per epoch, the predictions' ids the original tokens."""

    def original(key):  # The sequence with its predictions put back, and its NSP label.
        ids = list(key[0])
        for position, token in zip(key[2], key[3]):
            ids[position] = token
        return tuple(ids), key[1], key[4]

    # One row a batch, so that neither run cuts a partial global batch off its stream.
    one = [
        k
        for b in epoch(loader(short_build, batch_size=1, num_epochs=1, pack_sequences=True))
        for k, _ in packed_sequences(b)
    ]
    two = [
        k
        for b in epoch(loader(short_build, batch_size=1, num_epochs=2, pack_sequences=True))
        for k, _ in packed_sequences(b)
    ]
    stored = features.decode_batch(
        [r for path in pipeline.load_data_info(short_build).paths for r in records.read_all(path)],
        L,
        P,
    )
    assert not stored["masked_lm_weights"].any()  # Dynamic-masking records: original tokens.
    once = collections.Counter(
        (tuple(ids[:n]), tuple(types[:n]), int(nsp))
        for ids, types, n, nsp in zip(
            stored["input_ids"],
            stored["token_type_ids"],
            stored["attention_mask"].sum(axis=1),
            stored["next_sentence_labels"],
        )
    )
    assert collections.Counter(map(original, one)) == once
    assert collections.Counter(map(original, two)) == once + once
    assert len(set(two)) > 1.5 * len(set(one))  # Masks are drawn anew in the second epoch.


@pytest.mark.parametrize("num_packing_bins", [3, 128])
def test_packed_iterator_resumes_exactly(short_build, num_packing_bins):
    kwargs = dict(batch_size=3, seed=3, pack_sequences=True, num_packing_bins=num_packing_bins)
    it = loader(short_build, **kwargs)
    take(it, 7)
    state = it.get_state()
    expected = take(it, 6)
    resumed = loader(short_build, **kwargs)
    resumed.set_state(state)
    assert_same_batches(take(resumed, 6), expected)


def test_orbax_checkpoint_restores_the_packed_iterator(short_build, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    kwargs = dict(batch_size=3, seed=9, pack_sequences=True, num_packing_bins=4)
    it = loader(short_build, **kwargs)
    take(it, 5)
    with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",)) as manager:
        manager.save(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
    expected = take(it, 5)
    fresh = loader(short_build, **kwargs)
    with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",)) as manager:
        restored = manager.restore(
            manager.latest_step(),
            args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)),
        )
    assert_same_batches(take(restored["data"], 5), expected)


def test_worker_processes_give_the_same_packed_batches_and_resume(short_build):
    kwargs = dict(batch_size=4, seed=5, pack_sequences=True, num_packing_bins=8)
    reference = take(loader(short_build, **kwargs), 8)
    it = loader(short_build, worker_count=2, **kwargs)
    assert_same_batches(take(it, 4), reference[:4])
    state = it.get_state()
    it.close()
    resumed = loader(short_build, worker_count=2, **kwargs)
    resumed.set_state(state)
    assert_same_batches(take(resumed, 4), reference[4:])
    resumed.close()


def efficiency(batches):
    mask = np.concatenate([b["attention_mask"] for b in batches])
    return mask.sum() / mask.size


def test_packing_is_more_efficient_on_short_sequences(short_build, capsys):
    unpacked = efficiency(epoch(loader(short_build, batch_size=8, num_epochs=1)))
    packed = efficiency(epoch(loader(short_build, batch_size=8, num_epochs=1, pack_sequences=True)))
    with capsys.disabled():
        print(f"\npacking efficiency (real tokens / slots): {unpacked:.3f} -> {packed:.3f}")
    assert packed > unpacked + 0.15, (unpacked, packed)


def test_mlm_only_data_packs_with_zero_labels(tmp_path, tiny_tokenizer):
    _build(tmp_path, tiny_tokenizer, static_masking=False, next_sentence_prediction=False)
    batch = next(loader(tmp_path, batch_size=6, pack_sequences=True))
    assert not batch["next_sentence_labels"].any() and not batch["token_type_ids"].any()
    k = batch["next_sentence_weights"].sum(axis=1)
    np.testing.assert_array_equal(k, batch["segment_ids"].max(axis=1))


def test_foreign_static_records_get_s_times_p_prediction_slots():
    path = str(TESTDATA / "original_seed12345_len64.tfrecord")
    batch = next(loader(path, batch_size=4, shuffle=False, pack_sequences=True, max_segments=3))
    info = pipeline.load_data_info(path)
    assert batch["masked_lm_positions"].shape == (4, 3 * info.max_predictions_per_seq)
    assert batch["cls_positions"].shape == (4, 3)


def _dynamic_count(n, p, cap):
    return min(cap, max(1, int(np.rint(n * p))))


@pytest.mark.parametrize("length,segments,cap,p", [(40, 4, 6, 0.15), (64, 3, 20, 0.2)])
def test_max_predictions_per_row_bounds_every_packing(length, segments, cap, p):
    """Brute force over every split of a row into up to S sequences: the per-sequence rule never
    exceeds the bound, and the bound is at most S above the best packing's count."""
    count = [_dynamic_count(n, p, cap) for n in range(length + 1)]
    best = 0
    for k in range(1, segments + 1):
        for lengths in itertools.combinations_with_replacement(range(1, length + 1), k):
            if sum(lengths) <= length:
                best = max(best, sum(count[n] for n in lengths))
    bound = packing.max_predictions_per_row(length, segments, cap, p)
    assert best <= bound <= best + segments
    assert packing.max_predictions_per_row(length, segments, cap) == segments * cap


def test_a_row_over_the_prediction_bound_raises_instead_of_dropping():
    batch = {
        "input_ids": np.array([[2, 7, 8, 9, 3, 0], [2, 7, 8, 9, 3, 0]], np.int32),
        "token_type_ids": np.zeros((2, 6), np.int32),
        "attention_mask": np.array([[1] * 5 + [0]] * 2, np.int32),
        "masked_lm_positions": np.array([[1, 2, 3]] * 2, np.int32),
        "masked_lm_ids": np.array([[7, 8, 9]] * 2, np.int32),
        "masked_lm_weights": np.ones((2, 3), np.float32),
        "next_sentence_labels": np.zeros(2, np.int32),
    }
    ds = grain.MapDataset.source([batch]).to_iter_dataset()
    packed = packing.pack_pretraining_batches(
        ds, batch_size=1, max_seq_length=10, max_segments=2, max_predictions=5, num_packing_bins=1
    )
    with pytest.raises(ValueError, match="6 predictions, more than max_predictions_per_row=5"):
        next(iter(packed))
    ok = packing.pack_pretraining_batches(
        ds, batch_size=1, max_seq_length=10, max_segments=2, max_predictions=6, num_packing_bins=1
    )
    row = next(iter(ok))
    np.testing.assert_array_equal(row["masked_lm_positions"], [[1, 2, 3, 6, 7, 8]])
    np.testing.assert_array_equal(row["cls_positions"], [[0, 5]])


def test_sequence_lengths_of_packed_and_unpacked_batches(short_build):
    plain = next(loader(short_build, batch_size=5))
    np.testing.assert_array_equal(
        packing.sequence_lengths(plain), plain["attention_mask"].sum(axis=1)
    )
    packed = next(loader(short_build, batch_size=5, pack_sequences=True))
    expected = sorted(len(key[0]) for key, _ in packed_sequences(packed))
    assert sorted(packing.sequence_lengths(packed)) == expected
    assert len(expected) == packed["next_sentence_weights"].sum() > 5


def test_bad_packing_arguments(short_build):
    with pytest.raises(ValueError, match="max_segments=0"):
        loader(short_build, pack_sequences=True, max_segments=0)
    with pytest.raises(ValueError, match="num_packing_bins=0"):
        loader(short_build, pack_sequences=True, num_packing_bins=0)


def test_packed_loss_equals_unpacked_loss_of_the_same_sequences(short_build, tiny_tokenizer):
    """BertForPreTraining + pretraining_task(nsp=True): a packed batch's loss is the loss of its
    sequences fed one per row, with the same masks. Attention stays inside each sequence,
    positions restart, the pooler reads each [CLS] and NSP labels follow their sequences."""
    import flax.linen as nn
    import jax

    from bert_jax.models.bert import model as M
    from bert_jax.models.bert.config import BertConfig
    from bert_jax.models.params import init_params
    from bert_jax.training import objectives, steps

    packed = next(loader(short_build, batch_size=6, pack_sequences=True))
    # Some row really is shared, by sequences of different NSP labels.
    k = packed["next_sentence_weights"].sum(axis=1).astype(int)
    assert any(len(set(packed["next_sentence_labels"][r, : k[r]])) > 1 for r in range(6))
    stream = epoch(loader(short_build, batch_size=6, num_epochs=1))
    by_key = {
        key: {k: v[r] for k, v in b.items()} for b in stream for key, r in unpacked_sequences(b)
    }
    rows = [by_key[key] for key, _ in packed_sequences(packed)]
    unpacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    cfg = BertConfig(
        vocab_size=tiny_tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=L,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = M.BertForPreTraining(cfg)
    # Random parameters of std 0.5 (no init compile): attention far from uniform, so that a leak
    # between sequences would show.
    abstract = jax.eval_shape(lambda key: init_params(model, key, seq_len=L), jax.random.key(0))
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(
        lambda x: rng.normal(0.0, 0.5, x.shape).astype(x.dtype), nn.meta.unbox(abstract)
    )
    evaluate = jax.jit(
        functools.partial(
            steps.eval_step, model=model, objective=objectives.pretraining_objective(nsp=True)
        )
    )
    got, want = evaluate(params, packed), evaluate(params, unpacked)
    for key in ("mlm_count", "nsp_count"):
        assert float(got[key]) == float(want[key]) > 0
    for key in ("mlm_loss_sum", "nsp_loss_sum"):
        np.testing.assert_allclose(float(got[key]), float(want[key]), rtol=1e-5, err_msg=key)
    # The NSP score histogram counts the packed sequences, not the rows or the empty slots.
    assert float(got["nsp_score_hist"].sum()) == float(want["nsp_score_hist"].sum()) > 0
    np.testing.assert_allclose(float(got["loss"]), float(want["loss"]), atol=1e-5)
    # The comparison can fail: with one segment a row, attention crosses sequences and the loss
    # moves by 100x the tolerance above or more (3e-3 to 3e-2, as the vocabulary's ties fall).
    crossed = evaluate(params, {**packed, "segment_ids": packed["attention_mask"]})
    assert abs(float(crossed["loss"]) - float(want["loss"])) > 1e-3
