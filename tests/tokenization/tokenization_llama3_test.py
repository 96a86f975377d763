"""Llama-3's byte-level BPE (EuroBERT's): a trained tokenizer saved and read back by
`load_tokenizer` and by transformers' AutoTokenizer gives the same ids and rows."""

import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.tokenization import llama3

TEXTS = [
    "Hello world, what's the answer? 12345 apples.",
    "  Spaces\tand\nnew lines; émigré naïve café ☃ 😀",
    "The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="module")
def trained():
    return tokenization.train_llama3_bpe(TEXTS * 5, vocab_size=300, min_frequency=1)


def test_layout_and_roles(trained):
    """The bytes and merges, then <|begin_of_text|>, <|end_of_text|>, <|mask|> last; padding
    is <|end_of_text|>; rows are `bos A eos` and `bos A eos B eos`, types all 0."""
    v = trained.vocab_size
    assert (trained.cls_id, trained.sep_id, trained.mask_id) == (v - 3, v - 2, v - 1)
    assert trained.pad_id == trained.sep_id
    ids, types = trained.build_inputs([5, 6], [7])
    assert ids == [v - 3, 5, 6, v - 2, 7, v - 2] and types == [0] * 6
    assert trained.num_special_tokens(pair=True) == 3
    mask = trained.continuation_mask()
    assert not mask[trained.mask_id] and mask.dtype == np.bool_


def test_saved_tokenizer_reads_alike_here_and_in_transformers(trained, tmp_path):
    transformers = pytest.importorskip("transformers")
    trained.save(tmp_path)
    loaded = tokenization.load_tokenizer(tmp_path)
    assert isinstance(loaded, llama3.Llama3BPETokenizer)
    assert loaded.fingerprint() == trained.fingerprint()
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert theirs.pad_token_id == loaded.pad_id and theirs.mask_token_id == loaded.mask_id
    for a, b in zip(TEXTS, TEXTS[1:] + TEXTS[:1], strict=True):
        assert theirs(a)["input_ids"] == loaded.build_inputs(loaded.encode(a))[0]
        assert (
            theirs(a, b)["input_ids"] == loaded.build_inputs(loaded.encode(a), loaded.encode(b))[0]
        )
    masked = "the quick <|mask|> fox"
    assert theirs.tokenize(masked) == loaded.tokenize(masked)


def test_words_tokenize_as_in_running_text(trained):
    """NER's words, given one by one, take the pieces they have after a space in a sentence."""
    ((ids, words),) = trained.encode_words([["quick", "brown", "fox"]])
    assert ids == trained.encode(" quick brown fox")
    assert words[0] == 0 and words[-1] == 2
