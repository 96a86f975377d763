"""ModernBERT's model and config without torch: packed rows against padded ones, the splash path
against the exact one, config.json, and a deviceless compile for a TPU slice.

Parity with transformers and conversion are in `modernbert_convert_test.py`.
"""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import families
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.modernbert import model as MB
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.parallel import sharding
from tests.common import MODERN

LENGTH = 9


def random_params(model: nn.Module, seed: int = 0):
    """`model`'s parameters with every one (norm scales and zero biases too) perturbed."""
    ids = jnp.ones((1, 2, 5) if getattr(type(model), "choices", False) else (1, 5), jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(seed), ids)["params"])
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    noisy = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return jax.tree_util.tree_unflatten(tree, noisy)


def _packed_vs_alone(model: nn.Module, restart_positions: bool):
    """Outputs of two sequences (lengths 5 and 3) packed in one row of 9 (one pad), and of each
    alone in a right-padded row."""
    params = random_params(model)
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, MODERN.vocab_size, 5), rng.integers(1, MODERN.vocab_size, 3)
    packed = np.zeros((1, LENGTH), np.int32)
    packed[0, :8] = np.concatenate([a, b])
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]]) if restart_positions else None
    alone = np.zeros((2, LENGTH), np.int32)
    alone[0, :5], alone[1, :3] = a, b
    alone_mask = (np.arange(LENGTH) < np.array([[5], [3]])).astype(np.int32)
    pooled = isinstance(model, MB.ModernBertForSequenceClassification)
    apply = jax.jit(lambda p, *args, **kw: model.apply({"params": p}, *args, **kw))
    out_packed = apply(
        params,
        packed,
        attention_mask=segments > 0,
        position_ids=positions,
        segment_ids=segments,
        cls_positions=np.array([[0, 5]]) if pooled else None,
    )
    return out_packed, apply(params, alone, attention_mask=alone_mask)


@pytest.mark.parametrize("restart_positions", [True, False], ids=["restarting", "row-positions"])
def test_packed_rows_equal_padded_rows(restart_positions):
    """Unpadding: packed sequences (segment_ids; local windows cut at their edges) give each
    sequence's own outputs, whether positions restart per sequence or run along the row (RoPE
    sees only distances)."""
    packed, alone = _packed_vs_alone(MB.ModernBertForMaskedLM(MODERN), restart_positions)
    np.testing.assert_allclose(packed.logits[0, :5], alone.logits[0, :5], atol=1e-5)
    np.testing.assert_allclose(packed.logits[0, 5:8], alone.logits[1, :3], atol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_sequence_classification_equals_padded(pooling):
    cfg = MODERN.replace(classifier_pooling=pooling)
    packed, alone = _packed_vs_alone(MB.ModernBertForSequenceClassification(cfg), True)
    assert packed.logits.shape == (1, 2, cfg.num_labels)
    np.testing.assert_allclose(packed.logits[0], alone.logits, atol=1e-5)


def test_masked_positions_equal_gathered_logits():
    model = MB.ModernBertForMaskedLM(MODERN)
    params = random_params(model)
    ids = np.random.default_rng(0).integers(1, MODERN.vocab_size, (2, LENGTH))
    mask = np.array([[1] * LENGTH, [0, 0] + [1] * (LENGTH - 2)])
    positions = jnp.array([[0, 3], [2, 8]])
    full = model.apply({"params": params}, ids, attention_mask=mask).logits
    some = model.apply({"params": params}, ids, attention_mask=mask, masked_positions=positions)
    assert full.shape == (2, LENGTH, MODERN.vocab_size) and full.dtype == jnp.float32
    np.testing.assert_allclose(
        some.logits, jnp.take_along_axis(full, positions[..., None], axis=1), atol=1e-6
    )


def test_splash_equals_xla_with_local_layers_and_packed_rows():
    """The model through splash (Pallas interpret mode: its LocalMask on the local layer,
    segment ids for packing and padding) equals the exact xla path at real tokens."""
    cfg = MODERN.replace(num_hidden_layers=2)
    rows = np.array([[1, 1, 1, 2, 2, 2, 2, 0, 0], [0, 0, 1, 1, 1, 1, 1, 1, 1]])
    ids = np.random.default_rng(2).integers(1, cfg.vocab_size, rows.shape)
    exact = MB.ModernBertModel(cfg)
    params = random_params(exact)
    splash = MB.ModernBertModel(cfg, RuntimeConfig(attention="splash"))
    kwargs = dict(attention_mask=rows > 0, segment_ids=rows)
    a = exact.apply({"params": params}, ids, **kwargs).last_hidden_state
    b = splash.apply({"params": params}, ids, **kwargs).last_hidden_state
    real = (rows > 0)[..., None]
    np.testing.assert_allclose(np.where(real, a, 0), np.where(real, b, 0), atol=1e-5)


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------
def test_config_round_trips_through_config_json(tmp_path):
    path = tmp_path / "config.json"
    MODERN.to_json_file(path, architecture="ModernBertForMaskedLM")
    assert families.config_from_json_file(tmp_path) == MODERN
    written = json.loads(path.read_text())
    assert written["model_type"] == "modernbert"
    assert written["global_rope_theta"] == 1000.0 and written["local_rope_theta"] == 77.0
    assert written["layer_types"] == ["full_attention", "sliding_attention", "full_attention"]
    assert written["rope_parameters"]["sliding_attention"]["rope_theta"] == 77.0
    # The original release's spelling: no layer_types or rope_parameters.
    legacy = {k: v for k, v in written.items() if k not in ("layer_types", "rope_parameters")}
    assert families.config_from_hf_dict(legacy) == MODERN
    # The newer one alone: the period is read from layer_types, the thetas from rope_parameters.
    newer = {
        k: v
        for k, v in written.items()
        if k not in ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta")
    }
    assert families.config_from_hf_dict(newer) == MODERN
    assert families.config_from_hf_dict(BertConfig().to_hf_dict()) == BertConfig()
    assert families.family_of(MODERN).base_model == "ModernBertModel"


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(hidden_size=36), "even size"),  # 4 heads of 9
        (dict(local_attention=0), "positive integer"),
        (dict(classifier_pooling="max"), "classifier_pooling"),
        (dict(hidden_activation="swish"), "unknown activation"),
        (dict(attention_dropout=1.0), "probability"),
        (dict(norm_bias=1), "bool"),
        (dict(pad_token_id=99), "pad_token_id"),
        (dict(label_names=("a",)), "label_names"),
    ],
)
def test_config_checks_its_fields(change, match):
    with pytest.raises(ValueError, match=match):
        MODERN.replace(**change)


def test_config_refuses_layer_types_and_rope_it_does_not_implement():
    d = MODERN.to_hf_dict()
    with pytest.raises(ValueError, match="layer_types"):
        ModernBertConfig.from_hf_dict({**d, "layer_types": ["sliding_attention"] * 3})
    rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0}}
    with pytest.raises(ValueError, match="RoPE"):
        ModernBertConfig.from_hf_dict({**d, "rope_parameters": rope})
    with pytest.raises(ValueError, match="model_type"):
        families.config_from_hf_dict({**d, "model_type": "gpt2"})


# --------------------------------------------------------------------------------------------
# Compiled for a TPU without one
# --------------------------------------------------------------------------------------------
def test_compiles_deviceless_for_a_tpu_topology_with_splash_local_masks():
    """A small masked-LM forward + backward on packed rows, sharded over a v5e 2x2 slice
    (data 2, tensor 2), compiled by libtpu on this CPU host: `auto` resolves to splash, and the
    program holds two kernels each way. The local layer's is the one with splash's LocalMask:
    the mask is computed inside the kernel from the query positions, one operand more than the
    global layers' kernel (which two global layers share)."""
    pytest.importorskip("libtpu", reason="needs the tpu extra (libtpu)")
    from bert_jax.models.params import init_params
    from bert_jax.parallel import aot

    mesh = sharding.make_mesh(dict(data=2, fsdp=1, tensor=2), aot.topology_devices("v5e:2x2"))
    cfg = MODERN.replace(hidden_size=128, local_attention=16)  # head size 32
    runtime = RuntimeConfig(dtype="auto", attention="auto").resolved("tpu")
    model = MB.ModernBertForMaskedLM(cfg, runtime)
    rules = list(sharding.DEFAULT_RULES)
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
    params = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        nn.unbox(boxed),
        sharding.logical_shardings(boxed, mesh, rules),
    )
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(sharding.BATCH_AXES))
    names = ("input_ids", "attention_mask", "segment_ids")
    batch = {n: jax.ShapeDtypeStruct((4, 40), jnp.int32, sharding=rows) for n in names}

    def loss(p, b):
        return jnp.mean(jnp.square(model.apply({"params": p}, **b, deterministic=False).logits))

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        lowered = jax.jit(jax.value_and_grad(loss)).lower(params, batch)
        compiled = lowered.compile()
    calls = [line for line in lowered.as_text().splitlines() if "tpu_custom_call(" in line]
    operands = sorted(line.split("tpu_custom_call(")[1].split(")")[0].count("%") for line in calls)
    assert len(calls) == 4, operands  # global and local, forward and backward
    forward_global, forward_local, backward_global, backward_local = operands
    assert forward_local == forward_global + 1 and backward_local == backward_global + 1
    assert compiled.memory_analysis().temp_size_in_bytes < 64 * 2**20
