"""Tokenized corpora: documents of token-id sentences, stored as three flat arrays.

`tokenize_documents` encodes documents of sentence strings with any family's tokenizer (in
batches, in parallel in Rust) into a `TokenizedCorpus`:

    tokens            int32 [T]    all token ids back to back
    sentence_offsets  int64 [S+1]  sentence s is tokens[sentence_offsets[s]:sentence_offsets[s+1]]
    document_offsets  int64 [D+1]  document d is sentences document_offsets[d] .. [d+1]-1

`documents()` views it as the nested sequences that example creation reads, and `save`/`load`
share it with worker processes through memory-mapped .npy files. Sentences that tokenize to
nothing and documents left empty are dropped and counted, as the original drops them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
from collections.abc import Iterable, Sequence

import numpy as np

from bert_jax.pretrain.data.sources import Document


@dataclasses.dataclass
class TokenizedCorpus:
    """Documents of tokenized sentences, stored flat.

    Attributes:
      tokens: int32 [T], all token ids back to back.
      sentence_offsets: int64 [S+1] o; sentence s is tokens[o[s]:o[s+1]].
      document_offsets: int64 [D+1] q; document d is sentences q[d] .. q[d+1]-1.
    """

    tokens: np.ndarray
    sentence_offsets: np.ndarray
    document_offsets: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1

    def documents(self) -> _CorpusDocuments:
        """A `Sequence` of documents, each a `Sequence` of token-id lists."""
        return _CorpusDocuments(self)

    def save(self, directory: str) -> None:
        """Writes the three arrays as .npy files."""
        os.makedirs(directory, exist_ok=True)
        for name in ("tokens", "sentence_offsets", "document_offsets"):
            np.save(os.path.join(directory, f"{name}.npy"), getattr(self, name))

    @classmethod
    def load(cls, directory: str) -> TokenizedCorpus:
        """Memory-maps the arrays written by `save`."""
        return cls(
            *(
                np.load(os.path.join(directory, f"{name}.npy"), mmap_mode="r")
                for name in ("tokens", "sentence_offsets", "document_offsets")
            )
        )


class _CorpusDocuments(Sequence):
    def __init__(self, corpus: TokenizedCorpus):
        self._corpus = corpus

    def __len__(self) -> int:
        return self._corpus.num_documents

    def __getitem__(self, d: int) -> _Sentences:
        offsets = self._corpus.document_offsets
        return _Sentences(self._corpus, int(offsets[d]), int(offsets[d + 1]))


class _Sentences(Sequence):
    def __init__(self, corpus: TokenizedCorpus, start: int, stop: int):
        self._corpus, self._start, self._stop = corpus, start, stop

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, j: int) -> list[int]:
        if not 0 <= j < len(self):
            raise IndexError(j)
        offsets = self._corpus.sentence_offsets
        s = self._start + j
        return self._corpus.tokens[offsets[s] : offsets[s + 1]].tolist()


@dataclasses.dataclass
class CorpusStats:
    """What tokenization saw.

    Attributes:
      documents: non-empty documents kept.
      sentences: non-empty sentences kept.
      tokens: token ids.
      empty_sentences: sentences that tokenized to nothing (dropped, as in the original).
      empty_documents: documents left with no sentence (dropped).
      one_sentence_documents: documents of one sentence; with NSP they only give random-next pairs.
      fingerprint: hash of the documents' text.
    """

    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    empty_sentences: int = 0
    empty_documents: int = 0
    one_sentence_documents: int = 0
    fingerprint: str = ""


def keep_nonempty_sentences(
    sentence_ids: Sequence[list[int]], stats: CorpusStats
) -> list[list[int]]:
    """One document's sentences that tokenized to something; counts what is dropped.

    Args:
      sentence_ids: the token ids of each of the document's sentences.
      stats: its empty_sentences, empty_documents and one_sentence_documents are advanced.

    Returns:
      The non-empty sentences (an empty list: the document is dropped).
    """
    kept = [ids for ids in sentence_ids if ids]
    stats.empty_sentences += len(sentence_ids) - len(kept)
    stats.empty_documents += not kept
    stats.one_sentence_documents += len(kept) == 1
    return kept


def from_documents(documents: Sequence[Sequence[Sequence[int]]]) -> TokenizedCorpus:
    """A `TokenizedCorpus` of already tokenized documents (lists of token-id sentences)."""
    lengths = [len(s) for d in documents for s in d]
    tokens = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(documents)),
        np.int32,
        sum(lengths),
    )
    return TokenizedCorpus(tokens, _offsets(lengths), _offsets([len(d) for d in documents]))


def _offsets(sizes: Sequence[int]) -> np.ndarray:
    """int64 [n+1]: where each of n consecutive pieces of `sizes` starts, then the end."""
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def tokenize_documents(
    documents: Iterable[Document], tokenizer, *, batch_size: int = 2048, progress: bool = False
) -> tuple[TokenizedCorpus, CorpusStats]:
    """Tokenizes documents of sentences into a `TokenizedCorpus`.

    Sentences that tokenize to nothing and documents left empty are dropped and counted, as the
    original drops them.

    Args:
      documents: lists of sentence strings.
      tokenizer: a `tokenization.SubwordTokenizer`.
      batch_size: sentences per `encode_batch` call.
      progress: show a progress bar.

    Returns:
      (corpus, stats).
    """
    from tqdm import tqdm

    stats = CorpusStats()
    digest = hashlib.sha256()
    parts = _TokenizedParts()
    pending: list[str] = []
    pending_docs: list[int] = []  # Sentence count of each document in `pending`.

    def flush():
        parts.add(tokenizer.encode_batch(pending), pending_docs, stats)
        pending.clear()
        pending_docs.clear()

    bar = tqdm(desc="tokenizing", unit=" docs", disable=not progress)
    for document in documents:
        for sentence in document:
            digest.update(sentence.encode("utf-8", "surrogatepass") + b"\x1f")
        digest.update(b"\x1e")
        pending.extend(document)
        pending_docs.append(len(document))
        if len(pending) >= batch_size:
            flush()
        bar.update(1)
    flush()
    bar.close()
    corpus = parts.corpus()
    stats.documents = len(parts.document_sizes)
    stats.sentences = len(parts.sentence_lengths)
    stats.tokens = int(corpus.tokens.size)
    stats.fingerprint = digest.hexdigest()[:16]
    return corpus, stats


class _TokenizedParts:
    """A corpus gathered batch by batch: token ids, sentence lengths, document sizes."""

    def __init__(self):
        self.token_chunks: list[np.ndarray] = []
        self.sentence_lengths: list[int] = []
        self.document_sizes: list[int] = []

    def add(self, ids: list[list[int]], document_lengths: list[int], stats: CorpusStats) -> None:
        """Adds a batch's sentence ids, `document_lengths[i]` sentences for its document i."""
        # One array per flush, not per sentence: a per-sentence array costs ~100 bytes of overhead.
        self.token_chunks.append(
            np.fromiter(itertools.chain.from_iterable(ids), np.int32, sum(map(len, ids)))
        )
        k = 0
        for count in document_lengths:
            kept = keep_nonempty_sentences(ids[k : k + count], stats)
            k += count
            self.sentence_lengths.extend(map(len, kept))
            if kept:
                self.document_sizes.append(len(kept))

    def corpus(self) -> TokenizedCorpus:
        """The parts as one `TokenizedCorpus`."""
        chunks = self.token_chunks
        tokens = np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
        return TokenizedCorpus(
            tokens, _offsets(self.sentence_lengths), _offsets(self.document_sizes)
        )
