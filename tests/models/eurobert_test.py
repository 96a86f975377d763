"""EuroBERT against transformers: every head within 1e-5 (eager attention, float32) on full,
right-padded and left-padded rows of odd configurations with fewer key/value heads than query
heads (every rotary variant, a head size other than E / H, tied and untied MLM heads, biases on),
conversion both ways through `bert_jax.convert` with nothing missing or unused, config.json, and
packed rows against padded ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import hf, table
from bert_jax.models import families
from bert_jax.models.eurobert import model as EB
from bert_jax.models.eurobert.config import EuroBertConfig
from bert_jax.models.rotary import RopeParameters
from tests import family_fixtures

LENGTH = 9
MASK = np.array(
    [
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 1, 1],
    ]
)
# Odd sizes; 6 query heads share 2 key/value heads (3 each).
TINY = EuroBertConfig(
    vocab_size=99,
    hidden_size=36,
    intermediate_size=37,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=66,
    initializer_range=0.2,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=1,
    mask_token_id=2,
    rope_parameters=RopeParameters(rope_theta=77.0),
    num_labels=3,
)
ROPES = {
    "linear": dict(rope_type="linear", rope_theta=500.0, factor=2.0),
    "dynamic": dict(rope_type="dynamic", rope_theta=500.0, factor=3.0),  # grows past 8
    "yarn": dict(rope_type="yarn", rope_theta=500.0, factor=4.0,
                 original_max_position_embeddings=16),
    "llama3": dict(rope_type="llama3", rope_theta=500.0, factor=8.0,
                   original_max_position_embeddings=4, low_freq_factor=1.0,
                   high_freq_factor=4.0),
}  # fmt: skip
HEADS = (
    "EuroBertModel",
    "EuroBertForMaskedLM",
    "EuroBertForSequenceClassification",
    "EuroBertForTokenClassification",
)
CASES = {
    **{head: (head, {}) for head in HEADS},
    "tied-mlm-with-biases": (
        "EuroBertForMaskedLM",
        dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    ),
    "untied-mlm-with-biases": ("EuroBertForMaskedLM", dict(mlp_bias=True)),
    "head-size-10": ("EuroBertForMaskedLM", dict(head_size=10)),
    "bos": ("EuroBertForSequenceClassification", dict(classifier_pooling="bos")),
    "mean": ("EuroBertForSequenceClassification", dict(classifier_pooling="mean")),
    "regression": ("EuroBertForSequenceClassification", dict(num_labels=1)),
    "multi-head-attention": ("EuroBertForMaskedLM", dict(num_key_value_heads=6)),
    **{
        f"rope-{name}": (
            "EuroBertForMaskedLM",
            dict(
                rope_parameters=RopeParameters(**rope),
                max_position_embeddings=8 if name == "dynamic" else 66,
            ),
        )
        for name, rope in ROPES.items()
    },
}


def _real(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """x [N, L, ...] zeroed at padding (outputs there are unspecified)."""
    mask = mask.astype(bool)
    return np.where(mask.reshape(*mask.shape, *[1] * (x.ndim - 2)), x, 0.0)


@pytest.mark.torch
@pytest.mark.parametrize("case", list(CASES))
def test_every_head_equals_transformers(case):
    """Logits, hidden states and attention maps within 1e-5 at real tokens, the checkpoint read
    with no weight unused and none new."""
    torch = pytest.importorskip("torch")
    head, changes = CASES[case]
    cfg = TINY.replace(**changes)
    reference = family_fixtures.transformers_model(cfg, head)
    ids = np.random.default_rng(0).integers(3, cfg.vocab_size, MASK.shape)
    with torch.no_grad():
        theirs = reference(
            input_ids=torch.as_tensor(ids),
            attention_mask=torch.as_tensor(MASK),
            output_hidden_states=True,
            output_attentions=True,
        )
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    params, report = hf.hf_state_to_params(cfg, state, head)
    assert not report.unused and not report.newly_initialized, report.summary()
    model = families.get_model_class(head)(cfg)
    ours = jax.jit(
        lambda p, ids, mask: model.apply(
            {"params": p}, ids, attention_mask=mask, output_hidden_states=True,
            output_attentions=True,
        )
    )(params, ids, MASK)  # fmt: skip
    for name in ("logits", "last_hidden_state"):
        if getattr(theirs, name, None) is None:
            continue
        a, b = np.asarray(getattr(ours, name)), getattr(theirs, name).numpy()
        if a.ndim >= 2 and a.shape[1] == LENGTH:
            a, b = _real(a, MASK), _real(b, MASK)
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == cfg.num_hidden_layers + 1
    for a, b in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        np.testing.assert_allclose(_real(np.asarray(a), MASK), _real(b.numpy(), MASK), atol=1e-5)
    real_queries = MASK.reshape(-1, 1, LENGTH, 1).astype(bool)
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):  # [N, H, L, L]
        np.testing.assert_allclose(
            np.where(real_queries, a, 0), np.where(real_queries, b.numpy(), 0), atol=1e-5
        )


@pytest.mark.torch
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_conversion_both_ways_through_transformers(tmp_path, tied):
    """bert_jax -> convert.save_pytorch -> transformers loads it with no missing, unexpected or
    mismatched key -> save_pretrained -> convert.load_pytorch gives the same parameters and
    config back, nothing unused; a classifier takes the masked LM's encoder and initializes only
    its own layers."""
    transformers = pytest.importorskip("transformers")
    head = "EuroBertForMaskedLM"
    cfg = TINY.replace(tie_word_embeddings=tied, mlp_bias=True)
    params = family_fixtures.random_params(cfg, head, seed=3)
    convert.save_pytorch(cfg, params, tmp_path / "ours", head)
    theirs, info = transformers.EuroBertForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert theirs.config.tie_word_embeddings is tied
    theirs.save_pretrained(tmp_path / "theirs")
    config, back, report = convert.load_pytorch(tmp_path / "theirs", None, return_report=True)
    assert config == cfg and not report.unused and not report.newly_initialized
    flat, flat_back = (table.flatten_params(p) for p in (params, back))
    assert flat.keys() == flat_back.keys()
    for key, value in flat.items():
        np.testing.assert_array_equal(flat_back[key], value, err_msg=key)
    _, cls_params, report = convert.load_pytorch(
        tmp_path / "theirs",
        "EuroBertForSequenceClassification",
        allow_new_heads=True,
        return_report=True,
    )
    assert sorted(report.newly_initialized) == [
        "classifier/bias", "classifier/kernel", "dense/bias", "dense/kernel",
    ]  # fmt: skip


def test_config_json_both_spellings(tmp_path):
    """config.json round trips; transformers 4's `rope_theta` + `rope_scaling` and the first
    releases' `clf_pooling` read as `rope_parameters` and `classifier_pooling`."""
    cfg = TINY.replace(rope_parameters=RopeParameters(**ROPES["yarn"]), head_size=10)
    cfg.to_json_file(tmp_path / "config.json")
    assert EuroBertConfig.from_json_file(tmp_path) == cfg
    old = {k: v for k, v in TINY.to_hf_dict().items() if k not in ("rope_parameters", "head_dim")}
    old.update(rope_theta=250000.0, rope_scaling={"type": "linear", "factor": 2.0})
    old.pop("classifier_pooling")
    old["clf_pooling"] = "bos"
    read = EuroBertConfig.from_hf_dict(old)
    assert read.rope == RopeParameters("linear", 250000.0, factor=2.0)
    assert read.classifier_pooling == "bos" and read.head_dim == 6


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(num_key_value_heads=4), "must divide num_attention_heads"),
        (dict(classifier_pooling="cls"), "classifier_pooling"),
        (dict(rope_parameters={"rope_type": "yarn"}), "needs"),
        (dict(head_size=0), "head_size"),
        (dict(tie_word_embeddings=1), "tie_word_embeddings"),
    ],
)
def test_config_checks_its_fields(change, match):
    with pytest.raises(ValueError, match=match):
        TINY.replace(**change)


@pytest.mark.parametrize("pooling", ["bos", "mean", "late"])
def test_packed_rows_equal_padded_rows(pooling):
    """Two sequences (5 and 3 tokens) packed in one row give the classifier logits each has
    alone in a right-padded row, under every pooling; the masked LM's logits too."""
    cfg = TINY.replace(classifier_pooling=pooling)
    rng = np.random.default_rng(1)
    a, b = rng.integers(3, cfg.vocab_size, 5), rng.integers(3, cfg.vocab_size, 3)
    packed = np.zeros((1, LENGTH), np.int32)
    packed[0, :8] = np.concatenate([a, b])
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    alone = np.zeros((2, LENGTH), np.int32)
    alone[0, :5], alone[1, :3] = a, b
    alone_mask = (np.arange(LENGTH) < np.array([[5], [3]])).astype(np.int32)
    for cls in (EB.EuroBertForSequenceClassification, EB.EuroBertForMaskedLM):
        model = cls(cfg)
        params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 5), jnp.int32))["params"]
        pooled = cls is EB.EuroBertForSequenceClassification
        one = model.apply(
            {"params": params}, packed, attention_mask=segments > 0, segment_ids=segments,
            position_ids=np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]]),
            cls_positions=np.array([[0, 5]]) if pooled else None,
        ).logits  # fmt: skip
        two = model.apply({"params": params}, alone, attention_mask=alone_mask).logits
        if pooled:
            np.testing.assert_allclose(one[0], two, atol=1e-5)
        else:
            np.testing.assert_allclose(one[0, :5], two[0, :5], atol=1e-5)
            np.testing.assert_allclose(one[0, 5:8], two[1, :3], atol=1e-5)
