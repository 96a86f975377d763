"""ModernBERT checkpoints shaped like mmBERT (Gemma's BPE with byte fallback, <bos>=2 <eos>=1
<pad>=0 in config.json, both RoPE thetas 160,000) and like Ettin (ModernBERT's own byte-level BPE
with [CLS] [SEP]): a tiny ModernBertForMaskedLM saved by transformers beside tokenizer files
shaped as those releases (tests/tokenization/released_shapes.py) converts, embeds as
transformers computes it, and, with -m e2e, embeds through `python -m bert_jax.inference embed`
and SentenceTransformer, and fine-tunes (classification, SQuAD, NER) into exports transformers
reads."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import convert, inference, tokenization
from bert_jax.finetune import run as finetune_run
from bert_jax.models.families import get_model_class
from tests.finetune.run_test import (
    NAMES,
    WORDS,
    conll_file,
    finetune_config,
    sentiment_files,
    squad_file,
)
from tests.tokenization import released_shapes

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

TEXTS = ["good alpha beta gamma", "bad ünïcödé 😀 delta", "日本語 epsilon zeta eta", "x"]
# The fields of each release's config.json that are not sizes (the tokenizer gives the ids).
RELEASES = {
    "mmbert": (
        released_shapes.mmbert_like_dir,
        lambda tok: dict(
            bos_token_id=2,
            eos_token_id=1,
            cls_token_id=2,
            sep_token_id=1,
            global_rope_theta=160000.0,
            local_rope_theta=160000.0,
        ),
    ),  # fmt: skip
    "ettin": (
        released_shapes.ettin_like_dir,
        lambda tok: dict(
            bos_token_id=tok.cls_id,
            eos_token_id=tok.sep_id,
            cls_token_id=tok.cls_id,
            sep_token_id=tok.sep_id,
            global_rope_theta=160000.0,
            local_rope_theta=10000.0,
        ),
    ),  # fmt: skip
}


@pytest.fixture(scope="module", params=sorted(RELEASES))
def checkpoint(request, tmp_path_factory):
    """A directory as transformers saves a 2-layer ModernBertForMaskedLM (a global layer, a
    local one of window 4), every weight perturbed, beside the release's tokenizer files."""
    make_tokenizer, ids = RELEASES[request.param]
    out = tmp_path_factory.mktemp(request.param)
    words = [*WORDS, *NAMES, "good", "bad", "what", "who", "is", "the", "answer"]
    texts = released_shapes.TEXTS + [" ".join(words)] * 3
    tok = tokenization.load_tokenizer(make_tokenizer(out, texts))
    config = transformers.ModernBertConfig(
        vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, global_attn_every_n_layers=2,
        local_attention=4, max_position_embeddings=64, **ids(tok),
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.ModernBertForMaskedLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    return request.param, out, model


def _hf_rows(path, texts):
    theirs = transformers.AutoTokenizer.from_pretrained(str(path))
    return theirs(texts, padding=True, return_tensors="pt")


def test_converts_and_embeds_as_transformers(checkpoint):
    """Conversion reads every weight; the tokenizer is the release's kind and gives
    AutoTokenizer's rows; masked-LM logits and mean-pooled embeddings within 1e-4."""
    kind, path, model = checkpoint
    config, params, report = convert.load_pytorch(
        path, model="ModernBertForMaskedLM", return_report=True
    )
    assert report.loaded and not report.newly_initialized and not report.unused
    config, params, _, tok = inference.load(str(path))
    assert config.vocab_size == tok.vocab_size and config.pad_token_id == tok.pad_id
    assert (config.cls_token_id, config.sep_token_id) == (tok.cls_id, tok.sep_id)
    rows = _hf_rows(path, TEXTS)
    for text, ids, mask in zip(TEXTS, rows["input_ids"], rows["attention_mask"], strict=True):
        assert ids[mask.bool()].tolist() == tok.build_inputs(tok.encode(text))[0], (kind, text)
    with torch.no_grad():
        hidden = model.model(**rows).last_hidden_state.numpy()
        logits = model(**rows).logits.numpy()
    mask = rows["attention_mask"].numpy()[..., None]
    expected = (hidden * mask).sum(1) / mask.sum(1)
    ours = inference.embed(config, params, tok, TEXTS, pooling="mean")
    np.testing.assert_allclose(ours, expected, atol=1e-4)
    out = get_model_class("ModernBertForMaskedLM")(config).apply(
        {"params": params}, rows["input_ids"].numpy(), attention_mask=rows["attention_mask"].numpy()
    )
    real = mask.astype(bool)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logits)[real], logits[real], atol=1e-4)


# A process of its own, 3 to 4 s on 2 cores: with -m e2e, for the default stage's time
# (tests/inference/inference_families_test.py runs the command on a ModernBERT by default).
@pytest.mark.e2e
def test_python_m_inference_embed(checkpoint, tmp_path):
    _, path, _ = checkpoint
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.inference", "embed", "--model", str(path),
         "--input", str(tmp_path / "in.txt"), "--output", str(out), "--pooling", "mean"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    config, params, _, tok = inference.load(str(path))
    expected = inference.embed(config, params, tok, TEXTS, pooling="mean")
    np.testing.assert_allclose(np.load(out), expected, atol=1e-5)


@pytest.mark.e2e  # 8 to 20 s each on 2 cores
def test_fine_tunes_and_exports_the_tokenizer(checkpoint, tmp_path):
    """A classifier learns from the checkpoint with its own tokenizer; the export holds the
    same kind of tokenizer, read alike by AutoTokenizer, and transformers' classifier."""
    kind, path, _ = checkpoint
    sentiment_files(tmp_path)
    config = finetune_config("custom", tmp_path, path, init_from=str(path))
    results = finetune_run.train_and_evaluate(config, str(tmp_path / "run"))
    assert results["mean"]["accuracy"] > 0.9, (kind, results)
    hf_dir = tmp_path / "run" / "hf"
    exported = json.loads((hf_dir / "config.json").read_text())
    assert exported["architectures"] == ["ModernBertForSequenceClassification"]
    ours = tokenization.load_tokenizer(hf_dir)
    assert type(ours) is type(tokenization.load_tokenizer(path))
    rows = _hf_rows(hf_dir, TEXTS)
    assert (
        rows["input_ids"][3][rows["attention_mask"][3].bool()].tolist()
        == ours.build_inputs(ours.encode(TEXTS[3]))[0]
    )
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(str(hf_dir))
    assert classifier(**rows).logits.shape == (len(TEXTS), 2)
    shutil.rmtree(tmp_path / "run")


@pytest.mark.e2e  # 15 to 25 s each on 2 cores
@pytest.mark.parametrize("task", ["squad1", "conll2003"])
def test_span_and_word_tasks(checkpoint, tmp_path, task):
    """SQuAD (answers mapped back through the tokens' character offsets, byte-fallback pieces
    among them) and NER (words given one by one) learn from each checkpoint."""
    kind, path, _ = checkpoint
    rng = np.random.default_rng(3)
    if task == "squad1":
        squad_file(tmp_path / "train-v1.1.json", rng, 240)
        squad_file(tmp_path / "dev-v1.1.json", rng, 48)
        overrides = {"finetune.doc_stride": 16, "finetune.max_query_length": 8}
    else:
        conll_file(tmp_path / "train.txt", rng, 200)
        conll_file(tmp_path / "valid.txt", rng, 48)
        overrides = {}
    config = finetune_config(task, tmp_path, path, init_from=str(path), **overrides)
    mean = finetune_run.train_and_evaluate(config, str(tmp_path / "run"))["mean"]
    assert mean["f1" if task == "squad1" else "entity_f1"] > (50 if task == "squad1" else 0.8), (
        kind,
        mean,
    )


@pytest.mark.e2e  # sentence-transformers' import: a few seconds
def test_sentence_transformers_reads_the_saved_tokenizer(checkpoint, tmp_path):
    """The tokenizer files `save` writes, beside the checkpoint, give SentenceTransformer's mean
    embeddings equal to `inference.embed` within 1e-5."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models as st_models

    _, path, _ = checkpoint
    shutil.copytree(path, tmp_path / "m")
    (tmp_path / "m" / "tokenizer_config.json").unlink()
    config, params, _, tok = inference.load(str(path))
    tok.save(tmp_path / "m")
    model = st.SentenceTransformer(
        modules=[st_models.Transformer(str(tmp_path / "m")), st_models.Pooling(32, "mean")],
        device="cpu",
    )
    expected = inference.embed(config, params, tok, TEXTS, pooling="mean")
    np.testing.assert_allclose(model.encode(TEXTS), expected, atol=1e-5)
