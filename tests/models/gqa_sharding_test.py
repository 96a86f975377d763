"""Grouped-query attention under tensor parallelism, on 8 simulated devices (data 2, tensor 4):
EuroBERT's 8 query heads over 2 key/value heads (fewer than the tensor axis: k_proj and v_proj
are replicated along it, the query heads split 2 a device) and over 4 (one a device). The masked
LM's loss and every gradient equal the unsharded model's on one device within 1e-5."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.eurobert import model as EB
from bert_jax.models.eurobert.config import EuroBertConfig
from bert_jax.models.params import init_params
from bert_jax.models.rotary import RopeParameters
from bert_jax.parallel import sharding


def _config(kv_heads: int) -> EuroBertConfig:
    return EuroBertConfig(
        vocab_size=96, hidden_size=64, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=kv_heads, max_position_embeddings=32,
        initializer_range=0.2, pad_token_id=1, bos_token_id=0, eos_token_id=1, mask_token_id=2,
        rope_parameters=RopeParameters(rope_theta=50.0),
    )  # fmt: skip


def _batch() -> dict[str, jnp.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((4, 12), np.int32)
    mask[1, 7:] = 0
    mask[3, :5] = 0  # left padding
    return {"input_ids": jnp.asarray(rng.integers(3, 96, (4, 12)), jnp.int32),
            "attention_mask": jnp.asarray(mask)}  # fmt: skip


@pytest.mark.e2e  # two compiles of each model (about 20 s a case on 2 cores): the suite's time
@pytest.mark.parametrize("kv_heads", [2, 4], ids=["kv2-below-tensor4", "kv4-equal"])
def test_grouped_query_attention_is_exact_under_tensor_parallelism(kv_heads):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    model = EB.EuroBertForMaskedLM(_config(kv_heads))
    boxed = init_params(model, jax.random.PRNGKey(0))
    params, batch = nn.unbox(boxed), _batch()

    def loss(p, b):
        logits = model.apply({"params": p}, **b).logits
        return jnp.mean(jnp.square(logits) * b["attention_mask"][..., None])

    want, want_grads = jax.jit(jax.value_and_grad(loss))(params, batch)

    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 4}, jax.devices()[:8])
    rules = list(sharding.DEFAULT_RULES)
    shardings = sharding.logical_shardings(boxed, mesh, rules)
    k_spec = shardings["model"]["layers_0"]["self_attn"]["k_proj"]["kernel"].spec
    q_spec = shardings["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"].spec
    assert "tensor" in tuple(q_spec)  # the query heads split over the tensor axis
    assert ("tensor" in tuple(k_spec)) == (kv_heads % 4 == 0), k_spec
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        placed = jax.device_put(params, shardings)
        rows = jax.device_put(batch, sharding.batch_shardings(batch, mesh))
        got, grads = jax.jit(jax.value_and_grad(loss))(placed, rows)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for (path, g), w in zip(
        jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(want_grads)
    ):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
