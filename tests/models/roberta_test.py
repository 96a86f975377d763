"""RoBERTa and XLM-RoBERTa against transformers: every head of both models within 1e-5 (eager
attention, float32) on full, right-padded, left-padded and holed rows of an odd configuration;
packed rows, the scanned and rematerialized layers and the other kernels against the exact path;
config.json; conversion both ways (PyTorch, and transformers 4.57's flax_model.msgpack against
fixtures its FlaxRoberta*/FlaxXLMRoberta* classes wrote: tests/testdata/hf_flax_roberta)."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bert_jax
from bert_jax import convert
from bert_jax.checkpoints import detect, hf, hf_flax, native, table, verify
from bert_jax.models import families
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.encoder import padded_positions
from bert_jax.models.roberta import model as RB
from bert_jax.models.roberta.config import RobertaConfig, XLMRobertaConfig
from tests import family_fixtures

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "testdata" / "hf_flax_roberta"
LENGTH = 9
# RoBERTa with two token types and the tanh GELU in its layers (its MLM head keeps the exact
# one); XLM-R as released: one token type. 20 position rows, 18 positions (pad id 1).
ROBERTA = RobertaConfig(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, max_position_embeddings=20, type_vocab_size=2, layer_norm_eps=1e-5,
    hidden_act="gelu_new", num_labels=3,
)  # fmt: skip
XLMR = XLMRobertaConfig(**{**vars(ROBERTA), "type_vocab_size": 1, "hidden_act": "gelu"})
CONFIGS = {"roberta": ROBERTA, "xlm-roberta": XLMR}
# Full, right-padded, left-padded, and a hole: <pad> ids where the mask is 0, so that
# transformers counts positions over the other tokens.
MASK = np.array(
    [
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 1, 1, 1, 1, 1],
    ]
)
CASES = [(t, f.base_model.removesuffix("Model") + task) for t in CONFIGS for f in [families.FAMILIES[t]]
         for task in ("Model", "ForMaskedLM", "ForSequenceClassification", "ForMultipleChoice",
                      "ForTokenClassification", "ForQuestionAnswering")]  # fmt: skip


torch_model = family_fixtures.transformers_model  # random, every weight perturbed


def _inputs(cfg, head: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, cfg.vocab_size, MASK.shape)
    ids[MASK == 0] = cfg.pad_token_id
    out = dict(input_ids=ids, attention_mask=MASK)
    if cfg.type_vocab_size > 1:
        out["token_type_ids"] = (np.arange(LENGTH) >= 5).astype(np.int64) * MASK
    if head.endswith("MultipleChoice"):  # [2, 2, L]: the rows paired as choices
        out = {k: v.reshape(2, 2, LENGTH) for k, v in out.items()}
    return out


@pytest.mark.parametrize("model_type, head", CASES, ids=[h for _, h in CASES])
def test_every_head_equals_transformers(model_type, head):
    """Logits, hidden states and attention maps within 1e-5, every position (the xla kernel
    treats padding as transformers does; the classifiers read position 0, a pad when left
    padded, as transformers' do)."""
    cfg = CONFIGS[model_type].replace(num_labels=2 if "Question" in head else 3)
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


def test_positions_count_from_the_pad_id_over_real_tokens():
    ids = np.array([[5, 6, 1, 7, 1], [1, 1, 5, 6, 7]])
    np.testing.assert_array_equal(
        padded_positions(ids, None, ROBERTA.pad_token_id), [[2, 3, 1, 4, 1], [1, 1, 2, 3, 4]]
    )
    np.testing.assert_array_equal(
        padded_positions(ids, np.array([[0, 1, 2, 0, 1]] * 2), ROBERTA.pad_token_id)[0],
        [2, 3, 4, 2, 3],
    )
    model = RB.RobertaModel(ROBERTA)
    with pytest.raises(ValueError, match="exceeds the 18 positions"):
        model.init(jax.random.PRNGKey(0), jnp.ones((1, 19), jnp.int32))


def random_params(cfg, head: str, seed: int = 2) -> dict:
    """Parameters of `head` drawn from N(0, 0.3) (norm scales and biases too), without an init."""
    noise = np.random.default_rng(seed)
    flat = {k: noise.normal(0, 0.3, shape).astype(np.float32)
            for k, shape in table.expected_shapes(cfg, head).items()}  # fmt: skip
    return table.unflatten_params(flat, scan_layers=False)


def _packed_vs_alone(model, cfg, pooled: bool, runtime_model=None):
    """Outputs of two sequences (lengths 5 and 3) packed in one row of 9 (positions restarting),
    and of each alone in a right-padded row."""
    params = random_params(model.config, type(model).__name__)
    rng = np.random.default_rng(1)
    a, b = rng.integers(3, cfg.vocab_size, 5), rng.integers(3, cfg.vocab_size, 3)
    packed = np.full((1, LENGTH), cfg.pad_token_id)
    packed[0, :8] = np.concatenate([a, b])
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    alone = np.full((2, LENGTH), cfg.pad_token_id)
    alone[0, :5], alone[1, :3] = a, b
    run = runtime_model or model
    out_packed = jax.jit(run.apply)(
        {"params": params}, packed, attention_mask=segments > 0, segment_ids=segments,
        position_ids=np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0]]),
        cls_positions=np.array([[0, 5]]) if pooled else None,
    )  # fmt: skip
    return out_packed, jax.jit(model.apply)({"params": params}, alone, attention_mask=alone != 1)


def test_packed_rows_equal_the_sequences_alone():
    """Positions restarting per packed sequence (the shared batches') and the classifier read at
    each sequence's <s> (cls_positions); the masked LM's packed rows: the kernels' test below."""
    packed, alone = _packed_vs_alone(RB.RobertaForSequenceClassification(ROBERTA), ROBERTA, True)
    assert packed.logits.shape == (1, 2, ROBERTA.num_labels)
    np.testing.assert_allclose(packed.logits[0], alone.logits, atol=1e-5)


@pytest.mark.parametrize("attention", ["splash", "fused_xla"])
def test_other_kernels_equal_xla_on_packed_rows(attention):
    """splash (Pallas interpret mode here) and fused_xla (cuDNN's call, lowered by XLA) equal the
    exact path at real tokens of packed rows."""
    cfg = XLMR.replace(attention_probs_dropout_prob=0.0)
    model = RB.XLMRobertaForMaskedLM(cfg)
    other = RB.XLMRobertaForMaskedLM(cfg, RuntimeConfig(attention=attention))
    packed, alone = _packed_vs_alone(model, cfg, False, runtime_model=other)
    np.testing.assert_allclose(packed.logits[0, :5], alone.logits[0, :5], atol=1e-5)
    np.testing.assert_allclose(packed.logits[0, 5:8], alone.logits[1, :3], atol=1e-5)


# --------------------------------------------------------------------------------------------
# config.json and the registry
# --------------------------------------------------------------------------------------------
def test_config_round_trips_and_model_type_picks_the_family(tmp_path):
    for cfg in (ROBERTA, XLMR, XLMRobertaConfig.preset("base")):
        cfg.to_json_file(tmp_path / "config.json", architecture="RobertaModel")
        assert families.config_from_json_file(tmp_path) == cfg
        assert type(families.config_from_json_file(tmp_path)) is type(cfg)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "xlm-roberta"
    assert XLMRobertaConfig.preset("base").vocab_size == 250002
    assert RobertaConfig.preset("large").max_sequence_length == 512
    xlmr = families.family_of(XLMR)
    assert (xlmr.model_type, xlmr.base_model) == ("xlm-roberta", "XLMRobertaModel")
    assert xlmr.head_for(families.Role.MASKED_LM) == "XLMRobertaForMaskedLM"
    assert families.head_in_family(ROBERTA, families.Role.ENCODER) == "RobertaModel"
    with pytest.raises(ValueError, match="xlm-roberta has no next_sentence head"):
        xlmr.head_for(families.Role.NEXT_SENTENCE)
    fields = families.model_fields(XLMR)
    assert fields["model_type"] == "xlm-roberta" and families.config_from_fields(fields) == XLMR


def test_flops_are_berts_for_the_same_sizes():
    from bert_jax.models.bert.config import BertConfig
    from bert_jax.models.bert.flops import encoder_forward_flops

    lengths = np.array([[9, 4], [1, 7]])
    sizes = {k: getattr(ROBERTA, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")}  # fmt: skip
    ours = families.family_of(XLMR).encoder_flops(XLMR, lengths)
    assert ours == encoder_forward_flops(BertConfig(**sizes), lengths) > 0


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(max_position_embeddings=2), "at least pad_token_id \\+ 2"),
        (dict(hidden_size=30), "not divisible"),
        (dict(type_vocab_size=0), "positive integer"),
        (dict(classifier_dropout=1.0), "probability"),
        (dict(pad_token_id=99), "pad_token_id"),
    ],
)
def test_config_checks_its_fields(change, match):
    with pytest.raises(ValueError, match=f"XLMRobertaConfig.*{match}"):
        XLMR.replace(**change)


def test_config_refuses_what_it_does_not_implement():
    d = ROBERTA.to_hf_dict()
    for bad, match in (
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"is_decoder": True}, "is_decoder"),
        ({"model_type": "xlm-roberta"}, "model_type"),
    ):
        with pytest.raises(ValueError, match=match):
            RobertaConfig.from_hf_dict({**d, **bad})


# --------------------------------------------------------------------------------------------
# Conversion both ways
# --------------------------------------------------------------------------------------------
def test_round_trip_through_transformers_with_no_missing_keys(tmp_path):
    """bert_jax -> save_pytorch -> transformers loads it with no missing, unexpected or
    mismatched key -> save_pretrained -> load_pytorch gives the same parameters back; a classifier
    takes the encoder of the masked-LM checkpoint and initializes only its own weights."""
    head = "XLMRobertaForMaskedLM"
    params = RB.XLMRobertaForMaskedLM(XLMR).init(
        jax.random.PRNGKey(3), jnp.ones((1, 5), jnp.int32)
    )["params"]
    hf.save_pytorch(XLMR, params, tmp_path / "ours", head)
    theirs, info = transformers.XLMRobertaForMaskedLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs.save_pretrained(tmp_path / "theirs")
    config, back, report = hf.load_pytorch(tmp_path / "theirs", None, return_report=True)
    assert config == XLMR and not report.unused and not report.newly_initialized
    assert table.max_difference(params, back) == 0.0
    _, _, report = hf.load_pytorch(tmp_path / "theirs", "XLMRobertaForSequenceClassification",
                                   allow_new_heads=True, return_report=True)  # fmt: skip
    assert sorted(report.newly_initialized) == [
        f"classifier/{m}/{p}" for m in ("dense", "out_proj") for p in ("bias", "kernel")
    ]
    assert sorted(report.unused) == [f"lm_head.{k}" for k in ("bias", "dense.bias", "dense.weight", "layer_norm.bias", "layer_norm.weight")]  # fmt: skip


def test_command_line_converts_and_verifies(tmp_path, capsys):
    """`python -m bert_jax.convert HF_DIR OUT --verify` and back, as for BERT: model_type picks
    the family, architectures the head. 12 position rows hold 10 positions: --verify's sample
    rows are cut to them (`max_sequence_length`), not to the table's 12 rows."""
    head = "RobertaForSequenceClassification"
    cfg = ROBERTA.replace(max_position_embeddings=12)
    torch_model(cfg, head).save_pretrained(tmp_path / "hf")
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jax"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"{head}: loaded 41 weights" in out, out
    assert "newly initialized" not in out and "unused" not in out, out
    assert float(out.split("worst max abs difference ")[1].split()[0]) < 1e-5, out
    config, _, model = native.load_pretrained(tmp_path / "jax")
    assert (config, model) == (cfg, head)
    assert convert.main([str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert detect.detect_format(str(tmp_path / "back")) == "hf"
    assert families.config_from_json_file(tmp_path / "back") == cfg


_spec = __import__("importlib.util").util.spec_from_file_location(
    "make_hf_flax_fixtures", FIXTURES.parent / "make_hf_flax_fixtures.py"
)
_script = __import__("importlib.util").util.module_from_spec(_spec)
_spec.loader.exec_module(_script)
fixtures = _script.FAMILIES["roberta"]


@pytest.mark.parametrize("head", fixtures.heads)
def test_flax_msgpack_of_every_head_reads_and_writes_exactly(tmp_path, head):
    """transformers 4.57's FlaxRoberta*/FlaxXLMRoberta* checkpoint loads with every output within
    1e-5 of the one transformers computed, and what bert_jax writes back is the tree it wrote
    (make_hf_flax_fixtures.py `check` loads it with transformers 4.57)."""
    loaded = bert_jax.from_pretrained(FIXTURES / head)
    assert loaded.head == head and detect.detect_format(str(FIXTURES / head)) == "hf_flax"
    out = loaded.model.apply({"params": loaded.params}, **fixtures.inputs(head),
                             output_hidden_states=True, output_attentions=True)  # fmt: skip
    ours, ref = verify.named_outputs(out), dict(np.load(FIXTURES / head / "outputs.npz"))
    assert set(ours) == set(ref)
    for key, value in ref.items():
        np.testing.assert_allclose(ours[key], value, atol=1e-5, rtol=0, err_msg=key)
    hf_flax.save_hf_flax(loaded.config, loaded.params, tmp_path, head)
    theirs, written = hf.read_hf_state_dict(FIXTURES / head), hf.read_hf_state_dict(tmp_path)
    assert sorted(written) == sorted(theirs)
    for key in theirs:
        np.testing.assert_array_equal(written[key], theirs[key], err_msg=key)


# --------------------------------------------------------------------------------------------
# Inference on a converted directory
# --------------------------------------------------------------------------------------------
TEXTS = [
    "When shall we three meet again in thunder, lightning, or in rain?",
    "Fair is foul, and foul is fair.",
    "Hover through the fog and filthy air.",
]


def test_inference_on_a_converted_directory_equals_transformers(tmp_path):
    """`python -m bert_jax.inference embed|predict` on a transformers RobertaForSequenceClassification
    converted with `python -m bert_jax.convert` (its tokenizer beside it, <pad> id 0 here), against
    transformers on the same token ids: mean-pooled states and label probabilities."""
    from bert_jax import tokenization
    from bert_jax.data.sentence_features import encode_texts
    from bert_jax.inference.__main__ import main

    tokenizer = tokenization.train_wordpiece(TEXTS * 3, vocab_size=150, min_frequency=1)
    labels = ("comedy", "history", "tragedy")
    cfg = ROBERTA.replace(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id,
                          max_position_embeddings=40, label_names=labels)  # fmt: skip
    head = "RobertaForSequenceClassification"
    reference = torch_model(cfg, head)
    reference.save_pretrained(tmp_path / "hf")
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jax")]) == 0
    tokenizer.save(tmp_path / "jax")
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    argv = ["--model", str(tmp_path / "jax"), "--input", str(tmp_path / "in.txt"), "--max_seq_length", "32"]  # fmt: skip
    assert main(["embed", *argv, "--output", str(tmp_path / "e.npy"), "--pooling", "mean"]) == 0
    assert main(["predict", *argv, "--output", str(tmp_path / "p.jsonl")]) == 0
    features, _ = encode_texts(tokenizer, TEXTS, None, 32)
    ids, mask = (torch.as_tensor(features[k]).long() for k in ("input_ids", "attention_mask"))
    with torch.no_grad():
        states = reference.roberta(input_ids=ids, attention_mask=mask).last_hidden_state
        probs = torch.softmax(reference(input_ids=ids, attention_mask=mask).logits, -1).numpy()
    m = mask[..., None].float()
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), ((states * m).sum(1) / m.sum(1)).numpy(), atol=1e-5)  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [labels[i] for i in probs.argmax(-1)]
    np.testing.assert_allclose([[r["probabilities"][k] for k in labels] for r in rows], probs, atol=1e-5)  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize(
    "topology, extra, attention_calls",
    [("gpu:h100", [], 4), ("v5e:2x2", ["--config.runtime.scan_layers=True"], 0)],
)
def test_finetuning_compiles_from_a_roberta_directory(tmp_path, topology, extra, attention_calls):
    """`train.py --mode=compile` of MRPC from a RoBERTa directory (no attention dropout): cuDNN
    attention in the H100's train step (2 layers, forward and backward), the scanned layers
    sharded over a TPU v5e 2x2 slice; both fit."""
    import os
    import subprocess
    import sys

    pytest.importorskip("libtpu", reason="needs the tpu extra (libtpu)")
    from bert_jax import tokenization

    tokenizer = tokenization.train_wordpiece(TEXTS * 3, vocab_size=150, min_frequency=1)
    cfg = XLMR.replace(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id,
                       max_position_embeddings=130, attention_probs_dropout_prob=0.0)  # fmt: skip
    head = "XLMRobertaForMaskedLM"
    params = random_params(cfg, head)
    hf.save_pytorch(cfg, params, tmp_path, head)
    tokenizer.save(tmp_path)
    root = pathlib.Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(root / "train.py"), f"--config={root}/configs/finetune.py:task=mrpc",
         f"--config.init_from={tmp_path}", "--mode=compile", f"--topology={topology}", *extra],
        cwd=root, capture_output=True, text=True, timeout=900,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["fits"] and report["batch"] == [32, 128]
    assert report["cudnn_attention_calls"] == attention_calls
