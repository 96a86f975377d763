"""SQuAD predictions: start/end logits of every window mapped back to answer text, and
run_squad.py's prediction files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence

import numpy as np
from etils import epath

from bert_jax.finetune.squad.examples import SquadExample
from bert_jax.finetune.squad.features import SquadWindow


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
