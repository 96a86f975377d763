"""MPNet against transformers: every head within 1e-5 (eager attention, float32) on full,
right-padded, left-padded and holed rows of an odd configuration (rows longer than the exact
buckets, so that the log-spaced ones are read, and a bias table with more rows than the 32
buckets); T5's buckets against transformers' function; packed rows, the scanned and
rematerialized layers and fused_xla against the exact path; config.json; conversion both ways."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import detect, hf, native, table, verify
from bert_jax.models import families
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.encoder import padded_positions
from bert_jax.models.mpnet import model as MP
from bert_jax.models.mpnet.config import MPNetConfig
from bert_jax.models.relative_position import t5_relative_position_buckets
from tests import family_fixtures

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

LENGTH = 23  # past the 8 exact buckets of each direction
# The tanh GELU in its layers (its MLM head keeps the exact one), 40 bias rows (32 read), 30
# position rows (28 positions: pad id 1).
MPNET = MPNetConfig(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, max_position_embeddings=30, layer_norm_eps=1e-5, hidden_act="gelu_new",
    relative_attention_num_buckets=40, num_labels=3,
)  # fmt: skip
# Full, right-padded, left-padded, and a hole: <pad> ids where the mask is 0, so that
# transformers counts positions over the other tokens.
MASK = np.ones((4, LENGTH), np.int64)
MASK[1, 15:] = MASK[2, :6] = MASK[3, 2:4] = 0
HEADS = ("MPNetModel", "MPNetForMaskedLM", "MPNetForSequenceClassification",
         "MPNetForMultipleChoice", "MPNetForTokenClassification", "MPNetForQuestionAnswering")  # fmt: skip

torch_model = family_fixtures.transformers_model  # random, every weight perturbed


def _inputs(cfg, head: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, cfg.vocab_size, MASK.shape)
    ids[MASK == 0] = cfg.pad_token_id
    out = dict(input_ids=ids, attention_mask=MASK)
    if head.endswith("MultipleChoice"):  # [2, 2, L]: the rows paired as choices
        out = {k: v.reshape(2, 2, LENGTH) for k, v in out.items()}
    return out


@pytest.mark.parametrize("head", HEADS)
def test_every_head_equals_transformers(head):
    """Logits, hidden states and attention maps within 1e-5, every position (the xla kernel
    treats padding as transformers does; the classifiers read position 0, a pad when left
    padded, as transformers' do)."""
    cfg = MPNET.replace(num_labels=2 if "Question" in head else 3)
    reference = torch_model(cfg, head)
    inputs = _inputs(cfg, head)
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    params, report = hf.hf_state_to_params(cfg, state, head)
    assert not report.unused and not report.newly_initialized
    model = families.get_model_class(head)(cfg)
    ours = jax.jit(
        lambda p, x: model.apply(
            {"params": p}, **x, output_hidden_states=True, output_attentions=True
        )
    )(params, inputs)
    ours, theirs = verify.named_outputs(ours), verify.torch_outputs(reference, inputs)
    assert set(ours) == set(theirs) and len(theirs) >= 1 + 3 + 2  # output, states, maps
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, atol=1e-5, err_msg=name)


def test_buckets_equal_transformers():
    """T5's bidirectional buckets (32 up to 128, as MPNet reads them) for rows up to 600 long."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    for length in (1, 9, 600):
        index = torch.arange(length)
        theirs = MPNetEncoder.relative_position_bucket(index[None, :] - index[:, None])
        np.testing.assert_array_equal(t5_relative_position_buckets(length), theirs.numpy())


def test_positions_count_from_padding_idx_over_real_tokens():
    ids = np.array([[5, 6, 1, 7, 1], [1, 1, 5, 6, 7]])
    np.testing.assert_array_equal(
        padded_positions(ids, None, MP.PADDING_IDX), [[2, 3, 1, 4, 1], [1, 1, 2, 3, 4]]
    )
    np.testing.assert_array_equal(
        padded_positions(ids, np.array([[0, 1, 2, 0, 1]] * 2), MP.PADDING_IDX)[0], [2, 3, 4, 2, 3]
    )
    with pytest.raises(ValueError, match="exceeds the 28 positions"):
        MP.MPNetModel(MPNET).init(jax.random.PRNGKey(0), jnp.ones((1, 29), jnp.int32))


def random_params(cfg, head: str, seed: int = 2) -> dict:
    """Parameters of `head` drawn from N(0, 0.3) (norm scales and biases too), without an init."""
    noise = np.random.default_rng(seed)
    flat = {k: noise.normal(0, 0.3, shape).astype(np.float32)
            for k, shape in table.expected_shapes(cfg, head).items()}  # fmt: skip
    return table.unflatten_params(flat, scan_layers=False)


def _packed_vs_alone(model, cfg, pooled: bool, runtime_model=None):
    """Outputs of two sequences (lengths 12 and 9) packed in one row of 23 (positions
    restarting), and of each alone in a right-padded row."""
    params = random_params(model.config, type(model).__name__)
    rng = np.random.default_rng(1)
    a, b = rng.integers(3, cfg.vocab_size, 12), rng.integers(3, cfg.vocab_size, 9)
    packed = np.full((1, LENGTH), cfg.pad_token_id)
    packed[0, :21] = np.concatenate([a, b])
    segments = np.array([[1] * 12 + [2] * 9 + [0] * 2])
    positions = np.array([[*range(12), *range(9), 0, 0]])
    alone = np.full((2, LENGTH), cfg.pad_token_id)
    alone[0, :12], alone[1, :9] = a, b
    run = runtime_model or model
    out_packed = jax.jit(run.apply)(
        {"params": params}, packed, attention_mask=segments > 0, segment_ids=segments,
        position_ids=positions, cls_positions=np.array([[0, 12]]) if pooled else None,
    )  # fmt: skip
    return out_packed, jax.jit(model.apply)({"params": params}, alone, attention_mask=alone != 1)


def test_packed_rows_equal_the_sequences_alone():
    """Positions restarting per packed sequence and the classifier read at each <s>."""
    packed, alone = _packed_vs_alone(MP.MPNetForSequenceClassification(MPNET), MPNET, True)
    assert packed.logits.shape == (1, 2, MPNET.num_labels)
    np.testing.assert_allclose(packed.logits[0], alone.logits, atol=1e-5)


def test_fused_xla_equals_xla_on_packed_rows_and_cudnn_is_refused():
    cfg = MPNET.replace(attention_probs_dropout_prob=0.0)
    model = MP.MPNetForMaskedLM(cfg)
    other = MP.MPNetForMaskedLM(cfg, RuntimeConfig(attention="fused_xla"))
    packed, alone = _packed_vs_alone(model, cfg, False, runtime_model=other)
    np.testing.assert_allclose(packed.logits[0, :12], alone.logits[0, :12], atol=1e-5)
    np.testing.assert_allclose(packed.logits[0, 12:21], alone.logits[1, :9], atol=1e-5)
    from bert_jax.models.attention import resolve_attention

    with pytest.raises(ValueError, match="score bias"):
        resolve_attention(RuntimeConfig(attention="splash"), cfg, "tpu", training=False)
    bf16 = RuntimeConfig(attention="auto", dtype="bfloat16")
    assert resolve_attention(bf16, cfg, "gpu", training=False, compute_capability="9.0") == "xla"


@pytest.mark.parametrize("runtime", [dict(scan_layers=True), dict(remat_policy="full")])
def test_scanned_and_rematerialized_layers_equal_the_loop(runtime):
    head = "MPNetForMaskedLM"
    params = random_params(MPNET, head)
    inputs = _inputs(MPNET, head)
    model = MP.MPNetForMaskedLM(MPNET)
    other = MP.MPNetForMaskedLM(MPNET, RuntimeConfig(**runtime))
    other_params = params
    if runtime.get("scan_layers"):
        from bert_jax.models.params import stack_layers

        other_params = stack_layers(params)
    want = model.apply({"params": params}, **inputs).logits
    got = other.apply({"params": other_params}, **inputs).logits
    np.testing.assert_allclose(got, want, atol=1e-5)


# --------------------------------------------------------------------------------------------
# config.json and the registry
# --------------------------------------------------------------------------------------------
def test_config_round_trips_and_model_type_picks_the_family(tmp_path):
    for cfg in (MPNET, MPNetConfig.preset("base")):
        cfg.to_json_file(tmp_path / "config.json", architecture="MPNetModel")
        assert families.config_from_json_file(tmp_path) == cfg
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["model_type"] == "mpnet" and "type_vocab_size" not in d
    hf_config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert hf_config.relative_attention_num_buckets == 32 and hf_config.vocab_size == 30527
    assert MPNetConfig.preset("base").max_sequence_length == 512
    family = families.family_of(MPNET)
    assert (family.model_type, family.base_model) == ("mpnet", "MPNetModel")
    with pytest.raises(ValueError, match="mpnet has no next_sentence head"):
        family.head_for(families.Role.NEXT_SENTENCE)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(max_position_embeddings=2), "at least 3"),
        (dict(hidden_size=30), "not divisible"),
        (dict(relative_attention_num_buckets=16), "relative_attention_num_buckets"),
        (dict(pad_token_id=99), "pad_token_id"),
        (dict(hidden_dropout_prob=1.0), "probability"),
    ],
)
def test_config_checks_its_fields(change, match):
    with pytest.raises(ValueError, match=f"MPNetConfig.*{match}"):
        MPNET.replace(**change)


# --------------------------------------------------------------------------------------------
# Conversion both ways
# --------------------------------------------------------------------------------------------
def test_round_trip_through_transformers_with_no_missing_keys(tmp_path):
    """bert_jax -> save_pytorch -> transformers loads it with no missing, unexpected or
    mismatched key -> save_pretrained -> load_pytorch gives the same parameters back; a classifier
    takes the encoder of the masked-LM checkpoint and initializes only its own weights."""
    head = "MPNetForMaskedLM"
    params = MP.MPNetForMaskedLM(MPNET).init(jax.random.PRNGKey(3), jnp.ones((1, 5), jnp.int32))[
        "params"
    ]
    hf.save_pytorch(MPNET, params, tmp_path / "ours", head)
    theirs, info = transformers.MPNetForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs.save_pretrained(tmp_path / "theirs")
    config, back, report = hf.load_pytorch(tmp_path / "theirs", None, return_report=True)
    assert config == MPNET and not report.unused and not report.newly_initialized
    assert table.max_difference(params, back) == 0.0
    _, _, report = hf.load_pytorch(tmp_path / "theirs", "MPNetForSequenceClassification",
                                   allow_new_heads=True, return_report=True)  # fmt: skip
    assert sorted(report.newly_initialized) == [
        f"classifier/{m}/{p}" for m in ("dense", "out_proj") for p in ("bias", "kernel")
    ]
    assert sorted(report.unused) == [f"lm_head.{k}" for k in ("bias", "dense.bias", "dense.weight", "layer_norm.bias", "layer_norm.weight")]  # fmt: skip


def test_command_line_converts_and_verifies(tmp_path, capsys):
    """`python -m bert_jax.convert HF_DIR OUT --verify` and back: model_type picks the family,
    architectures the head; --verify's sample rows are cut to the 28 positions."""
    head = "MPNetForMultipleChoice"
    torch_model(MPNET, head).save_pretrained(tmp_path / "hf")
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jax"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "newly initialized" not in out and "unused" not in out, out
    assert float(out.split("worst max abs difference ")[1].split()[0]) < 1e-5, out
    config, _, model = native.load_pretrained(tmp_path / "jax")
    assert (config, model) == (MPNET, head)
    assert convert.main([str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert detect.detect_format(str(tmp_path / "back")) == "hf"
    assert families.config_from_json_file(tmp_path / "back") == MPNET


# --------------------------------------------------------------------------------------------
# The tokenizer
# --------------------------------------------------------------------------------------------
def test_tokenizer_rows_equal_transformers_from_either_file(tmp_path):
    """The fixture's MPNet WordPiece, saved: transformers' AutoTokenizer reads it as
    MPNetTokenizer, and `load_tokenizer` (tokenizer.json or vocab.txt) lays out the same rows
    (`<s> A </s></s> B </s>`, <mask> and [UNK] inside)."""
    from bert_jax import tokenization

    tokenizer = family_fixtures.mpnet_wordpiece(family_fixtures.training_texts())
    assert (tokenizer.cls_id, tokenizer.pad_id, tokenizer.sep_id, tokenizer.unk_id) == (0, 1, 2, 3)
    tokenizer.save(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(theirs).__name__ == "MPNetTokenizer" and theirs.pad_token_id == 1
    for path in (tmp_path, tmp_path / "vocab.txt"):
        ours = tokenization.load_tokenizer(path)
        assert isinstance(ours, tokenization.MPNetTokenizer)
        for a, b in (("Fair is foul, and <mask> is fair!", "Who? zzqx"), ("Ünï 中文 text", None)):
            row, types = ours.build_inputs(ours.encode(a), None if b is None else ours.encode(b))
            assert row == theirs(a, b)["input_ids"] and not any(types)


def test_tokenizer_options_apply_and_bert_only_ones_are_refused(tmp_path):
    from bert_jax import tokenization

    family_fixtures.mpnet_wordpiece(family_fixtures.training_texts()).save(tmp_path)
    cased = tokenization.load_tokenizer(tmp_path, lowercase=False)
    assert isinstance(cased, tokenization.MPNetTokenizer) and cased.lowercase is False
    assert tokenization.load_tokenizer(tmp_path, strip_accents=True).lowercase is True
    with pytest.raises(ValueError, match="match_original applies to BERT's only"):
        tokenization.load_tokenizer(tmp_path / "vocab.txt", match_original=True)
