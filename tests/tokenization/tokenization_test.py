"""WordPiece tokenization: parity with transformers' BertTokenizerFast, robustness, loading, training."""

import os
import shutil

import numpy as np
import pytest

from bert_jax import tokenization
from tests.pretrain.conftest import EXCERPT

HARD_TEXTS = [
    "",
    "   \t\n ",
    "Hello, World! It's 3.14 o'clock -- naïve café, résumé, ÀÉÎÕÜ.",
    "\x00\x01\x7f control\u200b chars\ufeff and \ufffd replacement",
    "emoji 😀👍🏽 and symbols ©®™ ∑∫",
    "中文字符測試 日本語のテキスト 한국어 텍스트",
    "a" * 150 + " short " + "b" * 99,
    "Special [CLS] tokens [SEP] in [MASK] text [PAD] [UNK]",
    "tabs\tand\nnewlines\r\nmixed",
    "Ångström, Ελληνικά, Русский, עברית, العربية",
]


def _hf_tokenizer(vocab_dir, **kwargs):
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizerFast.from_pretrained(vocab_dir, **kwargs)


@pytest.mark.torch
def test_ids_equal_bert_tokenizer_fast_on_real_and_hard_text(bert_vocab_dir, bert_tokenizer):
    hf = _hf_tokenizer(bert_vocab_dir)
    texts = EXCERPT.read_text().splitlines() + HARD_TEXTS
    ours = bert_tokenizer.encode_batch(texts)
    theirs = hf(texts, add_special_tokens=False)["input_ids"]
    assert ours == theirs


@pytest.mark.torch
def test_cased_vocab_matches_cased_bert_tokenizer_fast(tmp_path, bert_vocab_dir):
    # A cased vocab: the uncased one plus capitalized words; lowercase is inferred as False.
    words = (
        open(os.path.join(bert_vocab_dir, "vocab.txt"), encoding="utf-8").read().split("\n")[:-1]
    )
    extra = ["Hello", "World", "Café", "Naïve"]
    (tmp_path / "vocab.txt").write_text("\n".join(words + extra) + "\n", encoding="utf-8")
    tok = tokenization.load_tokenizer(tmp_path / "vocab.txt")
    assert tok.lowercase is False
    hf = _hf_tokenizer(str(tmp_path), do_lower_case=False)
    for text in HARD_TEXTS + ["Hello World Café Naïve hello"]:
        assert tok.encode(text) == hf(text, add_special_tokens=False)["input_ids"], text
    assert tok.tokenize("Hello hello Café") == ["Hello", "hello", "Café"]


def test_bert_semantics(bert_tokenizer):
    tok = bert_tokenizer
    assert tok.vocab_size == 30522
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.lowercase is True
    assert tok.tokenize("UNAFFABLE Résumé") == ["una", "##ffa", "##ble", "resume"]
    # CJK ideographs are split one per token, as in the original.
    assert tok.tokenize("中文") == ["中", "文"]
    # A word longer than max_input_chars_per_word (100) is one [UNK].
    assert tok.encode("x" * 101) == [tok.unk_id]
    assert tok.encode("") == []
    assert tok.encode("\x00\x01\u200b") == []


def test_no_input_crashes(bert_tokenizer):
    lone_surrogate = "broken \ud800 text"
    assert bert_tokenizer.encode(lone_surrogate) == bert_tokenizer.encode("broken text")
    assert bert_tokenizer.encode(b"bytes \xff input") == bert_tokenizer.encode("bytes input")
    rng = np.random.default_rng(0)
    for _ in range(50):
        codepoints = rng.integers(1, 0x10FFFF, 40)
        text = "".join(chr(c) for c in codepoints if not 0xD800 <= c <= 0xDFFF)
        ids = bert_tokenizer.encode(text)
        assert all(0 <= i < bert_tokenizer.vocab_size for i in ids)


def test_tokenizer_json_equals_vocab_txt(bert_vocab_dir, bert_tokenizer):
    from_json = tokenization.load_tokenizer(os.path.join(bert_vocab_dir, "tokenizer.json"))
    from_dir = tokenization.load_tokenizer(bert_vocab_dir)
    assert from_json.fingerprint() == bert_tokenizer.fingerprint() == from_dir.fingerprint()
    assert from_json.encode_batch(HARD_TEXTS) == bert_tokenizer.encode_batch(HARD_TEXTS)
    # An explicit lowercase overrides the file's normalizer.
    cased = tokenization.load_tokenizer(bert_vocab_dir, lowercase=False)
    assert cased.lowercase is False
    assert cased.encode("Hello") != from_json.encode("Hello")


def test_missing_special_tokens_named(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\nhello\n##s\n", encoding="utf-8")
    with pytest.raises(tokenization.MissingSpecialTokenError, match=r"\[SEP\], \[MASK\]"):
        tokenization.load_tokenizer(tmp_path / "vocab.txt")


def test_bad_vocab_files(tmp_path):
    (tmp_path / "dup.txt").write_text("[PAD]\na\nb\na\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'a' appears on lines 2 and 4"):
        tokenization.load_tokenizer(tmp_path / "dup.txt")
    (tmp_path / "blank.txt").write_text("[PAD]\n\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is blank"):
        tokenization.load_tokenizer(tmp_path / "blank.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ValueError, match="not UTF-8"):
        tokenization.load_tokenizer(tmp_path / "bin.txt")
    with pytest.raises(FileNotFoundError):
        tokenization.load_tokenizer(tmp_path / "absent.txt")
    with pytest.raises(FileNotFoundError, match="no tokenizer in .*tokenizer.json, vocab.txt"):
        tokenization.load_tokenizer(tmp_path)


def test_train_save_load_roundtrip(tmp_path):
    lines = EXCERPT.read_text().splitlines()
    tok = tokenization.train_wordpiece(lines, vocab_size=400, min_frequency=1)
    assert tok.vocab[:5] == list(tokenization.SPECIAL_TOKENS)
    assert tok.vocab[5:] == sorted(tok.vocab[5:])  # Ids depend only on the learned set.
    assert tok.vocab_size == 400
    assert any(t.startswith("##") for t in tok.vocab)
    assert tok.continuation_mask().sum() == sum(t.startswith("##") for t in tok.vocab)
    tok.save(tmp_path)
    for name in ("vocab.txt", "tokenizer.json"):
        loaded = tokenization.load_tokenizer(tmp_path / name)
        assert loaded.fingerprint() == tok.fingerprint()
        assert loaded.encode_batch(lines) == tok.encode_batch(lines)


@pytest.mark.torch
def test_saved_tokenizer_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = tokenization.train_wordpiece(EXCERPT.read_text().splitlines(), vocab_size=300)
    tok.save(tmp_path)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    text = "Now name the rest of the players."
    assert hf(text)["input_ids"] == [tok.cls_id, *tok.encode(text), tok.sep_id]
    shutil.rmtree(tmp_path)


# Where google-research/bert's FullTokenizer (tokenization.py) differs from BertTokenizerFast, and
# what it gives instead, read off its code: `_clean_text` drops NUL, U+FFFD and categories Cc and
# Cf only; each whitespace token is lower-cased with Python's str.lower(); CJK ideographs, U+2B820
# to U+2CEAF included, become tokens of their own; special-token strings get no special treatment;
# words of over 200 characters become [UNK]. (text, BertTokenizerFast's tokens, the original's.)
ORIGINAL_DIFFERENCES = [
    # A word of 101-200 characters: [UNK] beside 100; the original splits it into pieces.
    ("x" * 150, ["[UNK]"], ["xx"] + ["##xx"] * 74),
    # A literal [MASK]: the special id here, plain text in the original ("[mask]" lower-cased).
    (
        "[MASK] and [CLS]",
        ["[MASK]", "and", "[CLS]"],
        ["[", "mask", "]", "and", "[", "cl", "##s", "]"],
    ),
    # Final sigma: str.lower() gives "οδος" (ς, final form); BertNormalizer gives "οδοσ".
    ("ΟΔΟΣ ΣΑ", ["ο", "##δ", "##ο", "##σ", "σ", "##α"], ["ο", "##δ", "##ος", "σ", "##α"]),
    # Private use (Co) is dropped here; the original keeps it, so its word is unknown.
    ("a\ue000b x \U000f0000 y", ["ab", "x", "y"], ["[UNK]", "x", "[UNK]", "y"]),
    # U+2B820-U+2B91F (CJK Extension E): a token of its own in the original only.
    ("ab\U0002b820cd", ["[UNK]"], ["ab", "[UNK]", "cd"]),
]


@pytest.mark.parametrize("source", ["vocab.txt", "tokenizer.json"])
def test_match_original_tokenizes_as_google_research_bert(bert_vocab_dir, bert_tokenizer, source):
    path = os.path.join(bert_vocab_dir, source)
    original = tokenization.load_tokenizer(path, match_original=True)
    assert original.lowercase is True and original.fingerprint() != bert_tokenizer.fingerprint()
    for text, default_tokens, original_tokens in ORIGINAL_DIFFERENCES:
        assert bert_tokenizer.tokenize(text) == default_tokens, text
        assert original.tokenize(text) == original_tokens, text
    assert original.tokenize("ΟΔΟΣ") == bert_tokenizer.tokenize("ΟΔΟΣ".lower())
    # The same in both: control and format characters dropped, over 200 characters [UNK], CJK,
    # a sigma that does not end a word.
    for text in ("a\x01b\u200bc\ufffd", "y" * 201, "中文 \U0002b920", "Ωmega ΣΑ ΑΣΑ"):
        assert original.encode(text) == bert_tokenizer.encode(text), text
    # Ordinary text is unchanged.
    texts = EXCERPT.read_text().splitlines() + HARD_TEXTS[2:6] + HARD_TEXTS[8:]
    assert original.encode_batch(texts) == bert_tokenizer.encode_batch(texts)
    assert original.tokenizer.model.max_input_chars_per_word == 200


def test_match_original_survives_save_and_load(tmp_path, bert_vocab_dir):
    original = tokenization.load_tokenizer(bert_vocab_dir, match_original=True)
    original.save(tmp_path)
    reloaded = tokenization.load_tokenizer(tmp_path)
    assert reloaded.fingerprint() == original.fingerprint()
    for text, _, original_tokens in ORIGINAL_DIFFERENCES:
        assert reloaded.tokenize(text) == original_tokens, text
    # Overriding the casing keeps the original's pipeline; cased, a final sigma stays capital.
    cased = tokenization.load_tokenizer(tmp_path, lowercase=False)
    assert cased.lowercase is False
    assert cased.tokenize("[MASK] \ue000") == ["[", "[UNK]", "]", "[UNK]"]
