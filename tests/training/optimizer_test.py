import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from bert_jax.models.bert import model as M
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.params import init_params, stack_layers, unstack_layers
from bert_jax.training import optimizer
from tests.common import TINY


def test_linear_schedule_warmup_then_decay_to_zero():
    s = optimizer.make_schedule("linear", 1e-4, warmup_steps=10, total_steps=110)
    assert float(s(0)) == 0.0
    np.testing.assert_allclose(float(s(5)), 0.5e-4, rtol=1e-6)
    np.testing.assert_allclose(float(s(10)), 1e-4, rtol=1e-6)
    np.testing.assert_allclose(float(s(60)), 0.5e-4, rtol=1e-6)
    np.testing.assert_allclose(float(s(110)), 0.0, atol=1e-12)
    np.testing.assert_allclose(float(s(200)), 0.0, atol=1e-12)


def _original_bert_lr(step, init_lr, num_train_steps, num_warmup_steps):
    """google-research/bert optimization.create_optimizer's learning rate, in numpy."""
    step = float(step)
    decayed = init_lr * (1.0 - min(step, num_train_steps) / num_train_steps) ** 1.0  # end 0
    if num_warmup_steps:
        is_warmup = float(int(step) < num_warmup_steps)
        warmup = init_lr * step / num_warmup_steps
        decayed = (1.0 - is_warmup) * decayed + is_warmup * warmup
    return decayed


@pytest.mark.parametrize("warmup", [0, 10, 37])
def test_bert_schedule_is_the_originals_formula(warmup):
    s = optimizer.make_schedule("bert", 2e-5, warmup_steps=warmup, total_steps=294)
    for step in (0, 1, 5, 9, 10, 11, 29, 36, 37, 38, 100, 200, 293, 294, 400):
        want = _original_bert_lr(step, 2e-5, 294, warmup)
        np.testing.assert_allclose(float(s(step)), want, rtol=1e-6, atol=1e-12, err_msg=step)


def test_bert_schedule_is_below_hugging_faces_after_warmup():
    bert = optimizer.make_schedule("bert", 1.0, warmup_steps=10, total_steps=110)
    hf = optimizer.make_schedule("linear", 1.0, warmup_steps=10, total_steps=110)
    assert float(bert(5)) == float(hf(5)) == 0.5
    np.testing.assert_allclose(float(bert(10)), 100 / 110, rtol=1e-6)  # not the peak
    assert all(float(bert(t)) < float(hf(t)) for t in (10, 50, 100))


def test_cosine_wsd_and_constant_schedules():
    cos = optimizer.make_schedule("cosine", 2.0, 0, 100, end_learning_rate=0.2)
    np.testing.assert_allclose(float(cos(0)), 2.0, rtol=1e-6)
    np.testing.assert_allclose(float(cos(50)), 0.2 + 1.8 * 0.5, rtol=1e-5)
    np.testing.assert_allclose(float(cos(100)), 0.2, rtol=1e-5)
    wsd = optimizer.make_schedule("wsd", 1.0, 10, 110, decay_fraction=0.2)  # decay: last 22
    np.testing.assert_allclose([float(wsd(t)) for t in (5, 10, 50, 88)], [0.5, 1, 1, 1], rtol=1e-6)
    np.testing.assert_allclose(float(wsd(99)), 0.5, rtol=1e-6)
    np.testing.assert_allclose(float(wsd(110)), 0.0, atol=1e-7)
    const = optimizer.make_schedule("constant", 3.0, 4, 10)
    assert [float(const(t)) for t in (2, 4, 9)] == [1.5, 3.0, 3.0]


@pytest.mark.parametrize(
    "args, match",
    [
        (("exp", 1.0, 0, 10), "unknown schedule"),
        (("linear", 1.0, 20, 10), "warmup_steps=20"),
        (("linear", -1.0, 0, 10), "positive"),
    ],
)
def test_schedule_errors(args, match):
    with pytest.raises(ValueError, match=match):
        optimizer.make_schedule(*args)


def test_weight_decay_mask_excludes_layer_norm_and_biases():
    for runtime in (RuntimeConfig(), RuntimeConfig(scan_layers=True)):
        params = init_params(M.BertForPreTraining(TINY, runtime), jax.random.PRNGKey(0))
        for tree in (params, nn.meta.unbox(params)):
            mask = traverse_util.flatten_dict(
                nn.meta.unbox(optimizer.weight_decay_mask(tree)), sep="/"
            )
            decayed = {k for k, v in mask.items() if v}
            assert "bert/embeddings/word_embeddings/embedding" in decayed  # as the original
            assert not any(k.endswith("/bias") for k in decayed)
            assert not any("LayerNorm" in k for k in decayed)
            assert "cls/predictions/bias" not in decayed
            layer = "bert/encoder/layer" if runtime.scan_layers else "bert/encoder/layer_0"
            assert f"{layer}/attention/self/query/kernel" in decayed
            assert f"{layer}/output/LayerNorm/scale" not in decayed


def _random_tree(seed):
    rng = np.random.default_rng(seed)
    return {
        "dense": {
            "kernel": rng.normal(size=(4, 3)).astype(np.float32),
            "bias": rng.normal(size=3).astype(np.float32),
        },
        "LayerNorm": {
            "scale": rng.normal(size=3).astype(np.float32),
            "bias": rng.normal(size=3).astype(np.float32),
        },
    }


def _run(tx, steps=4):
    params = jax.tree_util.tree_map(jnp.asarray, _random_tree(0))
    state = tx.init(params)
    for t in range(steps):
        grads = jax.tree_util.tree_map(jnp.asarray, _random_tree(100 + t))
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def test_adamw_with_bias_correction_equals_optax_adamw():
    ours = optimizer.make_optimizer(
        "adamw", 1e-2, weight_decay=0.01, clip_norm=None, bias_correction=True
    )
    ref = optax.adamw(
        1e-2, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=optimizer.weight_decay_mask
    )
    for a, b in zip(jax.tree_util.tree_leaves(_run(ours)), jax.tree_util.tree_leaves(_run(ref))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_adamw_matches_original_bert_update_without_bias_correction():
    """google-research/bert AdamWeightDecayOptimizer: m, v without bias correction; update =
    m / (sqrt(v) + eps) + wd * param (not for LayerNorm/bias); param -= lr * update."""
    lr, wd, b1, b2, eps = 1e-2, 0.01, 0.9, 0.999, 1e-6
    params = _random_tree(0)
    flat = traverse_util.flatten_dict(params, sep="/")
    m = {k: np.zeros_like(v) for k, v in flat.items()}
    v = {k: np.zeros_like(x) for k, x in flat.items()}
    for t in range(4):
        grads = traverse_util.flatten_dict(_random_tree(100 + t), sep="/")
        for k in flat:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            update = m[k] / (np.sqrt(v[k]) + eps)
            if not (k.endswith("bias") or "LayerNorm" in k):
                update += wd * flat[k]
            flat[k] = flat[k] - lr * update
    ours = traverse_util.flatten_dict(
        _run(optimizer.make_optimizer("adamw", lr, clip_norm=None)), sep="/"
    )
    for k in flat:
        np.testing.assert_allclose(ours[k], flat[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_lamb_equals_optax_lamb_with_the_same_mask():
    ours = optimizer.make_optimizer("lamb", 1e-2, weight_decay=0.01, clip_norm=None)
    ref = optax.lamb(1e-2, eps=1e-6, weight_decay=0.01, mask=optimizer.weight_decay_mask)
    for a, b in zip(jax.tree_util.tree_leaves(_run(ours)), jax.tree_util.tree_leaves(_run(ref))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_lamb_gives_each_stacked_layer_its_own_trust_ratio():
    """Scanned (stacked) layers get the same LAMB updates as unrolled ones: one trust ratio per
    layer's weight, not one over the whole stack."""
    unrolled = nn.meta.unbox(init_params(M.BertForPreTraining(TINY), jax.random.PRNGKey(0)))
    # Layers of different scales, so a ratio shared by the stack would differ from each own one.
    layer_1 = unrolled["bert"]["encoder"]["layer_1"]
    unrolled["bert"]["encoder"]["layer_1"] = jax.tree_util.tree_map(lambda x: 5 * x, layer_1)
    rng = np.random.default_rng(0)
    grads = [
        jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), unrolled)
        for _ in range(3)
    ]

    def run(tx, params, grads):
        state, update = tx.init(params), jax.jit(tx.update)  # one compile, not one per operation
        for g in grads:
            updates, state = update(g, state, params)
            params = optax.apply_updates(params, updates)
        return params

    tx = optimizer.make_optimizer("lamb", 1e-2, weight_decay=0.01, clip_norm=1.0)
    want = run(tx, unrolled, grads)
    got = run(tx, stack_layers(unrolled), [stack_layers(g) for g in grads])
    flat_want = traverse_util.flatten_dict(want, sep="/")
    flat_got = traverse_util.flatten_dict(unstack_layers(got), sep="/")
    assert flat_got.keys() == flat_want.keys()
    for k in flat_want:
        np.testing.assert_allclose(flat_got[k], flat_want[k], rtol=1e-5, atol=1e-7, err_msg=k)
    # optax's trust ratio over the whole stack does not give the unrolled result.
    ref = optax.lamb(1e-2, eps=1e-6, weight_decay=0.01, mask=optimizer.weight_decay_mask)
    stacked_ref = unstack_layers(run(ref, stack_layers(unrolled), [stack_layers(g) for g in grads]))
    key = "bert/encoder/layer_0/attention/self/query/kernel"
    diff = traverse_util.flatten_dict(stacked_ref, sep="/")[key] - flat_want[key]
    assert np.abs(diff).max() > 1e-4


def test_global_norm_clipping():
    tx = optimizer.make_optimizer("sgd", 1.0, weight_decay=0.0, clip_norm=1.0)
    params = {"w": jnp.zeros(4)}
    updates, _ = tx.update({"w": jnp.array([3.0, 4.0, 0.0, 0.0])}, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], [-0.6, -0.8, 0, 0], rtol=1e-6)
    with pytest.raises(ValueError, match="unknown optimizer"):
        optimizer.make_optimizer("adafactor", 1.0)


def test_stable_adamw_is_adamw_with_per_tensor_update_clipping():
    """StableAdamW (Wortsman et al. 2023): bias-corrected AdamW whose update of each tensor is
    divided by max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))). A gradient 10x the earlier ones
    (step 3) is clipped; the first step's ratio is exactly 1."""
    lr, wd, b1, b2, eps = 1e-2, 0.01, 0.9, 0.98, 1e-6
    flat = traverse_util.flatten_dict(_random_tree(0), sep="/")
    m = {k: np.zeros_like(x, np.float64) for k, x in flat.items()}
    v = {k: np.zeros_like(x, np.float64) for k, x in flat.items()}
    clipped = 0
    for t in range(1, 5):
        grads = traverse_util.flatten_dict(_random_tree(99 + t), sep="/")
        for k in flat:
            g = grads[k] * (10.0 if t == 3 else 1.0)
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g**2
            m_hat, v_hat = m[k] / (1 - b1**t), v[k] / (1 - b2**t)
            rms = np.sqrt(np.mean(g**2 / np.maximum(v_hat, eps**2)))
            clipped += rms > 1.001
            update = m_hat / (np.sqrt(v_hat) + eps) / max(1.0, rms)
            if not (k.endswith("bias") or "LayerNorm" in k):
                update = update + wd * flat[k]
            flat[k] = flat[k] - lr * update
    assert clipped  # the test exercises the clipping
    tx = optimizer.make_optimizer(
        "stable_adamw", lr, weight_decay=wd, b2=b2, clip_norm=None, bias_correction=True
    )
    params = jax.tree_util.tree_map(jnp.asarray, _random_tree(0))
    state = tx.init(params)
    for t in range(1, 5):
        scale = 10.0 if t == 3 else 1.0
        grads = jax.tree_util.tree_map(lambda g, s=scale: jnp.asarray(g) * s, _random_tree(99 + t))
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    ours = traverse_util.flatten_dict(params, sep="/")
    for k in flat:
        np.testing.assert_allclose(ours[k], flat[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_weight_decay_mask_skips_modernbert_norms():
    params = {
        "model": {
            "embeddings": {"tok_embeddings": {"embedding": 1.0}, "norm": {"scale": 1.0}},
            "layers_1": {
                "attn_norm": {"scale": 1.0},
                "mlp_norm": {"scale": 1.0, "bias": 1.0},
                "attn": {"Wqkv": {"kernel": 1.0}},
            },
            "final_norm": {"scale": 1.0},
        },
        "head": {"dense": {"kernel": 1.0}, "norm": {"scale": 1.0}},
        "decoder": {"bias": 1.0},
    }
    mask = traverse_util.flatten_dict(optimizer.weight_decay_mask(params), sep="/")
    assert sorted(k for k, decay in mask.items() if decay) == [
        "head/dense/kernel",
        "model/embeddings/tok_embeddings/embedding",
        "model/layers_1/attn/Wqkv/kernel",
    ]


def test_layerwise_lr_decay_scales_each_layer_as_electra():
    """ELECTRA's layer-wise decay: the update of layer i of n is AdamW's times
    decay^(n + 1 - i), the embeddings' times decay^(n + 2), the heads' (pooler, classifier)
    untouched; stacked layers (`scan_layers`) get the same factors slice by slice."""
    params = nn.meta.unbox(init_params(M.BertForPreTraining(TINY), jax.random.PRNGKey(0)))
    rng = np.random.default_rng(1)
    grads = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)
    plain = optimizer.make_optimizer("adamw", 1e-3, clip_norm=0.0)
    decayed = optimizer.make_optimizer("adamw", 1e-3, clip_norm=0.0, layerwise_lr_decay=0.8)
    want = traverse_util.flatten_dict(plain.update(grads, plain.init(params), params)[0], sep="/")
    got = traverse_util.flatten_dict(
        decayed.update(grads, decayed.init(params), params)[0], sep="/"
    )
    n = TINY.num_hidden_layers
    factors = {
        "bert/embeddings/word_embeddings/embedding": 0.8 ** (n + 2),
        "bert/embeddings/LayerNorm/scale": 0.8 ** (n + 2),
        "bert/encoder/layer_0/attention/self/query/kernel": 0.8 ** (n + 1),
        f"bert/encoder/layer_{n - 1}/output/dense/kernel": 0.8**2,
        "bert/pooler/dense/kernel": 1.0,
        "cls/seq_relationship/kernel": 1.0,
    }
    for key, factor in factors.items():
        np.testing.assert_allclose(got[key], factor * want[key], rtol=1e-6, err_msg=key)
    stacked = stack_layers(params)
    updates = decayed.update(stack_layers(grads), decayed.init(stacked), stacked)[0]
    flat = traverse_util.flatten_dict(unstack_layers(updates), sep="/")
    for key in got:
        np.testing.assert_allclose(flat[key], got[key], rtol=1e-6, err_msg=key)
    with pytest.raises(ValueError, match="layerwise_lr_decay=1.5"):
        optimizer.make_optimizer("adamw", 1e-3, layerwise_lr_decay=1.5)


def test_a_named_parameters_factor_scales_its_whole_update():
    """`factors` (an inference-free model's query weights' own rate, as a torch parameter group
    of its own learning rate on the same schedule): that top-level parameter's update, weight
    decay included, is AdamW's times its factor; every other parameter's is AdamW's."""
    rng = np.random.default_rng(0)
    params = {
        "query_weight": jnp.asarray(rng.random(7) + 0.5, jnp.float32),
        "documents": {"dense": {"kernel": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)}},
    }
    grads = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)
    schedule = optimizer.make_schedule("linear", 1e-3, warmup_steps=2, total_steps=10)
    plain = optimizer.make_optimizer("adamw", schedule, weight_decay=0.1)
    scaled = optimizer.make_optimizer(
        "adamw", schedule, weight_decay=0.1, factors={"query_weight": 50.0}
    )
    states = plain.init(params), scaled.init(params)
    for _ in range(3):  # through the warmup: the factor rides on the schedule
        want, state_a = plain.update(grads, states[0], params)
        got, state_b = scaled.update(grads, states[1], params)
        states = state_a, state_b
        np.testing.assert_allclose(got["query_weight"], 50.0 * want["query_weight"], rtol=1e-6)
        np.testing.assert_array_equal(
            got["documents"]["dense"]["kernel"], want["documents"]["dense"]["kernel"]
        )
    updates, _ = optimizer.scale_by_name({"query_weight": 0.5}).update(grads, optax.EmptyState())
    np.testing.assert_array_equal(updates["query_weight"], 0.5 * grads["query_weight"])
    np.testing.assert_array_equal(
        updates["documents"]["dense"]["kernel"], grads["documents"]["dense"]["kernel"]
    )
