"""DeBERTa-v2/v3 against transformers: every head within 1e-5 (eager attention, float32) on full,
right-padded, left-padded and holed rows, every position (padding too: transformers' masking is
kept), on odd configurations: DeBERTa-v3's settings with 8 log buckets (distances beyond 4 share
buckets in 9-token rows), and one with token types, absolute positions, its own position
projections (share_att_key=False), c2p alone and no buckets (distances clipped at 3); the legacy
and the original MLM head layouts. Worst absolute differences observed (CPU, float32) over every
output, hidden state and attention map: 3.8e-6 (the original head's MLM logits), 3.4e-6 (token
classification logits), 2.4e-6 (the encoder's last states); the v3 configuration 3.4e-6, the typed
one 2.8e-6.

Also: the replaced-token-detection discriminator (transformers has none) against transformers'
DebertaV2Model and DeBERTa's head written in torch; packed rows; scan and remat; the kernels
(fused_xla equal, cudnn and splash refused naming the family); config.json; conversion both
ways; the DeBERTa-v3 tokenizer against transformers' on the Shakespeare excerpt."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert, tokenization
from bert_jax.checkpoints import hf, native, table, verify
from bert_jax.models import families
from bert_jax.models.attention import resolve_attention
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.deberta_v2 import model as DB
from bert_jax.models.deberta_v2.config import DebertaV2Config
from bert_jax.models.relative_position import make_log_bucket_position, relative_positions
from bert_jax.tokenization import unigram
from tests import family_fixtures

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

LENGTH = 9
V3 = DebertaV2Config(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, max_position_embeddings=20, initializer_range=0.2,
    relative_attention=True, max_relative_positions=-1, position_buckets=8,
    norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type="p2c|c2p",
    position_biased_input=False, type_vocab_size=0, hidden_act="gelu_new", num_labels=3,
)  # fmt: skip
# Token types, absolute positions, own position projections, c2p alone, no buckets: distances
# clipped to the 6 rows of max_relative_positions=3 (clamped both ways in 9-token rows).
TYPED = V3.replace(
    type_vocab_size=3, position_biased_input=True, share_att_key=False, pos_att_type=("c2p",),
    position_buckets=-1, max_relative_positions=3, norm_rel_ebd="none", hidden_act="gelu",
    pooler_hidden_act="relu", cls_dropout=0.3,
)  # fmt: skip
CONFIGS = {"v3": V3, "typed": TYPED, "original-mlm-head": V3.replace(legacy=False)}
MASK = np.array(
    [
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 1, 1, 1, 1, 1],
    ]
)
TASKS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForMultipleChoice",
         "ForTokenClassification", "ForQuestionAnswering")  # fmt: skip
CASES = [(c, f"DebertaV2{t}") for c in ("v3", "typed") for t in TASKS]
CASES.append(("original-mlm-head", "DebertaV2ForMaskedLM"))

torch_model = family_fixtures.transformers_model  # random, every weight perturbed


def _inputs(cfg, head: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, cfg.vocab_size, MASK.shape)
    ids[MASK == 0] = cfg.pad_token_id
    out = dict(input_ids=ids, attention_mask=MASK)
    if cfg.type_vocab_size:
        out["token_type_ids"] = np.minimum(np.arange(LENGTH) // 3, 2)[None].repeat(4, 0) * MASK
    if head.endswith("MultipleChoice"):  # [2, 2, L]: the rows paired as choices
        out = {k: v.reshape(2, 2, LENGTH) for k, v in out.items()}
    return out


def _worst(ours, theirs) -> float:
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    return max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in theirs)


@pytest.mark.parametrize("config, head", CASES, ids=[f"{c}-{h}" for c, h in CASES])
def test_every_head_equals_transformers(config, head):
    """Logits, hidden states and attention maps within 1e-5, every position."""
    cfg = CONFIGS[config].replace(num_labels=2 if "Question" in head else 3)
    reference = torch_model(cfg, head)
    inputs = _inputs(cfg, head)
    state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    params, report = hf.hf_state_to_params(cfg, state, head)
    assert not report.unused and not report.newly_initialized, report.summary()
    model = families.get_model_class(head)(cfg)
    ours = jax.jit(
        lambda p, x: model.apply(
            {"params": p}, **x, output_hidden_states=True, output_attentions=True
        )
    )(params, inputs)
    ours, theirs = verify.named_outputs(ours), verify.torch_outputs(reference, inputs)
    assert len(theirs) >= 1 + 3 + 2  # output, states, maps
    assert _worst(ours, theirs) < 1e-5, {k: np.abs(ours[k] - theirs[k]).max() for k in theirs}


def test_log_buckets_equal_transformers():
    """DeBERTa-v3's 256 buckets up to 512 and the fixtures' small ones, distances to 5000; the
    [L, L] tables as transformers builds them (`build_relative_position`)."""
    from transformers.models.deberta_v2 import modeling_deberta_v2 as theirs

    rel = np.arange(-5000, 5001)
    for buckets, reach in ((256, 512), (8, 20), (8, 66), (64, 1024)):
        want = theirs.make_log_bucket_position(torch.tensor(rel), buckets, reach).long().numpy()
        np.testing.assert_array_equal(make_log_bucket_position(rel, buckets, reach), want)
        rows = torch.zeros(1, 300, 1)
        want = theirs.build_relative_position(rows, rows, buckets, reach)
        np.testing.assert_array_equal(relative_positions(300, buckets, reach), want.numpy()[0])
    table = relative_positions(LENGTH, V3.position_buckets, V3.relative_distance)
    assert set(table[0]) == {0, -1, -2, -3, -4, -5, -6}  # 5.. -> 5, 6


def _mask_predictions_in_torch(head_weights: dict, hidden, hidden_act: str):
    """microsoft/DeBERTa's LMMaskPredictionHead on the encoder's last states [B, L, E]."""
    ln = torch.nn.functional.layer_norm
    w = {k: torch.as_tensor(v) for k, v in head_weights.items()}
    states = ln(hidden[:, :1] + hidden, (hidden.shape[-1],), w["LayerNorm.weight"],
                w["LayerNorm.bias"], V3.layer_norm_eps)  # fmt: skip
    states = transformers.activations.ACT2FN[hidden_act](
        states @ w["dense.weight"].T + w["dense.bias"]
    )
    return (states @ w["classifier.weight"].T + w["classifier.bias"])[..., 0]


def test_replaced_token_detection_head_is_debertas():
    """The discriminator's `deberta.*` weights are transformers' DebertaV2Model's (its states and
    maps within 1e-5) and `mask_predictions.*` DeBERTa's head (per-token logits [B, L] within
    1e-5 of it written in torch), converted with no weight missing or unused, both ways."""
    head = "DebertaV2ForReplacedTokenDetection"
    encoder = torch_model(V3, "DebertaV2Model")
    rng = np.random.default_rng(5)
    e = V3.hidden_size
    head_weights = {
        "dense.weight": rng.normal(0, 0.2, (e, e)), "dense.bias": rng.normal(0, 0.2, e),
        "LayerNorm.weight": 1 + rng.normal(0, 0.2, e), "LayerNorm.bias": rng.normal(0, 0.2, e),
        "classifier.weight": rng.normal(0, 0.2, (1, e)), "classifier.bias": rng.normal(0, 0.2, 1),
    }  # fmt: skip
    head_weights = {k: v.astype(np.float32) for k, v in head_weights.items()}
    state = {f"deberta.{k}": v.detach().numpy() for k, v in encoder.state_dict().items()}
    state.update({f"mask_predictions.{k}": v for k, v in head_weights.items()})
    params, report = hf.hf_state_to_params(V3, state, head)
    assert not report.unused and not report.newly_initialized, report.summary()
    assert set(table.params_to_hf_state(V3, params, head)) == set(state)
    inputs = _inputs(V3, head)
    model = DB.DebertaV2ForReplacedTokenDetection(V3)
    out = jax.jit(
        lambda p, x: model.apply(
            {"params": p}, **x, output_hidden_states=True, output_attentions=True
        )
    )(params, inputs)
    assert out.logits.shape == MASK.shape and out.logits.dtype == jnp.float32
    theirs = verify.torch_outputs(encoder, inputs)
    ours = verify.named_outputs(out)
    del ours["logits"], theirs["last_hidden_state"]
    assert _worst(ours, theirs) < 1e-5
    with torch.no_grad():
        hidden = encoder(**{k: torch.as_tensor(v) for k, v in inputs.items()}).last_hidden_state
        logits = _mask_predictions_in_torch(head_weights, hidden, V3.hidden_act).numpy()
    np.testing.assert_allclose(out.logits, logits, atol=1e-5)


def random_params(cfg, head: str, seed: int = 2) -> dict:
    """Parameters of `head` drawn from N(0, 0.3) (norm scales and biases too), without an init."""
    noise = np.random.default_rng(seed)
    flat = {k: noise.normal(0, 0.3, shape).astype(np.float32)
            for k, shape in table.expected_shapes(cfg, head).items()}  # fmt: skip
    return table.unflatten_params(flat, scan_layers=False)


@pytest.mark.parametrize("head", ["DebertaV2ForSequenceClassification",
                                  "DebertaV2ForReplacedTokenDetection"])  # fmt: skip
def test_packed_rows_equal_the_sequences_alone(head):
    """Two sequences (5 and 3 tokens) packed in one row of 9 give what each gives alone: the
    relative positions are distances, the first token each sequence's own (cls_positions)."""
    cfg = V3.replace(hidden_dropout_prob=0.0)
    model = families.get_model_class(head)(cfg)
    params = random_params(cfg, head)
    rng = np.random.default_rng(1)
    a, b = rng.integers(4, cfg.vocab_size, 5), rng.integers(4, cfg.vocab_size, 3)
    packed = np.zeros((1, LENGTH), np.int32)
    packed[0, :8] = np.concatenate([a, b])
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    alone = np.zeros((2, LENGTH), np.int32)
    alone[0, :5], alone[1, :3] = a, b
    apply = jax.jit(model.apply)
    out = apply({"params": params}, packed, attention_mask=segments > 0, segment_ids=segments,
                position_ids=np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]]),
                cls_positions=np.array([[0, 5]]))  # fmt: skip
    ref = apply({"params": params}, alone, attention_mask=alone != 0)
    if head.endswith("SequenceClassification"):
        np.testing.assert_allclose(out.logits[0], ref.logits, atol=1e-5)
    else:
        np.testing.assert_allclose(out.logits[0, :5], ref.logits[0, :5], atol=1e-5)
        np.testing.assert_allclose(out.logits[0, 5:8], ref.logits[1, :3], atol=1e-5)


# --------------------------------------------------------------------------------------------
# Attention kernels
# --------------------------------------------------------------------------------------------
def test_fused_xla_takes_the_position_scores():
    """fused_xla (jax.nn.dot_product_attention's bias) equals xla at real tokens; the masked LM
    at masked_positions [B, P] is its full logits gathered there."""
    head = "DebertaV2ForMaskedLM"
    cfg = V3.replace(attention_probs_dropout_prob=0.0)
    params, inputs = random_params(cfg, head), _inputs(cfg, head)
    exact = jax.jit(DB.DebertaV2ForMaskedLM(cfg).apply)({"params": params}, **inputs).logits
    fused = DB.DebertaV2ForMaskedLM(cfg, RuntimeConfig(attention="fused_xla"))
    positions = np.array([[0, 4], [1, 3], [8, 5], [6, 0]])
    apply = jax.jit(fused.apply)
    logits = apply({"params": params}, **inputs).logits
    real = MASK.astype(bool)
    np.testing.assert_allclose(np.asarray(logits)[real], np.asarray(exact)[real], atol=1e-5)
    at = apply({"params": params}, **inputs, masked_positions=positions).logits
    assert at.shape == (4, 2, cfg.vocab_size)
    gathered = np.take_along_axis(np.asarray(logits), positions[..., None], axis=1)
    np.testing.assert_allclose(at, gathered, atol=1e-5)


def test_kernels_without_a_score_bias_are_refused_naming_the_family():
    """cudnn and splash cannot add the relative-position scores: refused before anything runs
    (the job checks the kernel at start), naming DeBERTa-v2 and the kernel to use; auto is xla."""
    cfg = V3.replace(attention_probs_dropout_prob=0.0)
    for kernel, platform in (("cudnn", "cuda"), ("splash", "tpu"), ("splash", "cpu")):
        runtime = RuntimeConfig(attention=kernel, dtype="bfloat16")
        with pytest.raises(ValueError, match=f"'{kernel}' cannot add DeBERTa-v2's relative-pos"):
            resolve_attention(runtime, cfg, platform, training=True)
        with pytest.raises(ValueError, match="use attention='xla'"):
            resolve_attention(runtime, cfg, platform, training=False)
    auto = RuntimeConfig(attention="auto", dtype="bfloat16")
    for platform in ("cuda", "tpu", "cpu"):
        assert resolve_attention(auto, cfg, platform, training=False) == "xla"
    # Without relative attention the scores are plain (scaled otherwise): every kernel may run.
    plain = cfg.replace(relative_attention=False, norm_rel_ebd="none")
    assert resolve_attention(auto, plain, "cuda", training=False) == "cudnn"
    model = DB.DebertaV2Model(cfg, RuntimeConfig(attention="splash"))
    with pytest.raises(ValueError, match="DeBERTa-v2"):
        model.init(jax.random.PRNGKey(0), jnp.ones((1, 5), jnp.int32))


# --------------------------------------------------------------------------------------------
# config.json, conversion
# --------------------------------------------------------------------------------------------
def test_config_round_trips_and_reads_transformers_spelling(tmp_path):
    for cfg in (V3, TYPED, DebertaV2Config.preset("base"), DebertaV2Config.preset("xsmall")):
        cfg.to_json_file(tmp_path / "config.json", architecture="DebertaV2Model")
        assert families.config_from_json_file(tmp_path) == cfg
        theirs = transformers.AutoConfig.from_pretrained(tmp_path)
        assert families.config_from_hf_dict(theirs.to_dict()) == cfg
    # microsoft/deberta-v3-base's config.json
    base = {"model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
            "intermediate_size": 3072, "max_position_embeddings": 512, "relative_attention": True,
            "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
            "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7, "max_relative_positions": -1,
            "position_biased_input": False, "num_attention_heads": 12, "num_hidden_layers": 12,
            "type_vocab_size": 0, "vocab_size": 128100}  # fmt: skip
    assert DebertaV2Config.from_hf_dict(base) == DebertaV2Config.preset("base")
    sizes = [(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size)
             for c in map(DebertaV2Config.preset, ("xsmall", "small", "base", "large"))]  # fmt: skip
    assert sizes == [(384, 12, 6, 1536), (768, 6, 12, 3072), (768, 12, 12, 3072),
                     (1024, 24, 16, 4096)]  # fmt: skip


@pytest.mark.parametrize(
    "change, match",
    [
        ({"conv_kernel_size": 3}, "conv_kernel_size=3: the convolution layer"),
        ({"pos_att_type": "p2c|p2p"}, "pos_att_type.*not implemented"),
        ({"pooler_hidden_size": 64}, "pooler_hidden_size=64"),
        ({"attention_head_size": 16}, "attention_head_size=16"),
        ({"norm_rel_ebd": "batch_norm"}, "norm_rel_ebd"),
        ({"type_vocab_size": -1}, "type_vocab_size"),
        ({"relative_attention": False}, "norm_rel_ebd='layer_norm': normalizes"),
        ({"max_relative_positions": 5}, "must exceed position_buckets // 2 \\+ 1 = 5"),
    ],
)
def test_config_refuses_what_it_does_not_implement(change, match):
    with pytest.raises(ValueError, match=match):
        DebertaV2Config.from_hf_dict({**V3.to_hf_dict(), **change})


def test_round_trip_through_transformers_with_no_missing_keys(tmp_path):
    """bert_jax -> save_pytorch -> transformers loads it with no missing, unexpected or
    mismatched key -> save_pretrained -> load_pytorch gives the same parameters back; a classifier
    takes the discriminator's encoder and initializes only its own weights."""
    head = "DebertaV2ForMaskedLM"
    params = random_params(V3, head)
    hf.save_pytorch(V3, params, tmp_path / "ours", head)
    theirs, info = transformers.DebertaV2ForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs.save_pretrained(tmp_path / "theirs")
    config, back, report = hf.load_pytorch(tmp_path / "theirs", None, return_report=True)
    assert config == V3 and not report.unused and not report.newly_initialized
    assert table.max_difference(params, back) == 0.0
    rtd = "DebertaV2ForReplacedTokenDetection"
    hf.save_pytorch(V3, random_params(V3, rtd), tmp_path / "rtd", rtd)
    _, _, report = hf.load_pytorch(tmp_path / "rtd", "DebertaV2ForSequenceClassification",
                                   allow_new_heads=True, return_report=True)  # fmt: skip
    assert sorted(report.newly_initialized) == [
        f"{m}/{p}" for m in ("classifier", "pooler/dense") for p in ("bias", "kernel")
    ]
    assert sorted(report.unused) == [f"mask_predictions.{k}" for k in ("LayerNorm.bias", "LayerNorm.weight", "classifier.bias", "classifier.weight", "dense.bias", "dense.weight")]  # fmt: skip


def test_command_line_converts_and_verifies(tmp_path, capsys):
    """`python -m bert_jax.convert HF_DIR OUT --verify` (safetensors) and back: model_type picks
    the family, architectures the head; the sample rows of a model without token types have none."""
    head = "DebertaV2ForSequenceClassification"
    torch_model(V3, head).save_pretrained(tmp_path / "hf")
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jax"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"{head}: loaded" in out and "newly initialized" not in out and "unused" not in out
    assert float(out.split("worst max abs difference ")[1].split()[0]) < 1e-5, out
    config, _, model = native.load_pretrained(tmp_path / "jax")
    assert (config, model) == (V3, head)
    assert convert.main([str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert families.config_from_json_file(tmp_path / "back") == V3
    state = hf.read_hf_state_dict(tmp_path / "back")
    theirs = hf.read_hf_state_dict(tmp_path / "hf")
    assert sorted(state) == sorted(k for k in theirs if not k.endswith("position_ids"))
    for key, value in state.items():
        np.testing.assert_array_equal(value, theirs[key], err_msg=key)


def test_flops_add_the_position_terms():
    lengths = np.array([[9, 4], [1, 7]])
    plain = V3.replace(relative_attention=False, norm_rel_ebd="none")
    rows = np.minimum(V3.rel_embedding_rows, 2 * lengths - 1)  # 16 table rows
    extra = V3.num_hidden_layers * 2 * 2.0 * V3.hidden_size * (lengths * rows).sum()
    family = families.family_of(V3)
    assert family.encoder_flops(V3, lengths) == family.encoder_flops(plain, lengths) + extra


# --------------------------------------------------------------------------------------------
# The DeBERTa-v3 tokenizer
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lines() -> list[str]:
    return [d for doc in family_fixtures.documents() for d in doc]


def test_tokenizer_equals_transformers_on_shakespeare(lines, tmp_path):
    """A DeBERTa-v3-style vocabulary trained on the excerpt: its ids, saved and read back (its
    layout told by its special tokens), against transformers' AutoTokenizer on the saved files and
    DebertaV2Tokenizer built from the vocabulary: rows, pairs and token types."""
    from tests.tokenization.tokenization_test import HARD_TEXTS

    trained = tokenization.train_unigram(lines, vocab_size=400, layout=unigram.DEBERTA_V3)
    assert isinstance(trained, tokenization.DebertaV2Tokenizer) and trained.vocab_size == 400
    assert trained.vocab[:4] == ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    assert trained.vocab[-1] == "[MASK]" == trained.mask_token
    assert (trained.pad_id, trained.cls_id, trained.sep_id, trained.unk_id) == (0, 1, 2, 3)
    trained.save(tmp_path)
    ours = tokenization.load_tokenizer(tmp_path)
    assert type(ours) is tokenization.DebertaV2Tokenizer
    assert ours.fingerprint() == trained.fingerprint()
    vocab = [tuple(p) for p in json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]]  # fmt: skip
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(auto).__name__ == "DebertaV2Tokenizer"
    built = transformers.DebertaV2Tokenizer(vocab=vocab)
    texts = [*lines, *HARD_TEXTS, "To be or not to [MASK], that is [MASK].", "a  [MASK]b",
             "  spaced   out  ", "tab\there\nnewline\r\n"]  # fmt: skip
    rows = [ours.build_inputs(ours.encode(t))[0] for t in texts]
    firsts, seconds = texts[:60], texts[60:120]
    pairs = [ours.build_inputs(ours.encode(a), ours.encode(b)) for a, b in zip(firsts, seconds)]
    for theirs in (auto, built):
        assert theirs(texts)["input_ids"] == rows
        encoded = theirs(firsts, seconds, return_token_type_ids=True)
        assert [list(p) for p in zip(encoded["input_ids"], encoded["token_type_ids"])] == [
            list(p) for p in pairs
        ]
        assert theirs.convert_tokens_to_ids(list(ours.special_tokens)) == [0, 3, 1, 2, 399]
    assert pairs[0][1][-1] == 1 and pairs[0][1][0] == 0  # B and its [SEP]: type 1
    assert ours.tokenize("Good morrow") == auto.tokenize("Good morrow")
    assert ours.tokenize("Good morrow")[0].startswith(unigram.WORD_START)
    assert not ours.continuation_mask()[[0, 1, 2, 3, 399]].any()


def test_tokenizer_config_options_are_transformers(lines, tmp_path):
    """do_lower_case and split_by_punct of a tokenizer_config.json beside the tokenizer.json are
    read as transformers reads them (both false in the released models)."""
    trained = tokenization.train_unigram(lines, vocab_size=300, layout=unigram.DEBERTA_V3)
    trained.save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (config["do_lower_case"], config["split_by_punct"]) == (False, False)
    config.update(do_lower_case=True, split_by_punct=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = tokenization.load_tokenizer(tmp_path)
    assert (ours.lowercase, ours.split_by_punct) == (True, True)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    texts = [line.upper() for line in lines[:40]] + ["Nay--'tis so;I say!"]
    assert theirs(texts)["input_ids"] == [ours.build_inputs(ours.encode(t))[0] for t in texts]
    assert ours.tokenizer_config()["do_lower_case"] is True


def test_spm_model_reads_where_sentencepiece_is_installed(tmp_path):
    """DeBERTa's spm.model is found in a directory; without `sentencepiece` the error says what
    to do (give the tokenizer.json)."""
    (tmp_path / "spm.model").write_bytes(b"\x0a\x03abc")
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install sentencepiece.*tokenizer.json"):
            tokenization.load_tokenizer(tmp_path)
    else:
        with pytest.raises(ValueError, match="not a SentencePiece"):
            tokenization.load_tokenizer(tmp_path)
