"""ModernBERT against transformers: every head within 1e-5 (eager attention, float32) on padded
and left-padded rows of an odd configuration, and conversion both ways with no missing key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import detect, hf, native, table
from bert_jax.models import families
from tests import family_fixtures
from tests.common import MODERN

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

LENGTH = 9
# Full, right-padded, left-padded, and left padding longer than the window (the first pads'
# windows hold no real key).
MASK = np.array(
    [
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 1, 1, 1, 1],
    ]
)
POOLED = ("ModernBertForSequenceClassification", "ModernBertForMultipleChoice")
CASES = [
    ("ModernBertModel", "cls"),
    ("ModernBertForMaskedLM", "cls"),
    ("ModernBertForTokenClassification", "cls"),
    ("ModernBertForQuestionAnswering", "cls"),
    *((head, pooling) for head in POOLED for pooling in ("cls", "mean")),
]


torch_model = family_fixtures.transformers_model  # random, every weight perturbed


def _state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def _real(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """x [N, L, ...] zeroed at padding (outputs there are unspecified)."""
    mask = mask.reshape(-1, LENGTH).astype(bool)
    return np.where(mask.reshape(*mask.shape, *[1] * (x.ndim - 2)), x, 0.0)


@pytest.mark.parametrize("head, pooling", CASES, ids=[f"{h}-{p}" for h, p in CASES])
def test_every_head_equals_transformers(head, pooling):
    """Logits, hidden states and attention maps within 1e-5 at real tokens.

    cls pooling reads each row's first real token, as transformers' multiple-choice head does;
    its sequence classifier reads position 0, a pad in a left-padded row, so that head's cls
    case is compared on the rows without left padding."""
    cfg = MODERN.replace(classifier_pooling=pooling, num_labels=2 if "Question" in head else 3)
    reference = torch_model(cfg, head)
    ids = np.random.default_rng(0).integers(1, cfg.vocab_size, MASK.shape)
    mask = MASK
    if head == "ModernBertForMultipleChoice":  # [2, 2, L]: the rows paired as choices
        ids, mask = ids.reshape(2, 2, LENGTH), MASK.reshape(2, 2, LENGTH)
    with torch.no_grad():
        theirs = reference(
            input_ids=torch.as_tensor(ids),
            attention_mask=torch.as_tensor(mask),
            output_hidden_states=True,
            output_attentions=True,
        )
    params, report = hf.hf_state_to_params(cfg, _state(reference), head)
    assert not report.unused and not report.newly_initialized
    model = families.get_model_class(head)(cfg)
    ours = jax.jit(
        lambda p, ids, mask: model.apply(
            {"params": p},
            ids,
            attention_mask=mask,
            output_hidden_states=True,
            output_attentions=True,
        )
    )(params, ids, mask)
    rows = slice(None)
    if head == "ModernBertForSequenceClassification" and pooling == "cls":
        rows = MASK[:, 0] == 1  # no left padding
    for name in ("logits", "start_logits", "end_logits", "last_hidden_state"):
        if getattr(theirs, name, None) is None:
            continue
        a, b = np.asarray(getattr(ours, name)), getattr(theirs, name).numpy()
        if a.ndim >= 2 and a.shape[1] == LENGTH:
            a, b = _real(a, mask), _real(b, mask)
        np.testing.assert_allclose(a[rows], b[rows], atol=1e-5, err_msg=name)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == cfg.num_hidden_layers + 1
    for a, b in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        np.testing.assert_allclose(_real(np.asarray(a), mask), _real(b.numpy(), mask), atol=1e-5)
    real_queries = mask.reshape(-1, 1, LENGTH, 1).astype(bool)
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):  # [N, H, L, L]
        np.testing.assert_allclose(
            np.where(real_queries, a, 0), np.where(real_queries, b.numpy(), 0), atol=1e-5
        )


def test_round_trip_through_transformers_with_no_missing_keys(tmp_path):
    """bert_jax -> save_pytorch -> transformers loads it with no missing, unexpected or
    mismatched key -> save_pretrained -> load_pytorch gives the same parameters back; a task
    head takes the encoder of a masked-LM checkpoint and initializes only its classifier."""
    head = "ModernBertForMaskedLM"
    model = families.get_model_class(head)(MODERN)
    params = model.init(jax.random.PRNGKey(3), jnp.ones((1, 5), jnp.int32))["params"]
    hf.save_pytorch(MODERN, params, tmp_path / "ours", head)
    theirs, info = transformers.ModernBertForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs.save_pretrained(tmp_path / "theirs")
    config, back, report = hf.load_pytorch(tmp_path / "theirs", None, return_report=True)
    assert config == MODERN and not report.unused and not report.newly_initialized
    ours, again = (
        table.check_params(MODERN, params, head),
        table.check_params(config, back, head),
    )
    assert ours.keys() == again.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], again[key], err_msg=key)
    _, tagger, report = hf.load_pytorch(
        tmp_path / "theirs",
        "ModernBertForTokenClassification",
        allow_new_heads=True,
        return_report=True,
    )
    assert sorted(report.newly_initialized) == ["classifier/bias", "classifier/kernel"]
    assert report.unused == ["decoder.bias"]
    np.testing.assert_array_equal(
        tagger["model"]["layers_2"]["attn"]["Wqkv"]["kernel"],
        ours["model/layers_2/attn/Wqkv/kernel"],
    )


def test_command_line_converts_and_verifies(tmp_path, capsys):
    """`python -m bert_jax.convert HF_DIR OUT --verify` and back, as for BERT: model_type picks
    the family, architectures the head."""
    head = "ModernBertForSequenceClassification"
    torch_model(MODERN, head).save_pretrained(tmp_path / "hf")
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jax"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"{head}: loaded 45 weights" in out, out  # every bias on: 45 tensors
    assert "newly initialized" not in out and "unused" not in out, out
    worst = float(out.split("worst max abs difference ")[1].split()[0])
    assert worst < 1e-5, out
    config, _, model = native.load_pretrained(tmp_path / "jax")
    assert (config, model) == (MODERN, head)
    assert convert.main([str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert detect.detect_format(str(tmp_path / "back")) == "hf"
    assert families.config_from_json_file(tmp_path / "back") == MODERN
