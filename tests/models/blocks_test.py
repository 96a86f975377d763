"""The shared blocks against the transformers modules they mirror, within 1e-5 in float32:
RMSNorm (`LlamaRMSNorm`), the gated MLP (`LlamaMLP`'s SwiGLU, ModernBERT's fused GeGLU),
grouped-query attention with rotary positions (`LlamaAttention`, not causal, under an encoder's
padding mask) through the xla and fused_xla kernels, and a whole pre-norm layer
(`LlamaDecoderLayer`)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.attention import AttentionMask
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.mlp import FeedForward
from bert_jax.models.norms import RMSNorm, make_norm
from bert_jax.models.prenorm import GroupedQueryAttention, PreNormLayer, rotary_angles
from tests.models.toy_family import ToyConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.torch

CONFIG = ToyConfig(attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5)
LENGTHS = np.array([9, 5, 7])  # right-padded rows of 9
MASK = np.arange(9)[None] < LENGTHS[:, None]


def _llama_config(cfg: ToyConfig, **fields):
    config = transformers.LlamaConfig(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        hidden_act=cfg.hidden_act,
        attention_bias=cfg.attention_bias,
        mlp_bias=cfg.mlp_bias,
        rope_parameters=cfg.rope.to_hf(),
        **fields,
    )
    config._attn_implementation = "eager"
    return config


def _perturbed(module):
    """A torch module with every weight moved off its start (norm scales and biases too)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module.eval()


def _params(module, template) -> dict:
    """The torch module's state dict in the shapes of our `template` parameter tree: Linear
    weights transposed ([out, in] -> [in, out], then split into heads), norm weights `scale`."""
    flat = {}
    for key, value in module.state_dict().items():
        *path, leaf = key.split(".")
        value = value.detach().numpy()
        if leaf == "weight":
            leaf, value = ("kernel", value.T) if value.ndim == 2 else ("scale", value)
        flat[(*path, leaf)] = value
    shapes = nn.meta.unbox(template)
    flat_shapes = {k: v.shape for k, v in _flatten(shapes).items()}
    assert set(flat) == set(flat_shapes), (sorted(flat), sorted(flat_shapes))
    out: dict = {}
    for path, value in flat.items():
        node = out
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = jnp.asarray(value.reshape(flat_shapes[path]))
    return out


def _flatten(tree, prefix=()):
    if not isinstance(tree, dict):
        return {prefix: tree}
    return {k: v for name, sub in tree.items() for k, v in _flatten(sub, (*prefix, name)).items()}


def _hidden(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(3, 9, CONFIG.hidden_size)).astype(np.float32)


def test_rms_norm_equals_llamas():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    theirs = _perturbed(LlamaRMSNorm(CONFIG.hidden_size, eps=1e-5))
    x = 3.0 * _hidden()
    norm = RMSNorm(1e-5)
    params = _params(theirs, norm.init(jax.random.PRNGKey(0), x)["params"])
    ours = norm.apply({"params": params}, x)
    want = theirs(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np.asarray(ours), want, atol=1e-5)
    # bfloat16 compute: float32 statistics, the output in bfloat16
    low = RMSNorm(1e-5, dtype="bfloat16").apply({"params": params}, x.astype(jnp.bfloat16))
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(low, np.float32), want, atol=0.05, rtol=0.02)
    with pytest.raises(ValueError, match="norm kind 'batch_norm' is unknown; expected one of"):
        make_norm("batch_norm", RuntimeConfig(), 1e-5, "norm")


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_equals_llamas_mlp(bias):
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = CONFIG.replace(mlp_bias=bias)
    theirs = _perturbed(LlamaMLP(_llama_config(cfg)))
    x = _hidden()
    mlp = FeedForward(cfg, kind="gated", activation="silu", use_bias=bias)
    params = _params(theirs, mlp.init(jax.random.PRNGKey(0), x)["params"])
    want = theirs(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np.asarray(mlp.apply({"params": params}, x)), want, atol=1e-5)


def test_fused_geglu_equals_modernberts_mlp():
    from transformers.models.modernbert.modeling_modernbert import ModernBertMLP

    hf = transformers.ModernBertConfig(
        hidden_size=32, intermediate_size=37, hidden_activation="gelu", mlp_bias=True
    )
    theirs = _perturbed(ModernBertMLP(hf))
    x = _hidden()
    mlp = FeedForward(CONFIG, kind="fused_gated", activation="gelu", use_bias=True)
    params = _params(theirs, mlp.init(jax.random.PRNGKey(0), x)["params"])
    want = theirs(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np.asarray(mlp.apply({"params": params}, x)), want, atol=1e-5)
    with pytest.raises(ValueError, match="MLP kind 'moe' is unknown; expected one of"):
        FeedForward(CONFIG, kind="moe").init(jax.random.PRNGKey(0), x)


def _torch_mask() -> "torch.Tensor":
    """transformers' additive 4-D mask of an encoder: padding keys masked, nothing causal."""
    keys = torch.from_numpy(MASK)[:, None, None, :].expand(3, 1, 9, 9)
    return torch.zeros(keys.shape).masked_fill(~keys, torch.finfo(torch.float32).min)


def _angles(cfg, positions):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    theirs = LlamaRotaryEmbedding(_llama_config(cfg))(torch.zeros(1), torch.from_numpy(positions))
    return theirs, rotary_angles(cfg, jnp.asarray(positions))


@pytest.mark.parametrize("kernel, kv_heads", [("xla", 1), ("xla", 2), ("xla", 4), ("fused_xla", 2)])
def test_grouped_query_attention_equals_llamas(kernel, kv_heads):
    """q_proj, k_proj and v_proj, rotary positions, K = 1 (multi-query), 2 or 4 (plain
    multi-head) key/value heads, o_proj: outputs at real tokens and (xla) the probabilities."""
    from transformers.models.llama.modeling_llama import LlamaAttention

    cfg = CONFIG.replace(num_key_value_heads=kv_heads)
    theirs = _perturbed(LlamaAttention(_llama_config(cfg), layer_idx=0))
    theirs.is_causal = False
    x, positions = _hidden(), np.tile(np.arange(9), (3, 1))
    their_angles, angles = _angles(cfg, positions)
    attention = GroupedQueryAttention(cfg, RuntimeConfig(attention=kernel))
    mask = AttentionMask(jnp.asarray(MASK))
    kwargs = dict(deterministic=True, output_attentions=kernel == "xla")
    template = attention.init(jax.random.PRNGKey(0), x, mask, angles, **kwargs)["params"]
    params = _params(theirs, template)
    assert params["k_proj"]["kernel"].shape == (cfg.hidden_size, kv_heads, cfg.head_dim)
    out, probs = attention.apply({"params": params}, x, mask, angles, **kwargs)
    want, want_probs = theirs(torch.from_numpy(x), their_angles, _torch_mask())
    np.testing.assert_allclose(np.asarray(out)[MASK], want.detach().numpy()[MASK], atol=1e-5)
    if kernel == "xla":
        rows = np.asarray(probs).transpose(0, 2, 1, 3)[MASK]
        want_rows = want_probs.detach().numpy().transpose(0, 2, 1, 3)[MASK]
        np.testing.assert_allclose(rows, want_rows, atol=1e-5)


def test_grouped_query_attention_refuses_heads_that_do_not_group():
    with pytest.raises(ValueError, match="num_key_value_heads=3 must divide num_attention_heads"):
        ToyConfig(num_key_value_heads=3)


@pytest.mark.parametrize("rope", [None, {"rope_type": "yarn", "factor": 2.0}])
def test_pre_norm_layer_equals_llamas_decoder_layer_without_its_causal_mask(rope):
    """RMSNorm, GQA with rotary positions (default, and yarn with its attention factor), the
    residuals and SwiGLU, at real tokens."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    from bert_jax.models.rotary import RopeParameters, rope_cos_sin

    cfg = CONFIG
    hf = _llama_config(cfg)
    if rope is not None:
        hf.rope_parameters = {**cfg.rope.to_hf(), **rope, "original_max_position_embeddings": 32}
    theirs = _perturbed(LlamaDecoderLayer(hf, layer_idx=0))
    theirs.self_attn.is_causal = False
    x, positions = _hidden(), np.tile(np.arange(9), (3, 1))
    their_angles = LlamaRotaryEmbedding(hf)(torch.zeros(1), torch.from_numpy(positions))
    spec = RopeParameters.from_hf(hf.rope_parameters)
    angles = rope_cos_sin(spec, jnp.asarray(positions), cfg.head_dim, cfg.max_position_embeddings)
    layer = PreNormLayer(cfg, RuntimeConfig(), norm="rms_norm", mlp="gated")
    mask = AttentionMask(jnp.asarray(MASK))
    params = _params(theirs, layer.init(jax.random.PRNGKey(0), x, mask, angles)["params"])
    out, _ = layer.apply({"params": params}, x, mask, angles)
    want = theirs(torch.from_numpy(x), _torch_mask(), position_embeddings=their_angles)
    want = want[0] if isinstance(want, tuple) else want
    np.testing.assert_allclose(np.asarray(out)[MASK], want.detach().numpy()[MASK], atol=1e-5)


def test_pre_norm_layer_of_layer_norms_and_a_dense_mlp_equals_its_torch_composition():
    """The other kinds: LayerNorm (with biases) and a dense GELU MLP, against torch's LayerNorm,
    Llama's attention and two Linear layers composed as the pre-norm layer composes them."""
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    cfg = CONFIG.replace(hidden_act="gelu")
    hf = _llama_config(cfg)
    e, f = cfg.hidden_size, cfg.intermediate_size
    theirs = torch.nn.ModuleDict(
        dict(
            input_layernorm=torch.nn.LayerNorm(e, eps=cfg.norm_eps),
            self_attn=LlamaAttention(hf, layer_idx=0),
            post_attention_layernorm=torch.nn.LayerNorm(e, eps=cfg.norm_eps),
            mlp=torch.nn.ModuleDict(
                dict(up_proj=torch.nn.Linear(e, f), down_proj=torch.nn.Linear(f, e))
            ),
        )
    )
    _perturbed(theirs)
    x, positions = _hidden(), np.tile(np.arange(9), (3, 1))
    their_angles = LlamaRotaryEmbedding(hf)(torch.zeros(1), torch.from_numpy(positions))
    layer = PreNormLayer(cfg, RuntimeConfig(), norm="layer_norm", mlp="dense")
    mask, angles = AttentionMask(jnp.asarray(MASK)), rotary_angles(cfg, jnp.asarray(positions))
    params = _params(theirs, layer.init(jax.random.PRNGKey(0), x, mask, angles)["params"])
    out, _ = layer.apply({"params": params}, x, mask, angles)
    t = torch.from_numpy(x)
    t = t + theirs.self_attn(theirs.input_layernorm(t), their_angles, _torch_mask())[0]
    h = torch.nn.functional.gelu(theirs.mlp.up_proj(theirs.post_attention_layernorm(t)))
    want = (t + theirs.mlp.down_proj(h)).detach().numpy()
    np.testing.assert_allclose(np.asarray(out)[MASK], want[MASK], atol=1e-5)
