"""sentence-transformers directories: `SentenceTransformer(DIR).encode` equals
`python -m bert_jax.inference embed --model DIR` (its defaults taken from the directory) for tiny
random BERT and ModernBERT models saved with mean pooling normalized and CLS pooling not, and
(`-m e2e`) for the shipped all-MiniLM-L6-v2, itself such a directory; a save -> read -> save round
trip (in a bucket too); the old layout with the encoder in a subfolder; the modules bert_jax does
not compute."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.checkpoints import pretrained
from bert_jax.checkpoints.hf import read_hf_state_dict
from bert_jax.checkpoints.sentence_transformers import (
    SentenceTransformerSettings,
    read_sentence_transformer,
    save_sentence_transformer,
)
from bert_jax.inference.__main__ import main as inference_main
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.params import init_params
from tests.conftest import BUCKET

TEXTS = [
    "Fair is foul, and foul is fair: hover through the fog and filthy air.",
    "To be, or not to be",
    " ".join(
        ["Now is the winter of our discontent made glorious summer by this sun of York."] * 24
    ),
    "O",
]
SETTINGS_FILES = (
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
    "tokenizer_config.json",
    "config.json",
)


@pytest.fixture(scope="module")
def st():
    pytest.importorskip("torch")
    return pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def minilm(bert_vocab_dir):
    return pretrained.load(bert_vocab_dir)


def _ours(model_dir, tmp_path, *flags, capsys=None) -> np.ndarray:
    """`python -m bert_jax.inference embed --model model_dir` of TEXTS."""
    texts, out = tmp_path / "texts.txt", tmp_path / "emb.npy"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    argv = ["embed", "--model", str(model_dir), "--input", str(texts), "--output", str(out)]
    assert inference_main([*argv, *flags]) == 0
    return np.load(out)


def _theirs(st, model_dir) -> np.ndarray:
    return st.SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS)


def test_minilm_is_a_sentence_transformer(bert_vocab_dir):
    settings = read_sentence_transformer(bert_vocab_dir)
    assert settings == SentenceTransformerSettings("mean", True, 256)
    assert not os.path.exists(os.path.join(bert_vocab_dir, "2_Normalize"))  # listed, no folder


@pytest.mark.e2e
@pytest.mark.torch
def test_minilm_embeds_as_sentence_transformers(st, minilm, bert_vocab_dir, tmp_path):
    assert minilm.sentence_transformer == SentenceTransformerSettings("mean", True, 256)
    theirs = _theirs(st, bert_vocab_dir)
    np.testing.assert_allclose(_ours(bert_vocab_dir, tmp_path), theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=-1), 1.0, atol=1e-6)


@pytest.mark.e2e
@pytest.mark.torch
def test_minilm_saved_with_cls_pooling_unnormalized(st, minilm, bert_vocab_dir, tmp_path, capsys):
    out = tmp_path / "cls"
    save_sentence_transformer(
        out,
        minilm.config,
        minilm.params,
        tokenizer_dir=bert_vocab_dir,
        pooling="cls",
        normalize=False,
        max_seq_length=24,  # the third text is cut
        card="## Training\n\nNone: the weights of all-MiniLM-L6-v2.",
    )
    assert read_sentence_transformer(out) == SentenceTransformerSettings("cls", False, 24)
    assert not (out / "2_Normalize").exists()
    ours = _ours(out, tmp_path)
    np.testing.assert_allclose(ours, _theirs(st, out), atol=1e-5)
    assert np.linalg.norm(ours, axis=-1).max() > 2.0  # not normalized
    card = (out / "README.md").read_text()
    assert 'library_name: "sentence-transformers"' in card and card.endswith("all-MiniLM-L6-v2.\n")
    # A flag against the directory's setting is used, with a warning.
    capsys.readouterr()
    mean = _ours(out, tmp_path, "--pooling", "mean", "--normalize")
    assert "says pooling='cls'; pooling='mean' overrides it" in capsys.readouterr().err
    np.testing.assert_allclose(np.linalg.norm(mean, axis=-1), 1.0, atol=1e-6)


def _tiny(tokenizer, family: str = "modernbert"):
    """A random 2-layer model of `family` with the tokenizer's vocabulary: (config, params)."""
    if family == "bert":
        config = BertConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
            initializer_range=0.2,
        )  # fmt: skip
    else:
        config = ModernBertConfig(
            vocab_size=tokenizer.vocab_size, pad_token_id=0, hidden_size=32, intermediate_size=37,
            num_hidden_layers=2, num_attention_heads=4, global_attn_every_n_layers=2,
            local_attention=4, max_position_embeddings=64, initializer_range=0.2,
        )  # fmt: skip
    model = get_model_class(f"{'Bert' if family == 'bert' else 'ModernBert'}Model")(config)
    return config, jax.device_get(nn.meta.unbox(init_params(model, jax.random.PRNGKey(3))))


@pytest.mark.torch
@pytest.mark.parametrize(
    ("family", "pooling", "normalize"), [("bert", "cls", False), ("modernbert", "mean", True)]
)
def test_saved_model_embeds_as_sentence_transformers(
    st, bert_tokenizer, tmp_path, family, pooling, normalize
):
    config, params = _tiny(bert_tokenizer, family)
    out = tmp_path / family
    save_sentence_transformer(
        out,
        config,
        params,
        tokenizer_dir=bert_tokenizer,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=20,
    )
    assert (out / "2_Normalize").is_dir() == normalize
    ours = _ours(out, tmp_path)
    np.testing.assert_allclose(ours, _theirs(st, out), atol=1e-5)
    assert (np.abs(np.linalg.norm(ours, axis=-1) - 1.0).max() < 1e-6) == normalize


def test_round_trip_in_a_bucket(fake_bucket, bert_tokenizer, tmp_path):
    config, params = _tiny(bert_tokenizer)
    first, second = f"{BUCKET}/first", f"{BUCKET}/second"
    kwargs = dict(pooling="mean", normalize=True, max_seq_length=20)
    save_sentence_transformer(first, config, params, tokenizer_dir=bert_tokenizer, **kwargs)
    loaded = pretrained.load(first)
    settings = loaded.sentence_transformer
    assert settings == SentenceTransformerSettings("mean", True, 20)
    save_sentence_transformer(
        second,
        loaded.config,
        loaded.params,
        tokenizer_dir=loaded.tokenizer,
        pooling=settings.pooling,
        normalize=settings.normalize,
        max_seq_length=settings.max_seq_length,
    )
    root, _ = fake_bucket
    for name in (*SETTINGS_FILES, "tokenizer.json", "vocab.txt"):
        assert (root / "first" / name).read_text() == (root / "second" / name).read_text(), name
    a, b = (read_hf_state_dict(root / d) for d in ("first", "second"))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    # Saved again without normalization: modules.json no longer lists it.
    save_sentence_transformer(
        second, config, params, tokenizer_dir=bert_tokenizer, **{**kwargs, "normalize": False}
    )
    assert not read_sentence_transformer(second).normalize


def test_old_layout_and_what_bert_jax_does_not_compute(bert_tokenizer, tmp_path):
    config, params = _tiny(bert_tokenizer)
    out = tmp_path / "old"
    save_sentence_transformer(
        out, config, params, tokenizer_dir=bert_tokenizer, pooling="cls", normalize=False,
        max_seq_length=20,
    )  # fmt: skip
    # sentence-transformers 0.x kept the encoder in a subfolder with its own config.
    (out / "0_Transformer").mkdir()
    for name in os.listdir(out):
        if name not in ("modules.json", "1_Pooling", "0_Transformer"):
            shutil.move(out / name, out / "0_Transformer" / name)
    modules = json.loads((out / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (out / "modules.json").write_text(json.dumps(modules))
    loaded = pretrained.load(out)
    assert loaded.sentence_transformer == SentenceTransformerSettings(
        "cls", False, 20, "0_Transformer"
    )
    assert loaded.tokenizer.vocab_size == bert_tokenizer.vocab_size
    np.testing.assert_array_equal(
        loaded.params["final_norm"]["scale"], params["final_norm"]["scale"]
    )

    assert read_sentence_transformer(tmp_path) is None  # no modules.json: no such directory
    dense = [
        *modules,
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (out / "modules.json").write_text(json.dumps(dense))
    with pytest.raises(
        ValueError, match=r"lists the modules \['Transformer', 'Pooling', 'Dense'\]"
    ):
        pretrained.load(out)
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "max"}))
    with pytest.raises(ValueError, match=r"pooling \['max'\]; bert_jax computes one of"):
        read_sentence_transformer(out)
    with pytest.raises(ValueError, match="pooling must be one of"):
        save_sentence_transformer(
            out, config, params, tokenizer_dir=bert_tokenizer, pooling="max", normalize=False,
            max_seq_length=20,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"max_seq_length=65 is outside \[2, 64\]"):
        save_sentence_transformer(
            out, config, params, tokenizer_dir=bert_tokenizer, pooling="cls", normalize=False,
            max_seq_length=65,
        )  # fmt: skip
