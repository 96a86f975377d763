"""SQuAD features: each example's context cut into windows of token rows (see the package's
docstring for the rows' layout), with one host-side `SquadWindow` per row."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bert_jax import tokenization
from bert_jax.finetune.squad.examples import SquadExample, SquadStats


@dataclasses.dataclass(frozen=True)
class SquadWindow:
    """Host-side facts about one feature row (one window of one example).

    Attributes:
      example_index: the example's index in the list given to `featurize`.
      qas_id: the example's question id.
      window_index: the window's number within the example (0, 1, ...).
      context_start: the row position of the window's first context token (len(question) + 2).
      doc_start: that token's index among the context's tokens.
      doc_length: the number of context tokens in the window.
      token_offsets: int32 [T, 2], (start, end) character offsets in the context of all T
        context tokens (shared by the example's windows).
      is_max_context: bool [doc_length], whether this window is the token's max-context window.
    """

    example_index: int
    qas_id: str
    window_index: int
    context_start: int
    doc_start: int
    doc_length: int
    token_offsets: np.ndarray
    is_max_context: np.ndarray

    def char_span(self, position: int) -> tuple[int, int] | None:
        """(start, end) character offsets of the row's token at `position`, None if it is not
        a context token of this window."""
        k = position - self.context_start
        if not 0 <= k < self.doc_length:
            return None
        start, end = self.token_offsets[self.doc_start + k]
        return int(start), int(end)

    def token_to_char(self) -> np.ndarray:
        """int32 [context_start + doc_length + 1, 2]: each row token's character offsets in the
        context, (-1, -1) for [CLS], the question and the [SEP]s."""
        offsets = np.full((self.context_start + self.doc_length + 1, 2), -1, dtype=np.int32)
        window = slice(self.doc_start, self.doc_start + self.doc_length)
        offsets[self.context_start : self.context_start + self.doc_length] = self.token_offsets[
            window
        ]
        return offsets


def _without_lone_surrogates(text: str) -> str:
    """Replaces lone surrogates (which Rust strings cannot hold) one-for-one, keeping offsets."""
    if not any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        return text
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


def _context_tokens(
    tokenizer: tokenization.SubwordTokenizer, contexts: Sequence[str]
) -> list[tuple[list[int], np.ndarray]]:
    """(token ids, int32 [T, 2] char offsets) of each context, from the fast tokenizer.

    `SubwordTokenizer.encode_batch` returns ids only, so this adapter calls the wrapped
    `tokenizers.Tokenizer` for the offsets.
    """
    encodings = tokenizer.tokenizer.encode_batch(
        [_without_lone_surrogates(c) for c in contexts], add_special_tokens=False
    )
    return [(e.ids, np.asarray(e.offsets, dtype=np.int32).reshape(-1, 2)) for e in encodings]


def _window_starts(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window, as run_squad.py: windows of up to `max_tokens` tokens,
    each `doc_stride` after the previous, until one reaches the end (one empty window for an
    empty context)."""
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, doc_stride)


def _max_context(spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """bool [length] per window: is it the token's window with the most context on the nearer
    side (+ 0.01 * window length; the first such window wins ties)?"""
    if not spans or spans[-1][0] + spans[-1][1] == 0:
        return [np.zeros(length, dtype=bool) for _, length in spans]
    num_tokens = max(s + n for s, n in spans)
    best_score = np.full(num_tokens, -np.inf)
    best_span = np.full(num_tokens, -1)
    for index, (start, length) in enumerate(spans):
        positions = np.arange(start, start + length)
        score = np.minimum(positions - start, start + length - 1 - positions) + 0.01 * length
        better = score > best_score[positions]
        best_score[positions[better]] = score[better]
        best_span[positions[better]] = index
    return [best_span[start : start + length] == i for i, (start, length) in enumerate(spans)]


def _answer_tokens(offsets: np.ndarray, start_char: int, end_char: int) -> tuple[int, int] | None:
    """(first, last) context token overlapping the character span, None if none does."""
    first = int(np.searchsorted(offsets[:, 1], start_char, side="right"))
    last = int(np.searchsorted(offsets[:, 0], end_char, side="left")) - 1
    if first > last:
        return None
    return first, last


def featurize(
    examples: Sequence[SquadExample],
    tokenizer: tokenization.SubwordTokenizer,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    stats: SquadStats | None = None,
) -> tuple[dict[str, np.ndarray], list[SquadWindow], SquadStats]:
    """Windowed QA features (keys in the module docstring) and their `SquadWindow`s.

    Args:
      examples: the questions.
      tokenizer: the WordPiece tokenizer.
      max_seq_length: L, the row length.
      doc_stride: tokens between the starts of consecutive windows.
      max_query_length: questions are cut to this many tokens (counted).
      stats: counts are added here (a new `SquadStats` if None).

    Returns:
      (features with leading axis F, one `SquadWindow` per row, the counts).
    """
    if not examples:
        raise ValueError("no examples to featurize")
    if doc_stride < 1:
        raise ValueError("doc_stride must be >= 1")
    stats = stats if stats is not None else SquadStats()
    questions = tokenizer.encode_batch([e.question for e in examples])
    unique_contexts = list(dict.fromkeys(e.context for e in examples))
    context_tokens = dict(zip(unique_contexts, _context_tokens(tokenizer, unique_contexts)))

    rows: list[list[int]] = []
    positions: list[tuple[int, int]] = []
    windows: list[SquadWindow] = []
    for example_index, example in enumerate(examples):
        question = questions[example_index]
        if len(question) > max_query_length:
            question = question[:max_query_length]
            stats.truncated_questions += 1
        for row, position, window in _example_rows(
            example_index,
            example,
            question,
            context_tokens[example.context],
            tokenizer,
            max_seq_length,
            doc_stride,
            stats,
        ):
            rows.append(row)
            positions.append(position)
            windows.append(window)
    stats.windows += len(rows)
    features = _feature_arrays(
        rows, windows, positions, tokenizer.pad_id, max_seq_length, tokenizer.pair_token_types
    )
    return features, windows, stats


def _example_rows(
    example_index: int,
    example: SquadExample,
    question: list[int],
    context: tuple[list[int], np.ndarray],
    tokenizer: tokenization.SubwordTokenizer,
    max_seq_length: int,
    doc_stride: int,
    stats: SquadStats,
) -> list[tuple[list[int], tuple[int, int], SquadWindow]]:
    """One example's rows: ([CLS] question [SEP] window [SEP] ids, the answer's (start, end) row
    positions or (0, 0) if the window does not hold it, the window)."""
    max_tokens = _window_length(
        example, len(question), max_seq_length, tokenizer.num_special_tokens(pair=True)
    )
    doc_ids, offsets = context
    spans = _window_starts(len(doc_ids), max_tokens, doc_stride)
    stats.multi_window_examples += len(spans) > 1
    answer = _answer_span(example, offsets, stats)
    context_start = len(tokenizer.build_inputs(question, [])[0]) - 1
    inside_any = False
    result = []
    for window_index, ((doc_start, doc_length), max_context) in enumerate(
        zip(spans, _max_context(spans))
    ):
        row, _ = tokenizer.build_inputs(question, doc_ids[doc_start : doc_start + doc_length])
        position = (0, 0)
        if answer is not None:
            first, last = answer
            if doc_start <= first and last < doc_start + doc_length:
                position = (first - doc_start + context_start, last - doc_start + context_start)
                inside_any = True
            else:
                stats.answers_outside_window += 1
        window = SquadWindow(
            example_index,
            example.qas_id,
            window_index,
            context_start,
            doc_start,
            doc_length,
            offsets,
            max_context,
        )
        result.append((row, position, window))
    if answer is not None and not inside_any:
        stats.answers_in_no_window += 1
    return result


def _window_length(
    example: SquadExample, question_length: int, max_seq_length: int, num_special: int
) -> int:
    """Context tokens a row holds beside the question and `num_special` special tokens (3 for
    BERT, 4 for RoBERTa); ValueError if there is no room."""
    max_tokens = max_seq_length - question_length - num_special
    if max_tokens < 1:
        raise ValueError(
            f"question {example.qas_id!r}: max_seq_length={max_seq_length} leaves no room "
            f"for context after its {question_length} tokens and {num_special} special tokens; "
            "lower max_query_length"
        )
    return max_tokens


def _answer_span(
    example: SquadExample, offsets: np.ndarray, stats: SquadStats
) -> tuple[int, int] | None:
    """The context tokens (first, last) of the example's first answer; None if it has none."""
    answer = None
    if example.answers and not example.is_impossible:
        text, start_char = example.answers[0]
        answer = _answer_tokens(offsets, start_char, start_char + len(text))
        if answer is None:
            stats.answers_without_tokens += 1
    return answer


def _feature_arrays(
    rows: Sequence[list[int]],
    windows: Sequence[SquadWindow],
    positions: Sequence[tuple[int, int]],
    pad_id: int,
    max_seq_length: int,
    context_token_type: bool = True,
) -> dict[str, np.ndarray]:
    """The rows padded into the feature arrays of the module docstring ([F, L] and [F]); the
    context has token type 1 where `context_token_type` (BERT; RoBERTa's are all 0)."""
    f = len(rows)
    input_ids = np.full((f, max_seq_length), pad_id, dtype=np.int32)
    token_type_ids = np.zeros((f, max_seq_length), dtype=np.int32)
    attention_mask = np.zeros((f, max_seq_length), dtype=np.int32)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = row
        token_type_ids[i, windows[i].context_start : len(row)] = int(context_token_type)
        attention_mask[i, : len(row)] = 1
    position_array = np.asarray(positions, dtype=np.int32).reshape(f, 2)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "start_positions": position_array[:, 0].copy(),
        "end_positions": position_array[:, 1].copy(),
        "example_weights": np.ones(f, dtype=np.float32),
    }
