"""Evaluation metrics of the fine-tuning tasks, in plain numpy (the table: docs/finetune_data.md,
"Metrics").

Each function takes host-side arrays (or lists) of one whole evaluation split, with the filler
examples that pad the last batch already removed, and returns Python floats. The results equal
scikit-learn's, scipy's, seqeval's and the official SQuAD scripts' (tests/finetune/metrics_test.py),
none of which this module imports.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

# ---- Classification and regression ----


def _pair(labels, predictions) -> tuple[np.ndarray, np.ndarray]:
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.shape != predictions.shape or labels.ndim != 1:
        raise ValueError(
            f"labels and predictions must be 1-D of one length, got shapes {labels.shape} and "
            f"{predictions.shape}"
        )
    if labels.size == 0:
        raise ValueError("no examples to score")
    return labels, predictions


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """The fraction of predictions equal to the label.

    Args:
      labels: int [N], the gold classes.
      predictions: int [N], the predicted classes.

    Returns:
      A float in [0, 1].
    """
    labels, predictions = _pair(labels, predictions)
    return float(np.mean(labels == predictions))


def f1_score(
    labels: Sequence[int],
    predictions: Sequence[int],
    *,
    positive_label: int = 1,
    average: str = "binary",
) -> float:
    """F1 of one positive class (MRPC, QQP) or the unweighted mean F1 over classes.

    A class that is never predicted and never true has F1 0 (scikit-learn's `zero_division=0`).

    Args:
      labels: int [N], the gold classes.
      predictions: int [N], the predicted classes.
      positive_label: the class scored when `average="binary"`.
      average: "binary" or "macro" (the mean over the classes seen in labels or predictions).

    Returns:
      A float in [0, 1].

    Raises:
      ValueError: `average="binary"` with more than two classes in labels and predictions
        together, or two classes that do not include `positive_label` (as scikit-learn).
    """
    labels, predictions = _pair(labels, predictions)
    if average == "binary":
        present = np.unique(np.concatenate([labels, predictions])).tolist()
        if len(present) > 2:
            raise ValueError(
                f"binary F1 needs at most 2 classes, but labels and predictions hold "
                f"{len(present)} ({present[:10]}); use average='macro' for more"
            )
        if len(present) == 2 and positive_label not in present:
            raise ValueError(f"positive_label={positive_label} is not one of the classes {present}")
        classes = [positive_label]
    elif average == "macro":
        classes = np.unique(np.concatenate([labels, predictions])).tolist()
    else:
        raise ValueError(f"average must be 'binary' or 'macro', not {average!r}")
    scores = []
    for c in classes:
        true_positives = np.sum((predictions == c) & (labels == c))
        # F1 = 2 TP / (2 TP + FP + FN) = 2 TP / (#predicted c + #true c).
        denominator = np.sum(predictions == c) + np.sum(labels == c)
        scores.append(2.0 * true_positives / denominator if denominator else 0.0)
    return float(np.mean(scores))


def matthews_corrcoef(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Matthews correlation coefficient (CoLA's metric), multi-class (Gorodkin's R_K).

    Args:
      labels: int [N], the gold classes.
      predictions: int [N], the predicted classes.

    Returns:
      A float in [-1, 1]; 0 when either side has a single class.
    """
    labels, predictions = _pair(labels, predictions)
    classes, encoded = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    k, n = len(classes), len(labels)
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (encoded[:n], encoded[n:]), 1.0)
    true_per_class = confusion.sum(axis=1)
    predicted_per_class = confusion.sum(axis=0)
    correct = np.trace(confusion)
    covariance_tp = correct * n - true_per_class @ predicted_per_class
    variance_t = n * n - true_per_class @ true_per_class
    variance_p = n * n - predicted_per_class @ predicted_per_class
    if variance_t * variance_p == 0:
        return 0.0
    return float(covariance_tp / np.sqrt(variance_t * variance_p))


def pearson(labels: Sequence[float], predictions: Sequence[float]) -> float:
    """Pearson's correlation coefficient, computed as scipy.stats.pearsonr does.

    The deviations from the mean are scaled by their largest magnitude before they are squared,
    so deviations of 1e150 do not overflow and deviations of 1e-150 do not underflow.

    Args:
      labels: float [N].
      predictions: float [N].

    Returns:
      A float in [-1, 1]; nan if either side is constant or holds a NaN.
    """
    labels, predictions = _pair(labels, predictions)
    x, y = labels.astype(np.float64), predictions.astype(np.float64)
    if np.all(x == x[0]) or np.all(y == y[0]):  # Constant (NaN != NaN, so not for NaN input).
        return float("nan")
    with np.errstate(invalid="ignore"):  # Inf or NaN input gives NaN, as in scipy.
        x, y = x - np.mean(x), y - np.mean(y)
        x, y = x / np.max(np.abs(x)), y / np.max(np.abs(y))
        r = (x / np.linalg.norm(x)) @ (y / np.linalg.norm(y))
    if len(x) == 2:  # Two points lie on a line: exactly +-1 (scipy rounds too).
        r = np.round(r)
    return float(np.clip(r, -1.0, 1.0))


def rank_average(values: Sequence[float]) -> np.ndarray:
    """float64 [N]: 1-based ranks, tied values sharing the mean of their ranks."""
    values = np.asarray(values)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start of each run of equal values, in sorted order.
    new_run = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
    run_id = np.cumsum(new_run) - 1
    run_starts = np.flatnonzero(new_run)
    run_ends = np.concatenate([run_starts[1:], [len(values)]])
    mean_rank = (run_starts + run_ends + 1) / 2.0  # Mean of the 1-based ranks start+1 .. end.
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = mean_rank[run_id]
    return ranks


def spearman(labels: Sequence[float], predictions: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's of the average ranks.

    Args:
      labels: float [N].
      predictions: float [N].

    Returns:
      A float in [-1, 1]; nan if either side is constant or holds a NaN (scipy's default
      `nan_policy="propagate"`: a diverged run's NaN predictions must not get ranks).
    """
    labels, predictions = _pair(labels, predictions)
    if np.isnan(labels.astype(np.float64)).any() or np.isnan(predictions.astype(np.float64)).any():
        return float("nan")
    return pearson(rank_average(labels), rank_average(predictions))


def majority_class_accuracy(train_labels: Sequence[int], eval_labels: Sequence[int]) -> float:
    """Accuracy on `eval_labels` of always predicting the most frequent training class.

    Ties go to the smallest class id.

    Args:
      train_labels: int [N_train].
      eval_labels: int [N_eval].

    Returns:
      A float in [0, 1].
    """
    train_labels = np.asarray(train_labels)
    if train_labels.size == 0:
        raise ValueError("no training labels")
    classes, counts = np.unique(train_labels, return_counts=True)
    majority = classes[np.argmax(counts)]
    eval_labels = np.asarray(eval_labels)
    return accuracy(eval_labels, np.full_like(eval_labels, majority))


METRIC_FNS: dict[str, Callable[[Sequence, Sequence], float]] = {
    "accuracy": accuracy,
    "f1": f1_score,
    "macro_f1": lambda labels, predictions: f1_score(labels, predictions, average="macro"),
    "matthews_corrcoef": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def compute(
    names: Iterable[str], labels: Sequence[float], predictions: Sequence[float]
) -> dict[str, float]:
    """The named metrics (keys of `METRIC_FNS`) of one evaluation split.

    Args:
      names: e.g. ("f1", "accuracy").
      labels: [N] gold classes (int) or scores (float).
      predictions: [N] predicted classes or scores.

    Returns:
      {name: value}.
    """
    unknown = [name for name in names if name not in METRIC_FNS]
    if unknown:
        raise KeyError(f"unknown metric(s) {unknown}; known: {sorted(METRIC_FNS)}")
    return {name: METRIC_FNS[name](labels, predictions) for name in names}


# ---- SQuAD ----

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalization: lower, drop punctuation, drop articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


SQUAD_VERSIONS = ("1.1", "2.0")


def squad_exact(prediction: str, gold_answers: Sequence[str], *, version: str = "2.0") -> float:
    """1.0 if the normalized prediction equals a normalized gold answer, else 0.0.

    Args:
      prediction: the predicted text ("" predicts "no answer").
      gold_answers: the gold texts. In "2.0", those that normalize to "" are dropped and a
        question left with none is unanswerable: its only correct answer is "". In "1.1" every
        gold answer counts as it is (so "" matches a gold "The"), and there must be one.
      version: the official script to follow, "1.1" or "2.0".
    """
    predicted = normalize_answer(prediction)
    return float(any(predicted == gold for gold in _gold_normalized(gold_answers, version)))


def squad_f1(prediction: str, gold_answers: Sequence[str], *, version: str = "2.0") -> float:
    """The best bag-of-words F1 of the normalized prediction against any gold answer.

    When the prediction or a gold answer has no tokens, F1 is 0.0, except in "2.0" where it is
    1.0 if both have none.

    Args:
      prediction: the predicted text.
      gold_answers: the gold texts (see `squad_exact`).
      version: the official script to follow, "1.1" or "2.0".
    """
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for gold in _gold_normalized(gold_answers, version):
        gold_tokens = gold.split()
        if version == "2.0" and (not gold_tokens or not predicted):
            best = max(best, float(gold_tokens == predicted))
            continue
        overlap = sum((collections.Counter(gold_tokens) & collections.Counter(predicted)).values())
        if overlap:
            precision, recall = overlap / len(predicted), overlap / len(gold_tokens)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _gold_normalized(gold_answers: Sequence[str], version: str) -> list[str]:
    """Normalized gold answers; in "2.0" the non-empty ones, or [""] when there are none."""
    if version not in SQUAD_VERSIONS:
        raise ValueError(f"version must be one of {SQUAD_VERSIONS}, not {version!r}")
    if isinstance(gold_answers, str):
        raise TypeError("gold_answers must be a sequence of strings, not one string")
    normalized = [normalize_answer(a) for a in gold_answers]
    if version == "1.1":
        if not normalized:
            raise ValueError(
                "SQuAD v1.1 has no unanswerable questions, but a question has no gold answer; "
                "score SQuAD v2.0 data with version='2.0'"
            )
        return normalized
    return [a for a in normalized if a] or [""]


def squad_evaluate(
    gold_answers: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    *,
    version: str = "2.0",
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """SQuAD exact match and F1 over a dataset, as percentages, as the official script scores them.

    "1.1" follows `evaluate-v1.1.py`: every question needs a gold answer, a question without a
    prediction scores 0 and stays in the total (counted in `missing`). "2.0" follows
    `evaluate-v2.0.py` (its results also on v1.1 data): gold answers that normalize to "" are
    dropped, questions with and without answers are also scored apart, and a question without a
    prediction is an error (the official script fails on it with a `KeyError`).

    Args:
      gold_answers: question id -> gold answer texts ([] for an unanswerable question, "2.0").
      predictions: question id -> predicted text ("" = no answer), e.g. predictions.json.
      version: "1.1" or "2.0".
      na_probs: "2.0" only: question id -> no-answer score (e.g. null_odds.json), one for every
        predicted question. A prediction is replaced by "" where the score exceeds
        `na_prob_thresh`, and the best threshold is searched (`best_exact`, `best_exact_thresh`,
        `best_f1`, `best_f1_thresh`).
      na_prob_thresh: see `na_probs`.

    Returns:
      "1.1": {"exact", "f1", "total", "missing"} ("exact" is the script's "exact_match").
      "2.0": {"exact", "f1", "total"}, then "HasAns_exact", "HasAns_f1", "HasAns_total" if any
      question has an answer and "NoAns_exact", "NoAns_f1", "NoAns_total" if any has none (as
      the script prints them); with `na_probs` also the best-threshold entries.

    Raises:
      KeyError: a prediction for an unknown question id; in "2.0", a question without a
        prediction, or a predicted question without a no-answer score in `na_probs`.
      ValueError: no gold answers; an unknown version; in "1.1", a question without a gold
        answer, or `na_probs`.
    """
    _check_squad_inputs(gold_answers, predictions, version)
    missing = [qid for qid in gold_answers if qid not in predictions]
    if version == "1.1":
        if na_probs is not None:
            raise ValueError("na_probs (no-answer scores) are for version='2.0'; v1.1 has none")
        return _squad_evaluate_v1(gold_answers, predictions, missing)
    _check_v2_inputs(gold_answers, predictions, missing, na_probs)
    return _squad_evaluate_v2(gold_answers, predictions, na_probs, na_prob_thresh)


def _check_squad_inputs(
    gold_answers: Mapping[str, Sequence[str]], predictions: Mapping[str, str], version: str
) -> None:
    """Raises on an unknown version, no gold answers, or predictions for unknown questions."""
    if version not in SQUAD_VERSIONS:
        raise ValueError(f"version must be one of {SQUAD_VERSIONS}, not {version!r}")
    if not gold_answers:
        raise ValueError("no gold answers to evaluate against")
    unknown = sorted(set(predictions) - set(gold_answers))
    if unknown:
        raise KeyError(f"{len(unknown)} predictions for unknown question ids, e.g. {unknown[:3]}")


def _check_v2_inputs(
    gold_answers: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    missing: list[str],
    na_probs: Mapping[str, float] | None,
) -> None:
    """Raises KeyError on questions without a prediction, predictions without a no-answer score."""
    if missing:
        raise KeyError(
            f"{len(missing)} of {len(gold_answers)} questions have no prediction, e.g. "
            f"{missing[:3]}; the official v2.0 script fails on them too. Predict every question, "
            "or score with version='1.1', which counts them as 0"
        )
    if na_probs is not None:
        unscored = [qid for qid in predictions if qid not in na_probs]
        if unscored:
            raise KeyError(
                f"na_probs lacks {len(unscored)} predicted question(s), e.g. {unscored[:3]}"
            )


def _squad_evaluate_v1(
    gold_answers: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    missing: Sequence[str],
) -> dict[str, float]:
    """`evaluate-v1.1.py`'s {"exact", "f1"} (percent), "total" and "missing" (questions)."""
    exact = {
        q: squad_exact(predictions.get(q, ""), g, version="1.1") for q, g in gold_answers.items()
    }
    f1 = {q: squad_f1(predictions.get(q, ""), g, version="1.1") for q, g in gold_answers.items()}
    for qid in missing:  # The v1.1 script: "Unanswered question ... will receive score 0."
        exact[qid] = f1[qid] = 0.0
    return {
        "exact": 100.0 * sum(exact.values()) / len(exact),
        "f1": 100.0 * sum(f1.values()) / len(f1),
        "total": len(exact),
        "missing": len(missing),
    }


def _squad_evaluate_v2(
    gold_answers: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None,
    na_prob_thresh: float,
) -> dict[str, float]:
    """`evaluate-v2.0.py`'s scores (percent) over all, HasAns_ and NoAns_ questions, and with
    `na_probs` the best thresholds; every question predicted, every prediction scored."""
    # As the official script, a question "has an answer" if its list is not empty, even when the
    # answers normalize to "" (whose only correct prediction is then "").
    has_answer = {qid: len(gold) > 0 for qid, gold in gold_answers.items()}
    raw_exact = {q: squad_exact(predictions[q], g) for q, g in gold_answers.items()}
    raw_f1 = {q: squad_f1(predictions[q], g) for q, g in gold_answers.items()}
    exact, f1 = dict(raw_exact), dict(raw_f1)
    if na_probs is not None:
        for qid in gold_answers:
            if na_probs[qid] > na_prob_thresh:
                exact[qid] = f1[qid] = float(not has_answer[qid])
    groups = {
        "": list(gold_answers),
        "HasAns_": [qid for qid in gold_answers if has_answer[qid]],
        "NoAns_": [qid for qid in gold_answers if not has_answer[qid]],
    }
    result: dict[str, float] = {}
    for prefix, qids in groups.items():
        if qids:
            result[prefix + "exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
            result[prefix + "f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
            result[prefix + "total"] = len(qids)
    if na_probs is not None:
        for name, raw in (("exact", raw_exact), ("f1", raw_f1)):
            score, threshold = _best_threshold(raw, predictions, na_probs, has_answer)
            result[f"best_{name}"], result[f"best_{name}_thresh"] = score, threshold
    return result


def _best_threshold(
    raw_scores: Mapping[str, float],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """The best score over no-answer thresholds, and that threshold (the v2.0 script's search).

    Starting from "answer nothing" (every unanswerable question right), questions are admitted in
    order of increasing no-answer score; each changes the total by its answered score.
    """
    score = best = float(sum(not v for v in has_answer.values()))
    threshold = 0.0
    for qid in sorted((q for q in na_probs if q in raw_scores), key=lambda q: na_probs[q]):
        if has_answer[qid]:
            score += raw_scores[qid]
        elif predictions.get(qid):
            score -= 1.0
        if score > best:
            best, threshold = score, float(na_probs[qid])
    return 100.0 * best / len(raw_scores), threshold


# ---- Named entities ----

_BEGINS_AFTER_END = {"E", "S", "O"}  # An I or E tag after one of these starts a new entity.
_ENDS_BEFORE_NEW = {"B", "S", "O"}  # A B or I tag followed by one of these ends its entity.


def _split_tag(tag: str) -> tuple[str, str]:
    """("B", "PER") from "B-PER"; the type is "_" when absent (as seqeval)."""
    return tag[:1], tag[1:].split("-", maxsplit=1)[-1] or "_"


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one tag sequence (IOB1, IOB2, IOE or IOBES) as (type, first index, last
    index), conlleval's rules.

    An entity starts at a B or S tag, at an I or E tag that follows O, E or S, or where the type
    changes; it ends before such a start, after an E or S tag, and before an O. So IOB1 ("I-PER
    I-PER B-PER") and IOB2 ("B-PER I-PER B-PER") read alike, and an I tag that starts a sequence
    starts an entity.

    Args:
      tags: e.g. ["B-PER", "I-PER", "O", "B-LOC"].

    Returns:
      e.g. [("PER", 0, 1), ("LOC", 3, 3)].
    """
    entities = []
    prev_prefix, prev_type, start = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, type_ = _split_tag(tag)
        type_changed = prev_type != type_
        ends = prev_prefix in ("E", "S") or (
            prev_prefix in ("B", "I") and prefix in _ENDS_BEFORE_NEW
        )
        if prev_prefix not in ("O", ".") and type_changed:
            ends = True
        if ends:
            entities.append((prev_type, start, i - 1))
        begins = prefix in ("B", "S") or (prefix in ("I", "E") and prev_prefix in _BEGINS_AFTER_END)
        if prefix not in ("O", ".") and type_changed:
            begins = True
        if begins:
            start = i
        prev_prefix, prev_type = prefix, type_
    return entities


def entity_scores(
    true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]
) -> dict:
    """Entity-level micro precision, recall and F1 over sentences, as seqeval's default mode.

    An entity counts as correct only if the prediction has one of the same type, start and end.
    Zero divisions give 0.

    Args:
      true_tags: one list of tags per sentence.
      predicted_tags: the predicted tags, the same lengths.

    Returns:
      {"precision", "recall", "f1", "num_true", "num_predicted", "num_correct",
       "per_type": {type: {"precision", "recall", "f1", "support"}}}.
    """
    if len(true_tags) != len(predicted_tags):
        raise ValueError(f"{len(true_tags)} true sentences but {len(predicted_tags)} predicted")
    true_set, predicted_set = set(), set()
    for i, (true, predicted) in enumerate(zip(true_tags, predicted_tags)):
        if len(true) != len(predicted):
            raise ValueError(f"sentence {i}: {len(true)} true tags but {len(predicted)} predicted")
        true_set.update((i, *e) for e in get_entities(list(true)))
        predicted_set.update((i, *e) for e in get_entities(list(predicted)))

    def prf(true: set, predicted: set) -> dict:
        correct = len(true & predicted)
        precision = correct / len(predicted) if predicted else 0.0
        recall = correct / len(true) if true else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1, "support": len(true)}

    per_type = {}
    for type_ in sorted({e[1] for e in true_set | predicted_set}):
        per_type[type_] = prf(
            {e for e in true_set if e[1] == type_}, {e for e in predicted_set if e[1] == type_}
        )
    overall = prf(true_set, predicted_set)
    return {
        "precision": overall["precision"],
        "recall": overall["recall"],
        "f1": overall["f1"],
        "num_true": len(true_set),
        "num_predicted": len(predicted_set),
        "num_correct": len(true_set & predicted_set),
        "per_type": per_type,
    }


def entity_f1(true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]) -> float:
    """Entity-level micro F1 (seqeval's `f1_score` in its default mode); see `entity_scores`."""
    return entity_scores(true_tags, predicted_tags)["f1"]
