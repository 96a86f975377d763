"""Pretraining examples from documents, with the semantics of google-research/bert.

This follows `create_pretraining_data.py` step for step and draws its random numbers from
Python's `random.Random` in the same order, so with one output shard, the same seed, vocab and
input, it makes the same examples as the original (a test checks this on records the original
wrote). The recipe (segments, truncation, masking), MLM-only and dynamic masking:
docs/data.md, "Example creation". `create_hashed_shard_instances` makes a shard from its own
documents only, so a shard needs only its own documents in memory (the Beam build).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Iterable, Sequence

import numpy as np

Segment = Sequence[int]  # One tokenized sentence: token ids.


@dataclasses.dataclass(frozen=True)
class PretrainingOptions:
    """How examples are made (the flags of google-research/bert's script, same defaults).

    Attributes:
      max_seq_length: L, tokens per example including [CLS] and [SEP]s.
      max_predictions_per_seq: P, the most masked positions per example.
      masked_lm_prob: fraction of tokens to mask.
      short_seq_prob: probability that a document's examples aim at a random shorter length.
      dupe_factor: how many times the corpus is made into examples (each time with new pairs and,
        if static, new masks).
      whole_word_mask: mask all pieces of a word together.
      next_sentence_prediction: make A/B pairs with 50% random B; False makes single-segment
        examples for MLM-only training.
      static_masking: choose masks now (the original); False leaves them to the input pipeline.
      random_seed: seed of example creation.
      full_sentences: RoBERTa's FULL-SENTENCES rows (`create_full_sentence_instances` over a
        shard's documents, reshuffled each `dupe_factor` pass; no short rows); needs
        next_sentence_prediction=False.
    """

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    whole_word_mask: bool = False
    next_sentence_prediction: bool = True
    static_masking: bool = True
    random_seed: int = 12345
    full_sentences: bool = False

    def __post_init__(self):
        special = 3 if self.next_sentence_prediction else 2
        if not isinstance(self.max_seq_length, int) or self.max_seq_length < special + 2:
            raise ValueError(
                f"max_seq_length={self.max_seq_length!r}: must be an int >= {special + 2} "
                f"({special} special tokens plus at least 2 text tokens)"
            )
        if not isinstance(self.max_predictions_per_seq, int) or self.max_predictions_per_seq < 1:
            raise ValueError(
                f"max_predictions_per_seq={self.max_predictions_per_seq!r}: must be >= 1"
            )
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob={self.masked_lm_prob!r}: must be in (0, 1)")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob={self.short_seq_prob!r}: must be in [0, 1]")
        if not isinstance(self.dupe_factor, int) or self.dupe_factor < 1:
            raise ValueError(f"dupe_factor={self.dupe_factor!r}: must be an int >= 1")
        if not isinstance(self.random_seed, int) or self.random_seed < 0:
            raise ValueError(f"random_seed={self.random_seed!r}: must be an int >= 0")
        if self.full_sentences and self.next_sentence_prediction:
            raise ValueError(
                "full_sentences=True packs contiguous sentences into single-segment rows (MLM "
                "only); set next_sentence_prediction=False"
            )

    def to_dict(self) -> dict:
        """The options as a JSON-able dict (`full_sentences` only when set, so that the builds
        made before it existed are still recognised)."""
        options = dataclasses.asdict(self)
        if not self.full_sentences:
            del options["full_sentences"]
        return options


@dataclasses.dataclass(frozen=True)
class VocabInfo:
    """What masking needs to know about the vocabulary.

    Attributes:
      vocab_size: V; random replacements are drawn uniformly from ids 0 .. V-1 (as the original).
      cls_id, sep_id, pad_id, mask_id: special token ids.
      continuation: bool [V], True for "##" pieces (used by whole-word masking).
    """

    vocab_size: int
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    continuation: np.ndarray

    @classmethod
    def from_tokenizer(cls, tokenizer) -> VocabInfo:
        """From a `tokenization.SubwordTokenizer`."""
        return cls(
            vocab_size=tokenizer.vocab_size,
            cls_id=tokenizer.cls_id,
            sep_id=tokenizer.sep_id,
            pad_id=tokenizer.pad_id,
            mask_id=tokenizer.mask_id,
            continuation=tokenizer.continuation_mask(),
        )


@dataclasses.dataclass
class TrainingInstance:
    """One example before padding.

    Attributes:
      tokens: token ids `[CLS] A [SEP] B [SEP]`, with masks applied if masking was static.
      segment_ids: 0 for `[CLS] A [SEP]`, 1 for `B [SEP]`; same length as `tokens`.
      is_random_next: B was taken from another document.
      masked_lm_positions: increasing positions of the predictions (empty if not masked).
      masked_lm_ids: the original token ids at those positions.
    """

    tokens: list[int]
    segment_ids: list[int]
    is_random_next: bool
    masked_lm_positions: list[int]
    masked_lm_ids: list[int]


def truncate_seq_pair(
    tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random
) -> None:
    """Shortens the longer of two lists, one token at a time from a random end, until they fit."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def create_masked_lm_predictions(
    tokens: list[int],
    options: PretrainingOptions,
    vocab: VocabInfo,
    rng: random.Random,
) -> tuple[list[int], list[int], list[int]]:
    """Chooses masked-LM positions and replacements as the original does.

    Args:
      tokens: token ids of one example, with [CLS]/[SEP].
      options: masked_lm_prob, max_predictions_per_seq and whole_word_mask are used.
      vocab: special ids, vocabulary size and the "##" table.
      rng: the example-creation random generator (advanced).

    Returns:
      (output tokens, increasing masked positions, original ids at those positions).
    """
    excluded = (vocab.cls_id, vocab.sep_id, vocab.pad_id)
    continuation = vocab.continuation
    cand_indexes: list[list[int]] = []
    for i, token in enumerate(tokens):
        if token in excluded:
            continue
        if options.whole_word_mask and cand_indexes and continuation[token]:
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    rng.shuffle(cand_indexes)

    output_tokens = list(tokens)
    num_to_predict = min(
        options.max_predictions_per_seq,
        max(1, int(round(len(tokens) * options.masked_lm_prob))),
    )
    masked: list[tuple[int, int]] = []
    for index_set in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(index_set) > num_to_predict:
            continue  # A whole word that would overshoot is skipped.
        for index in index_set:
            if rng.random() < 0.8:
                replacement = vocab.mask_id
            elif rng.random() < 0.5:
                replacement = tokens[index]
            else:
                replacement = rng.randint(0, vocab.vocab_size - 1)
            output_tokens[index] = replacement
            masked.append((index, tokens[index]))
    masked.sort()
    return output_tokens, [p for p, _ in masked], [t for _, t in masked]


def _finish_instance(
    tokens_a: list[int],
    tokens_b: list[int] | None,
    is_random_next: bool,
    options: PretrainingOptions,
    vocab: VocabInfo,
    rng: random.Random,
) -> TrainingInstance:
    """Adds [CLS]/[SEP], token type ids and (if static) masks."""
    tokens = [vocab.cls_id, *tokens_a, vocab.sep_id]
    segment_ids = [0] * len(tokens)
    if tokens_b is not None:
        tokens += [*tokens_b, vocab.sep_id]
        segment_ids += [1] * (len(tokens_b) + 1)
    positions: list[int] = []
    labels: list[int] = []
    if options.static_masking:
        tokens, positions, labels = create_masked_lm_predictions(tokens, options, vocab, rng)
    return TrainingInstance(tokens, segment_ids, is_random_next, positions, labels)


def create_instances_from_document(
    all_documents: Sequence[Sequence[Segment]],
    document_index: int,
    options: PretrainingOptions,
    vocab: VocabInfo,
    rng: random.Random,
) -> list[TrainingInstance]:
    """Makes the examples of one document (the recipe: docs/data.md, "Example creation").

    Args:
      all_documents: every document (random B segments come from any of them); each is a
        non-empty sequence of non-empty token-id segments.
      document_index: which document to make examples from.
      options: the recipe.
      vocab: special ids etc.
      rng: advanced in the original's order.

    Returns:
      The examples, in document order.
    """
    document = all_documents[document_index]
    nsp = options.next_sentence_prediction
    max_num_tokens = options.max_seq_length - (3 if nsp else 2)
    target_seq_length = max_num_tokens
    if rng.random() < options.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    current_chunk: list[Segment] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                if not nsp:
                    tokens_a = [t for seg in current_chunk for t in seg]
                    truncate_seq_pair(tokens_a, [], max_num_tokens, rng)
                    instances.append(_finish_instance(tokens_a, None, False, options, vocab, rng))
                else:
                    tokens_a, tokens_b, is_random_next, unused = _sentence_pair(
                        current_chunk, all_documents, document_index, target_seq_length, rng
                    )
                    i -= unused  # Put the unused segments back so that they are not wasted.
                    truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                    instances.append(
                        _finish_instance(tokens_a, tokens_b, is_random_next, options, vocab, rng)
                    )
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _sentence_pair(
    chunk: list[Segment],
    all_documents: Sequence[Sequence[Segment]],
    document_index: int,
    target_seq_length: int,
    rng: random.Random,
) -> tuple[list[int], list[int], bool, int]:
    """A chunk's tokens A and B (B random or the chunk's rest) and how many segments go unused."""
    a_end = 1
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
    tokens_a = [t for seg in chunk[:a_end] for t in seg]
    if len(chunk) == 1 or rng.random() < 0.5:
        target_b_length = target_seq_length - len(tokens_a)
        tokens_b = _random_next(all_documents, document_index, target_b_length, rng)
        return tokens_a, tokens_b, True, len(chunk) - a_end
    return tokens_a, [t for seg in chunk[a_end:] for t in seg], False, 0


def _random_next(
    all_documents: Sequence[Sequence[Segment]],
    document_index: int,
    target_b_length: int,
    rng: random.Random,
) -> list[int]:
    """A random B: another document's segments from a random start, to `target_b_length` tokens."""
    # Try a few times for another document (the original's loop).
    for _ in range(10):
        random_document_index = rng.randint(0, len(all_documents) - 1)
        if random_document_index != document_index:
            break
    random_document = all_documents[random_document_index]
    random_start = rng.randint(0, len(random_document) - 1)
    tokens_b: list[int] = []
    for j in range(random_start, len(random_document)):
        tokens_b.extend(random_document[j])
        if len(tokens_b) >= target_b_length:
            break
    return tokens_b


def create_full_sentence_instances(
    documents: Sequence[Sequence[Segment]],
    options: PretrainingOptions,
    vocab: VocabInfo,
    rng: random.Random,
) -> list[TrainingInstance]:
    """RoBERTa's FULL-SENTENCES examples of `documents` read in order as one stream.

    Each example is `[CLS] S1 S2 ... [SEP]`: whole sentences, contiguous, until the next one would
    pass `max_seq_length - 2` tokens; where a document ends inside an example, one [SEP] separates
    it from the next document's first sentence (none at an example's end). A sentence longer
    than an example is cut into examples of its own, so no token is dropped.

    Args:
      documents: the documents in reading order, each a list of non-empty token-id segments.
      options: max_seq_length, and masking if static.
      vocab: special ids etc.
      rng: draws static masks (advanced only if `options.static_masking`).

    Returns:
      The examples in stream order.
    """
    budget = options.max_seq_length - 2
    rows: list[list[int]] = []
    current: list[int] = []

    def flush() -> None:
        if current and current[-1] == vocab.sep_id:
            current.pop()  # A separator ending an example separates nothing.
        if current:
            rows.append(list(current))
        current.clear()

    for d, document in enumerate(documents):
        if d and current:
            current.append(vocab.sep_id)  # The document boundary, inside an example.
        for segment in document:
            segment = list(segment)
            if len(current) + len(segment) > budget:
                flush()
            while len(segment) > budget:
                rows.append(segment[:budget])
                segment = segment[budget:]
            current.extend(segment)
    flush()
    return [_finish_instance(tokens, None, False, options, vocab, rng) for tokens in rows]


def _full_sentence_passes(
    documents: Sequence[Sequence[Segment]],
    options: PretrainingOptions,
    vocab: VocabInfo,
    rng: random.Random,
) -> list[TrainingInstance]:
    """`dupe_factor` passes of FULL-SENTENCES examples over `documents`, each in a new order (the
    first as given), shuffled together."""
    order = list(range(len(documents)))
    instances: list[TrainingInstance] = []
    for dupe in range(options.dupe_factor):
        if dupe:
            rng.shuffle(order)
        stream = ShuffledDocuments(documents, order)
        instances.extend(create_full_sentence_instances(stream, options, vocab, rng))
    rng.shuffle(instances)
    return instances


class ShuffledDocuments(Sequence):
    """A read-only view of documents in the order `random.Random(seed).shuffle` gives them."""

    def __init__(self, documents: Sequence[Sequence[Segment]], order: Sequence[int]):
        self._documents = documents
        self._order = order

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, index):
        return self._documents[self._order[index]]


def create_shard_instances(
    all_documents: Sequence[Sequence[Segment]],
    options: PretrainingOptions,
    vocab: VocabInfo,
    shard_index: int = 0,
    num_shards: int = 1,
) -> list[TrainingInstance]:
    """Makes the shuffled examples of one output shard.

    Like the original, the documents are first shuffled with `random.Random(random_seed)`; shard
    `s` of `S` takes the shuffled documents `s, s + S, ...`, all `dupe_factor` times, and shuffles
    its examples. With one shard the random stream is the original's throughout; with several,
    each shard continues from its own seed, so shards can be built in parallel and in any order.

    Args:
      all_documents: every document, each a non-empty list of non-empty token-id segments.
      options: the recipe.
      vocab: special ids etc.
      shard_index: which shard.
      num_shards: how many shards the documents are split into.

    Returns:
      The shard's examples in shuffled order.
    """
    rng = random.Random(options.random_seed)
    order = list(range(len(all_documents)))
    rng.shuffle(order)
    documents = ShuffledDocuments(all_documents, order)
    if num_shards > 1:
        rng.seed(f"{options.random_seed}/{shard_index}/{num_shards}")
    if options.full_sentences:
        own = ShuffledDocuments(documents, range(shard_index, len(documents), num_shards))
        return _full_sentence_passes(own, options, vocab, rng)
    instances: list[TrainingInstance] = []
    for _ in range(options.dupe_factor):
        for document_index in range(shard_index, len(documents), num_shards):
            instances.extend(
                create_instances_from_document(documents, document_index, options, vocab, rng)
            )
    rng.shuffle(instances)
    return instances


def document_key(document: Sequence[Segment]) -> int:
    """A stable 64-bit hash of a tokenized document: the same in every process, run and machine.

    Args:
      document: token-id segments (sentences).

    Returns:
      An int in [0, 2**64): sha256 over the segments' int32 little-endian ids, each segment ended
      by a separator.
    """
    digest = hashlib.sha256()
    for segment in document:
        digest.update(np.asarray(segment, dtype="<i4").tobytes())
        digest.update(b"\xff\xff\xff\xff")  # Not an id (ids are >= 0): ends the segment.
    return int.from_bytes(digest.digest()[:8], "little")


def documents_fingerprint(keys: Iterable[int]) -> str:
    """Names a set of documents by their `document_key`s, in any order: 16 hex digits."""
    return f"{sum(keys) % 2**64:016x}"


def create_hashed_shard_instances(
    shard_documents: Sequence[Sequence[Segment]],
    options: PretrainingOptions,
    vocab: VocabInfo,
    shard_index: int,
    num_shards: int,
) -> list[TrainingInstance]:
    """Makes the shuffled examples of hash-partitioned shard `shard_index` of `num_shards`.

    The shard holds the documents with `document_key(d) % num_shards == shard_index`, given here
    in any order: they are sorted by key (equal keys are equal documents), then shuffled with the
    shard's seed, so the result depends only on the set of documents, never on the order a reader
    or a distributed runner delivers them in. Examples are made `dupe_factor` times with random B
    segments drawn from this shard's documents, then shuffled.

    Args:
      shard_documents: the shard's documents, each a non-empty list of non-empty token-id segments.
      options: the recipe.
      vocab: special ids etc.
      shard_index: which shard (seeds its random stream).
      num_shards: how many shards.

    Returns:
      The shard's examples in shuffled order (empty for a shard without documents).
    """
    keys = [document_key(d) for d in shard_documents]
    order = sorted(range(len(shard_documents)), key=keys.__getitem__)
    rng = random.Random(f"{options.random_seed}/hash/{shard_index}/{num_shards}")
    rng.shuffle(order)
    documents = ShuffledDocuments(shard_documents, order)
    if options.full_sentences:
        return _full_sentence_passes(documents, options, vocab, rng)
    instances: list[TrainingInstance] = []
    for _ in range(options.dupe_factor):
        for document_index in range(len(documents)):
            instances.extend(
                create_instances_from_document(documents, document_index, options, vocab, rng)
            )
    rng.shuffle(instances)
    return instances
