"""Rotary positions (`models.rotary`) against transformers: every `rope_type`'s inverse
frequencies and scale against `ROPE_INIT_FUNCTIONS` (and the default one), the cos/sin of
`LlamaRotaryEmbedding` at the rows' positions, and the rotation against `apply_rotary_pos_emb`;
the config.json spellings of `rope_parameters`."""

import numpy as np
import pytest

from bert_jax.models import rotary

HEAD_DIM = 16
MAX_POSITIONS = 64
# A small theta, so that llama3's three bands (wavelengths < 8, 8..32, > 32) all hold pairs.
VARIANTS = {
    "default": dict(rope_type="default", rope_theta=500.0),
    "partial": dict(rope_type="default", rope_theta=500.0, partial_rotary_factor=0.5),
    "linear": dict(rope_type="linear", rope_theta=500.0, factor=3.0),
    "dynamic": dict(rope_type="dynamic", rope_theta=500.0, factor=2.5),
    "yarn": dict(rope_type="yarn", rope_theta=500.0, factor=2.0, original_max_position_embeddings=32),
    "yarn-mscale": dict(
        rope_type="yarn", rope_theta=500.0, factor=2.0, original_max_position_embeddings=32,
        mscale=0.8, mscale_all_dim=0.5, beta_fast=16, beta_slow=2, partial_rotary_factor=0.75,
    ),
    "llama3": dict(
        rope_type="llama3", rope_theta=500.0, factor=8.0, original_max_position_embeddings=32,
        low_freq_factor=1.0, high_freq_factor=4.0,
    ),
}  # fmt: skip


def _llama_config(parameters: dict):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        hidden_size=4 * HEAD_DIM,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters=dict(parameters),
    )


def _theirs_inv_freq(parameters: dict, seq_len=None):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _llama_config(parameters)
    kind = parameters["rope_type"]
    if kind == "default":
        inv_freq, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
        if parameters.get("partial_rotary_factor", 1.0) != 1.0:  # Llama's rotates every dim
            dim = int(HEAD_DIM * parameters["partial_rotary_factor"])
            inv_freq = 1.0 / (parameters["rope_theta"] ** (np.arange(0, dim, 2) / dim))
            return np.asarray(inv_freq, np.float32), scale
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=seq_len)
    return np.asarray(inv_freq), scale


@pytest.mark.torch
@pytest.mark.parametrize("name", list(VARIANTS))
def test_inverse_frequencies_equal_transformers(name):
    parameters = VARIANTS[name]
    rope = rotary.RopeParameters.from_hf(parameters)
    lengths = [None, 100] if rope.rope_type == "dynamic" else [None]  # 100: theta grown
    for seq_len in lengths:
        ours, scale = rotary.inverse_frequencies(rope, HEAD_DIM, MAX_POSITIONS, seq_len)
        theirs, their_scale = _theirs_inv_freq(parameters, seq_len)
        assert ours.shape == theirs.shape == (rope.rotated_dims(HEAD_DIM) // 2,)
        np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6, atol=1e-6, err_msg=name)
        assert scale == pytest.approx(their_scale, rel=1e-12), name
    if rope.rope_type == "yarn":
        assert scale != 1.0  # yarn's attention factor is exercised
    if rope.rope_type == "llama3":  # every band holds pairs
        wavelengths = 2 * np.pi / _theirs_inv_freq(VARIANTS["default"])[0]
        assert (wavelengths < 8).any() and (wavelengths > 32).any()
        assert ((wavelengths >= 8) & (wavelengths <= 32)).any()


@pytest.mark.torch
@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "partial"])
def test_cos_sin_and_rotation_equal_llamas(name):
    """`rope_cos_sin` equals `LlamaRotaryEmbedding`'s cos and sin (its scale, and dynamic's
    growth at rows longer than max_position_embeddings), and `apply_rotary` its
    `apply_rotary_pos_emb` on queries and keys [B, L, H, D], within 1e-5: angles reach 99
    radians, where one float32 step is 7.6e-6 (torch divides linear's frequencies by the factor
    one last bit away from XLA's division now and then: 1.9e-6 in a cosine here)."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    parameters = VARIANTS[name]
    rope = rotary.RopeParameters.from_hf(parameters)
    if rope.partial_rotary_factor != 1.0:  # Llama rotates every dim: the whole head
        parameters = {**parameters, "partial_rotary_factor": 1.0}
        rope = rotary.RopeParameters.from_hf(parameters)
    rng = np.random.default_rng(0)
    positions = np.stack([np.arange(100), rng.permutation(100)]).astype(np.int32)  # [2, 100]
    q = rng.normal(size=(2, 100, 4, HEAD_DIM)).astype(np.float32)
    k = rng.normal(size=(2, 100, 2, HEAD_DIM)).astype(np.float32)
    cos, sin = rotary.rope_cos_sin(rope, positions, HEAD_DIM, MAX_POSITIONS)
    embedding = LlamaRotaryEmbedding(_llama_config(parameters))
    their_cos, their_sin = embedding(torch.from_numpy(q), torch.from_numpy(positions).long())
    np.testing.assert_allclose(np.asarray(cos), their_cos.numpy(), atol=1e-5, err_msg=name)
    np.testing.assert_allclose(np.asarray(sin), their_sin.numpy(), atol=1e-5, err_msg=name)
    their_q, their_k = apply_rotary_pos_emb(
        torch.from_numpy(q), torch.from_numpy(k), their_cos, their_sin, unsqueeze_dim=2
    )
    ours_q, ours_k = rotary.apply_rotary(q, cos, sin), rotary.apply_rotary(k, cos, sin)
    np.testing.assert_allclose(np.asarray(ours_q), their_q.numpy(), atol=1e-5, err_msg=name)
    np.testing.assert_allclose(np.asarray(ours_k), their_k.numpy(), atol=1e-5, err_msg=name)


def test_partial_rotary_leaves_the_other_dims_and_scores_see_only_distances():
    rope = rotary.RopeParameters(rope_theta=500.0, partial_rotary_factor=0.5)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 6, 2, HEAD_DIM)).astype(np.float32)
    positions = np.arange(6)[None]
    out = np.asarray(rotary.apply_rotary(x, *rotary.rope_cos_sin(rope, positions, HEAD_DIM, 64)))
    np.testing.assert_array_equal(out[..., HEAD_DIM // 2 :], x[..., HEAD_DIM // 2 :])
    shifted = np.asarray(
        rotary.apply_rotary(x, *rotary.rope_cos_sin(rope, positions + 7, HEAD_DIM, 64))
    )
    scores = np.einsum("bqhd,bkhd->bhqk", out, out)
    np.testing.assert_allclose(np.einsum("bqhd,bkhd->bhqk", shifted, shifted), scores, atol=1e-4)


def test_rope_parameters_read_both_spellings_and_refuse_what_they_lack():
    older = rotary.RopeParameters.from_hf({"type": "linear", "factor": 2.0}, rope_theta=1e4)
    assert older == rotary.RopeParameters("linear", 1e4, factor=2.0)
    assert rotary.RopeParameters.from_hf(older.to_hf()) == older
    assert older.to_hf() == {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}
    assert rotary.RopeParameters.from_hf(None, rope_theta=5.0) == rotary.RopeParameters(
        rope_theta=5.0
    )
    with pytest.raises(ValueError, match="rope_type='longrope' is not implemented; bert_jax has"):
        rotary.RopeParameters.from_hf({"rope_type": "longrope"})
    with pytest.raises(ValueError, match=r"rope_type='yarn' needs \['factor', 'original_max"):
        rotary.RopeParameters.from_hf({"rope_type": "yarn"})
    with pytest.raises(ValueError, match=r"keys \['short_factor'\] bert_jax does not read"):
        rotary.RopeParameters.from_hf({"rope_type": "linear", "factor": 2, "short_factor": []})
