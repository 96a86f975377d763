import os
import shutil

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax.checkpoints import checkpointing
from bert_jax.parallel import sharding


def make_state(seed, mesh):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(8, 6)).astype(np.float32)
    return {
        "params": {"w": jax.device_put(w, NamedSharding(mesh, P("fsdp", None)))},
        "step": jnp.asarray(seed, jnp.int32),
    }


def targets(mesh):
    return {
        "params": {
            "w": jax.ShapeDtypeStruct(
                (8, 6), jnp.float32, sharding=NamedSharding(mesh, P("fsdp", None))
            )
        },
        "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P())),
    }


def data_iterator(seed=0):
    return iter(grain.MapDataset.range(1000).shuffle(seed=seed).batch(4).to_iter_dataset())


def truncate_arrays(step_dir):
    """Overwrites the array files of a checkpoint with two bytes (a bad disk, a killed copy)."""
    for root, _, files in os.walk(step_dir / "state"):
        for f in files:
            if "manifest" in f or root.endswith("d"):
                with open(os.path.join(root, f), "wb") as fh:
                    fh.write(b"\x00\x01")


def test_round_trip_with_shardings_and_data_position(tmp_path):
    mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
    ckpt = checkpointing.Checkpointer(str(tmp_path), max_to_keep=2, async_save=True)
    it = data_iterator()
    for _ in range(3):
        next(it)
    state = make_state(7, mesh)
    assert ckpt.save(7, state, data_iterator=it, meta={"model": "BertModel", "step": 7})
    expected_next = [next(it) for _ in range(3)]
    ckpt.wait()
    fresh = data_iterator()
    restored = checkpointing.Checkpointer(str(tmp_path)).restore_latest(
        targets(mesh), data_iterator=fresh
    )
    step, got, meta = restored
    assert step == 7 and meta == {"model": "BertModel", "step": 7}
    np.testing.assert_array_equal(got["params"]["w"], state["params"]["w"])
    assert got["params"]["w"].sharding.spec == P("fsdp", None)
    for want in expected_next:  # the data iterator continues exactly where it was saved
        np.testing.assert_array_equal(next(fresh), want)


def test_interval_and_retention(tmp_path):
    mesh = sharding.make_mesh({"data": 8})
    ckpt = checkpointing.Checkpointer(str(tmp_path), max_to_keep=2, async_save=False)
    for step in (10, 20, 30):
        assert ckpt.save(step, make_state(step, mesh))
    ckpt.wait()
    assert ckpt.all_steps() == [20, 30]


def test_corrupt_latest_falls_back_to_previous_and_is_kept(tmp_path):
    mesh = sharding.make_mesh({"data": 8})
    ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
    ckpt.save(1, make_state(1, mesh))
    ckpt.save(2, make_state(2, mesh))
    ckpt.close()
    truncate_arrays(tmp_path / "2")
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    step, state, _ = ckpt.restore_latest(targets(mesh))
    assert step == 1 and int(state["step"]) == 1
    assert (tmp_path / "corrupt-2").is_dir()  # reported and kept aside, not deleted
    assert ckpt.all_steps() == [1]
    # Training goes on: step 2 can be saved again.
    assert ckpt.save(2, make_state(2, mesh))
    ckpt.close()


def test_unfinished_save_is_not_a_checkpoint(tmp_path):
    mesh = sharding.make_mesh({"data": 8})
    ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
    ckpt.save(3, make_state(3, mesh))
    ckpt.close()
    os.makedirs(tmp_path / "5.orbax-checkpoint-tmp-1234" / "state")  # a save killed midway
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    assert ckpt.all_steps() == [3]
    assert ckpt.restore_latest(targets(mesh))[0] == 3
    empty = checkpointing.Checkpointer(str(tmp_path / "none"))
    assert empty.restore_latest(targets(mesh)) is None


def test_shape_mismatch_is_reported_not_silently_loaded(tmp_path):
    mesh = sharding.make_mesh({"data": 8})
    ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
    ckpt.save(1, make_state(1, mesh))
    ckpt.close()
    wrong = targets(mesh)
    wrong["params"]["w"] = jax.ShapeDtypeStruct(
        (8, 5), jnp.float32, sharding=NamedSharding(mesh, P())
    )
    with pytest.raises(ValueError, match=r"\(8, 5\) is not compatible with the stored shape"):
        checkpointing.Checkpointer(str(tmp_path)).restore(1, wrong)
    # Resuming with a config that does not fit is not corruption: stop, move nothing.
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    with pytest.raises(checkpointing.RestoreError, match=r"checkpoint 1 .*other error.*\(8, 5\)"):
        ckpt.restore_latest(wrong)
    assert ckpt.all_steps() == [1] and not ckpt.quarantined()


def test_corrupt_files_of_any_item_fall_back_and_every_one_is_kept(tmp_path):
    mesh = sharding.make_mesh({"data": 8})
    ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
    it = data_iterator()
    for step in (1, 2, 3):
        next(it)
        ckpt.save(step, make_state(step, mesh), data_iterator=it, meta={"step": step})
    ckpt.close()
    os.remove(tmp_path / "3" / "data" / "process_0-of-1.json")  # a missing data position
    (tmp_path / "2" / "meta" / "metadata").write_text("{garbage")  # undecodable JSON
    fresh = data_iterator()
    step, state, meta = checkpointing.Checkpointer(str(tmp_path)).restore_latest(
        targets(mesh), data_iterator=fresh
    )
    assert step == 1 and meta == {"step": 1} and int(state["step"]) == 1
    assert sorted(os.listdir(tmp_path)) == ["1", "corrupt-2", "corrupt-3"]
    reference = data_iterator()
    next(reference)
    np.testing.assert_array_equal(next(fresh), next(reference))  # step 1's data position


def test_a_corrupt_only_checkpoint_stops_the_run_instead_of_restarting(tmp_path):
    mesh = sharding.make_mesh({"data": 8})
    ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
    ckpt.save(4, make_state(4, mesh))
    ckpt.close()
    truncate_arrays(tmp_path / "4")
    with pytest.raises(checkpointing.RestoreError, match="refusing to start from scratch"):
        checkpointing.Checkpointer(str(tmp_path)).restore_latest(targets(mesh))
    assert sorted(os.listdir(tmp_path)) == ["corrupt-4"]
    # A second attempt does not quietly start at step 0 either, and keeps what was set aside.
    with pytest.raises(checkpointing.RestoreError, match=r"corrupt-4"):
        checkpointing.Checkpointer(str(tmp_path)).restore_latest(targets(mesh))
    assert sorted(os.listdir(tmp_path)) == ["corrupt-4"]


def test_another_process_count_resumes_from_the_shared_data_position(tmp_path):
    """A checkpoint written by 2 processes (grain: one file each) resumes on 1 from the
    process-independent `data_position`; without it the run stops and nothing is moved."""
    mesh = sharding.make_mesh({"data": 8})
    ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
    it = data_iterator()
    for _ in range(3):
        next(it)
    ckpt.save(2, make_state(2, mesh), data_iterator=it)
    ckpt.close()
    expected = next(it)
    data = tmp_path / "2" / "data"
    os.replace(data / "process_0-of-1.json", data / "process_0-of-2.json")
    (data / "process_1-of-2.json").write_text((data / "process_0-of-2.json").read_text())
    fresh = data_iterator()
    step, _, _ = checkpointing.Checkpointer(str(tmp_path)).restore_latest(
        targets(mesh), data_iterator=fresh
    )
    assert step == 2
    np.testing.assert_array_equal(next(fresh), expected)
    shutil.rmtree(tmp_path / "2" / "data_position")  # processes that were at different positions
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    with pytest.raises(checkpointing.RestoreError, match=r"of \[2\] process\(es\), which differed"):
        ckpt.restore_latest(targets(mesh), data_iterator=data_iterator())
    assert ckpt.all_steps() == [2] and not ckpt.quarantined()


def test_transient_errors_are_retried_then_stop_without_moving_anything(tmp_path, monkeypatch):
    mesh = sharding.make_mesh({"data": 8})
    ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
    ckpt.save(5, make_state(5, mesh))
    ckpt.close()
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    real_restore, failures = ckpt.restore, []

    def flaky(step, abstract, **kwargs):
        if len(failures) < 2:  # storage that times out twice, then answers
            failures.append(step)
            raise TimeoutError("gs read timed out")
        return real_restore(step, abstract, **kwargs)

    monkeypatch.setattr(ckpt, "restore", flaky)
    assert ckpt.restore_latest(targets(mesh), backoff_s=0)[0] == 5 and failures == [5, 5]

    def down(step, abstract, **kwargs):
        raise ValueError("UNAVAILABLE: the storage service is down")

    monkeypatch.setattr(ckpt, "restore", down)
    with pytest.raises(checkpointing.RestoreError, match="transient I/O error.*UNAVAILABLE"):
        ckpt.restore_latest(targets(mesh), retries=2, backoff_s=0)
    assert ckpt.all_steps() == [5] and not ckpt.quarantined()


def test_urls_stay_urls_and_local_paths_become_absolute(tmp_path, monkeypatch):
    for url in ("gs://bucket/run/checkpoints", "s3://bucket/a b/checkpoints"):
        path = checkpointing.as_path(url)
        assert str(path) == url and str(path / "4" / "data") == url + "/4/data"
    monkeypatch.chdir(tmp_path)
    assert str(checkpointing.as_path("run/checkpoints")) == str(tmp_path / "run" / "checkpoints")
    ckpt = checkpointing.Checkpointer("run/checkpoints")
    monkeypatch.chdir("/")  # the run's directory does not follow the working directory
    assert str(ckpt.directory) == str(tmp_path / "run" / "checkpoints") and ckpt.all_steps() == []


def test_the_cause_chain_decides_but_transient_and_unknown_errors_move_nothing():
    def chained(outer, inner):
        try:
            try:
                raise inner
            except Exception as e:
                raise outer from e
        except Exception as e:
            return e

    classify = checkpointing.classify_restore_error
    damaged = chained(
        Exception("Encountered error while reading array index"),
        ValueError("OUT_OF_RANGE: Requested byte range [1, 2) is not valid for value of size 1"),
    )
    assert classify(damaged) == checkpointing.CORRUPT
    assert "OUT_OF_RANGE" in checkpointing.describe_error(damaged)
    slow = chained(Exception("Encountered error"), TimeoutError("gs read timed out"))
    assert classify(slow) == checkpointing.TRANSIENT  # retried, never moved
    odd = chained(Exception("Encountered error"), ValueError("something else"))
    assert classify(odd) == checkpointing.OTHER  # stops the run, moves nothing
    assert classify(ValueError("(8, 5) is not compatible with the stored shape")) == (
        checkpointing.OTHER
    )
