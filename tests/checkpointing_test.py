import os

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax import checkpointing, sharding


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
    # Truncate every array file of the newest checkpoint (a bad disk, a killed copy).
    for root, _, files in os.walk(tmp_path / "2" / "state"):
        for f in files:
            if "manifest" in f or root.endswith("d"):
                with open(os.path.join(root, f), "wb") as fh:
                    fh.write(b"\x00\x01")
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
