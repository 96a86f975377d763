"""GTE against transformers: every head within 1e-5 (eager attention, float32) on full,
right-padded and left-padded rows, with three token types and with none (type_vocab_size 0, as
gte-base-en-v1.5), under rotary scaling variants of `rope_parameters`; config.json both ways;
conversion both ways (through `bert_jax.convert`) with no missing or unused weight, including
the fused names transformers saves (`qkv_proj`, `up_gate_proj`); packed rows against the
sequences alone."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import detect, hf, native, table, verify
from bert_jax.models import families
from bert_jax.models.gte import model as G
from bert_jax.models.gte.config import GteConfig
from bert_jax.models.rotary import RopeParameters
from tests import family_fixtures

LENGTH = 9
# Odd sizes, three token types, a theta of its own, dropout as released (off in eval).
GTE = GteConfig(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, max_position_embeddings=64, type_vocab_size=3, num_labels=3,
    rope=RopeParameters(rope_theta=77.0),
)  # fmt: skip
NO_TYPES = GTE.replace(type_vocab_size=0, pad_token_id=0)  # gte-base-en-v1.5's layout
# Rotary scaling variants; 6 positions trained, so that dynamic and yarn scale the 9.
ROPES = {
    "dynamic": dict(rope_type="dynamic", rope_theta=500.0, factor=2.0),
    "yarn": dict(rope_type="yarn", rope_theta=500.0, factor=4.0, original_max_position_embeddings=6),
}  # fmt: skip
# Full, right-padded, left-padded.
MASK = np.array([[1] * 9, [1] * 5 + [0] * 4, [0] * 3 + [1] * 6])
HEADS = ("GteModel", "GteForMaskedLM", "GteForSequenceClassification", "GteForTokenClassification")


def _inputs(cfg, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1, cfg.vocab_size, MASK.shape)
    ids[MASK == 0] = cfg.pad_token_id
    types = (np.arange(LENGTH) >= 4).astype(np.int64) + (np.arange(LENGTH) >= 7)
    return dict(input_ids=ids, attention_mask=MASK, token_type_ids=types[None].repeat(3, 0) * MASK)


def _compare(cfg, head: str) -> None:
    torch_model = family_fixtures.transformers_model(cfg, head)
    inputs = _inputs(cfg)
    state = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    params, report = hf.hf_state_to_params(cfg, state, head)
    assert not report.unused and not report.newly_initialized, report.summary()
    model = families.get_model_class(head)(cfg)
    ours = jax.jit(
        lambda p, x: model.apply(
            {"params": p}, **x, output_hidden_states=True, output_attentions=True
        )
    )(params, inputs)
    ours, theirs = verify.named_outputs(ours), verify.torch_outputs(torch_model, inputs)
    assert set(ours) == set(theirs) and len(theirs) >= 1 + 3 + 2  # output, states, maps
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, atol=1e-5, err_msg=name)


@pytest.mark.torch
@pytest.mark.parametrize(
    "cfg, head",
    [(GTE, h) for h in HEADS]
    + [(NO_TYPES, "GteForMaskedLM"), (NO_TYPES, "GteForSequenceClassification")],
    ids=[*HEADS, "no_types-GteForMaskedLM", "no_types-GteForSequenceClassification"],
)
def test_every_head_equals_transformers(cfg, head):
    """Logits, hidden states and attention maps within 1e-5 at every position (the classifier
    reads position 0, a pad when left padded, as transformers' does)."""
    pytest.importorskip("transformers")
    _compare(cfg, head)


@pytest.mark.torch
@pytest.mark.parametrize("rope", list(ROPES))
def test_rope_scaling_equals_transformers(rope):
    pytest.importorskip("transformers")
    cfg = GTE.replace(rope=RopeParameters(**ROPES[rope]), max_position_embeddings=6)
    _compare(cfg, "GteForTokenClassification")


def test_packed_rows_equal_the_sequences_alone():
    """Two sequences packed in one row (segment_ids, positions restarting) give the logits each
    has alone in a right-padded row."""
    model = G.GteForTokenClassification(NO_TYPES)
    params = _params("GteForTokenClassification", NO_TYPES)
    apply = jax.jit(lambda p, ids, **kw: model.apply({"params": p}, ids, **kw).logits)
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, GTE.vocab_size, 5), rng.integers(1, GTE.vocab_size, 3)
    packed = np.zeros((1, LENGTH), np.int32)
    packed[0, :8] = np.concatenate([a, b])
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]])
    alone = np.zeros((2, LENGTH), np.int32)
    alone[0, :5], alone[1, :3] = a, b
    mask = (np.arange(LENGTH) < np.array([[5], [3]])).astype(np.int32)
    one = apply(
        params, packed, attention_mask=segments > 0, position_ids=positions, segment_ids=segments
    )
    two = apply(params, alone, attention_mask=mask)
    np.testing.assert_allclose(one[0, :5], two[0, :5], atol=1e-5)
    np.testing.assert_allclose(one[0, 5:8], two[1, :3], atol=1e-5)


def test_biases_and_tables_are_where_transformers_has_them():
    """Gate and up projections without a bias, the down projection with one; a token-type
    table only when type_vocab_size > 0."""
    flat = table.flatten_params(_params("GteModel", NO_TYPES))
    mlp = sorted(k.split("mlp/")[1] for k in flat if "layers/0/mlp/" in k)
    assert mlp == ["down_proj/bias", "down_proj/kernel", "gate_proj/kernel", "up_proj/kernel"]
    assert not any("token_type" in k for k in flat)
    assert "embeddings/token_type_embeddings/embedding" in table.flatten_params(
        _params("GteModel", GTE)
    )


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------
def test_config_round_trips_through_config_json(tmp_path):
    for cfg in (GTE, NO_TYPES.replace(rope=RopeParameters(**ROPES["yarn"])), GteConfig()):
        cfg.to_json_file(tmp_path / "config.json", architecture="GteModel")
        assert families.config_from_json_file(tmp_path) == cfg
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_parameters"] == {"rope_type": "default", "rope_theta": 160000.0}
    assert written["model_type"] == "gte" and written["type_vocab_size"] == 1
    # transformers' defaults (gte-multilingual-base's sizes) when config.json names nothing.
    assert families.config_from_hf_dict({"model_type": "gte"}) == GteConfig()
    older = {"model_type": "gte", "rope_theta": 500.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}}  # fmt: skip
    assert GteConfig.from_hf_dict(older).rope == RopeParameters("dynamic", 500.0, factor=2.0)
    assert families.family_of(GTE).base_model == "GteModel"


@pytest.mark.torch
def test_config_json_is_transformers(tmp_path):
    """transformers' GteConfig reads the config.json bert_jax writes to the same fields, and
    bert_jax reads the one transformers writes to the same config."""
    transformers = pytest.importorskip("transformers")
    for cfg in (GTE, NO_TYPES.replace(rope=RopeParameters(**ROPES["dynamic"]))):
        cfg.to_json_file(tmp_path / "config.json", architecture="GteModel")
        theirs = transformers.AutoConfig.from_pretrained(tmp_path)
        assert theirs.rope_parameters == cfg.rope.to_hf()
        assert theirs.type_vocab_size == cfg.type_vocab_size
        theirs.save_pretrained(tmp_path / "theirs")
        assert families.config_from_json_file(tmp_path / "theirs") == cfg


def _params(head: str, cfg=GTE):
    model = families.get_model_class(head)(cfg)
    return nn.meta.unbox(model.init(jax.random.PRNGKey(5), jnp.ones((1, 5), jnp.int32)))["params"]


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(hidden_size=30), "not divisible"),
        (dict(hidden_size=24, num_attention_heads=8), "even size"),
        (dict(type_vocab_size=-1), "type_vocab_size.*non-negative"),
        (dict(intermediate_size=0), "intermediate_size.*positive integer"),
        (dict(classifier_dropout=1.0), "probability"),
        (dict(pad_token_id=99), "pad_token_id"),
        (dict(rope={"rope_type": "default", "partial_rotary_factor": 0.5}), "partial_rotary"),
        (dict(rope=3), "RopeParameters"),
    ],
)
def test_config_checks_its_fields(change, match):
    with pytest.raises(ValueError, match=f"GteConfig.*{match}"):
        GTE.replace(**change)


def test_config_refuses_what_it_does_not_implement():
    d = GTE.to_hf_dict()
    for bad, match in (
        ({"head_dim": 16}, "head_dim"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_type"),
        ({"is_decoder": True}, "is_decoder"),
    ):
        with pytest.raises(ValueError, match=match):
            GteConfig.from_hf_dict({**d, **bad})


def test_flops_count_the_projections_gated_mlp_and_pairs():
    e, f, n = GTE.hidden_size, GTE.intermediate_size, np.array([9, 4])
    expected = 2 * (2 * (4 * e * e + 3 * e * f) * 13 + 4 * e * (81 + 16))
    assert families.family_of(GTE).encoder_flops(GTE, n) == expected


# --------------------------------------------------------------------------------------------
# Conversion both ways
# --------------------------------------------------------------------------------------------
def _fused_names(state: dict) -> dict:
    """`state` in the original release's names, as transformers 5 saves a Gte model (under
    `new.` for the original checkpoints)."""
    out = {}
    for key, value in state.items():
        for new, old in (("layers.", "encoder.layer."), ("self_attn.o_proj", "attention.o_proj"),
                         ("post_attention_layernorm", "attn_ln"), ("post_mlp_layernorm", "mlp_ln"),
                         ("lm_head.layer_norm", "lm_head.norm")):  # fmt: skip
            key = key.replace(new, old)
        out[key.replace("gte.", "new.")] = value
    for i in range(GTE.num_hidden_layers):
        for kind in ("weight", "bias"):
            parts = [out.pop(f"new.encoder.layer.{i}.self_attn.{p}_proj.{kind}") for p in "qkv"]
            out[f"new.encoder.layer.{i}.attention.qkv_proj.{kind}"] = np.concatenate(parts)
        parts = [out.pop(f"new.encoder.layer.{i}.mlp.{p}_proj.weight") for p in ("up", "gate")]
        out[f"new.encoder.layer.{i}.mlp.up_gate_proj.weight"] = np.concatenate(parts)
    return out


def test_the_original_weight_names_are_read():
    """A state dict in the original release's names (`new.` prefix, fused `qkv_proj` [3E, E]
    and `up_gate_proj` [2F, E], `attn_ln`/`mlp_ln`, `lm_head.norm`) loads as transformers 5's."""
    head = "GteForMaskedLM"
    state = table.params_to_hf_state(GTE, _params(head), head)
    original = _fused_names(state)
    assert "new.encoder.layer.1.mlp.up_gate_proj.weight" in original
    params, report = hf.hf_state_to_params(GTE, original, head)
    assert not report.unused and not report.newly_initialized, report.summary()
    assert table.max_difference(params, _params(head)) == 0.0


@pytest.mark.torch
def test_round_trip_through_transformers_with_no_missing_keys(tmp_path):
    """bert_jax -> convert.save_pytorch -> transformers loads it with no missing, unexpected or
    mismatched key -> save_pretrained -> convert.load_pytorch gives the same
    parameters back; a classifier takes the masked LM's encoder and initializes only its own
    weights."""
    transformers = pytest.importorskip("transformers")
    params = _params("GteForMaskedLM")
    convert.save_pytorch(GTE, params, tmp_path / "ours", "GteForMaskedLM")
    theirs, info = transformers.GteForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs.save_pretrained(tmp_path / "theirs")
    config, back, report = convert.load_pytorch(tmp_path / "theirs", None, return_report=True)
    assert config == GTE and not report.unused and not report.newly_initialized
    assert table.max_difference(params, back) == 0.0
    _, _, report = convert.load_pytorch(
        tmp_path / "theirs", "GteForSequenceClassification", allow_new_heads=True,
        return_report=True,
    )  # fmt: skip
    assert sorted(report.newly_initialized) == [
        f"{m}/{p}" for m in ("classifier", "gte/pooler/dense") for p in ("bias", "kernel")
    ]
    assert sorted(report.unused) == sorted(
        f"lm_head.{k}"
        for k in ("decoder.bias", "dense.bias", "dense.weight", "layer_norm.bias",
                  "layer_norm.weight")
    )  # fmt: skip


@pytest.mark.torch
def test_command_line_converts_and_verifies(tmp_path, capsys):
    """`python -m bert_jax.convert HF_DIR OUT --verify` and back: model_type picks the family,
    architectures the head; no token types (gte-base-en-v1.5's layout). transformers saves a
    model it built itself in the original release's names (the fused `qkv_proj` and
    `up_gate_proj`), which are read as its own."""
    pytest.importorskip("transformers")
    head = "GteForSequenceClassification"
    family_fixtures.transformers_model(NO_TYPES, head).save_pretrained(tmp_path / "hf")
    saved = hf.read_hf_state_dict(tmp_path / "hf")
    assert "gte.encoder.layer.1.mlp.up_gate_proj.weight" in saved, sorted(saved)
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jax"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"{head}: loaded 39 weights" in out, out
    assert "newly initialized" not in out and "unused" not in out, out
    assert float(out.split("worst max abs difference ")[1].split()[0]) < 1e-5, out
    config, _, model = native.load_pretrained(tmp_path / "jax")
    assert (config, model) == (NO_TYPES, head)
    assert convert.main([str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert detect.detect_format(str(tmp_path / "back")) == "hf"
    assert families.config_from_json_file(tmp_path / "back") == NO_TYPES
