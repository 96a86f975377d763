"""`python -m bert_jax.inference` on a small BERT and a small ModernBERT saved as transformers
saves them (model.safetensors, config.json, tokenizer.json): what differs between the families
(pooling='pooler' where there is no pooler layer) and the command in a process of its own. Each
command's outputs against the model applied directly, on every family of the registry:
tests/conformance_test.py."""

import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax import convert, inference, tokenization
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
        self.classifier = self.family.head_for("sequence_classification")
        self.masked_lm = self.family.head_for("masked_lm")
        self.params, self.dirs = {}, {}
        for seed, head in enumerate((self.classifier, self.masked_lm)):
            config = self.config if head == self.classifier else self.base
            params = init_params(get_model_class(head)(config), jax.random.PRNGKey(seed))
            self.params[head] = jax.device_get(nn.meta.unbox(params))
            self.dirs[head] = str(root / head)
            convert.save_pytorch(config, self.params[head], self.dirs[head], head)
            self.tokenizer.save(root / head)


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def saved(request, tmp_path_factory):
    return Saved(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture
def texts_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return str(path)


def test_pooler_pooling_needs_a_pooler_layer(saved, texts_file, tmp_path, capsys):
    argv = ["embed", "--input", texts_file, "--output", str(tmp_path / "p.npy")]
    code = main([*argv, "--model", saved.dirs[saved.masked_lm], "--pooling", "pooler"])
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "p.npy").exists()
    if saved.family.model_type == "bert":  # BertForMaskedLM is saved without the pooler
        assert "this checkpoint has no pooler" in err and "use pooling='cls' or 'mean'" in err
    else:
        assert "error: ModernBERT has no pooler layer" in err and "ModernBertModel" in err


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
