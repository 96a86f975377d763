"""Fixtures of the pretraining data tests: tiny corpora and vocabularies (the real BERT vocab
is in tests/conftest.py)."""

import pathlib

import pytest

TESTDATA = pathlib.Path(__file__).parent / "testdata"
EXCERPT = TESTDATA / "shakespeare_excerpt.txt"


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
