"""SQuAD examples: the records and their readers (official JSON, tensorflow-datasets, the Hub's
Parquet)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

from absl import logging

from bert_jax.data import tables, text_io


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
    reading = _Reading.start(on_bad_answer, stats)
    dataset = _load_json(path)
    for i, article in enumerate(_field(dataset, "data", list, path)):
        where_article = f"{path}: data[{i}]"
        title = article.get("title", "") if isinstance(article, dict) else ""
        for j, paragraph in enumerate(_field(article, "paragraphs", list, where_article)):
            where_paragraph = f"{where_article}.paragraphs[{j}]"
            context = _field(paragraph, "context", str, where_paragraph)
            for k, qa in enumerate(_field(paragraph, "qas", list, where_paragraph)):
                where = f"{where_paragraph}.qas[{k}]"
                _read_qa(qa, context, title, where, reading)
    return reading.examples_of(path)


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
    reading: _Reading,
) -> None:
    """Reads one question of the JSON at `where` into `reading`."""
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
    reading.add(qas_id, question, context, answers, is_impossible, title, where)


@dataclasses.dataclass
class _Reading:
    """One split's reading: the bad-answer policy, the counts, the ids seen and the examples."""

    on_bad_answer: str
    stats: SquadStats
    seen: set[str] = dataclasses.field(default_factory=set)
    examples: list[SquadExample] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, on_bad_answer: str, stats: SquadStats | None) -> _Reading:
        """Checks `on_bad_answer` ("raise" or "skip"); counts into `stats` or new ones."""
        if on_bad_answer not in ("raise", "skip"):
            raise ValueError(f"on_bad_answer must be 'raise' or 'skip', not {on_bad_answer!r}")
        return cls(on_bad_answer, stats if stats is not None else SquadStats())

    def add(
        self,
        qas_id: str,
        question: str,
        context: str,
        answers: list[tuple[str, int]],
        is_impossible: bool,
        title: str,
        where: str,
    ) -> None:
        """Checks one question, counts it and keeps it unless it lost all of its answers."""
        if qas_id in self.seen:
            raise ValueError(f"{where}: duplicate question id {qas_id!r}")
        self.seen.add(qas_id)
        self.stats.questions += 1
        if is_impossible:
            self.stats.unanswerable += 1
            answers = []  # v2.0 files list none; `plausible_answers` are not answers.
        elif answers:
            checked = _checked_answers(answers, context, where, self.on_bad_answer, self.stats)
            if not checked:
                self.stats.dropped_questions.append(qas_id)
                return
            answers = checked
        self.examples.append(
            SquadExample(qas_id, question, context, tuple(answers), is_impossible, title)
        )

    def examples_of(self, source: str) -> list[SquadExample]:
        """The questions kept, in reading order; ValueError naming `source` if there are none."""
        if not self.examples:
            raise ValueError(f"{source} has no questions")
        return self.examples


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
    reading = _Reading.start(on_bad_answer, stats)
    builder = text_io.tfds_builder(name, data_dir, download)
    for record in text_io.tfds_records(builder, split):
        qas_id = text_io.as_str(record["id"])
        where = f"tfds:{name}/{split} (id {qas_id})"
        impossible = bool(record.get("is_impossible", False))
        _record_example(record, impossible, where, reading)
    return reading.examples_of(f"tfds:{name}/{split}")


HUB_COLUMNS = ("id", "title", "context", "question", "answers")


def read_squad_hub(
    files: Sequence[str], *, on_bad_answer: str = "raise", stats: SquadStats | None = None
) -> list[SquadExample]:
    """Reads the Hub's Parquet files of one SQuAD split (`rajpurkar/squad` or `squad_v2`,
    local or gs://), streamed; a question with no answer is unanswerable (v2.0). Answers are
    checked as in `read_squad`; errors name the file, row and id."""
    reading = _Reading.start(on_bad_answer, stats)
    for path in files:
        text_io.note_read(path)
        for row, record in tables.iter_rows(path, HUB_COLUMNS):
            where = f"{path}: row {row} (id {record['id']})"
            for key in ("id", "context", "question", "answers"):
                if record[key] is None:
                    raise ValueError(f"{where}: {key} is null")
            impossible = not record["answers"]["text"]
            _record_example(record, impossible, where, reading)
    return reading.examples_of(", ".join(files))


def _record_example(record, impossible, where, reading: _Reading) -> None:
    """Reads one question of a tfds or Hub record (the same fields, bytes or str) into `reading`."""
    texts = [text_io.as_str(t) for t in record["answers"]["text"]]
    starts = [int(s) for s in record["answers"]["answer_start"]]
    reading.add(
        text_io.as_str(record["id"]),
        text_io.as_str(record["question"]),
        text_io.as_str(record["context"]),
        list(zip(texts, starts)),
        impossible,
        text_io.as_str(record.get("title") or ""),
        where,
    )


def gold_answers(examples: Sequence[SquadExample]) -> dict[str, list[str]]:
    """Question id -> gold answer texts ([] if unanswerable), for `metrics.squad_evaluate`."""
    return {e.qas_id: [text for text, _ in e.answers] for e in examples}
