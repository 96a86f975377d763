import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from bert_jax.models import families
from bert_jax.models.bert import model as M
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.params import (
    count_params,
    init_params,
    is_stacked,
    stack_layers,
    unstack_layers,
)
from tests.common import MODERN, TINY, random_batch

KEY = jax.random.PRNGKey(0)

# The parameter table of ../shared/seeds/003: BertModel base. (Its BERT-large total, 335,043,584,
# is an arithmetic slip: its per-layer sum 12,592,128 omits the 4,096-wide intermediate bias; the
# real count, which transformers gives too, is 335,141,888.)
BASE_PARAMS = 109_482_240
LARGE_PARAMS = 335_141_888


def _abstract_count(model):
    return count_params(jax.eval_shape(lambda: init_params(model, KEY)))


def test_parameter_counts_base_and_large():
    assert _abstract_count(M.BertModel(BertConfig.preset("base"))) == BASE_PARAMS
    assert _abstract_count(M.BertModel(BertConfig.preset("large"))) == LARGE_PARAMS
    # Embeddings / encoder / pooler split of the seed table for BERT-base.
    shapes = jax.eval_shape(lambda: init_params(M.BertModel(BertConfig()), KEY))
    parts = {k: count_params(v) for k, v in shapes.items()}
    assert parts == {"embeddings": 23_837_184, "encoder": 85_054_464, "pooler": 590_592}


@pytest.mark.torch
@pytest.mark.parametrize(
    "preset", ["tiny", "L4-H512", "L12-H256", "base", pytest.param("large", marks=pytest.mark.full)]
)
def test_parameter_counts_equal_transformers(preset):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = BertConfig.preset(preset)
    hf_cfg = transformers.BertConfig(**cfg.to_hf_dict())
    for cls in M.ROLES.values():
        name = cls.__name__
        with torch.device("meta"):
            theirs = sum(p.numel() for p in getattr(transformers, name)(hf_cfg).parameters())
        assert _abstract_count(cls(cfg)) == theirs, name


@pytest.mark.parametrize("name", sorted(c.__name__ for c in M.ROLES.values()))
def test_head_shapes_and_dtypes(name):
    cls = getattr(M, name)
    batch = random_batch(TINY)
    b, length = batch["input_ids"].shape
    if name == "BertForMultipleChoice":
        batch = {k: np.stack([v, v[::-1]], axis=1) for k, v in batch.items()}
    module = cls(TINY)
    params = init_params(module, KEY)
    out = module.apply(
        {"params": params}, **batch, output_hidden_states=True, output_attentions=True
    )
    e, v, n = TINY.hidden_size, TINY.vocab_size, TINY.num_labels
    expected = {
        "BertModel": {"last_hidden_state": (b, length, e), "pooler_output": (b, e)},
        "BertForPreTraining": {
            "prediction_logits": (b, length, v),
            "seq_relationship_logits": (b, 2),
        },
        "BertForMaskedLM": {"logits": (b, length, v)},
        "BertForNextSentencePrediction": {"logits": (b, 2)},
        "BertForSequenceClassification": {"logits": (b, n)},
        "BertForMultipleChoice": {"logits": (b, 2)},
        "BertForTokenClassification": {"logits": (b, length, n)},
        "BertForQuestionAnswering": {"start_logits": (b, length), "end_logits": (b, length)},
    }[name]
    for field, shape in expected.items():
        value = getattr(out, field)
        assert value.shape == shape, field
        assert value.dtype == jnp.float32, field
    rows = b * 2 if name == "BertForMultipleChoice" else b
    assert len(out.hidden_states) == TINY.num_hidden_layers + 1
    assert all(h.shape == (rows, length, e) for h in out.hidden_states)
    assert len(out.attentions) == TINY.num_hidden_layers
    assert all(a.shape == (rows, TINY.num_attention_heads, length, length) for a in out.attentions)


def test_regression_head_has_one_output():
    cfg = TINY.replace(num_labels=1)
    module = M.BertForSequenceClassification(cfg)
    params = init_params(module, KEY)
    out = module.apply({"params": params}, **random_batch(cfg))
    assert out.logits.shape == (3, 1)


def _tiny_base_params():
    module = M.BertModel(TINY)
    return module, init_params(module, KEY)


def test_padding_never_changes_real_positions():
    module, params = _tiny_base_params()
    batch = random_batch(TINY, batch=3, length=9)
    out = module.apply({"params": params}, **batch, output_attentions=True)
    changed = dict(batch)
    ids = batch["input_ids"].copy()
    ids[batch["attention_mask"] == 0] = 7  # new junk in the padded slots
    changed["input_ids"] = ids
    types = batch["token_type_ids"].copy()
    types[batch["attention_mask"] == 0] = 2
    changed["token_type_ids"] = types
    out2 = module.apply({"params": params}, **changed, output_attentions=True)
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_array_equal(out.last_hidden_state[real], out2.last_hidden_state[real])
    np.testing.assert_array_equal(out.pooler_output, out2.pooler_output)
    # Attention never lands on a padded key.
    for probs in out.attentions:
        assert float(jnp.max(probs * (1 - batch["attention_mask"])[:, None, None, :])) == 0.0


def test_attention_probabilities_sum_to_one():
    module, params = _tiny_base_params()
    out = module.apply({"params": params}, **random_batch(TINY), output_attentions=True)
    for probs in out.attentions:
        np.testing.assert_allclose(np.sum(probs, -1), 1.0, atol=1e-6)


def test_deterministic_repeats_and_dropout_needs_and_uses_rng():
    module, params = _tiny_base_params()
    batch = random_batch(TINY)
    a = module.apply({"params": params}, **batch).last_hidden_state
    b = module.apply({"params": params}, **batch).last_hidden_state
    np.testing.assert_array_equal(a, b)
    with pytest.raises(Exception, match="dropout"):
        module.apply({"params": params}, **batch, deterministic=False)
    run = lambda k: (
        module.apply(  # noqa: E731
            {"params": params}, **batch, deterministic=False, rngs={"dropout": k}
        ).last_hidden_state
    )
    d1, d2, d1b = run(jax.random.PRNGKey(1)), run(jax.random.PRNGKey(2)), run(jax.random.PRNGKey(1))
    np.testing.assert_array_equal(d1, d1b)
    assert not np.allclose(d1, d2)
    assert not np.allclose(d1, a)


def test_masked_positions_equal_gathered_full_logits():
    module = M.BertForPreTraining(TINY)
    params = init_params(module, KEY)
    batch = random_batch(TINY, length=11)
    positions = np.array([[1, 4, 0], [2, 3, 5], [7, 0, 0]], np.int32)
    full = module.apply({"params": params}, **batch).prediction_logits
    masked = module.apply({"params": params}, **batch, masked_positions=positions)
    np.testing.assert_allclose(
        masked.prediction_logits, np.take_along_axis(full, positions[..., None], 1), atol=1e-6
    )
    assert masked.prediction_logits.shape == (3, 3, TINY.vocab_size)
    lm = M.BertForMaskedLM(TINY)
    lm_params = init_params(lm, KEY)
    full = lm.apply({"params": lm_params}, **batch).logits
    masked = lm.apply({"params": lm_params}, **batch, masked_positions=positions).logits
    np.testing.assert_allclose(masked, np.take_along_axis(full, positions[..., None], 1), atol=1e-6)


def test_decoder_is_tied_to_word_embeddings():
    module = M.BertForPreTraining(TINY)
    params = nn.meta.unbox(init_params(module, KEY))
    flat = traverse_util.flatten_dict(params, sep="/")
    assert not any("decoder" in k for k in flat)
    assert flat["cls/predictions/bias"].shape == (TINY.vocab_size,)
    # Changing the word embeddings changes the MLM logits through the tied decoder.
    batch = random_batch(TINY)
    out = module.apply({"params": params}, **batch).prediction_logits
    emb = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    bumped = jax.tree_util.tree_map(lambda x: x, params)
    bumped["bert"]["embeddings"]["word_embeddings"]["embedding"] = emb.at[5].add(1.0)
    out2 = module.apply({"params": bumped}, **batch).prediction_logits
    assert not np.allclose(out[..., 5], out2[..., 5])


@pytest.mark.parametrize("remat", ["none", "dots", "full"])
def test_scan_layers_equals_unrolled(remat):
    module, params = _tiny_base_params()
    scanned = M.BertModel(TINY, RuntimeConfig(scan_layers=True, remat_policy=remat))
    stacked = stack_layers(nn.meta.unbox(params))
    assert stacked["encoder"]["layer"]["attention"]["self"]["query"]["kernel"].shape == (
        TINY.num_hidden_layers,
        32,
        4,
        8,
    )
    batch = random_batch(TINY)
    flags = dict(output_hidden_states=True, output_attentions=True)
    a = jax.jit(lambda p, b: module.apply({"params": p}, **b, **flags))(params, batch)
    b = jax.jit(lambda p, b: scanned.apply({"params": p}, **b, **flags))(stacked, batch)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, atol=1e-6)
    # Gradients agree as well (remat changes what is stored, never the result).
    # A fixed random projection: sum(h**2) after LayerNorm is nearly constant, its gradient noise.
    proj = jax.random.normal(jax.random.PRNGKey(9), (3, 7, TINY.hidden_size))

    def loss(p, m):
        return jnp.sum(m.apply({"params": p}, **batch).last_hidden_state * proj)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    ga = stack_layers(grad(nn.meta.unbox(params), module))
    gb = grad(stacked, scanned)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-4)
    for x, y in zip(
        jax.tree_util.tree_leaves(unstack_layers(stacked)),
        jax.tree_util.tree_leaves(nn.meta.unbox(params)),
    ):
        np.testing.assert_array_equal(x, y)


def test_scanned_init_carries_layer_axis_name():
    module = M.BertForPreTraining(TINY, RuntimeConfig(scan_layers=True))
    params = init_params(module, KEY)
    kernel = params["bert"]["encoder"]["layer"]["intermediate"]["dense"]["kernel"]
    assert kernel.names == ("layers", "embed", "mlp")
    assert kernel.value.shape == (2, 32, 37)


def test_a_heads_layers_stack_and_unstack_through_its_encoder():
    """A head's tree stacks under its encoder (`bert/encoder/layer`), the rest untouched."""
    params = nn.meta.unbox(init_params(M.BertForPreTraining(TINY), KEY))
    stacked = stack_layers(params)
    assert is_stacked(stacked) and not is_stacked(params)
    assert set(stacked["bert"]["encoder"]) == {"layer"}
    assert (
        stacked["cls"] is params["cls"]
        and stacked["bert"]["embeddings"] is params["bert"]["embeddings"]
    )
    assert stack_layers(stacked) is stacked and unstack_layers(params) is params
    back = unstack_layers(stacked)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)


def test_a_family_never_scanned_is_never_stacked():
    params = nn.meta.unbox(init_params(get_model_class("ModernBertForMaskedLM")(MODERN), KEY))
    assert not is_stacked(params) and unstack_layers(params) is params
    with pytest.raises(ValueError, match="modernbert's layers are never scanned"):
        stack_layers(params)
    with pytest.raises(ValueError, match="holds the layers of no known family.*'head'"):
        stack_layers({"head": {"kernel": np.zeros(2)}})
    assert not is_stacked({"head": {"kernel": np.zeros(2)}})


def test_a_new_family_stacks_by_its_row_alone(monkeypatch):
    """Stacking reads the registry row: a family with other names needs no code of its own."""
    row = dataclasses.replace(
        families.FAMILIES["bert"],
        model_type="toy",
        encoder_name="trunk",
        layers_path=("blocks",),
        layer_name="block{}",
        scanned_layer="block",
    )
    monkeypatch.setitem(families.FAMILIES, "toy", row)
    block = lambda v: {"w": np.full((2, 3), v), "b": np.full(3, v)}  # noqa: E731
    tree = {"trunk": {"blocks": {f"block{i}": block(i) for i in range(3)}, "emb": 7}, "out": 1}
    stacked = stack_layers(tree)
    assert is_stacked(stacked)
    assert stacked["out"] == 1 and stacked["trunk"]["emb"] == 7
    assert stacked["trunk"]["blocks"]["block"]["w"].shape == (3, 2, 3)
    np.testing.assert_array_equal(stacked["trunk"]["blocks"]["block"]["b"][:, 0], [0, 1, 2])
    back = unstack_layers(stacked)
    assert sorted(back["trunk"]["blocks"]) == ["block0", "block1", "block2"]
    np.testing.assert_array_equal(back["trunk"]["blocks"]["block2"]["w"], block(2)["w"])


@pytest.mark.parametrize("model_type", sorted(families.FAMILIES))
def test_starting_paths_name_parameters_of_the_pretraining_heads(model_type):
    """Each family's starting-value paths (`Family.starting_paths`) are parameters of its MLM
    head, with the shapes the pretraining job's values have."""
    family = families.FAMILIES[model_type]
    tiny = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37)
    own = {"bert": TINY, "modernbert": MODERN}
    cfg = own.get(model_type) or family.config_class.preset("tiny", **tiny)
    module = family.model_classes[family.head_for(families.Role.MASKED_LM)](cfg)
    flat = traverse_util.flatten_dict(
        nn.meta.unbox(jax.eval_shape(lambda: init_params(module, KEY)))
    )
    want = {
        "mlm_bias": (cfg.padded_vocab_size,),
        "position_embeddings": (
            getattr(cfg, "max_position_embeddings", 0),
            getattr(cfg, "embedding_size", None) or cfg.hidden_size,  # ELECTRA's may be less
        ),
    }
    # EuroBERT's has none (no MLM bias, no position table); each other family's has some.
    assert family.starting_paths or model_type == "eurobert"
    assert set(family.starting_paths) <= set(want)
    for role, path in family.starting_paths.items():
        assert flat[path].shape == want[role], (role, path)


def test_every_parameter_has_logical_axes():
    allowed = {"vocab", "embed", "heads", "kv", "mlp", "layers", None}
    for cls in M.ROLES.values():
        name = cls.__name__
        params = init_params(cls(TINY), KEY)
        leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
        for leaf in leaves:
            assert isinstance(leaf, nn.Partitioned), name
            assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= allowed, name
    params = init_params(M.BertModel(TINY), KEY)
    q = params["encoder"]["layer_0"]["attention"]["self"]["query"]["kernel"]
    assert q.names == ("embed", "heads", "kv")
    assert params["embeddings"]["word_embeddings"]["embedding"].names == ("vocab", "embed")
    out = params["encoder"]["layer_0"]["attention"]["output"]["dense"]["kernel"]
    assert out.names == ("heads", "kv", "embed")


def test_packed_sequences_equal_separate_ones():
    """Two sequences packed in one row (segment ids, restarted positions) give the outputs each
    gives alone: attention never crosses a segment."""
    module, params = _tiny_base_params()
    rng = np.random.default_rng(3)
    a = rng.integers(1, 99, size=5).astype(np.int32)
    b = rng.integers(1, 99, size=4).astype(np.int32)
    ta = np.array([0, 0, 1, 1, 1], np.int32)
    tb = np.array([0, 1, 1, 2, 0], np.int32)[:4]
    length = 11
    ids = np.zeros((1, length), np.int32)
    ids[0, :5], ids[0, 5:9] = a, b
    types = np.zeros((1, length), np.int32)
    types[0, :5], types[0, 5:9] = ta, tb
    seg = np.zeros((1, length), np.int32)
    seg[0, :5], seg[0, 5:9] = 1, 2
    pos = np.zeros((1, length), np.int32)
    pos[0, :5], pos[0, 5:9] = np.arange(5), np.arange(4)
    mask = (seg > 0).astype(np.int32)
    packed = module.apply(
        {"params": params},
        ids,
        token_type_ids=types,
        attention_mask=mask,
        position_ids=pos,
        segment_ids=seg,
        cls_positions=np.array([[0, 5]], np.int32),
    )
    alone_a = module.apply({"params": params}, a[None], token_type_ids=ta[None])
    alone_b = module.apply({"params": params}, b[None], token_type_ids=tb[None])
    np.testing.assert_allclose(
        packed.last_hidden_state[0, :5], alone_a.last_hidden_state[0], atol=2e-6
    )
    np.testing.assert_allclose(
        packed.last_hidden_state[0, 5:9], alone_b.last_hidden_state[0], atol=2e-6
    )
    np.testing.assert_allclose(packed.pooler_output[0, 0], alone_a.pooler_output[0], atol=2e-6)
    np.testing.assert_allclose(packed.pooler_output[0, 1], alone_b.pooler_output[0], atol=2e-6)


def test_bfloat16_compute_within_bf16_tolerance_of_float32():
    cfg = BertConfig.preset("L2-H128", vocab_size=301, max_position_embeddings=64)
    f32 = M.BertForPreTraining(cfg)
    bf16 = M.BertForPreTraining(cfg, RuntimeConfig(dtype="bfloat16"))
    params = init_params(f32, KEY)
    batch = random_batch(cfg, batch=4, length=32)
    a = jax.jit(f32.apply)({"params": params}, **batch)
    b = jax.jit(bf16.apply)({"params": params}, **batch)
    for x, y in (
        (a.prediction_logits, b.prediction_logits),
        (a.seq_relationship_logits, b.seq_relationship_logits),
    ):
        assert y.dtype == jnp.float32
        scale = float(jnp.max(jnp.abs(x)))
        err = float(jnp.max(jnp.abs(x - y)))
        assert err <= 0.05 * scale, (err, scale)  # bf16 keeps 8 bits of mantissa
        assert err > 0  # it really ran in bfloat16
    # Parameters can be stored in bfloat16 too.
    both = M.BertModel(cfg, RuntimeConfig(dtype="bfloat16", param_dtype="bfloat16"))
    p16 = init_params(both, KEY)
    leaf = jax.tree_util.tree_leaves(nn.meta.unbox(p16))[0]
    assert leaf.dtype == jnp.bfloat16
    assert jax.jit(both.apply)({"params": p16}, **batch).last_hidden_state.dtype == jnp.bfloat16


def test_bfloat16_gradients_within_bf16_tolerance_of_float32():
    # The backward pass in bfloat16 (on whatever CPU runs the tests: bfloat16 matmuls are emulated
    # where it has no bfloat16 units, computed natively where it has AMX or AVX-512 BF16).
    cfg = BertConfig.preset("L2-H128", vocab_size=301, max_position_embeddings=64)
    batch = random_batch(cfg, batch=4, length=32)
    positions = jnp.asarray(np.tile([3, 9, 17, 25], (4, 1)), jnp.int32)
    labels = jax.random.randint(KEY, (4, 4), 0, cfg.vocab_size)

    def grads(dtype):
        model = M.BertForPreTraining(cfg, RuntimeConfig(dtype=dtype))

        def loss_fn(params):
            out = model.apply({"params": params}, **batch, masked_positions=positions)
            logp = jax.nn.log_softmax(out.prediction_logits)
            return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

        return jax.jit(jax.grad(loss_fn))(params)  # one compile, not one per operation

    params = nn.meta.unbox(init_params(M.BertForPreTraining(cfg), KEY))
    g32, g16 = grads("float32"), grads("bfloat16")
    for path, a in traverse_util.flatten_dict(g32, sep="/").items():
        b = traverse_util.flatten_dict(g16, sep="/")[path]
        assert b.dtype == jnp.float32, path  # gradients of the float32 master weights
        a, b = np.ravel(a), np.ravel(b)
        if np.linalg.norm(a) < 1e-6:  # e.g. the pooler's, which this loss does not reach
            continue
        cosine = np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))
        assert cosine > 0.99, (path, cosine)
        assert np.linalg.norm(a - b) <= 0.1 * np.linalg.norm(a), path


def test_bfloat16_mlm_logits_are_not_rounded_to_bfloat16():
    cfg = BertConfig.preset("L2-H128", vocab_size=301, max_position_embeddings=64)
    bf16 = M.BertForPreTraining(cfg, RuntimeConfig(dtype="bfloat16"))
    params = init_params(bf16, KEY)
    batch = random_batch(cfg, batch=4, length=32)
    positions = np.tile(np.arange(1, 6, dtype=np.int32), (4, 1))
    apply = jax.jit(lambda p, b, m: bf16.apply({"params": p}, **b, masked_positions=m))
    logits = apply(params, batch, positions).prediction_logits
    assert logits.dtype == jnp.float32
    # The decoder's products are summed in float32 (bias 0 at init): most logits need more than
    # bfloat16's 8 bits of mantissa. Rounded to bfloat16 first, every one would be representable.
    rounded = logits.astype(jnp.bfloat16).astype(jnp.float32)
    assert float(jnp.mean(logits != rounded)) > 0.9


def test_bad_inputs_raise_clear_errors():
    module, params = _tiny_base_params()
    batch = random_batch(TINY)
    with pytest.raises(ValueError, match="token_type_ids has shape"):
        module.apply(
            {"params": params}, batch["input_ids"], token_type_ids=batch["token_type_ids"][:, :3]
        )
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        module.apply({"params": params}, np.ones((1, 65), np.int32))
    with pytest.raises(ValueError, match=r"input_ids must be \[batch, length\]"):
        module.apply({"params": params}, np.ones((7,), np.int32))
    with pytest.raises(ValueError, match="unknown model class"):
        get_model_class("BertForEverything")


def test_fused_attention_path_equals_reference_at_real_positions():
    """`fused_xla` runs jax.nn.dot_product_attention (the cuDNN code path, XLA backend): padded
    rows through their lengths, packed rows through the segment mask."""
    cfg = TINY.replace(attention_probs_dropout_prob=0.0)
    ref = M.BertForPreTraining(cfg)
    fused = M.BertForPreTraining(cfg, RuntimeConfig(attention="fused_xla", scan_layers=True))
    params = nn.meta.unbox(init_params(ref, KEY))
    stacked = stack_layers(params)
    batch = random_batch(cfg, batch=3, length=9)
    real = batch["attention_mask"].astype(bool)
    a = jax.jit(ref.apply)({"params": params}, **batch)
    b = jax.jit(fused.apply)({"params": stacked}, **batch)
    np.testing.assert_allclose(a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-5)
    np.testing.assert_allclose(a.prediction_logits[real], b.prediction_logits[real], atol=1e-4)
    # Training (hidden dropout on, attention dropout off): same loss and gradients.
    positions = np.array([[1, 2], [3, 1], [2, 4]], np.int32)
    proj = jax.random.normal(jax.random.PRNGKey(3), (3, 2, cfg.vocab_size))

    def loss(p, m):
        out = m.apply(
            {"params": p},
            **batch,
            masked_positions=positions,
            deterministic=False,
            rngs={"dropout": jax.random.PRNGKey(5)},
        )
        return jnp.sum(out.prediction_logits * proj)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    ga = grad(stacked, M.BertForPreTraining(cfg, RuntimeConfig(scan_layers=True)))
    gb = grad(stacked, fused)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4)


def test_fused_attention_with_packed_rows():
    cfg = TINY.replace(attention_probs_dropout_prob=0.0)
    ref, fused = M.BertModel(cfg), M.BertModel(cfg, RuntimeConfig(attention="fused_xla"))
    params = init_params(ref, KEY)
    ids = np.arange(1, 12, dtype=np.int32)[None] % 90 + 3
    seg = np.array([[1, 1, 1, 1, 2, 2, 2, 3, 3, 0, 0]], np.int32)
    pos = np.array([[0, 1, 2, 3, 0, 1, 2, 0, 1, 0, 0]], np.int32)
    kwargs = dict(
        attention_mask=(seg > 0).astype(np.int32),
        position_ids=pos,
        segment_ids=seg,
        cls_positions=np.array([[0, 4, 7]], np.int32),
    )
    a = ref.apply({"params": params}, ids, **kwargs)
    b = fused.apply({"params": params}, ids, **kwargs)
    np.testing.assert_allclose(a.last_hidden_state[0, :9], b.last_hidden_state[0, :9], atol=1e-5)
    np.testing.assert_allclose(a.pooler_output, b.pooler_output, atol=1e-5)


def test_fused_attention_refuses_attention_dropout_and_auto_falls_back():
    batch = random_batch(TINY)
    for name in ("fused_xla", "cudnn", "splash"):
        dtype = "bfloat16" if name == "cudnn" else "float32"  # cuDNN refuses float32 at once
        model = M.BertModel(TINY, RuntimeConfig(dtype=dtype, attention=name))
        params = init_params(M.BertModel(TINY), KEY)
        with pytest.raises(ValueError, match="attention-probability dropout"):
            model.apply({"params": params}, **batch, deterministic=False, rngs={"dropout": KEY})
    auto = M.BertModel(TINY, RuntimeConfig(attention="auto"))  # CPU: the exact xla path
    params = init_params(auto, KEY)
    out = auto.apply({"params": params}, **batch, deterministic=False, rngs={"dropout": KEY})
    assert np.isfinite(np.asarray(out.last_hidden_state)).all()
