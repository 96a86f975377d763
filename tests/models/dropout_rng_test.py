"""`RuntimeConfig.dropout_rng="rbg"` (XLA's RngBitGenerator) and "hash" (`models.hash_rng`):
dropout bits drawn from the run's threefry key and the step, so runs repeat and resume exactly;
the masks keep their rate; the hash's bits are the same whatever the sharding."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import hash_rng
from bert_jax.models.attention import dropout
from bert_jax.models.config import RuntimeConfig
from bert_jax.training import experiment, objectives, steps
from tests.training.steps_test import CFG, pretraining_batch, setup


def test_rbg_keys_draw_masks_at_the_rate_and_differ_from_threefry():
    rbg = steps.step_rng(jax.random.PRNGKey(0), jnp.int32(3), RuntimeConfig(dropout_rng="rbg"))
    assert jax.random.key_impl(rbg) == jax.random.key_impl(jax.random.key(0, impl="rbg"))
    ones = jnp.ones((200, 1000), jnp.float32)
    dropped = np.asarray(jax.jit(lambda k: dropout(ones, 0.1, k))(rbg))
    assert abs((dropped == 0).mean() - 0.1) < 0.003  # 200,000 draws: 5 standard errors
    np.testing.assert_allclose(dropped[dropped != 0], 1 / 0.9, rtol=1e-6)
    threefry = steps.step_rng(jax.random.PRNGKey(0), jnp.int32(3), RuntimeConfig())
    assert not np.array_equal(dropped, np.asarray(dropout(ones, 0.1, threefry)))
    with pytest.raises(ValueError, match="dropout_rng='philox'"):
        RuntimeConfig(dropout_rng="philox")


def test_hash_keys_draw_independent_masks_at_the_rate_whatever_the_sharding():
    """A hash key's masks keep the rate; keys folded apart (modules, steps) give uncorrelated
    masks; the bits are threefry's key words hashed, so they differ from threefry's and rbg's;
    sharded over 8 devices they are the single device's."""
    runtime = RuntimeConfig(dropout_rng="hash")
    key = steps.step_rng(jax.random.PRNGKey(0), jnp.int32(3), runtime)
    assert jax.random.key_impl(key) == jax.random.key_impl(
        hash_rng.hash_key(jnp.zeros(2, "uint32"))
    )
    ones = jnp.ones((200, 1000), jnp.float32)
    dropped = np.asarray(jax.jit(lambda k: dropout(ones, 0.1, k))(key))
    assert abs((dropped == 0).mean() - 0.1) < 0.003  # 200,000 draws: 5 standard errors
    np.testing.assert_allclose(dropped[dropped != 0], 1 / 0.9, rtol=1e-6)
    for other in ("threefry", "rbg"):
        theirs = steps.step_rng(
            jax.random.PRNGKey(0), jnp.int32(3), RuntimeConfig(dropout_rng=other)
        )
        assert not np.array_equal(dropped, np.asarray(dropout(ones, 0.1, theirs)))
    # Masks of keys folded apart (a module's name, the next step) are uncorrelated, bit by bit.
    bits = [np.asarray(jax.random.bits(k, (200_000,), jnp.uint32))
            for k in (key, jax.random.fold_in(key, 1), steps.step_rng(jax.random.PRNGKey(0),
                                                                     jnp.int32(4), runtime))]  # fmt: skip
    for word in bits:
        ones_per_bit = ((word[:, None] >> np.arange(32, dtype=np.uint32)) & 1).mean(axis=0)
        assert np.all(np.abs(ones_per_bit - 0.5) < 0.006)  # 200,000 draws: 5 standard errors
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert abs(np.corrcoef(bits[a] < 2**31, bits[b] < 2**31)[0, 1]) < 0.012
    # Neighbouring words of one draw are uncorrelated too.
    assert abs(np.corrcoef(bits[0][:-1] < 2**31, bits[0][1:] < 2**31)[0, 1]) < 0.012
    # The counter is the word's place in the whole array: sharding does not change the bits.
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("d",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    draw = jax.jit(lambda k: jax.random.bits(k, (64, 100), jnp.uint32), out_shardings=split)
    np.testing.assert_array_equal(
        np.asarray(draw(key)), np.asarray(jax.random.bits(key, (64, 100)))
    )
    assert jax.random.bits(key, (3,), jnp.uint16).dtype == jnp.uint16
    with pytest.raises(ValueError, match="fewer than 2\\^32 words"):
        jax.jit(lambda k: jax.random.bits(k, (2**16, 2**16))).lower(key)


@pytest.mark.parametrize("generator", ["rbg", "hash"])
def test_steps_repeat_resume_and_fold_in_the_step(generator):
    """The same state and step give the same loss (a resumed run's); the next step other masks;
    the checkpointed key is the threefry one either way."""
    model, tx, schedule, init = setup(runtime=RuntimeConfig(dropout_rng=generator))
    state = jax.jit(lambda r: nn.unbox(init(r)))(jax.random.PRNGKey(0))
    step = experiment.compile_train_step(
        model, tx, objectives.get_objective("pretraining"), donate=False
    )
    batch = pretraining_batch(CFG)
    after_one, m1 = step(state, batch)
    _, m1b = step(jax.device_put(jax.device_get(state)), batch)  # restored from the host
    _, m2 = step(after_one, batch)
    _, m2b = step(jax.device_put(jax.device_get(after_one)), batch)
    assert float(m1["loss"]) == float(m1b["loss"]) and float(m2["loss"]) == float(m2b["loss"])
    assert float(m1["loss"]) != float(step(state.replace(step=state.step + 1), batch)[1]["loss"])
    assert state.rng.shape == (2,) and state.rng.dtype == jnp.uint32
