"""Attention kernels against the exact xla path, and the choice among them on every platform.

Splash attention runs here in Pallas interpret mode (the CPU executes the TPU kernel's program);
one test compiles it for a TPU topology without a TPU (libtpu's deviceless compilation).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from bert_jax import hardware
from bert_jax.models import attention as A
from bert_jax.models.bert import model as M
from bert_jax.models.bert.config import PRESETS, BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.params import init_params
from tests.common import TINY, load_config_file, random_batch

KEY = jax.random.PRNGKey(0)

# Masks of 3 rows of length 7: full, right-padded, and left padding with a hole.
TOKENS = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 1, 1]], bool)
# Two packed rows: three sequences then padding, and two sequences.
SEGMENTS = np.array([[1, 1, 1, 2, 2, 3, 0], [1, 1, 1, 1, 2, 2, 2]], np.int32)


# Splash is a TPU kernel, interpreted here on CPU; on a GPU (benchmarks/gpu_suite.py runs this
# file there) the library refuses it, as it should.
NOT_ON_GPU = pytest.mark.skipif(jax.default_backend() == "gpu", reason="splash is refused on a GPU")
SPLASH = pytest.param("splash", marks=NOT_ON_GPU)


def _qkv(batch, length, heads=4, head_dim=8, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, k, v, w = (jax.random.normal(x, (batch, length, heads, head_dim), dtype) for x in keys)
    return q, k, v, w.astype(jnp.float32)


def _at_real(x, tokens):
    """x [B, L, ...] with the positions of padding tokens zeroed (their outputs are unspecified)."""
    return jnp.where(jnp.asarray(tokens).reshape(*tokens.shape, *[1] * (x.ndim - 2)), x, 0.0)


@pytest.mark.parametrize(
    "mask",
    [
        A.AttentionMask(jnp.asarray(TOKENS)),
        A.AttentionMask(jnp.asarray(SEGMENTS > 0), jnp.asarray(SEGMENTS)),
        A.AttentionMask(jnp.asarray(TOKENS), window=2),  # a local layer: splash's LocalMask
        A.AttentionMask(jnp.asarray(SEGMENTS > 0), jnp.asarray(SEGMENTS), window=1),
    ],
    ids=["padded-and-holes", "packed", "local-padded-and-holes", "local-packed"],
)
@pytest.mark.parametrize("implementation", [SPLASH, "fused_xla"])
def test_kernels_equal_xla_forward_and_gradients(implementation, mask):
    """Forward within 1e-5 and gradients within 1e-4 of the exact path, at real tokens, float32."""
    batch, length = mask.tokens.shape
    q, k, v, w = _qkv(batch, length)

    def loss(fn):
        return lambda q, k, v: jnp.sum(_at_real(fn(q, k, v), mask.tokens) * w)

    def exact(q, k, v):
        return A.xla_attention(q, k, v, mask.dense())[0]

    if implementation == "splash":
        kernel = lambda q, k, v: A.splash_attention(q, k, v, mask, interpret=True)  # noqa: E731
    else:
        kernel = lambda q, k, v: A.fused_attention(q, k, v, mask, "fused_xla")  # noqa: E731
    np.testing.assert_allclose(
        _at_real(kernel(q, k, v), mask.tokens), _at_real(exact(q, k, v), mask.tokens), atol=1e-5
    )
    expected = jax.grad(loss(exact), argnums=(0, 1, 2))(q, k, v)
    got = jax.grad(loss(kernel), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", expected, got):
        np.testing.assert_allclose(b, a, atol=1e-4, err_msg=f"d{name}")


@NOT_ON_GPU
@pytest.mark.parametrize("window", [None, 3], ids=["global", "local"])
def test_splash_pads_lengths_past_one_block(window):
    """A length of 131 is padded inside the call to 256 (two 128-blocks), the pad masked; a local
    window reaches across the blocks' edge, and the kernel skips the blocks outside it."""
    tokens = np.ones((2, 131), bool)
    tokens[1, 100:] = False
    mask = A.AttentionMask(jnp.asarray(tokens), window=window)
    q, k, v, _ = _qkv(2, 131, heads=2)
    out = A.splash_attention(q, k, v, mask, interpret=True)
    ref = A.xla_attention(q, k, v, mask.dense())[0]
    assert out.shape == q.shape
    np.testing.assert_allclose(_at_real(out, tokens), _at_real(ref, tokens), atol=1e-5)


def test_xla_attention_keeps_one_bfloat16_copy_of_the_probabilities(capsys):
    """The backward pass of the exact path saves one [B, H, L, L] array, in bfloat16 when the
    compute dtype is, with attention dropout on (its mask is recomputed, not stored)."""
    for dtype, name in ((jnp.bfloat16, "bf16"), (jnp.float32, "f32")):
        q, k, v, _ = _qkv(3, 7, dtype=dtype)
        mask = A.AttentionMask(jnp.asarray(TOKENS)).dense()

        def attend(q, k, v, mask=mask):
            return A.xla_attention(q, k, v, mask, dropout_rate=0.1, dropout_rng=KEY)[0]

        print_saved_residuals(attend, q, k, v)
        per_score = [line for line in capsys.readouterr().out.splitlines() if "[3,4,7,7]" in line]
        assert len(per_score) == 1 and per_score[0].startswith(name), per_score


def test_xla_attention_scores_are_not_rounded_to_bfloat16():
    """In bfloat16 the QK^T products accumulate in float32: the probabilities equal float32
    attention on the same (bfloat16) inputs to float32 precision, not bfloat16's 4e-3."""
    q, k, v, _ = _qkv(3, 7, dtype=jnp.bfloat16)
    q, k = q * 4, k * 4  # large scores: rounding them to bfloat16 would move probabilities
    mask = A.AttentionMask(jnp.asarray(TOKENS)).dense()
    _, probs = A.xla_attention(q, k, v, mask, return_probs=True)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    _, exact = A.xla_attention(*f32, mask, return_probs=True)
    np.testing.assert_allclose(probs, exact, atol=1e-6)


def test_xla_attention_dropout_gradients_equal_autodiff():
    """The exact path's own backward pass equals autodiff of softmax + dropout + matmul."""
    q, k, v, w = _qkv(3, 7)
    mask = A.AttentionMask(jnp.asarray(TOKENS)).dense()

    def reference(q, k, v):
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(8.0)
        probs = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", A.dropout(probs, 0.3, KEY), v)

    def ours(q, k, v):
        return A.xla_attention(q, k, v, mask, dropout_rate=0.3, dropout_rng=KEY)[0]

    np.testing.assert_allclose(ours(q, k, v), reference(q, k, v), atol=1e-6)
    for a, b in zip(
        jax.grad(lambda *x: jnp.sum(reference(*x) * w), argnums=(0, 1, 2))(q, k, v),
        jax.grad(lambda *x: jnp.sum(ours(*x) * w), argnums=(0, 1, 2))(q, k, v),
    ):
        np.testing.assert_allclose(b, a, atol=1e-5)


@pytest.mark.parametrize("implementation", ["fused_xla", SPLASH])
def test_model_with_left_padding_and_holes_equals_xla(implementation):
    """Masks that are not a prefix reach the fused kernels whole (they once read row lengths)."""
    cfg = TINY.replace(attention_probs_dropout_prob=0.0)
    ref = M.BertModel(cfg)
    fused = M.BertModel(cfg, RuntimeConfig(attention=implementation))
    params = init_params(ref, KEY)
    batch = random_batch(cfg)
    batch["attention_mask"] = TOKENS.astype(np.int32)
    a = ref.apply({"params": params}, **batch).last_hidden_state
    b = fused.apply({"params": params}, **batch).last_hidden_state
    np.testing.assert_allclose(_at_real(b, TOKENS), _at_real(a, TOKENS), atol=1e-5)


@NOT_ON_GPU
def test_model_splash_packed_training_equals_xla():
    """Packed rows, hidden dropout on: the loss gradients of splash equal those of xla."""
    cfg = TINY.replace(attention_probs_dropout_prob=0.0)
    params = init_params(M.BertModel(cfg), KEY)
    ids = np.arange(3, 3 + 2 * 7, dtype=np.int32).reshape(2, 7)
    positions = np.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 0, 1, 2]], np.int32)
    batch = dict(
        attention_mask=(SEGMENTS > 0).astype(np.int32), position_ids=positions, segment_ids=SEGMENTS
    )
    w = jax.random.normal(KEY, (2, 7, cfg.hidden_size))

    def loss(p, attention):
        out = M.BertModel(cfg, RuntimeConfig(attention=attention)).apply(
            {"params": p}, ids, **batch, deterministic=False, rngs={"dropout": KEY}
        )
        return jnp.sum(_at_real(out.last_hidden_state, SEGMENTS > 0) * w)

    ga = jax.grad(loss)(params, "xla")
    gb = jax.grad(loss)(params, "splash")
    for a, b in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(b, a, atol=1e-4)


# --------------------------------------------------------------------------------------------
# The choice
# --------------------------------------------------------------------------------------------
# What each platform's kernels take, written out from their documentation and checks (jax's
# cudnn `check_layout` / `check_is_flash_attention`, splash's block rules): the backend is
# simulated by naming the platform to the pure `resolve_attention`, and every resolved path is
# checked against this table, not against the resolver's own code.
def _accepted(platform, implementation, dtype, cfg, training):
    dropping = training and cfg.attention_probs_dropout_prob > 0
    if implementation == "xla":
        return True
    if dropping:  # only xla applies attention-probability dropout
        return False
    if implementation == "cudnn":
        head = cfg.head_dim
        return platform == "cuda" and dtype == "bfloat16" and head % 8 == 0 and head <= 128
    if implementation == "splash":
        return platform == "tpu"
    return implementation == "fused_xla"


def _shipped():
    """(variant, ConfigDict, BertConfig) for every variant string of every config file.

    Fine-tuning takes its architecture from init_from: its own small model, MiniLM (init=minilm),
    and the BERT checkpoints it is published for (base and large).
    """
    pretrain, finetune = load_config_file("pretrain.py"), load_config_file("finetune.py")
    for size in PRESETS:
        for phase in (1, 2):
            for mlm_only in (0, 1):
                variant = f"size={size},phase={phase},mlm_only={mlm_only}"
                config = pretrain.get_config(variant)
                yield f"pretrain.py:{variant}", config, BertConfig(**config.model.to_dict())
    minilm = None
    for task in finetune.TASKS:
        for init in ("", "minilm"):
            for pack in (0, 1):
                variant = f"task={task},pack={pack}" + (f",init={init}" if init else "")
                config = finetune.get_config(variant)
                if init:
                    minilm = minilm or BertConfig.from_json_file(config.init_from)
                    archs = {"minilm": minilm}
                else:
                    own = BertConfig(**{**config.model.to_dict(), "vocab_size": 30522})
                    archs = {"own": own, "base": BertConfig(), "large": BertConfig.preset("large")}
                for arch, cfg in archs.items():
                    yield f"finetune.py:{variant} ({arch})", config, cfg


def test_every_shipped_config_resolves_to_a_path_its_platform_accepts():
    pytest.importorskip("ml_collections")  # the configs' own dependency (absent on a bare GPU host)
    seen = set()
    for name, config, cfg in _shipped():
        runtime = RuntimeConfig(**config.runtime.to_dict())
        for platform in ("cpu", "gpu", "rocm", "tpu"):
            resolved = runtime.resolved(platform)
            assert resolved.dtype == ("float32" if platform == "cpu" else "bfloat16"), name
            assert resolved.param_dtype == "float32", name
            for training in (True, False):
                path = A.resolve_attention(resolved, cfg, platform, training=training)
                kind = "cuda" if platform == "gpu" else platform
                ok = _accepted(kind, path, resolved.dtype, cfg, training)
                assert ok, f"{name} on {platform} ({'train' if training else 'eval'}): {path}"
                seen.add((kind, path))
    # The fused kernels are chosen where they apply (not xla everywhere).
    assert {("cuda", "cudnn"), ("tpu", "splash"), ("cpu", "xla")} <= seen, seen
    # `make pretrain` (size=tiny) stays float32 on the CPU and is cuDNN-ready on a GPU.
    tiny = load_config_file("pretrain.py").get_config("size=tiny")
    runtime = RuntimeConfig(**tiny.runtime.to_dict())
    cfg = BertConfig(**tiny.model.to_dict())
    assert runtime.resolved("cpu").dtype == "float32"
    assert A.resolve_attention(runtime, cfg, "cpu", training=True) == "xla"
    assert A.resolve_attention(runtime, cfg, "gpu", training=True) == "cudnn"


def test_auto_picks_by_platform_dtype_head_size_and_dropout():
    bf16 = RuntimeConfig(dtype="bfloat16", attention="auto")
    no_dropout = TINY.replace(attention_probs_dropout_prob=0.0)  # head size 8
    resolve = A.resolve_attention
    assert resolve(bf16, no_dropout, "gpu", training=True) == "cudnn"
    assert resolve(bf16, TINY, "gpu", training=True) == "xla"  # attention dropout
    assert resolve(bf16, TINY, "gpu", training=False) == "cudnn"
    assert resolve(bf16, TINY, "rocm", training=False) == "xla"
    assert resolve(bf16, TINY, "tpu", training=False) == "splash"
    assert resolve(RuntimeConfig(attention="auto"), TINY, "gpu", training=False) == "xla"  # f32
    odd_heads = BertConfig.preset("tiny", num_attention_heads=4, hidden_size=132)  # head size 33
    assert resolve(bf16, odd_heads, "gpu", training=False) == "xla"
    wide = BertConfig.preset("tiny", num_attention_heads=1, hidden_size=256)  # head size 256
    assert resolve(bf16, wide, "gpu", training=False) == "xla"


@pytest.mark.parametrize(
    "runtime, cfg, platform, training, match",
    [
        (dict(dtype="bfloat16", attention="cudnn"), TINY, "gpu", True, "dropout"),
        (dict(dtype="bfloat16", attention="cudnn"), TINY, "tpu", False, "needs a CUDA GPU"),
        (dict(dtype="auto", attention="cudnn"), TINY, "cpu", False, "needs a CUDA GPU"),
        (
            dict(dtype="bfloat16", attention="cudnn"),
            BertConfig.preset("tiny", num_attention_heads=4, hidden_size=132),
            "gpu",
            False,
            "heads of size 33",
        ),
        (dict(attention="splash"), TINY, "gpu", False, "TPU kernel"),
        (dict(attention="splash"), TINY, "tpu", True, "dropout"),
        (dict(attention="fused_xla"), TINY, "cpu", True, "dropout"),
    ],
)
def test_explicit_choices_that_cannot_run_are_refused(runtime, cfg, platform, training, match):
    with pytest.raises(ValueError, match=match):
        A.resolve_attention(RuntimeConfig(**runtime), cfg, platform, training=training)


def test_runtime_config_refuses_float16_parameters_and_cudnn_in_float32():
    assert RuntimeConfig(dtype="float16").dtype == "float16"  # with loss scaling (loss_scale_test)
    with pytest.raises(ValueError, match=r"param_dtype='float16'.*master weights"):
        RuntimeConfig(param_dtype="float16")
    with pytest.raises(ValueError, match=r"attention='cudnn' takes bfloat16.*use dtype='bfloat16'"):
        RuntimeConfig(attention="cudnn")
    with pytest.raises(ValueError, match="platform="):
        A.resolve_attention(RuntimeConfig(), TINY, "metal", training=False)
    auto = RuntimeConfig(dtype="auto")
    assert auto.resolved("cpu").dtype == "float32"
    assert auto.resolved("tpu") == dataclasses.replace(auto, dtype="bfloat16")
    assert RuntimeConfig(dtype="float32").resolved("tpu").dtype == "float32"  # explicit stays
    with pytest.raises(ValueError, match="dtype='auto' is resolved once"):
        M.BertModel(TINY, auto).init(KEY, jnp.ones((1, 7), jnp.int32))


# --------------------------------------------------------------------------------------------
# Compiled for a TPU without one
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "attention, mesh_sizes, packed",
    [("auto", dict(data=2, tensor=2), True), ("splash", dict(data=4), False)],
    ids=["auto-packed-data2-tensor2", "splash-padded-data4"],
)
def test_splash_compiles_deviceless_for_a_tpu_topology(monkeypatch, attention, mesh_sizes, packed):
    """A small pretraining model's forward + backward, sharded over a v5e 2x2 mesh, compiled by
    libtpu on this CPU host: `auto` resolves to splash there, and the program holds its Pallas
    kernels (forward and fused backward). The second case traced splash at initialization too,
    which once leaked a cached kernel's tracers into the compiled step."""
    pytest.importorskip("libtpu")
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes may hold libtpu
    from jax.experimental import topologies

    from bert_jax.parallel import sharding

    devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
    mesh = sharding.make_mesh({"fsdp": 1, "tensor": 1, **mesh_sizes}, devices)
    cfg = BertConfig(
        vocab_size=99,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,  # head size 32, as MiniLM's
        intermediate_size=37,
        max_position_embeddings=64,
        attention_probs_dropout_prob=0.0,
    )
    runtime = RuntimeConfig(dtype="auto", attention=attention, scan_layers=True)
    runtime = runtime.resolved(hardware.current_platform(mesh))
    assert runtime.dtype == "bfloat16"
    model = M.BertForPreTraining(cfg, runtime)
    rules = list(sharding.DEFAULT_RULES)
    boxed = jax.eval_shape(lambda: init_params(model, KEY))
    params = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        nn.unbox(boxed),
        sharding.logical_shardings(boxed, mesh, rules),
    )
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(sharding.BATCH_AXES))
    names = ("input_ids", "token_type_ids", "attention_mask") + (("segment_ids",) if packed else ())
    batch = {n: jax.ShapeDtypeStruct((4, 7), jnp.int32, sharding=rows) for n in names}

    def loss(p, b):
        out = model.apply({"params": p}, **b, deterministic=False, rngs={"dropout": KEY})
        return jnp.mean(jnp.square(out.prediction_logits))

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        assert (
            A.resolve_attention(runtime, cfg, hardware.current_platform(), training=True)
            == "splash"
        )
        lowered = jax.jit(jax.value_and_grad(loss)).lower(params, batch)
        compiled = lowered.compile()
    assert lowered.as_text().count("tpu_custom_call") == 2  # scanned: one forward, one backward
    stats = compiled.memory_analysis()
    assert stats.temp_size_in_bytes < 64 * 2**20, stats  # a tiny model: megabytes, not more


def test_cudnn_path_traces_with_a_simulated_gpu():
    """No GPU here: jax's cuDNN checks that need one (library version, compute capability) are
    stubbed and the platform named "cuda"; the rest of jax's own checks (dtype, head size, bias
    shape, even length when training with a mask) run while the training step is traced. The
    length is 7: the call pads it to 8."""
    from unittest import mock

    from jax._src.cudnn import fused_attention_stablehlo as cudnn_checks

    cfg = TINY.replace(attention_probs_dropout_prob=0.0)
    batch = random_batch(cfg)  # right-padded rows of length 7
    batch["attention_mask"] = TOKENS.astype(np.int32)  # and a row with left padding and a hole
    params = init_params(M.BertForPreTraining(cfg), KEY)

    def loss(p, model):
        out = model.apply({"params": p}, **batch, deterministic=False, rngs={"dropout": KEY})
        return jnp.sum(out.prediction_logits)

    with (
        mock.patch.object(cudnn_checks, "check_cudnn_version", return_value=91000),
        mock.patch.object(cudnn_checks, "check_compute_capability", return_value=True),
        mock.patch.object(hardware, "current_platform", return_value="cuda"),
    ):
        auto = M.BertForPreTraining(
            cfg, RuntimeConfig(dtype="auto", attention="auto").resolved("gpu")
        )
        jaxpr = jax.make_jaxpr(jax.grad(lambda p: loss(p, auto)))(params)
        kernels = [e.primitive.name for e in jaxpr.eqns if "dot_product_attention" in str(e)]
        assert kernels and all("dot_product_attention" in k for k in kernels), kernels
        # float32 would reach cuDNN only past RuntimeConfig; jax refuses it at trace time too.
        with pytest.raises(ValueError, match="Unsupported dtype"):
            A.fused_attention(*_qkv(3, 7)[:3], A.AttentionMask(jnp.asarray(TOKENS)), "cudnn")
