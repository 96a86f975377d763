"""The grain input pipeline: batch contract, host sharding, epochs, exact resumption (also via Orbax)."""

import os

import grain
import numpy as np
import pytest

from bert_jax.pretrain.data import build, features, masking, pipeline, records, sources
from bert_jax.pretrain.data.examples import PretrainingOptions, TrainingInstance
from tests.pretrain.conftest import EXCERPT, TESTDATA

L, P = 16, 3


def write_numbered_records(directory, num_records, num_files=3, record_format="array_record"):
    """Records whose input_ids[1] is the record's number (static masks at position 2)."""
    os.makedirs(directory, exist_ok=True)
    paths = [str(directory / f"part-{i}.{record_format}") for i in range(num_files)]
    writers = [records.open_writer(p, record_format) for p in paths]
    for n in range(num_records):
        tokens = [2, 1000 + n, 4, 7, 8, 3, 9, 3]
        inst = TrainingInstance(tokens, [0] * 6 + [1] * 2, n % 2 == 1, [2], [50])
        writers[n * num_files // num_records].write(features.instance_to_example(inst, L, P))
    for w in writers:
        w.close()
    return paths


def numbers(batch):
    return (batch["input_ids"][:, 1] - 1000).tolist()


@pytest.fixture(scope="module")
def static_build(tmp_path_factory, tiny_tokenizer):
    out = tmp_path_factory.mktemp("static")
    docs = list(sources.text_file_documents(str(EXCERPT), split_sentences=False))
    options = PretrainingOptions(max_seq_length=40, max_predictions_per_seq=6, dupe_factor=2)
    build.build_pretraining_shards(
        docs, out, tiny_tokenizer, options, num_shards=2, num_workers=1, progress=False
    )
    return out


@pytest.fixture(scope="module")
def dynamic_build(tmp_path_factory, tiny_tokenizer):
    out = tmp_path_factory.mktemp("dynamic")
    docs = list(sources.text_file_documents(str(EXCERPT), split_sentences=False))
    options = PretrainingOptions(
        max_seq_length=40, max_predictions_per_seq=6, dupe_factor=1, static_masking=False
    )
    build.build_pretraining_shards(
        docs, out, tiny_tokenizer, options, num_shards=2, num_workers=1, progress=False
    )
    return out


def loader(paths, **kwargs):
    kwargs = {"seed": 0, "shard_index": 0, "shard_count": 1, **kwargs}
    if "global_batch_size" not in kwargs:
        kwargs.setdefault("batch_size", 4)
    return pipeline.make_pretraining_loader(paths, **kwargs)


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.parametrize("which", ["static_build", "dynamic_build"])
def test_batch_contract(which, request):
    build_dir = request.getfixturevalue(which)
    info = pipeline.load_data_info(build_dir)
    assert (info.max_seq_length, info.max_predictions_per_seq) == (40, 6)
    assert info.static_masks == (which == "static_build") and info.next_sentence_prediction
    batch = next(loader(build_dir, global_batch_size=6))
    expected = {
        "input_ids": ((6, 40), np.int32),
        "token_type_ids": ((6, 40), np.int32),
        "attention_mask": ((6, 40), np.int32),
        "masked_lm_positions": ((6, 6), np.int32),
        "masked_lm_ids": ((6, 6), np.int32),
        "masked_lm_weights": ((6, 6), np.float32),
        "next_sentence_labels": ((6,), np.int32),
    }
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == expected
    lengths = batch["attention_mask"].sum(axis=1)
    for r in range(6):
        assert (batch["attention_mask"][r, : lengths[r]] == 1).all()
        assert (batch["input_ids"][r, lengths[r] :] == 0).all()
        assert (batch["token_type_ids"][r, lengths[r] :] == 0).all()
        real = batch["masked_lm_weights"][r] > 0
        assert real.any() and (batch["masked_lm_positions"][r][real] < lengths[r]).all()
        assert not batch["masked_lm_positions"][r][~real].any()
    assert set(batch["next_sentence_labels"]) <= {0, 1}


def test_every_example_once_per_epoch_across_hosts(tmp_path):
    paths = write_numbered_records(tmp_path, 96)
    per_host = []
    for host in range(4):
        it = loader(paths, global_batch_size=8, num_epochs=2, shard_index=host, shard_count=4)
        per_host.append([numbers(b) for b in it])
    assert [len(h) for h in per_host] == [24, 24, 24, 24]  # 2 epochs * 96 / 8 steps each.
    for epoch in range(2):
        seen = [n for h in per_host for b in h[epoch * 12 : (epoch + 1) * 12] for n in b]
        assert sorted(seen) == list(range(96))
    first = [n for b in per_host[0][:12] for n in b]
    second = [n for b in per_host[0][12:] for n in b]
    assert first != second  # Reshuffled every epoch.


def test_uneven_counts_drop_the_last_partial_global_batch(tmp_path):
    paths = write_numbered_records(tmp_path, 101)
    seen = []
    counts = []
    for host in range(3):
        batches = list(
            loader(paths, global_batch_size=6, num_epochs=1, shard_index=host, shard_count=3)
        )
        counts.append(len(batches))
        seen += [n for b in batches for n in numbers(b)]
    assert counts == [16, 16, 16]  # 101 // 6 = 16 steps on every host.
    assert len(seen) == len(set(seen)) == 96


def test_shuffle_seed_and_order(tmp_path):
    paths = write_numbered_records(tmp_path, 40)
    stored = [
        n for b in loader(paths, batch_size=8, num_epochs=1, shuffle=False) for n in numbers(b)
    ]
    assert stored == list(range(40))
    seed0 = [numbers(b) for b in take(loader(paths, batch_size=8), 5)]
    seed1 = [numbers(b) for b in take(loader(paths, batch_size=8, seed=1), 5)]
    assert seed0 == [numbers(b) for b in take(loader(paths, batch_size=8), 5)]
    assert seed0 != seed1 and sorted(sum(seed0, [])) == list(range(40))


def test_resumed_iterator_continues_exactly(dynamic_build):
    it = loader(dynamic_build, batch_size=5, seed=3)
    take(it, 7)
    state = it.get_state()
    expected = take(it, 6)
    resumed = loader(dynamic_build, batch_size=5, seed=3)
    resumed.set_state(state)
    assert_same_batches(take(resumed, 6), expected)


def test_orbax_checkpoint_restores_the_iterator(dynamic_build, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    it = loader(dynamic_build, batch_size=5, seed=9)
    take(it, 4)
    with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",)) as manager:
        manager.save(4, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
    expected = take(it, 5)
    fresh = loader(dynamic_build, batch_size=5, seed=9)
    with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",)) as manager:
        restored = manager.restore(
            manager.latest_step(),
            args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)),
        )
    assert_same_batches(take(restored["data"], 5), expected)


def test_dynamic_masks_change_per_epoch_and_not_with_host_count(tmp_path, tiny_tokenizer):
    paths = write_numbered_records(tmp_path, 24, num_files=1)
    kwargs = dict(dynamic_masking=True, tokenizer=tiny_tokenizer, shuffle=False, num_epochs=2)
    single = list(loader(paths, batch_size=4, **kwargs))
    stream = {k: np.concatenate([b[k] for b in single]) for k in single[0]}
    # Every record is the same 8 tokens except its number: the masks of epoch 1 and 2 differ.
    first, second = stream["masked_lm_positions"][:24], stream["masked_lm_positions"][24:]
    assert (first != second).any(axis=1).mean() > 0.5
    # Host 1 of 2 reads the second half of every global batch of 4 (stream elements 2, 3, 6, 7,
    # ...) and masks them exactly as a single host does.
    host1 = list(loader(paths, batch_size=2, shard_index=1, shard_count=2, **kwargs))
    second_halves = np.arange(len(stream["input_ids"])).reshape(-1, 4)[:, 2:].reshape(-1)
    for key in stream:
        np.testing.assert_array_equal(
            np.concatenate([b[key] for b in host1]), stream[key][second_halves]
        )


def test_hosts_assemble_the_single_host_batches_row_for_row(dynamic_build):
    """Concatenating the hosts' batches of a step (host 0 first) gives the single host's batch,
    so a run does not depend on the number of hosts."""
    single = take(loader(dynamic_build, global_batch_size=8, seed=3), 3)
    hosts = [
        take(loader(dynamic_build, global_batch_size=8, seed=3, shard_index=h, shard_count=4), 3)
        for h in range(4)
    ]
    for step, reference in enumerate(single):
        for key in reference:
            joined = np.concatenate([hosts[h][step][key] for h in range(4)])
            np.testing.assert_array_equal(joined, reference[key])


def test_worker_processes_give_the_same_batches_and_resume(dynamic_build):
    reference = take(loader(dynamic_build, batch_size=4, seed=5), 8)
    it = loader(dynamic_build, batch_size=4, seed=5, worker_count=2)
    assert_same_batches(take(it, 4), reference[:4])
    state = it.get_state()
    it.close()
    resumed = loader(dynamic_build, batch_size=4, seed=5, worker_count=2)
    resumed.set_state(state)
    assert_same_batches(take(resumed, 4), reference[4:])
    resumed.close()


def test_reads_original_tfrecords_and_can_remask_them(bert_vocab_dir):
    path = str(TESTDATA / "original_seed12345_len64.tfrecord")
    info = pipeline.load_data_info(path)
    assert (info.record_format, info.num_records, info.max_seq_length) == ("tfrecord", 140, 64)
    assert info.static_masks and info.vocab_size is None
    stored = next(loader(path, batch_size=10, shuffle=False))
    np.testing.assert_array_equal(
        stored["input_ids"], features.decode_batch(records.read_all(path)[:10], 64, 10)["input_ids"]
    )
    with pytest.raises(ValueError, match="dynamic masking needs the vocabulary"):
        loader(path, batch_size=10, dynamic_masking=True)
    remasked = next(
        loader(path, batch_size=10, shuffle=False, dynamic_masking=True, tokenizer=bert_vocab_dir)
    )
    unmask = lambda b: masking.unmask(
        b["input_ids"], b["masked_lm_positions"], b["masked_lm_ids"], b["masked_lm_weights"]
    )
    np.testing.assert_array_equal(unmask(remasked), unmask(stored))
    assert not np.array_equal(remasked["masked_lm_positions"], stored["masked_lm_positions"])
    for key in ("token_type_ids", "attention_mask", "next_sentence_labels"):
        np.testing.assert_array_equal(remasked[key], stored[key])


def test_mlm_only_data(tmp_path, tiny_tokenizer):
    docs = list(sources.text_file_documents(str(EXCERPT), split_sentences=False))
    options = PretrainingOptions(
        max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, next_sentence_prediction=False
    )
    build.build_pretraining_shards(
        docs, tmp_path, tiny_tokenizer, options, num_shards=1, num_workers=1, progress=False
    )
    info = pipeline.load_data_info(tmp_path)
    assert info.next_sentence_prediction is False
    batch = next(loader(tmp_path, batch_size=8))
    assert not batch["next_sentence_labels"].any() and not batch["token_type_ids"].any()


def test_bad_arguments_and_inputs(tmp_path, dynamic_build):
    with pytest.raises(ValueError, match="exactly one of batch_size"):
        loader(dynamic_build, batch_size=4, global_batch_size=8)
    with pytest.raises(ValueError, match="not divisible by shard_count=3"):
        loader(dynamic_build, global_batch_size=8, shard_count=3)
    with pytest.raises(ValueError, match="carry no masks"):
        loader(dynamic_build, dynamic_masking=False)
    with pytest.raises(ValueError, match="shard_index=2 is not in"):
        loader(dynamic_build, shard_index=2, shard_count=2)
    with pytest.raises(ValueError, match="make no global batch"):
        loader(write_numbered_records(tmp_path / "few", 5, num_files=1), batch_size=8, num_epochs=1)
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "build.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="unfinished build"):
        loader(tmp_path / "unfinished")
    with pytest.raises(FileNotFoundError, match="not a pretraining build"):
        loader(tmp_path)


def test_host_rows_read_those_rows_of_every_global_batch(tmp_path):
    """`host_rows` (what `sharding.host_batch_rows` gives a host) picks rows of the global batch a
    single host reads, in the order given; two hosts that share a batch shard read the same."""
    paths = write_numbered_records(tmp_path, 96)
    whole = [numbers(b) for b in take(loader(paths, global_batch_size=8), 5)]
    rows = [6, 7, 2, 3]  # two non-adjacent shards of 2 rows, as a mesh may give a host
    kwargs = dict(seed=0, global_batch_size=8, host_rows=rows)
    mine = [numbers(b) for b in take(pipeline.make_pretraining_loader(paths, **kwargs), 5)]
    assert mine == [[batch[r] for r in rows] for batch in whole]
    other = [numbers(b) for b in take(pipeline.make_pretraining_loader(paths, **kwargs), 5)]
    assert other == mine
    with pytest.raises(ValueError, match="host_rows goes with global_batch_size"):
        pipeline.make_pretraining_loader(paths, batch_size=4, host_rows=rows)
    with pytest.raises(ValueError, match="host_rows must lie in"):
        pipeline.make_pretraining_loader(paths, global_batch_size=8, host_rows=[7, 8])
    with pytest.raises(ValueError, match="distinct row indices"):
        pipeline.make_pretraining_loader(paths, global_batch_size=8, host_rows=[1, 1])
