"""`RuntimeConfig.dropout_rng="rbg"`: dropout bits from XLA's RngBitGenerator, drawn from the
run's threefry key and the step, so runs repeat and resume exactly; the masks keep their rate."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def test_rbg_steps_repeat_resume_and_fold_in_the_step():
    """The same state and step give the same loss (a resumed run's); the next step other masks;
    the checkpointed key is the threefry one either way."""
    model, tx, schedule, init = setup(runtime=RuntimeConfig(dropout_rng="rbg"))
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
