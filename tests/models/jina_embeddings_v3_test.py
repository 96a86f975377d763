"""Jina-embeddings-v3 against transformers: every head within 1e-5 (eager attention, float32)
on full, right-padded and left-padded rows with two token types, under rotary variants of
`rope_parameters`; config.json both ways; conversion both ways (through `bert_jax.convert`)
with no missing or unused weight; packed rows against the sequences alone, and the scanned,
rematerialized stack against the loop. Tiny configs only: the default stage's time is short."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import hf, table, verify
from bert_jax.models import families
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.jina_embeddings_v3 import model as JM
from bert_jax.models.jina_embeddings_v3.config import JinaEmbeddingsV3Config
from bert_jax.models.params import stack_layers, unstack_layers
from bert_jax.models.rotary import RopeParameters
from tests import family_fixtures

LENGTH = 9
# Odd sizes, two token types, a theta of its own, no dropout in the comparison.
JINA = JinaEmbeddingsV3Config(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, max_position_embeddings=64, type_vocab_size=2, num_labels=3,
    rope=RopeParameters(rope_theta=77.0),
)  # fmt: skip
# Rotary variants; 6 positions trained, so that dynamic and yarn scale the 9.
ROPES = {
    "dynamic": dict(rope_type="dynamic", rope_theta=500.0, factor=2.0),
    "yarn": dict(rope_type="yarn", rope_theta=500.0, factor=4.0, original_max_position_embeddings=6),
}  # fmt: skip
# Full, right-padded, left-padded.
MASK = np.array([[1] * 9, [1] * 5 + [0] * 4, [0] * 3 + [1] * 6])
HEADS = tuple(families.FAMILIES["jina_embeddings_v3"].model_classes)


def _inputs(cfg) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(0).integers(3, cfg.vocab_size, MASK.shape)
    ids[MASK == 0] = cfg.pad_token_id
    types = (np.arange(LENGTH) >= 4).astype(np.int64)
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
@pytest.mark.parametrize("head", HEADS)
def test_every_head_equals_transformers(head):
    """(transformers' QA head is `num_labels` wide: 2 for it.) Logits (the encoder's pooler output too), hidden states and attention maps within 1e-5
    at every position (the classifier reads position 0, a pad when left padded, as
    transformers' does)."""
    pytest.importorskip("transformers")
    _compare(JINA.replace(num_labels=2 if "Question" in head else 3), head)


@pytest.mark.torch
@pytest.mark.parametrize("rope", list(ROPES))
def test_rope_variants_equal_transformers(rope):
    pytest.importorskip("transformers")
    cfg = JINA.replace(rope=RopeParameters(**ROPES[rope]), max_position_embeddings=6)
    _compare(cfg, "JinaEmbeddingsV3Model")


def test_packed_rows_equal_the_sequences_alone():
    """Two sequences packed in one row (segment_ids, positions restarting) give the logits each
    has alone in a right-padded row."""
    model = JM.JinaEmbeddingsV3ForTokenClassification(JINA)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 5), jnp.int32))["params"]
    apply = jax.jit(model.apply)  # one compile each, where op by op takes seconds
    rng = np.random.default_rng(1)
    a, b = rng.integers(3, JINA.vocab_size, 5), rng.integers(3, JINA.vocab_size, 3)
    packed = np.full((1, LENGTH), JINA.pad_token_id, np.int32)
    packed[0, :8] = np.concatenate([a, b])
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]])
    alone = np.full((2, LENGTH), JINA.pad_token_id, np.int32)
    alone[0, :5], alone[1, :3] = a, b
    mask = (np.arange(LENGTH) < np.array([[5], [3]])).astype(np.int32)
    one = apply(
        {"params": params}, packed, attention_mask=segments > 0, position_ids=positions,
        segment_ids=segments,
    ).logits  # fmt: skip
    two = apply({"params": params}, alone, attention_mask=mask).logits
    np.testing.assert_allclose(one[0, :5], two[0, :5], atol=1e-5)
    np.testing.assert_allclose(one[0, 5:8], two[1, :3], atol=1e-5)


def test_scanned_and_rematerialized_layers_equal_the_loop():
    """The stack scanned over the stacked tree and rematerialized (`scan_layers`,
    `remat_policy="full"`) gives the loop's logits and gradients within 1e-5."""
    model = JM.JinaEmbeddingsV3ForSequenceClassification(JINA)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 5), jnp.int32)))
    ids = np.random.default_rng(0).integers(3, JINA.vocab_size, MASK.shape)
    inputs = dict(input_ids=ids, attention_mask=MASK)

    def loss_and_grad(runtime, p):
        model = JM.JinaEmbeddingsV3ForSequenceClassification(JINA, runtime)
        loss = lambda p: model.apply(p, **inputs).logits.sum()  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(p)

    loss, grad = loss_and_grad(RuntimeConfig(), params)
    scanned = RuntimeConfig(scan_layers=True, remat_policy="full")
    stacked = {"params": stack_layers(params["params"])}
    assert "layer" in stacked["params"]["roberta"]["layers"]
    loss2, grad2 = loss_and_grad(scanned, stacked)
    np.testing.assert_allclose(loss, loss2, rtol=1e-5)
    assert table.max_difference(grad["params"], unstack_layers(grad2["params"])) < 1e-5


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------
def test_config_round_trips_through_config_json(tmp_path):
    yarn = JINA.replace(rope=RopeParameters(**ROPES["yarn"]))
    for cfg in (JINA, yarn, JinaEmbeddingsV3Config()):
        cfg.to_json_file(tmp_path / "config.json", architecture="JinaEmbeddingsV3Model")
        assert families.config_from_json_file(tmp_path) == cfg
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_parameters"] == {"rope_type": "default", "rope_theta": 20000.0}
    assert written["model_type"] == "jina_embeddings_v3" and written["tie_word_embeddings"]
    # transformers' defaults (jina-embeddings-v3's sizes) when config.json names nothing.
    assert families.config_from_hf_dict({"model_type": "jina_embeddings_v3"}) == (
        JinaEmbeddingsV3Config.preset("large")
    )
    older = {"model_type": "jina_embeddings_v3", "rope_theta": 500.0,
             "rope_scaling": {"type": "linear", "factor": 2.0}}  # fmt: skip
    assert JinaEmbeddingsV3Config.from_hf_dict(older).rope == RopeParameters(
        "linear", 500.0, factor=2.0
    )
    assert families.family_of(JINA).base_model == "JinaEmbeddingsV3Model"


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(hidden_size=30), "not divisible"),
        (dict(hidden_size=24, num_attention_heads=8), "even size"),
        (dict(type_vocab_size=0), "positive integer"),
        (dict(classifier_dropout=1.0), "probability"),
        (dict(pad_token_id=99), "pad_token_id"),
        (dict(eos_token_id=-1), "eos_token_id"),
        (dict(rope={"rope_type": "default", "partial_rotary_factor": 0.5}), "partial_rotary"),
        (dict(rope=3), "RopeParameters"),
    ],
)
def test_config_checks_its_fields(change, match):
    with pytest.raises(ValueError, match=f"JinaEmbeddingsV3Config.*{match}"):
        JINA.replace(**change)


def test_config_refuses_what_it_does_not_implement():
    d = JINA.to_hf_dict()
    for bad, match in (
        ({"head_dim": 16}, "head_dim"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_type"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings"),
        ({"is_decoder": True}, "is_decoder"),
    ):
        with pytest.raises(ValueError, match=match):
            JinaEmbeddingsV3Config.from_hf_dict({**d, **bad})


def test_flops_count_the_projections_mlp_and_pairs():
    e, f, n = JINA.hidden_size, JINA.intermediate_size, np.array([9, 4])
    expected = 2 * (2 * (4 * e * e + 2 * e * f) * 13 + 4 * e * (81 + 16))
    assert families.family_of(JINA).encoder_flops(JINA, n) == expected


# --------------------------------------------------------------------------------------------
# Conversion both ways
# --------------------------------------------------------------------------------------------
@pytest.mark.torch
def test_round_trip_through_transformers_with_no_missing_keys(tmp_path):
    """bert_jax -> convert.save_pytorch -> transformers loads it with no missing, unexpected or
    mismatched key -> save_pretrained -> convert.load_pytorch gives the same parameters back; a
    classifier takes the masked LM's encoder and initializes only its own weights."""
    transformers = pytest.importorskip("transformers")
    head = "JinaEmbeddingsV3ForMaskedLM"
    params = JM.JinaEmbeddingsV3ForMaskedLM(JINA).init(
        jax.random.PRNGKey(3), jnp.ones((1, 5), jnp.int32)
    )["params"]
    convert.save_pytorch(JINA, params, tmp_path / "ours", head)
    theirs, info = transformers.JinaEmbeddingsV3ForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs.save_pretrained(tmp_path / "theirs")
    config, back, report = convert.load_pytorch(tmp_path / "theirs", None, return_report=True)
    assert config == JINA and not report.unused and not report.newly_initialized
    assert table.max_difference(params, back) == 0.0
    _, _, report = convert.load_pytorch(
        tmp_path / "theirs", "JinaEmbeddingsV3ForSequenceClassification", allow_new_heads=True,
        return_report=True,
    )  # fmt: skip
    assert sorted(report.newly_initialized) == [
        f"classifier/{m}/{p}" for m in ("dense", "out_proj") for p in ("bias", "kernel")
    ]
    assert sorted(report.unused) == sorted(
        f"lm_head.{k}"
        for k in ("bias", "dense.bias", "dense.weight", "layer_norm.bias", "layer_norm.weight")
    )
