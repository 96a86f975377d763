"""`python -m bert_jax.inference` on every model family: embed, predict, attention and fill-mask
on a small BERT and a small ModernBERT saved as transformers saves them (model.safetensors,
config.json, tokenizer.json), each output checked against the model applied directly to the
weights that were saved."""

import json
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax import convert, inference, tokenization
from bert_jax.data.text_io import encode_texts
from bert_jax.inference.__main__ import main
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.families import family_of, get_model_class
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.params import init_params

TEXTS = [
    "When shall we three meet again in thunder, lightning, or in rain?",
    "Fair is foul, and foul is fair.",
    "Hover through the fog and filthy air.",
]
QUERIES = ["fair is [MASK], and foul is fair", "[MASK] shall we three [MASK] again"]
LABELS = ("comedy", "history", "tragedy")


def _config(family: str, vocab_size: int):
    """A 2-layer config; ModernBERT's layer 0 attends globally, layer 1 in a window of 4 keys.
    A wide initialization, so that the context (not ties) decides the top tokens and labels."""
    if family == "bert":
        return BertConfig(
            vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64, initializer_range=0.2,
        )  # fmt: skip
    return ModernBertConfig(
        vocab_size=vocab_size, pad_token_id=0, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, global_attn_every_n_layers=2,
        local_attention=4, max_position_embeddings=64, classifier_pooling="mean",
        initializer_range=0.2,
    )  # fmt: skip


class Saved:
    """A family's classifier and masked-LM directories, and the parameters saved in them."""

    def __init__(self, root, family: str):
        self.tokenizer = tokenization.train_wordpiece(TEXTS * 3, vocab_size=150, min_frequency=1)
        self.base = _config(family, self.tokenizer.vocab_size)
        self.config = self.base.replace(num_labels=3, label_names=LABELS)
        self.family = family_of(self.config)
        self.classifier = self.family.head_for("BertForSequenceClassification")
        self.masked_lm = self.family.head_for("BertForMaskedLM")
        self.params, self.dirs = {}, {}
        for seed, head in enumerate((self.classifier, self.masked_lm)):
            config = self.config if head == self.classifier else self.base
            params = init_params(get_model_class(head)(config), jax.random.PRNGKey(seed))
            self.params[head] = jax.device_get(nn.meta.unbox(params))
            self.dirs[head] = str(root / head)
            convert.save_pytorch(config, self.params[head], self.dirs[head], head)
            self.tokenizer.save(root / head)

    def encoder_out(self, text: str, head: str, **kwargs):
        """The family's bare encoder (with its pooling layer) applied to `text` alone."""
        features, _ = encode_texts(self.tokenizer, [text], None, 64)
        n = int(features["attention_mask"].sum())
        model = get_model_class(self.family.base_model)(self.config, add_pooling_layer=True)
        params = self.params[head][self.family.encoder_name]
        return model.apply({"params": params}, features["input_ids"][:, :n], **kwargs)


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def saved(request, tmp_path_factory):
    return Saved(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture
def texts_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return str(path)


def test_embed_equals_the_encoder_applied_directly(saved, texts_file, tmp_path):
    model = saved.dirs[saved.masked_lm]  # any head: the encoder is taken from it
    for pooling in ("cls", "mean"):
        out = tmp_path / f"{pooling}.npy"
        argv = ["embed", "--model", model, "--input", texts_file, "--output", str(out)]
        assert main([*argv, "--pooling", pooling, "--batch_size", "2"]) == 0
        rows = np.load(out)
        assert rows.shape == (3, 32) and rows.dtype == np.float32 and np.isfinite(rows).all()
        config, params, _, tokenizer = inference.load(model)
        np.testing.assert_array_equal(
            rows, inference.embed(config, params, tokenizer, TEXTS, pooling=pooling, batch_size=2)
        )
    # The encoder's own pooled output, computed on each text alone: the classifier's pooling
    # ([CLS] through BERT's tanh pooler; ModernBERT's mean over the real tokens).
    pooling = "pooler" if saved.family.model_type == "bert" else "mean"
    out = tmp_path / "pooled.npy"
    argv = ["embed", "--model", saved.dirs[saved.classifier], "--input", texts_file]
    assert main([*argv, "--output", str(out), "--pooling", pooling]) == 0
    direct = [saved.encoder_out(t, saved.classifier).pooler_output[0] for t in TEXTS]
    np.testing.assert_allclose(np.load(out), np.stack(direct), atol=2e-5)
    cls = [saved.encoder_out(t, saved.classifier).last_hidden_state[0, 0] for t in TEXTS]
    assert main([*argv, "--output", str(tmp_path / "c.npy"), "--layers", "0,-1"]) == 0
    per_layer = np.load(tmp_path / "c.npy")
    assert per_layer.shape == (3, 2, 32)
    np.testing.assert_allclose(per_layer[:, 1], np.stack(cls), atol=2e-5)


def test_pooler_pooling_needs_a_pooler_layer(saved, texts_file, tmp_path, capsys):
    argv = ["embed", "--input", texts_file, "--output", str(tmp_path / "p.npy")]
    code = main([*argv, "--model", saved.dirs[saved.masked_lm], "--pooling", "pooler"])
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "p.npy").exists()
    if saved.family.model_type == "bert":  # BertForMaskedLM is saved without the pooler
        assert "this checkpoint has no pooler" in err and "use pooling='cls' or 'mean'" in err
    else:
        assert "error: ModernBERT has no pooler layer" in err and "ModernBertModel" in err


def test_predict_gives_the_classifier_labels(saved, texts_file, tmp_path):
    out = tmp_path / "out.jsonl"
    argv = ["predict", "--model", saved.dirs[saved.classifier], "--input", texts_file]
    assert main([*argv, "--output", str(out), "--batch_size", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == TEXTS
    model = get_model_class(saved.classifier)(saved.config)
    for text, row in zip(TEXTS, rows):
        features, _ = encode_texts(saved.tokenizer, [text], None, 64)
        n = int(features["attention_mask"].sum())
        logits = model.apply(
            {"params": saved.params[saved.classifier]}, features["input_ids"][:, :n]
        )
        probs = np.asarray(jax.nn.softmax(logits.logits[0]))
        assert row["label"] == LABELS[int(np.argmax(probs))]
        np.testing.assert_allclose([row["probabilities"][k] for k in LABELS], probs, atol=1e-5)


def test_predict_refuses_a_model_without_a_classifier(saved, texts_file, tmp_path, capsys):
    argv = ["predict", "--model", saved.dirs[saved.masked_lm], "--input", texts_file]
    assert main([*argv, "--output", str(tmp_path / "o.jsonl")]) == 1
    err = capsys.readouterr().err
    assert f"predict needs a sequence classifier ({saved.classifier}), not {saved.masked_lm}" in err


def test_attention_map_is_the_encoder_attention(saved, tmp_path):
    out = tmp_path / "map.png"
    argv = ["attention", "--model", saved.dirs[saved.classifier], "--text", TEXTS[0]]
    assert main([*argv, "--layer", "1", "--head", "2", "--output", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config, params, _, tokenizer = inference.load(saved.dirs[saved.classifier])
    probs = inference.attention_map(config, params, tokenizer, TEXTS[0], 1, 2, str(out))
    direct = saved.encoder_out(TEXTS[0], saved.classifier, output_attentions=True)
    expected = np.asarray(direct.attentions[1][0, 2])
    assert probs.shape == expected.shape and probs.shape[0] > 8
    np.testing.assert_allclose(probs, expected, atol=1e-6)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    if saved.family.model_type == "modernbert":  # layer 1 is local: keys within 2 positions
        distance = np.abs(np.subtract.outer(np.arange(len(probs)), np.arange(len(probs))))
        assert (probs[distance > 2] == 0).all() and (probs[distance <= 2] > 0).all()


def test_fill_mask_gives_the_masked_lm_top_tokens(saved, capsys):
    argv = ["fill-mask", "--model", saved.dirs[saved.masked_lm], "--json", "--top_k", "3"]
    assert main([*argv, *QUERIES]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == QUERIES and [len(r["masks"]) for r in rows] == [1, 2]
    model = get_model_class(saved.masked_lm)(saved.base)
    for text, row in zip(QUERIES, rows):
        features, _ = encode_texts(saved.tokenizer, [text], None, 64)
        n = int(features["attention_mask"].sum())
        ids = features["input_ids"][:, :n]
        logits = model.apply({"params": saved.params[saved.masked_lm]}, ids).logits[0]
        probs = np.asarray(jax.nn.softmax(logits))
        positions = np.flatnonzero(ids[0] == saved.tokenizer.mask_id)
        for position, candidates in zip(positions, row["masks"], strict=True):
            top = np.argsort(-probs[position])[:3]
            assert [c["token_id"] for c in candidates] == top.tolist()
            assert [c["token"] for c in candidates] == [saved.tokenizer.id_to_token(t) for t in top]
            np.testing.assert_allclose(
                [c["score"] for c in candidates], probs[position, top], atol=1e-5
            )


def test_fill_mask_refuses_a_model_without_a_masked_lm_head(saved, capsys):
    directory = saved.dirs[saved.classifier]
    assert main(["fill-mask", "--model", directory, QUERIES[0]]) == 1
    err = capsys.readouterr().err
    assert f"{directory} has no masked-LM head (it holds a {saved.classifier})" in err
    assert saved.masked_lm in err


def test_python_m_runs_each_family(saved, texts_file, tmp_path):
    """The command itself, in a process of its own: the ModernBERT directory that `embed` once
    built a BertModel for."""
    out = tmp_path / "e.npy"
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.inference", "embed", "--model",
         saved.dirs[saved.masked_lm], "--input", texts_file, "--output", str(out),
         "--pooling", "mean"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote (3, 32) embeddings to {out}" in proc.stdout
    config, params, _, tokenizer = inference.load(saved.dirs[saved.masked_lm])
    expected = inference.embed(config, params, tokenizer, TEXTS, pooling="mean")
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)
