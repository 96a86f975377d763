"""NomicBERT against transformers: every head within 1e-5 (eager attention, float32) on full,
right-padded and left-padded rows with two token types, under each rotary variant of
`rope_parameters`; config.json both ways; conversion both ways (through `bert_jax.convert`) with
no missing or unused weight; packed rows against the sequences alone."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import detect, hf, native, table, verify
from bert_jax.models import families
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.nomic_bert import model as NB
from bert_jax.models.nomic_bert.config import NomicBertConfig
from bert_jax.models.params import stack_layers, unstack_layers
from bert_jax.models.rotary import RopeParameters
from tests import family_fixtures

LENGTH = 9
# Odd sizes, three token types, a theta of its own; no dropout and eps 1e-12 as released.
NOMIC = NomicBertConfig(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, max_position_embeddings=64, type_vocab_size=3, num_labels=3,
    rope=RopeParameters(rope_theta=77.0),
)  # fmt: skip
# Each rotary variant; 6 positions trained, so that dynamic, yarn and llama3 scale the 9.
ROPES = {
    "default": dict(rope_type="default", rope_theta=1000.0),
    "linear": dict(rope_type="linear", rope_theta=500.0, factor=2.0),
    "dynamic": dict(rope_type="dynamic", rope_theta=500.0, factor=2.0),
    "yarn": dict(rope_type="yarn", rope_theta=500.0, factor=4.0, original_max_position_embeddings=6),
    "llama3": dict(rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=6),
}  # fmt: skip
# Full, right-padded, left-padded.
MASK = np.array([[1] * 9, [1] * 5 + [0] * 4, [0] * 3 + [1] * 6])
HEADS = ("NomicBertModel", "NomicBertForMaskedLM", "NomicBertForSequenceClassification",
         "NomicBertForTokenClassification")  # fmt: skip


def _inputs(cfg, head: str, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1, cfg.vocab_size, MASK.shape)
    ids[MASK == 0] = cfg.pad_token_id
    types = (np.arange(LENGTH) >= 4).astype(np.int64) + (np.arange(LENGTH) >= 7)
    return dict(input_ids=ids, attention_mask=MASK, token_type_ids=types[None].repeat(3, 0) * MASK)


def _compare(cfg, head: str) -> None:
    torch_model = family_fixtures.transformers_model(cfg, head)
    inputs = _inputs(cfg, head)
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
@pytest.mark.parametrize("head", HEADS)
def test_every_head_equals_transformers(head):
    """Logits, hidden states and attention maps within 1e-5 at every position (the classifier
    reads position 0, a pad when left padded, as transformers' does)."""
    pytest.importorskip("transformers")
    _compare(NOMIC, head)


@pytest.mark.torch
@pytest.mark.parametrize("rope", list(ROPES))
def test_every_rope_variant_equals_transformers(rope):
    pytest.importorskip("transformers")
    cfg = NOMIC.replace(rope=RopeParameters(**ROPES[rope]), max_position_embeddings=6)
    _compare(cfg, "NomicBertForMaskedLM")


def test_packed_rows_equal_the_sequences_alone():
    """Two sequences packed in one row (segment_ids, positions restarting) give the logits each
    has alone in a right-padded row."""
    model = NB.NomicBertForTokenClassification(NOMIC)
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 5), jnp.int32))["params"]
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, NOMIC.vocab_size, 5), rng.integers(1, NOMIC.vocab_size, 3)
    packed = np.zeros((1, LENGTH), np.int32)
    packed[0, :8] = np.concatenate([a, b])
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]])
    alone = np.zeros((2, LENGTH), np.int32)
    alone[0, :5], alone[1, :3] = a, b
    mask = (np.arange(LENGTH) < np.array([[5], [3]])).astype(np.int32)
    one = model.apply(
        {"params": params}, packed, attention_mask=segments > 0, position_ids=positions,
        segment_ids=segments,
    ).logits  # fmt: skip
    two = model.apply({"params": params}, alone, attention_mask=mask).logits
    np.testing.assert_allclose(one[0, :5], two[0, :5], atol=1e-5)
    np.testing.assert_allclose(one[0, 5:8], two[1, :3], atol=1e-5)


def test_scanned_and_rematerialized_layers_equal_the_loop():
    """The stack scanned over the stacked tree and rematerialized (`scan_layers`,
    `remat_policy="full"`) gives the loop's logits and gradients within 1e-5 (the conformance
    test's check, which reads a multiple-choice head NomicBERT lacks)."""
    model = NB.NomicBertForSequenceClassification(NOMIC)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 5), jnp.int32)))
    ids = np.random.default_rng(0).integers(1, NOMIC.vocab_size, MASK.shape)
    inputs = dict(input_ids=ids, attention_mask=MASK)

    def loss_and_grad(runtime, p):
        model = NB.NomicBertForSequenceClassification(NOMIC, runtime)
        loss = lambda p: model.apply(p, **inputs).logits.sum()  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(p)

    loss, grad = loss_and_grad(RuntimeConfig(), params)
    scanned = RuntimeConfig(scan_layers=True, remat_policy="full")
    stacked = {"params": stack_layers(params["params"])}
    assert "layer" in stacked["params"]["nomic_bert"]["layers"]
    loss2, grad2 = loss_and_grad(scanned, stacked)
    np.testing.assert_allclose(loss, loss2, rtol=1e-5)
    assert table.max_difference(grad["params"], unstack_layers(grad2["params"])) < 1e-5


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------
def test_config_round_trips_through_config_json(tmp_path):
    for cfg in (NOMIC, NOMIC.replace(rope=RopeParameters(**ROPES["yarn"])), NomicBertConfig()):
        cfg.to_json_file(tmp_path / "config.json", architecture="NomicBertModel")
        assert families.config_from_json_file(tmp_path) == cfg
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_parameters"] == {"rope_type": "default", "rope_theta": 1000.0}
    assert written["head_dim"] == 64 and written["model_type"] == "nomic_bert"
    # transformers' defaults (nomic-embed-text-v1.5's sizes) when config.json names nothing.
    assert families.config_from_hf_dict({"model_type": "nomic_bert"}) == NomicBertConfig()
    older = {"model_type": "nomic_bert", "rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2.0}}  # fmt: skip
    assert NomicBertConfig.from_hf_dict(older).rope == RopeParameters("linear", 500.0, factor=2.0)
    assert families.family_of(NOMIC).base_model == "NomicBertModel"


# nomic-ai/nomic-embed-text-v1.5's config.json, as its own code wrote it (the weights' keys only).
ORIGINAL = dict(
    model_type="nomic_bert", activation_function="swiglu", n_embd=768, n_head=12, n_inner=3072,
    n_layer=12, n_positions=8192, max_trained_positions=2048, layer_norm_epsilon=1e-12,
    qkv_proj_bias=False, mlp_fc1_bias=False, mlp_fc2_bias=False, prenorm=False,
    rotary_emb_base=1000, rotary_emb_fraction=1.0, rotary_emb_interleaved=False,
    rotary_scaling_factor=None, type_vocab_size=2, vocab_size=30528, causal=False,
    use_flash_attn=True, fused_bias_fc=True, auto_map={"AutoModel": "x"},
)  # fmt: skip


def test_the_original_config_json_is_read():
    """The original release's keys name the same fields (its sizes are transformers' defaults);
    a setting transformers' NomicBert does not implement raises naming the key."""
    assert families.config_from_hf_dict(ORIGINAL) == NomicBertConfig()
    small = {**ORIGINAL, "n_embd": 32, "n_head": 4, "n_inner": 37, "rotary_emb_base": 77}
    assert NomicBertConfig.from_hf_dict(small) == NomicBertConfig(
        hidden_size=32, num_attention_heads=4, intermediate_size=37, rope=dict(rope_theta=77.0)
    )
    for key, value in (("prenorm", True), ("qkv_proj_bias", True), ("rotary_scaling_factor", 2),
                       ("rotary_emb_fraction", 0.5), ("activation_function", "gelu")):  # fmt: skip
        with pytest.raises(ValueError, match=key):
            NomicBertConfig.from_hf_dict({**ORIGINAL, key: value})


def test_the_original_weight_names_are_read():
    """A state dict in the original release's names (no `nomic_bert.` prefix, fused `Wqkv`
    [3E, E], `emb_ln`, `fc11`/`fc12`/`fc2`, `norm1`/`norm2`) loads as transformers 5's."""
    state = table.params_to_hf_state(NOMIC, _params("NomicBertModel"), "NomicBertModel")
    original = {}
    for key, value in state.items():
        for new, old in (("embeddings.LayerNorm.", "emb_ln."), ("layers.", "encoder.layers."),
                         ("self_attn.o_proj", "attn.out_proj"), ("mlp.up_proj", "mlp.fc11"),
                         ("mlp.gate_proj", "mlp.fc12"), ("mlp.down_proj", "mlp.fc2"),
                         ("post_attention_layernorm", "norm1"), ("post_mlp_layernorm", "norm2")):  # fmt: skip
            key = key.replace(new, old)
        original[key] = value
    for i in range(NOMIC.num_hidden_layers):
        parts = [original.pop(f"encoder.layers.{i}.self_attn.{p}_proj.weight") for p in "qkv"]
        original[f"encoder.layers.{i}.attn.Wqkv.weight"] = np.concatenate(parts)
    params, report = hf.hf_state_to_params(NOMIC, original, "NomicBertModel")
    assert not report.unused and not report.newly_initialized, report.summary()
    assert table.max_difference(params, _params("NomicBertModel")) == 0.0


def _params(head: str):
    model = families.get_model_class(head)(NOMIC)
    return nn.meta.unbox(model.init(jax.random.PRNGKey(5), jnp.ones((1, 5), jnp.int32)))["params"]


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(hidden_size=30), "not divisible"),
        (dict(hidden_size=24, num_attention_heads=8), "even size"),
        (dict(type_vocab_size=0), "positive integer"),
        (dict(classifier_dropout=1.0), "probability"),
        (dict(pad_token_id=99), "pad_token_id"),
        (dict(rope={"rope_type": "default", "partial_rotary_factor": 0.5}), "partial_rotary"),
        (dict(rope=3), "RopeParameters"),
    ],
)
def test_config_checks_its_fields(change, match):
    with pytest.raises(ValueError, match=f"NomicBertConfig.*{match}"):
        NOMIC.replace(**change)


def test_config_refuses_what_it_does_not_implement():
    d = NOMIC.to_hf_dict()
    for bad, match in (
        ({"head_dim": 16}, "head_dim"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_type"),
        ({"is_decoder": True}, "is_decoder"),
    ):
        with pytest.raises(ValueError, match=match):
            NomicBertConfig.from_hf_dict({**d, **bad})


def test_flops_count_the_projections_swiglu_and_pairs():
    e, f, n = NOMIC.hidden_size, NOMIC.intermediate_size, np.array([9, 4])
    expected = 2 * (2 * (4 * e * e + 3 * e * f) * 13 + 4 * e * (81 + 16))
    assert families.family_of(NOMIC).encoder_flops(NOMIC, n) == expected


# --------------------------------------------------------------------------------------------
# Conversion both ways
# --------------------------------------------------------------------------------------------
@pytest.mark.torch
def test_round_trip_through_transformers_with_no_missing_keys(tmp_path):
    """bert_jax -> convert.save_pytorch -> transformers loads it with no missing, unexpected or
    mismatched key -> save_pretrained -> convert.load_pytorch gives the same parameters back; a
    classifier takes the masked LM's encoder and initializes only its own weights."""
    transformers = pytest.importorskip("transformers")
    head = "NomicBertForMaskedLM"
    params = NB.NomicBertForMaskedLM(NOMIC).init(
        jax.random.PRNGKey(3), jnp.ones((1, 5), jnp.int32)
    )["params"]
    convert.save_pytorch(NOMIC, params, tmp_path / "ours", head)
    theirs, info = transformers.NomicBertForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs.save_pretrained(tmp_path / "theirs")
    config, back, report = convert.load_pytorch(tmp_path / "theirs", None, return_report=True)
    assert config == NOMIC and not report.unused and not report.newly_initialized
    assert table.max_difference(params, back) == 0.0
    _, _, report = convert.load_pytorch(
        tmp_path / "theirs", "NomicBertForSequenceClassification", allow_new_heads=True,
        return_report=True,
    )  # fmt: skip
    assert sorted(report.newly_initialized) == [
        f"{m}/{p}" for m in ("classifier", "nomic_bert/pooler/dense") for p in ("bias", "kernel")
    ]
    assert sorted(report.unused) == sorted(
        f"cls.predictions.{k}"
        for k in ("bias", "transform.dense.bias", "transform.dense.weight",
                  "transform.layer_norm.bias", "transform.layer_norm.weight")
    )  # fmt: skip


@pytest.mark.torch
def test_command_line_converts_and_verifies(tmp_path, capsys):
    """`python -m bert_jax.convert HF_DIR OUT --verify` and back: model_type picks the family,
    architectures the head. transformers saves a model it built in the original release's names
    (the fused `attn.Wqkv`), which are read as its own."""
    pytest.importorskip("transformers")
    head = "NomicBertForSequenceClassification"
    family_fixtures.transformers_model(NOMIC, head).save_pretrained(tmp_path / "hf")
    saved = hf.read_hf_state_dict(tmp_path / "hf")
    assert "nomic_bert.encoder.layers.1.attn.Wqkv.weight" in saved, sorted(saved)
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jax"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"{head}: loaded 30 weights" in out, out
    assert "newly initialized" not in out and "unused" not in out, out
    assert float(out.split("worst max abs difference ")[1].split()[0]) < 1e-5, out
    config, _, model = native.load_pretrained(tmp_path / "jax")
    assert (config, model) == (NOMIC, head)
    assert convert.main([str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert detect.detect_format(str(tmp_path / "back")) == "hf"
    assert families.config_from_json_file(tmp_path / "back") == NOMIC


def test_layerwise_lr_decay_finds_the_layers():
    """ELECTRA's layer-wise decay reads NomicBERT's layer indices (`layers/<i>`): the
    embeddings decay^(n+2), layer i decay^(n+1-i), the head the full rate."""
    from bert_jax.training.optimizer import scale_by_layer_depth

    params = _params("NomicBertForMaskedLM")
    ones = jax.tree_util.tree_map(jnp.ones_like, params)
    tx = scale_by_layer_depth(0.5)
    scaled, _ = tx.update(ones, tx.init(params), params)
    flat = table.flatten_params(scaled)
    assert flat["nomic_bert/embeddings/LayerNorm/scale"][0] == 0.5**4
    assert flat["nomic_bert/layers/0/mlp/up_proj/kernel"][0, 0] == 0.5**3
    assert flat["nomic_bert/layers/1/self_attn/o_proj/kernel"][0, 0, 0] == 0.5**2
    assert flat["cls/predictions/bias"][0] == 1.0
