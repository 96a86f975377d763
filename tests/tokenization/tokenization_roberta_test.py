"""RoBERTa's byte-level BPE and XLM-R's SentencePiece Unigram: parity with transformers' fast
tokenizers on Shakespeare, rows and pairs, files, training, and the errors of bad inputs.

No RoBERTa or XLM-R vocabulary ships offline, so small ones are trained here on two plays and
saved in the files transformers reads."""

import json

import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.pretrain.data import default_corpus, sources
from bert_jax.tokenization import unigram
from tests.tokenization.tokenization_test import HARD_TEXTS

MASKED = ["To be or not to <mask>, that is the question.", "<mask> my lord!", "a  <mask>b <mask>"]


@pytest.fixture(scope="module")
def play_lines():
    files = default_corpus.default_corpus_files()[:2]
    stats = sources.SourceStats()
    return [s for f in files for s in default_corpus.default_corpus_document(f, stats)]


@pytest.fixture(scope="module")
def bpe_dir(play_lines, tmp_path_factory):
    tokenizer = tokenization.train_byte_level_bpe(play_lines, vocab_size=700)
    directory = tmp_path_factory.mktemp("roberta_tokenizer")
    tokenizer.save(directory)
    return directory


@pytest.fixture(scope="module")
def unigram_dir(play_lines, tmp_path_factory):
    """An XLM-R layout tokenizer.json over a Unigram model trained as SentencePiece orders it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    spm = Tokenizer(models.Unigram())
    spm.pre_tokenizer = pre_tokenizers.Metaspace()
    spm.train_from_iterator(
        play_lines,
        trainers.UnigramTrainer(
            vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>"
        ),
    )
    pieces = [tuple(p) for p in json.loads(spm.to_str())["model"]["vocab"]]
    vocab = unigram.fairseq_vocab(pieces)
    tokenizer = tokenization.SentencePieceTokenizer(unigram.xlm_roberta_tokenizer(vocab))
    directory = tmp_path_factory.mktemp("xlmr_tokenizer")
    tokenizer.save(directory)
    return directory


def _texts(play_lines):
    return play_lines[-300:] + HARD_TEXTS + MASKED


@pytest.mark.torch
@pytest.mark.parametrize("files", ["tokenizer.json", "vocab.json"])
def test_bpe_equals_roberta_tokenizer_fast(bpe_dir, play_lines, tmp_path, files):
    transformers = pytest.importorskip("transformers")
    if files == "vocab.json":  # RoBERTa's original files alone
        for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
            (tmp_path / name).write_bytes((bpe_dir / name).read_bytes())
        bpe_dir = tmp_path
    ours = tokenization.load_tokenizer(bpe_dir)
    assert isinstance(ours, tokenization.ByteLevelBPETokenizer)
    theirs = transformers.RobertaTokenizerFast.from_pretrained(str(bpe_dir))
    texts = _texts(play_lines)
    assert ours.encode_batch(texts) == theirs(texts, add_special_tokens=False)["input_ids"]
    # Rows and pairs with specials, truncated as transformers does (longest first).
    a, b = texts[:40], texts[40:80]
    expected = theirs(a, b, truncation="longest_first", max_length=24, return_token_type_ids=True)
    for i, (x, y) in enumerate(zip(a, b)):
        ids_a, ids_b = ours.encode(x), ours.encode(y)
        budget = 24 - ours.num_special_tokens(pair=True)
        while len(ids_a) + len(ids_b) > budget:
            (ids_a if len(ids_a) > len(ids_b) else ids_b).pop()
        row, types = ours.build_inputs(ids_a, ids_b)
        assert row == expected["input_ids"][i]
        assert types == expected["token_type_ids"][i] == [0] * len(row)
    # Words given one by one (NER) read as after a space: transformers' add_prefix_space=True.
    words = [line.split() for line in texts[:50]]
    with_space = transformers.RobertaTokenizerFast.from_pretrained(
        str(bpe_dir), add_prefix_space=True
    )
    expected = with_space(words, is_split_into_words=True, add_special_tokens=False)
    assert [ids for ids, _ in ours.encode_words(words)] == expected["input_ids"]
    assert [w for _, w in ours.encode_words(words)] == [
        expected.word_ids(i) for i in range(len(words))
    ]
    # The mask token takes the space before it, as RoBERTa's <mask> (lstrip).
    assert ours.encode("to <mask> it") == [*ours.encode("to"), ours.mask_id, *ours.encode(" it")]


def test_bpe_semantics(bpe_dir):
    tok = tokenization.load_tokenizer(bpe_dir / "tokenizer.json")
    assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.mask_id == tok.vocab_size - 1 == 699
    assert tok.build_inputs([7], [8]) == ([0, 7, 2, 2, 8, 2], [0] * 6)
    assert tok.num_special_tokens() == 2 and tok.num_special_tokens(pair=True) == 4
    words = tok.tokenize("Hello unperceived the")
    assert "".join(words).replace("Ġ", " ") == "Hello unperceived the" and "Ġthe" in words
    cont = tok.continuation_mask()
    assert not cont[[0, 1, 2, 3, tok.mask_id]].any()
    assert cont[tok.token_to_id("H")] and not cont[tok.token_to_id("Ġthe")]
    # Every byte is in the vocabulary: no <unk>, whatever the text; decoding gives it back.
    rng = np.random.default_rng(0)
    text = "".join(chr(c) for c in rng.integers(32, 0x2FFFF, 60) if not 0xD800 <= c <= 0xDFFF)
    ids = tok.encode(text)
    assert tok.unk_id not in ids and tok.decode(ids) == text
    assert tok.encode("broken \ud800 text") == tok.encode("broken \ufffd text")
    # The saved files are what the loader reads back, all of them.
    again = tokenization.load_tokenizer(bpe_dir / "vocab.json")
    assert again.fingerprint() == tok.fingerprint() and again.vocab == tok.vocab


@pytest.mark.torch
def test_unigram_equals_xlm_roberta_tokenizer_fast(unigram_dir, play_lines):
    transformers = pytest.importorskip("transformers")
    ours = tokenization.load_tokenizer(unigram_dir)
    assert isinstance(ours, tokenization.SentencePieceTokenizer)
    assert (ours.cls_id, ours.pad_id, ours.sep_id, ours.unk_id) == (0, 1, 2, 3)
    assert ours.mask_id == ours.vocab_size - 1
    theirs = transformers.XLMRobertaTokenizerFast.from_pretrained(str(unigram_dir))
    texts = _texts(play_lines)
    assert ours.encode_batch(texts) == theirs(texts, add_special_tokens=False)["input_ids"]
    pairs = theirs(texts[:20], texts[20:40])["input_ids"]
    assert [ours.build_inputs(ours.encode(a), ours.encode(b))[0] for a, b in zip(
        texts[:20], texts[20:40])] == pairs  # fmt: skip
    assert ours.tokenize("Good morrow")[0].startswith(unigram.WORD_START)
    cont = ours.continuation_mask()
    assert not cont[[0, 1, 2, 3, ours.mask_id]].any()


@pytest.mark.torch
def test_train_unigram_lays_out_xlm_r_and_loads_in_transformers(play_lines, tmp_path):
    """A Unigram vocabulary trained on a few hundred lines: fairseq's ids, XLM-R's pipeline, and
    a tokenizer.json that transformers' AutoTokenizer reads as XLM-R's and encodes alike."""
    transformers = pytest.importorskip("transformers")
    trained = tokenization.train_unigram(play_lines[:400], vocab_size=500)
    assert isinstance(trained, tokenization.SentencePieceTokenizer) and trained.kind == "unigram"
    assert trained.vocab_size == 500
    assert trained.vocab[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and trained.vocab[-1] == "<mask>"
    assert (trained.cls_id, trained.pad_id, trained.sep_id, trained.unk_id) == (0, 1, 2, 3)
    assert trained.mask_id == 499
    assert unigram.WORD_START + "the" in trained.vocab  # pieces that start a word carry "▁"
    trained.save(tmp_path)
    ours = tokenization.load_tokenizer(tmp_path)
    assert ours.fingerprint() == trained.fingerprint()
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(theirs).__name__ in ("XLMRobertaTokenizer", "XLMRobertaTokenizerFast")
    texts = [*play_lines[400:420], *MASKED, "Unheard-of words: zounds, forsooth!"]
    ids = theirs(texts)["input_ids"]
    assert ids == [ours.build_inputs(ours.encode(t))[0] for t in texts]
    assert ids == [trained.build_inputs(trained.encode(t))[0] for t in texts]
    assert all(row[0] == 0 and row[-1] == 2 for row in ids)
    assert theirs.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>", "<mask>"]) == [
        0, 1, 2, 3, 499]  # fmt: skip


def test_bad_inputs_are_named(tmp_path, bpe_dir):
    # vocab.json without its merges.txt
    (tmp_path / "vocab.json").write_bytes((bpe_dir / "vocab.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        tokenization.load_tokenizer(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(ValueError, match="line 2 is not two tokens"):
        tokenization.load_tokenizer(tmp_path)
    # A BPE vocabulary without RoBERTa's special tokens
    vocab = json.loads((bpe_dir / "vocab.json").read_text())
    del vocab["<mask>"], vocab["<pad>"]
    (tmp_path / "merges.txt").write_bytes((bpe_dir / "merges.txt").read_bytes())
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(tokenization.MissingSpecialTokenError, match="<pad>"):
        tokenization.load_tokenizer(tmp_path / "vocab.json")
    # WordPiece options on another kind
    with pytest.raises(ValueError, match="lowercase apply to WordPiece"):
        tokenization.load_tokenizer(bpe_dir, lowercase=True)
    # sentencepiece.bpe.model without the sentencepiece package: say what to do
    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / "sentencepiece.bpe.model").write_bytes(b"\x0a\x03abc")
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install sentencepiece.*tokenizer.json"):
            tokenization.load_tokenizer(tmp_path / "spm")
    else:
        with pytest.raises(ValueError, match="not a SentencePiece"):
            tokenization.load_tokenizer(tmp_path / "spm")
    with pytest.raises(ValueError, match="leaves no room for merges"):
        tokenization.train_byte_level_bpe(["a b"], vocab_size=200)
    with pytest.raises(ValueError, match="cannot hold every character"):
        tokenization.train_unigram(["abcdefghijklmnopqrstuvwxyz"], vocab_size=12)
