"""SQuAD v1.1 and v2.0: reading, windowed features, and predictions from start/end logits.

Readers: `read_squad` (the official JSON), `read_squad_tfds`, `read_squad_hub` (the Hub's Parquet
of `rajpurkar/squad` and `rajpurkar/squad_v2`, which the tasks read when `data_dir` holds no
SQuAD JSON). Features as google-research/bert's `run_squad.py`: the context cut into windows of
`max_seq_length - len(question) - 3` tokens (4 for RoBERTa's `</s></s>`), every `doc_stride`
tokens, each row laid out by `tokenization.SubwordTokenizer.build_inputs` (RoBERTa's token types
all 0):

    input_ids        int32   [F, L]   F windows (rows), L = max_seq_length
    token_type_ids   int32   [F, L]   0 for [CLS] question [SEP], 1 for the window and last [SEP]
    attention_mask   int32   [F, L]
    start_positions  int32   [F]      the first answer's first/last token in the row; 0 ([CLS])
    end_positions    int32   [F]      when unanswerable or not wholly inside this window
    example_weights  float32 [F]      1.0 (`batching.batches` adds 0.0 fillers)

beside one host-side `SquadWindow` per row (its example, the row's context tokens, their
character offsets and max-context flags). `postprocess` maps logits back to the exact context
text; `write_predictions` writes run_squad.py's files. Windows, postprocessing, bad input:
docs/finetune_data.md, "SQuAD v1.1 / v2.0".

Kept whole past the usual 600 lines: reading, features, predictions and the tasks (its sections,
in that order) share `SquadExample`, `SquadWindow` and the offsets that carry an answer from text
to tokens and back.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence

import numpy as np
from absl import logging
from etils import epath

from bert_jax import tokenization
from bert_jax.data import tables, text_io
from bert_jax.finetune import metrics
from bert_jax.finetune import task as task_lib


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """One question about one context.

    Attributes:
      qas_id: the question's id.
      question: the question text.
      context: the paragraph.
      answers: the gold answers as (text, character offset in `context`); empty if unanswerable
        (or unlabelled).
      is_impossible: SQuAD v2.0's flag (the question has no answer in the context).
      title: the article's title.
    """

    qas_id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False
    title: str = ""


@dataclasses.dataclass
class SquadStats:
    """Counts of reading and featurizing.

    Attributes:
      questions: questions read.
      unanswerable: questions with is_impossible (v2.0).
      bad_answers: "where: reason" of answers skipped with `on_bad_answer="skip"`.
      dropped_questions: ids of answerable questions left with no valid answer (skipped).
      windows: feature rows made.
      multi_window_examples: examples whose context needed more than one window.
      truncated_questions: questions longer than max_query_length (cut).
      answers_outside_window: windows of answerable examples whose answer is not inside them
        (their positions are 0, as run_squad.py).
      answers_in_no_window: answerable examples whose answer fits in no window at all.
      answers_without_tokens: answers whose text covers no token (e.g. only whitespace).
    """

    questions: int = 0
    unanswerable: int = 0
    bad_answers: list[str] = dataclasses.field(default_factory=list)
    dropped_questions: list[str] = dataclasses.field(default_factory=list)
    windows: int = 0
    multi_window_examples: int = 0
    truncated_questions: int = 0
    answers_outside_window: int = 0
    answers_in_no_window: int = 0
    answers_without_tokens: int = 0

    def log(self) -> None:
        """Logs the counts, with warnings for anything skipped, cut or unreachable."""
        logging.info(
            "SQuAD: %d questions (%d unanswerable), %d windows, %d examples with several",
            self.questions,
            self.unanswerable,
            self.windows,
            self.multi_window_examples,
        )
        for name in ("truncated_questions", "answers_in_no_window", "answers_without_tokens"):
            if getattr(self, name):
                logging.warning("SQuAD: %s = %d", name, getattr(self, name))
        if self.bad_answers:
            logging.warning(
                "SQuAD: skipped %d answers whose text is not at their offset, e.g. %s",
                len(self.bad_answers),
                self.bad_answers[0],
            )
        if self.dropped_questions:
            logging.warning(
                "SQuAD: dropped %d questions with no valid answer: %s",
                len(self.dropped_questions),
                self.dropped_questions[:5],
            )

    def to_dict(self) -> dict:
        """The counts as a JSON-able dict (lists reduced to counts)."""
        d = dataclasses.asdict(self)
        d["bad_answers"] = len(self.bad_answers)
        d["dropped_questions"] = len(self.dropped_questions)
        return d


# ---- Reading ----


def _field(obj, key: str, kind: type | tuple[type, ...], where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"{where}: missing field {key!r}")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or isinstance(value, bool):
        expected = " or ".join(k.__name__ for k in kinds)
        raise ValueError(f"{where}.{key}: expected {expected}, got {type(value).__name__}")
    return value


def _checked_answers(
    answers: Sequence[tuple[str, int]],
    context: str,
    where: str,
    on_bad_answer: str,
    stats: SquadStats,
) -> list[tuple[str, int]]:
    """The answers whose text is at their offset; raises (or skips and counts) the others."""
    good = []
    for k, (text, start) in enumerate(answers):
        found = context[start : start + len(text)] if start >= 0 else None
        if found == text and text:
            good.append((text, start))
            continue
        reason = (
            "the answer text is empty"
            if not text
            else f"answer_start={start} gives {found!r}, not the answer text {text!r}"
        )
        message = f"{where}.answers[{k}]: {reason}"
        if on_bad_answer == "raise":
            raise ValueError(message)
        stats.bad_answers.append(message)
    return good


def read_squad(
    path: str | os.PathLike,
    *,
    on_bad_answer: str = "raise",
    stats: SquadStats | None = None,
) -> list[SquadExample]:
    """Reads a SQuAD v1.1 or v2.0 JSON file.

    Args:
      path: e.g. train-v1.1.json or dev-v2.0.json. Questions without an `answers` field (a
        test file) read as unlabelled.
      on_bad_answer: "raise" (default) when an answer's text is not at its `answer_start`, or
        "skip" such answers (counted in `stats.bad_answers`; an answerable question left with
        none is dropped and its id recorded in `stats.dropped_questions`).
      stats: filled with counts.

    Returns:
      The questions in file order.

    Raises:
      ValueError: not JSON, a missing or mistyped field, a duplicate id, a misplaced answer;
        the message names the file and the JSON path (and the question id).
    """
    path = os.fspath(path)
    if on_bad_answer not in ("raise", "skip"):
        raise ValueError(f"on_bad_answer must be 'raise' or 'skip', not {on_bad_answer!r}")
    stats = stats if stats is not None else SquadStats()
    dataset = _load_json(path)
    examples: list[SquadExample] = []
    seen: set[str] = set()
    for i, article in enumerate(_field(dataset, "data", list, path)):
        where_article = f"{path}: data[{i}]"
        title = article.get("title", "") if isinstance(article, dict) else ""
        for j, paragraph in enumerate(_field(article, "paragraphs", list, where_article)):
            where_paragraph = f"{where_article}.paragraphs[{j}]"
            context = _field(paragraph, "context", str, where_paragraph)
            for k, qa in enumerate(_field(paragraph, "qas", list, where_paragraph)):
                where = f"{where_paragraph}.qas[{k}]"
                example = _read_qa(qa, context, title, where, on_bad_answer, stats, seen)
                if example is not None:
                    examples.append(example)
    if not examples:
        raise ValueError(f"{path} has no questions")
    return examples


def _load_json(path: str):
    """The JSON value in the (local or URL) file `path`; ValueError naming it if not JSON."""
    with text_io.open_text(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not JSON: {e}") from None


def _read_qa(
    qa,
    context: str,
    title: str,
    where: str,
    on_bad_answer: str,
    stats: SquadStats,
    seen: set[str],
) -> SquadExample | None:
    """One question of the JSON at `where` (checked and counted); None if it lost its answers."""
    qas_id = str(_field(qa, "id", (str, int), where))
    where = f"{where} (id {qas_id})"
    question = _field(qa, "question", str, where)
    is_impossible = bool(qa.get("is_impossible", False))
    answers = []
    for a, answer in enumerate(qa.get("answers", [])):
        where_answer = f"{where}.answers[{a}]"
        answers.append(
            (
                _field(answer, "text", str, where_answer),
                _field(answer, "answer_start", int, where_answer),
            )
        )
    return _make_example(
        qas_id, question, context, answers, is_impossible, title, where, on_bad_answer, stats, seen
    )


def _make_example(
    qas_id: str,
    question: str,
    context: str,
    answers: list[tuple[str, int]],
    is_impossible: bool,
    title: str,
    where: str,
    on_bad_answer: str,
    stats: SquadStats,
    seen: set[str],
) -> SquadExample | None:
    """Checks one question and counts it; None if it lost all of its answers."""
    if qas_id in seen:
        raise ValueError(f"{where}: duplicate question id {qas_id!r}")
    seen.add(qas_id)
    stats.questions += 1
    if is_impossible:
        stats.unanswerable += 1
        answers = []  # v2.0 files list none; `plausible_answers` are not answers.
    elif answers:
        checked = _checked_answers(answers, context, where, on_bad_answer, stats)
        if not checked:
            stats.dropped_questions.append(qas_id)
            return None
        answers = checked
    return SquadExample(qas_id, question, context, tuple(answers), is_impossible, title)


def read_squad_tfds(
    name: str,
    split: str,
    *,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    on_bad_answer: str = "raise",
    stats: SquadStats | None = None,
) -> list[SquadExample]:
    """Reads tfds `squad/v1.1` or `squad/v2.0` ("train" or "validation") from `data_dir`.

    Needs the optional `tf` extra; answers are checked as in `read_squad`.
    """
    if on_bad_answer not in ("raise", "skip"):
        raise ValueError(f"on_bad_answer must be 'raise' or 'skip', not {on_bad_answer!r}")
    stats = stats if stats is not None else SquadStats()
    builder = text_io.tfds_builder(name, data_dir, download)
    examples, seen = [], set()
    for record in text_io.tfds_records(builder, split):
        qas_id = text_io.as_str(record["id"])
        where = f"tfds:{name}/{split} (id {qas_id})"
        impossible = bool(record.get("is_impossible", False))
        example = _record_example(record, impossible, where, on_bad_answer, stats, seen)
        if example is not None:
            examples.append(example)
    if not examples:
        raise ValueError(f"tfds:{name}/{split} has no questions")
    return examples


HUB_COLUMNS = ("id", "title", "context", "question", "answers")


def read_squad_hub(
    files: Sequence[str], *, on_bad_answer: str = "raise", stats: SquadStats | None = None
) -> list[SquadExample]:
    """Reads the Hub's Parquet files of one SQuAD split (`rajpurkar/squad` or `squad_v2`,
    local or gs://), streamed; a question with no answer is unanswerable (v2.0). Answers are
    checked as in `read_squad`; errors name the file, row and id."""
    if on_bad_answer not in ("raise", "skip"):
        raise ValueError(f"on_bad_answer must be 'raise' or 'skip', not {on_bad_answer!r}")
    stats = stats if stats is not None else SquadStats()
    examples, seen = [], set()
    for path in files:
        text_io.note_read(path)
        for row, record in tables.iter_rows(path, HUB_COLUMNS):
            where = f"{path}: row {row} (id {record['id']})"
            for key in ("id", "context", "question", "answers"):
                if record[key] is None:
                    raise ValueError(f"{where}: {key} is null")
            impossible = not record["answers"]["text"]
            example = _record_example(record, impossible, where, on_bad_answer, stats, seen)
            if example is not None:
                examples.append(example)
    if not examples:
        raise ValueError(f"{', '.join(files)} has no questions")
    return examples


def _record_example(record, impossible, where, on_bad_answer, stats, seen) -> SquadExample | None:
    """One question from a tfds or Hub record (the same fields, bytes or str)."""
    texts = [text_io.as_str(t) for t in record["answers"]["text"]]
    starts = [int(s) for s in record["answers"]["answer_start"]]
    return _make_example(
        text_io.as_str(record["id"]),
        text_io.as_str(record["question"]),
        text_io.as_str(record["context"]),
        list(zip(texts, starts)),
        impossible,
        text_io.as_str(record.get("title") or ""),
        where,
        on_bad_answer,
        stats,
        seen,
    )


def gold_answers(examples: Sequence[SquadExample]) -> dict[str, list[str]]:
    """Question id -> gold answer texts ([] if unanswerable), for `metrics.squad_evaluate`."""
    return {e.qas_id: [text for text, _ in e.answers] for e in examples}


# ---- Features ----


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


# ---- Predictions ----


@dataclasses.dataclass
class SquadPredictions:
    """What `postprocess` returns.

    Attributes:
      predictions: question id -> answer text ("" = no answer), predictions.json.
      nbest: question id -> the n best answers, each {"text", "probability", "start_logit",
        "end_logit"} (plus "start"/"end" character offsets for spans), nbest_predictions.json.
      null_odds: question id -> null score minus the best span's score (v2.0 only),
        null_odds.json; pass it as `na_probs` to `metrics.squad_evaluate` to find the best
        `null_score_diff_threshold`.
    """

    predictions: dict[str, str]
    nbest: dict[str, list[dict]]
    null_odds: dict[str, float] | None


def _best_positions(logits: np.ndarray, lo: int, hi: int, n: int) -> np.ndarray:
    """The n positions in [lo, hi) with the highest logits (ties: the earlier position)."""
    order = np.argsort(-logits[lo:hi], kind="stable")[:n]
    return order + lo


def _softmax(scores: list[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def postprocess(
    examples: Sequence[SquadExample],
    windows: Sequence[SquadWindow],
    start_logits: np.ndarray | Sequence[np.ndarray],
    end_logits: np.ndarray | Sequence[np.ndarray],
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> SquadPredictions:
    """Answers from the start/end logits of every window: spans with start <= end, length <=
    `max_answer_length` and a max-context start, ranked by start + end logit, mapped back through
    the offsets; for v2.0 the null score is the lowest `start_logits[0] + end_logits[0]`.

    Candidates are the `n_best_size` best starts and ends among each window's context tokens
    (run_squad.py ranks all positions, padding included, so what it finds depends on how much
    padding a row has; ranking only context tokens makes the result independent of padding and
    never misses a span run_squad.py would find). Duplicate texts keep their best score. An
    example with no valid span predicts "" (run_squad.py writes "empty").

    Args:
      examples: the examples given to `featurize`.
      windows: its `SquadWindow`s, one per logits row.
      start_logits: float [F, L'] (L' >= each row's length; rows may also be given one by one
        with different lengths, as dynamic padding leaves them).
      end_logits: float [F, L'], likewise.
      n_best_size: candidates per window and answers kept per example.
      max_answer_length: the longest span, in tokens.
      version_2_with_negative: SQuAD v2.0: consider the null answer.
      null_score_diff_threshold: predict "" when null score - best span score exceeds this.

    Returns:
      The predictions, n-best lists and (v2.0) null odds, keyed by question id in example order.
    """
    if len(start_logits) != len(windows) or len(end_logits) != len(windows):
        raise ValueError(
            f"{len(windows)} windows but {len(start_logits)} start and {len(end_logits)} end "
            "logit rows; drop the batch fillers (example_weights 0) first"
        )
    predictions, nbest_json, null_odds = {}, {}, {} if version_2_with_negative else None
    for example, rows in zip(examples, _rows_of_examples(examples, windows)):
        candidates, null = _example_candidates(
            rows, windows, start_logits, end_logits, n_best_size, max_answer_length,
            version_2_with_negative,
        )  # fmt: skip
        entries = _nbest_entries(example.context, candidates, null, n_best_size)
        probabilities = _softmax([e["start_logit"] + e["end_logit"] for e in entries])
        nbest_json[example.qas_id] = [
            {"text": e["text"], "probability": p, **{k: v for k, v in e.items() if k != "text"}}
            for e, p in zip(entries, probabilities)
        ]
        if version_2_with_negative:
            null_odds[example.qas_id], predictions[example.qas_id] = _null_or_best_span(
                entries, null[0], null_score_diff_threshold
            )
        else:
            predictions[example.qas_id] = entries[0]["text"]
    return SquadPredictions(predictions, nbest_json, null_odds)


def _example_candidates(
    rows: list[int],
    windows: Sequence[SquadWindow],
    start_logits: np.ndarray | Sequence[np.ndarray],
    end_logits: np.ndarray | Sequence[np.ndarray],
    n_best_size: int,
    max_answer_length: int,
    version_2_with_negative: bool,
) -> tuple[list[tuple], tuple | None]:
    """One example's span candidates over its windows `rows`, and (v2.0) its lowest null."""
    candidates = []  # (score, start logit, end logit, char start, char end)
    null = None  # (score, start logit, end logit) of the window with the lowest null score.
    for f in rows:
        starts = np.asarray(start_logits[f], dtype=np.float64)
        ends = np.asarray(end_logits[f], dtype=np.float64)
        if version_2_with_negative:
            score = starts[0] + ends[0]
            if null is None or score < null[0]:
                null = (score, starts[0], ends[0])
        candidates += _span_candidates(f, windows[f], starts, ends, n_best_size, max_answer_length)
    return candidates, null


def _rows_of_examples(
    examples: Sequence[SquadExample], windows: Sequence[SquadWindow]
) -> list[list[int]]:
    """The logits rows of each example's windows; every example must have one."""
    by_example: list[list[int]] = [[] for _ in examples]
    for f, window in enumerate(windows):
        if not 0 <= window.example_index < len(examples):
            raise ValueError(f"window {f} refers to example {window.example_index}")
        by_example[window.example_index].append(f)
    for example, rows in zip(examples, by_example):
        if not rows:
            raise ValueError(f"example {example.qas_id!r} has no window")
    return by_example


def _null_or_best_span(
    entries: list[dict], null_score: float, threshold: float
) -> tuple[float, str]:
    """(null odds, prediction) of a v2.0 example: "" when the null score exceeds the best span's
    score by more than `threshold`."""
    best_span = next((e for e in entries if e["text"]), None)
    if best_span is None:
        # No valid span in any window: the null answer is the only one.
        return float(null_score), ""
    diff = float(null_score - best_span["start_logit"] - best_span["end_logit"])
    return diff, "" if diff > threshold else best_span["text"]


def _span_candidates(
    f: int,
    window: SquadWindow,
    starts: np.ndarray,
    ends: np.ndarray,
    n_best_size: int,
    max_answer_length: int,
) -> list[tuple]:
    """(score, start logit, end logit, char start, char end) of each valid span of window `f`
    among its `n_best_size` best starts and ends, given its float64 logits [L']."""
    lo = window.context_start
    hi = lo + window.doc_length
    if starts.shape[0] < hi or ends.shape[0] < hi:
        raise ValueError(f"window {f}: logits cover {starts.shape[0]} positions < {hi}")
    candidates = []
    best_ends = _best_positions(ends, lo, hi, n_best_size)
    for s in _best_positions(starts, lo, hi, n_best_size):
        if not window.is_max_context[s - lo]:
            continue
        for e in best_ends:
            if e < s or e - s + 1 > max_answer_length:
                continue
            char_start = window.char_span(int(s))[0]
            char_end = window.char_span(int(e))[1]
            candidates.append((starts[s] + ends[e], starts[s], ends[e], char_start, char_end))
    return candidates


def _nbest_entries(
    context: str, candidates: list[tuple], null: tuple | None, n_best_size: int
) -> list[dict]:
    """The best distinct answers, each {"text", "start_logit", "end_logit"} (+ "start"/"end"
    for spans), best first; with a `null` (v2.0) the null answer is always among them."""
    if null is not None:
        candidates = [*candidates, (null[0], null[1], null[2], None, None)]
    # Stable: ties keep window order, and the null answer (added last) follows equal spans.
    candidates = sorted(candidates, key=lambda c: c[0], reverse=True)
    entries, seen = [], set()
    for _, start_logit, end_logit, char_start, char_end in candidates:
        if len(entries) >= n_best_size:
            break
        text = "" if char_start is None else context[char_start:char_end]
        if text in seen or (char_start is not None and not text):
            continue
        seen.add(text)
        entry = {"text": text, "start_logit": float(start_logit), "end_logit": float(end_logit)}
        if char_start is not None:
            entry.update(start=int(char_start), end=int(char_end))
        entries.append(entry)
    if null is not None and "" not in seen:
        entries.append({"text": "", "start_logit": float(null[1]), "end_logit": float(null[2])})
    if not entries:
        entries = [{"text": "", "start_logit": 0.0, "end_logit": 0.0}]
    return entries


def write_predictions(output_dir: str | os.PathLike, result: SquadPredictions) -> dict[str, str]:
    """Writes predictions.json, nbest_predictions.json and (v2.0) null_odds.json (through
    `etils.epath`: `output_dir` may be a `gs://` URL).

    Returns:
      {"predictions": path, "nbest": path[, "null_odds": path]}.
    """
    output_dir = epath.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    files = {"predictions": ("predictions.json", result.predictions)}
    files["nbest"] = ("nbest_predictions.json", result.nbest)
    if result.null_odds is not None:
        files["null_odds"] = ("null_odds.json", result.null_odds)
    paths = {}
    for key, (name, content) in files.items():
        paths[key] = os.fspath(output_dir / name)
        with (output_dir / name).open("w", encoding="utf-8") as f:
            json.dump(content, f, indent=4, ensure_ascii=False)
            f.write("\n")
    return paths


# ---- The fine-tuning tasks ----


_FILES = {
    False: ("train-v1.1.json", "dev-v1.1.json", ""),
    True: ("train-v2.0.json", "dev-v2.0.json", ""),
}
_HUB_CONFIG = {False: "plain_text", True: "squad_v2"}  # rajpurkar/squad, rajpurkar/squad_v2


def _load(version2: bool):
    files = _FILES[version2]

    def load(ft, tokenizer):
        """TaskData of SQuAD: the JSON files in data_dir (else the Hub's Parquet layout there;
        or tensorflow-datasets), in windows."""
        windows_args = dict(
            max_seq_length=ft.max_seq_length,
            doc_stride=ft.doc_stride,
            max_query_length=ft.max_query_length,
        )

        def read(which, split):
            if ft.source == "tfds":
                name = "squad/v2.0" if version2 else "squad/v1.1"
                return read_squad_tfds(name, split, data_dir=ft.tfds_data_dir or None)
            path = task_lib.split_file(ft, which, files)
            if path.lower().endswith(".parquet"):
                return read_squad_hub([path])
            hub = [] if os.path.exists(path) else task_lib.hub_split_files(
                ft.data_dir, split, (_HUB_CONFIG[version2],)
            )  # fmt: skip
            if hub:
                return read_squad_hub(hub)
            if not path:
                raise ValueError(
                    f"{ft.name} needs config.finetune.data_dir (or train_file/dev_file)"
                )
            return read_squad(path)

        train = task_lib.subsample(read(0, "train"), ft.max_train_examples, 0)
        features, _, stats = featurize(train, tokenizer, **windows_args)
        logging.info("SQuAD train: %s", stats)
        dev = task_lib.subsample(read(1, "validation"), ft.max_eval_examples, 1)
        f, windows, s = featurize(dev, tokenizer, **windows_args)
        logging.info("SQuAD dev: %s", s)
        return task_lib.TaskData(
            "question_answering",
            2,
            None,
            features,
            [task_lib.EvalSet("dev", f, dev, True, windows)],
        )

    return load


def _score(version2: bool):
    def score(data, eval_set, outputs, ft, out_dir):
        """The official evaluate-v1.1.py / v2.0.py numbers, and the prediction files."""
        del data
        prediction = postprocess(
            eval_set.examples,
            eval_set.extra,
            outputs["start_logits"],
            outputs["end_logits"],
            n_best_size=ft.n_best_size,
            max_answer_length=ft.max_answer_length,
            version_2_with_negative=version2,
            null_score_diff_threshold=ft.null_score_diff_threshold,
        )
        scores = metrics.squad_evaluate(
            gold_answers(eval_set.examples),
            prediction.predictions,
            version="2.0" if version2 else "1.1",
            na_probs=prediction.null_odds or None,
        )
        if out_dir is not None:
            write_predictions(out_dir, prediction)
        return {k: float(v) for k, v in scores.items() if isinstance(v, (int, float))}

    return score


SQUAD1, SQUAD2 = (
    task_lib.FinetuneTask(
        f"squad{2 if v2 else 1}",
        _load(v2),
        _score(v2),
        files=_FILES[v2],
        objective="question_answering",
        num_labels=2,
    )
    for v2 in (False, True)
)
