"""The tokenizers of ModernBERT checkpoints shaped like mmBERT (Gemma's SentencePiece BPE with byte
fallback) and like Ettin (ModernBERT's own byte-level BPE): read from directories written as
those releases are (tests/tokenization/released_shapes.py says what is imitated), they give
transformers' AutoTokenizer's ids and rows, and the files `save` writes read alike in both."""

import json

import numpy as np
import pytest
from absl import logging

from bert_jax import tokenization
from tests.tokenization import released_shapes
from tests.tokenization.released_shapes import PROBES, TEXTS

transformers = pytest.importorskip("transformers")

KINDS = {
    "mmbert": (released_shapes.mmbert_like_dir, tokenization.SentencePieceBPETokenizer),
    "ettin": (released_shapes.ettin_like_dir, tokenization.ModernBertBPETokenizer),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def released(request, tmp_path_factory):
    """(kind, directory) of a released-shaped tokenizer."""
    make, _ = KINDS[request.param]
    return request.param, make(tmp_path_factory.mktemp(request.param))


def _rows_equal(ours, theirs, texts):
    for a, b in zip(texts, texts[1:] + texts[:1], strict=True):
        assert theirs(a)["input_ids"] == ours.build_inputs(ours.encode(a))[0], a
        if b:  # transformers takes an empty second text for none
            pair = ours.build_inputs(ours.encode(a), ours.encode(b))[0]
            assert theirs(a, b)["input_ids"] == pair, (a, b)


def test_released_files_read_as_transformers_reads_them(released):
    kind, directory = released
    ours = tokenization.load_tokenizer(directory)
    assert type(ours) is KINDS[kind][1]
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    for role in ("cls", "sep", "pad", "unk", "mask"):
        assert getattr(theirs, f"{role}_token_id") == getattr(ours, f"{role}_id"), role
    _rows_equal(ours, theirs, TEXTS + PROBES)
    for text in PROBES:
        assert ours.tokenize(text) == theirs.tokenize(text), text
        assert ours.decode(ours.encode(text)) == theirs.decode(
            theirs(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True
        ), text


def test_saved_files_read_alike_here_and_in_transformers(released, tmp_path):
    _, directory = released
    ours = tokenization.load_tokenizer(directory)
    ours.save(tmp_path, model_max_length=64)
    loaded = tokenization.load_tokenizer(tmp_path)
    assert type(loaded) is type(ours) and loaded.fingerprint() == ours.fingerprint()
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id) == (
        loaded.cls_id,
        loaded.sep_id,
        loaded.mask_id,
    )
    assert theirs.model_max_length == 64
    _rows_equal(loaded, theirs, TEXTS + PROBES)


def test_mmbert_layout_and_byte_fallback(tmp_path):
    """Gemma's first ids; a character the vocabulary lacks is its UTF-8 bytes, never <unk>;
    rows are `<bos> A <eos>` and `<bos> A <eos> B <eos>`, types all 0."""
    tok = tokenization.load_tokenizer(released_shapes.mmbert_like_dir(tmp_path))
    assert (tok.pad_id, tok.sep_id, tok.cls_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.vocab[5:261] == [f"<0x{b:02X}>" for b in range(256)]
    assert tok.tokenize("😀") == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert tok.unk_id not in tok.encode(" ".join(PROBES))
    ids, types = tok.build_inputs([7, 8], [9])
    assert ids == [2, 7, 8, 1, 9, 1] and types == [0] * 6
    mask = tok.continuation_mask()
    assert not mask[:5].any() and mask[5:261].all() and mask.dtype == np.bool_
    ((word_ids, words),) = tok.encode_words([["quick", "brown", "fox"]])
    assert word_ids == tok.encode(" quick brown fox") and words[0] == 0 and words[-1] == 2


def test_ettin_layout(tmp_path):
    """ModernBERT's ids: OLMo's two first, [UNK] [CLS] [SEP] [PAD] [MASK] after the learned
    tokens, [unused<i>] to a multiple of 8; [MASK] takes the space before it."""
    tok = tokenization.load_tokenizer(released_shapes.ettin_like_dir(tmp_path, vocab_size=403))
    assert tok.vocab[:2] == ["<|endoftext|>", "<|padding|>"] and tok.vocab_size % 8 == 0
    first = tok.unk_id
    assert (tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id) == tuple(
        first + i for i in (1, 2, 3, 4)
    )
    assert tok.vocab[tok.mask_id + 1 :] == [
        f"[unused{i}]" for i in range(tok.vocab_size - first - 5)
    ]
    masked = tok.encode("the quick") + [tok.mask_id] + tok.encode(" fox")
    assert tok.encode("the quick [MASK] fox") == masked
    ids, _ = tok.build_inputs([7], [9])
    assert ids == [tok.cls_id, 7, tok.sep_id, 9, tok.sep_id]
    config = json.loads(tok.files()["tokenizer_config.json"])
    assert (
        config["tokenizer_class"] == "PreTrainedTokenizerFast" and "vocab.json" not in tok.files()
    )


def test_gemma_template_becomes_modernbert_rows(tmp_path):
    """A tokenizer.json with Gemma's own template (`<bos> A`, no <eos>) is read in ModernBERT's
    rows, with a warning, and written back with them, so transformers then lays rows out alike."""
    directory = released_shapes.mmbert_like_dir(tmp_path / "gemma", gemma_template=True)
    warnings = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logging, "warning", lambda msg, *args: warnings.append(msg % args))
        tok = tokenization.load_tokenizer(directory)
    assert len(warnings) == 1 and "as <bos> A | <bos> A <bos> B;" in warnings[0]
    assert tok.build_inputs([7])[0] == [2, 7, 1]
    tok.save(tmp_path / "saved")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    _rows_equal(tok, theirs, TEXTS)


def test_vocabulary_of_mmbert_size(tmp_path):
    """256,000 ids (mmBERT's), the learned pieces last (unused tokens between, as Gemma has):
    text encodes to ids past 65,535 here as in transformers, and a model of that size reads it
    (nothing assumes 16-bit ids)."""
    directory = released_shapes.mmbert_like_dir(tmp_path)
    state = json.loads(released_shapes.read_tokenizer(directory).to_str())
    vocab = state["model"]["vocab"]
    learned = sorted((t for t, i in vocab.items() if i >= 261), key=vocab.get)
    for i in range(261, 256_000 - len(learned)):
        vocab[f"<unused{i}>"] = i
    vocab.update({t: 256_000 - len(learned) + n for n, t in enumerate(learned)})
    (directory / "tokenizer.json").write_text(json.dumps(state))
    tok = tokenization.load_tokenizer(directory)
    assert tok.vocab_size == 256_000
    tok.check_model_vocab_size(256_000)
    ids = tok.encode(TEXTS[0])
    assert min(ids) > 65_535 and tok.decode(ids) == TEXTS[0]
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert theirs(TEXTS[0])["input_ids"] == tok.build_inputs(ids)[0]
