"""Metrics equal scikit-learn, scipy and seqeval on random inputs; SQuAD scoring on hand cases."""

import ast
import math
import pathlib
import sys

import numpy as np
import pytest

from bert_jax.finetune import metrics

sklearn_metrics = pytest.importorskip("sklearn.metrics")
scipy_stats = pytest.importorskip("scipy.stats")


def test_module_imports_only_numpy_and_stdlib():
    source = pathlib.Path(metrics.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) == {"numpy"}


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_equal_sklearn(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(5, 200)), int(rng.integers(2, 5))
    labels, predictions = rng.integers(0, k, n), rng.integers(0, k, n)
    predictions[: n // 3] = labels[: n // 3]  # Some signal.
    assert metrics.accuracy(labels, predictions) == pytest.approx(
        sklearn_metrics.accuracy_score(labels, predictions)
    )
    assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(labels, predictions)
    )
    assert metrics.f1_score(labels, predictions, average="macro") == pytest.approx(
        sklearn_metrics.f1_score(labels, predictions, average="macro", zero_division=0)
    )
    binary_labels, binary_predictions = labels % 2, predictions % 2
    assert metrics.f1_score(binary_labels, binary_predictions) == pytest.approx(
        sklearn_metrics.f1_score(binary_labels, binary_predictions, zero_division=0)
    )
    assert metrics.matthews_corrcoef(binary_labels, binary_predictions) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(binary_labels, binary_predictions)
    )
    assert metrics.f1_score(binary_labels, binary_predictions, positive_label=0) == pytest.approx(
        sklearn_metrics.f1_score(binary_labels, binary_predictions, pos_label=0, zero_division=0)
    )


def test_classification_edge_cases():
    assert metrics.matthews_corrcoef([1, 1, 1], [1, 1, 1]) == 0.0  # sklearn gives 0 too.
    assert metrics.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert metrics.f1_score([0, 0], [0, 0]) == 0.0  # No positives anywhere.
    assert metrics.compute(["accuracy", "f1"], [1, 0, 1, 1], [1, 1, 1, 0]) == {
        "accuracy": 0.5,
        "f1": pytest.approx(2 / 3),
    }
    with pytest.raises(KeyError, match="unknown metric"):
        metrics.compute(["bleu"], [1], [1])
    with pytest.raises(ValueError, match="one length"):
        metrics.accuracy([1, 2], [1])
    with pytest.raises(ValueError, match="no examples"):
        metrics.accuracy([], [])
    # Train majority is class 2; it is right on 1 of 4 eval labels.
    assert metrics.majority_class_accuracy([2, 2, 1, 0, 2], [2, 1, 1, 0]) == 0.25


@pytest.mark.parametrize("seed", range(5))
def test_correlations_equal_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 300))
    labels = rng.normal(size=n)
    predictions = 0.5 * labels + rng.normal(size=n)
    if seed % 2:  # STS-B-like scores with many ties.
        labels = np.round(rng.uniform(0, 5, n) * 2) / 2
        predictions = np.round(predictions)
    assert metrics.pearson(labels, predictions) == pytest.approx(
        scipy_stats.pearsonr(labels, predictions)[0], abs=1e-12
    )
    assert metrics.spearman(labels, predictions) == pytest.approx(
        scipy_stats.spearmanr(labels, predictions)[0], abs=1e-12
    )
    np.testing.assert_allclose(metrics.rank_average(labels), scipy_stats.rankdata(labels))


@pytest.mark.filterwarnings("ignore:An input array is constant")  # scipy says so, then nan.
def test_correlation_of_a_constant_is_nan():
    assert math.isnan(metrics.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(metrics.spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]))
    # A mean that is not exactly the constant (0.1 * 3 / 3 != 0.1) must not make it a slope.
    assert math.isnan(metrics.pearson([0.1, 0.1, 0.1], [1.0, 2.0, 3.0]))
    assert math.isnan(scipy_stats.pearsonr([0.1, 0.1, 0.1], [1.0, 2.0, 3.0])[0])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # scipy's "invalid value" on NaN input.
@pytest.mark.parametrize("where", ["labels", "predictions", "both"])
def test_correlations_of_nan_input_are_nan_as_scipy(where):
    rng = np.random.default_rng(0)
    labels, predictions = rng.normal(size=20), rng.normal(size=20)
    if where in ("labels", "both"):
        labels[3] = np.nan
    if where in ("predictions", "both"):
        predictions[7] = np.nan
    assert math.isnan(scipy_stats.spearmanr(labels, predictions)[0])
    assert math.isnan(metrics.spearman(labels, predictions))
    assert math.isnan(scipy_stats.pearsonr(labels, predictions)[0])
    assert math.isnan(metrics.pearson(labels, predictions))
    # A diverged run predicts NaN everywhere: no plausible score from NaNs ranked in turn.
    assert math.isnan(scipy_stats.spearmanr([1, 2, 3, 4], [np.nan] * 4)[0])
    assert math.isnan(metrics.spearman([1, 2, 3, 4], [np.nan] * 4))


@pytest.mark.parametrize("scale", [1e77, 1e-78, 1e150, 1e-150])
def test_pearson_is_stable_at_extreme_scales(scale):
    # Squared deviations of 1e77 overflow a product of sums of squares (inf, so r = 0) and those
    # of 1e-78 underflow it (0, so r = nan); scaling by the largest deviation avoids both.
    rng = np.random.default_rng(1)
    labels = rng.normal(size=40)
    predictions = 0.5 * labels + rng.normal(size=40)
    expected = scipy_stats.pearsonr(labels * scale, predictions * scale)[0]
    assert metrics.pearson(labels * scale, predictions * scale) == pytest.approx(
        expected, rel=1e-12
    )
    assert expected == pytest.approx(metrics.pearson(labels, predictions), rel=1e-12)
    # Mixed scales: each side is scaled by its own largest deviation.
    expected = scipy_stats.pearsonr(labels * scale, predictions)[0]
    assert metrics.pearson(labels * scale, predictions) == pytest.approx(expected, rel=1e-12)


@pytest.mark.filterwarnings("ignore:F-score is ill-defined")  # sklearn on [0, 0] vs [0, 0].
def test_binary_f1_refuses_what_sklearn_refuses():
    three_classes = ([0, 1, 2, 1], [0, 1, 1, 2])
    with pytest.raises(ValueError, match="multiclass"):
        sklearn_metrics.f1_score(*three_classes)
    with pytest.raises(ValueError, match="binary F1 needs at most 2 classes.*3.*macro"):
        metrics.f1_score(*three_classes)
    with pytest.raises(ValueError, match="binary F1 needs at most 2 classes"):
        metrics.compute(["f1"], *three_classes)
    assert metrics.compute(["macro_f1"], *three_classes)["macro_f1"] == pytest.approx(
        sklearn_metrics.f1_score(*three_classes, average="macro")
    )
    # Two classes that do not hold the positive one.
    with pytest.raises(ValueError, match="pos_label=1 is not a valid label"):
        sklearn_metrics.f1_score([0, 2, 2], [2, 0, 2])
    with pytest.raises(ValueError, match="positive_label=1 is not one of the classes"):
        metrics.f1_score([0, 2, 2], [2, 0, 2])
    # One class only is binary for both (F1 0 when it is not the positive class).
    assert metrics.f1_score([0, 0], [0, 0]) == sklearn_metrics.f1_score([0, 0], [0, 0]) == 0.0
    assert metrics.f1_score([1, 1], [1, 1]) == sklearn_metrics.f1_score([1, 1], [1, 1]) == 1.0


def _random_tags(rng, n, types, prefixes):
    tags = []
    for _ in range(n):
        if rng.random() < 0.35:
            tags.append("O")
        else:
            tags.append(f"{rng.choice(prefixes)}-{rng.choice(types)}")
    return tags


@pytest.mark.filterwarnings("ignore:.*ill-defined")  # seqeval's per-type zero divisions.
@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "IOBES"])
def test_entity_scores_equal_seqeval(scheme):
    seqeval = pytest.importorskip("seqeval.metrics")
    rng = np.random.default_rng({"IOB1": 0, "IOB2": 1, "IOBES": 2}[scheme])
    prefixes = {"IOB1": ["I", "I", "B"], "IOB2": ["B", "I"], "IOBES": ["B", "I", "E", "S"]}[scheme]
    types = ["PER", "LOC", "ORG", "MISC"]
    for _ in range(30):
        lengths = rng.integers(1, 12, size=int(rng.integers(1, 8)))
        true = [_random_tags(rng, int(n), types, prefixes) for n in lengths]
        predicted = [
            [
                t if rng.random() < 0.7 else p
                for t, p in zip(s, _random_tags(rng, len(s), types, prefixes))
            ]
            for s in true
        ]
        scores = metrics.entity_scores(true, predicted)
        assert scores["f1"] == pytest.approx(seqeval.f1_score(true, predicted))
        assert scores["precision"] == pytest.approx(seqeval.precision_score(true, predicted))
        assert scores["recall"] == pytest.approx(seqeval.recall_score(true, predicted))
        report = seqeval.classification_report(true, predicted, output_dict=True)
        for type_, values in scores["per_type"].items():
            if type_ in report:
                assert values["f1"] == pytest.approx(report[type_]["f1-score"])
                assert values["support"] == report[type_]["support"]
    from seqeval.metrics.sequence_labeling import get_entities

    for _ in range(200):
        tags = _random_tags(rng, int(rng.integers(1, 15)), types, prefixes + ["E"])
        assert metrics.get_entities(tags) == get_entities(tags)


def test_entities_by_hand():
    # IOB1: an I tag starts an entity; B only separates two adjacent entities of one type.
    assert metrics.get_entities(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == [
        ("PER", 0, 1),
        ("PER", 2, 2),
        ("LOC", 4, 4),
    ]
    # IOB2, with a type change inside a run.
    assert metrics.get_entities(["B-ORG", "I-ORG", "I-LOC", "O"]) == [("ORG", 0, 1), ("LOC", 2, 2)]
    true = [["B-PER", "I-PER", "O"], ["B-LOC"]]
    predicted = [["B-PER", "O", "O"], ["B-LOC"]]  # The PER span is cut short: wrong.
    scores = metrics.entity_scores(true, predicted)
    assert (scores["num_true"], scores["num_predicted"], scores["num_correct"]) == (2, 2, 1)
    assert metrics.entity_f1(true, predicted) == 0.5
    with pytest.raises(ValueError, match="sentence 1"):
        metrics.entity_scores(true, [["O", "O", "O"], []])


# ---------------------------------------------------------------------------------------------
# SQuAD, checked by hand.


def test_normalize_answer():
    assert metrics.normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert metrics.normalize_answer("an apple, a pear & the plum.") == "apple pear plum"
    # Articles go only as whole words; punctuation goes before articles are looked for.
    assert metrics.normalize_answer("Theater of the Absurd") == "theater of absurd"
    assert metrics.normalize_answer("the-end") == "theend"
    assert metrics.normalize_answer("A") == ""
    assert metrics.normalize_answer("  Ünïcode “quotes” ") == "ünïcode “quotes”"


def test_squad_exact_and_f1_by_hand():
    gold = ["Denver Broncos", "The Denver Broncos", "Broncos"]
    assert metrics.squad_exact("the denver broncos.", gold) == 1.0
    assert metrics.squad_exact("Denver", gold) == 0.0
    # "Denver" vs "Denver Broncos": P = 1, R = 1/2, F1 = 2/3 (the best over the gold answers).
    assert metrics.squad_f1("Denver", gold) == pytest.approx(2 / 3)
    # "Broncos won" vs "Broncos": P = 1/2, R = 1 -> 2/3; vs "Denver Broncos": 1/2 each -> 1/2.
    assert metrics.squad_f1("Broncos won", gold) == pytest.approx(2 / 3)
    # Repeated tokens count once per occurrence in both.
    assert metrics.squad_f1("broncos broncos", ["broncos"]) == pytest.approx(2 / 3)
    assert metrics.squad_f1("Carolina Panthers", gold) == 0.0
    # Unanswerable: only "" is right.
    assert metrics.squad_exact("", []) == 1.0 and metrics.squad_f1("", []) == 1.0
    assert metrics.squad_exact("Denver", []) == 0.0 and metrics.squad_f1("Denver", []) == 0.0
    assert metrics.squad_f1("", gold) == 0.0
    # A gold answer that normalizes to nothing counts as "no answer" (the v2.0 script).
    assert metrics.squad_exact("", ["The"]) == 1.0
    with pytest.raises(TypeError):
        metrics.squad_exact("x", "x")


def test_squad_evaluate_by_hand():
    gold = {
        "q1": ["Denver Broncos", "Broncos"],
        "q2": ["Saint Bernadette Soubirous"],
        "q3": [],  # Unanswerable.
        "q4": [],  # Unanswerable.
    }
    predictions = {"q1": "the Broncos", "q2": "Bernadette", "q3": "", "q4": "Paris"}
    # q1: exact 1, f1 1; q2: exact 0, f1 = 2 * (1 * 1/3) / (4/3) = 1/2; q3: 1, 1; q4: 0, 0.
    result = metrics.squad_evaluate(gold, predictions)
    assert result["exact"] == pytest.approx(50.0)
    assert result["f1"] == pytest.approx(62.5)
    assert result["total"] == 4
    # The keys evaluate-v2.0.py prints, in its order (a missing prediction is an error there).
    assert list(result) == [
        "exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
        "NoAns_exact", "NoAns_f1", "NoAns_total",
    ]  # fmt: skip
    assert result["HasAns_exact"] == pytest.approx(50.0)
    assert result["HasAns_f1"] == pytest.approx(75.0)
    assert result["NoAns_exact"] == result["NoAns_f1"] == pytest.approx(50.0)
    assert result["HasAns_total"] == result["NoAns_total"] == 2

    # No-answer scores: predicting "" above the threshold fixes q4 and breaks q2.
    na_probs = {"q1": 0.1, "q2": 0.9, "q3": 0.8, "q4": 0.95}
    result = metrics.squad_evaluate(gold, predictions, na_probs=na_probs, na_prob_thresh=0.5)
    assert result["exact"] == pytest.approx(75.0)  # q1 1, q2 0, q3 1, q4 1.
    assert result["f1"] == pytest.approx(75.0)
    # Best threshold: start from "all no-answer" (2 right), admit in order of the score:
    # q1 +1 (3), q3 0 (3), q2 +0 exact / +0.5 f1, q4 -1. Best exact 3/4 at 0.1; f1 3.5/4 at 0.9.
    assert result["best_exact"] == pytest.approx(75.0)
    assert result["best_exact_thresh"] == pytest.approx(0.1)
    assert result["best_f1"] == pytest.approx(87.5)
    assert result["best_f1_thresh"] == pytest.approx(0.9)

    with pytest.raises(KeyError, match="unknown question ids"):
        metrics.squad_evaluate(gold, {"q9": "x"})
    # v1.1 data: every question has an answer. evaluate-v1.1.py prints only exact and F1;
    # evaluate-v2.0.py prints the HasAns_ group too (it prints each group that has questions).
    v1_gold, v1_predictions = {"a": ["x y"], "b": ["z"]}, {"a": "x", "b": "z"}
    v1 = metrics.squad_evaluate(v1_gold, v1_predictions, version="1.1")
    assert v1 == {
        "exact": 50.0,
        "f1": pytest.approx(100 * (2 / 3 + 1) / 2),
        "total": 2,
        "missing": 0,
    }
    v2 = metrics.squad_evaluate(v1_gold, v1_predictions)
    assert list(v2) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"]
    assert (v2["HasAns_exact"], v2["HasAns_f1"], v2["HasAns_total"]) == (50.0, v1["f1"], 2)
    assert (v2["exact"], v2["f1"], v2["total"]) == (50.0, v1["f1"], 2)
    no_answers = metrics.squad_evaluate({"a": [], "b": []}, {"a": "", "b": "x"})
    assert list(no_answers) == ["exact", "f1", "total", "NoAns_exact", "NoAns_f1", "NoAns_total"]
    assert no_answers["NoAns_exact"] == no_answers["exact"] == 50.0


def test_squad_v1_1_scores_as_evaluate_v1_1():
    # evaluate-v1.1.py keeps every gold answer as it is: a gold "The" normalizes to "", which an
    # empty prediction matches exactly (EM 1), but its F1 is 0 because no token is shared.
    # evaluate-v2.0.py drops such gold answers, so "" is the "no answer" it expects (1 / 1).
    assert metrics.squad_exact("", ["The"], version="1.1") == 1.0
    assert metrics.squad_f1("", ["The"], version="1.1") == 0.0
    assert metrics.squad_exact("", ["The"]) == metrics.squad_f1("", ["The"]) == 1.0
    # With a real answer beside it: v1.1 still matches "" against "The"; v2.0 scores "Denver".
    assert metrics.squad_exact("", ["The", "Denver"], version="1.1") == 1.0
    assert metrics.squad_exact("", ["The", "Denver"]) == 0.0
    assert metrics.squad_f1("the Denver", ["The", "Denver"], version="1.1") == 1.0
    gold = {"q1": ["The"], "q2": ["Denver Broncos"], "q3": ["Carolina"]}
    predictions = {"q1": "", "q2": "Broncos"}  # q3 unanswered.
    result = metrics.squad_evaluate(gold, predictions, version="1.1")
    # q1: EM 1, F1 0; q2: EM 0, F1 2/3; q3 scores 0 and stays in the total (the v1.1 script:
    # "Unanswered question q3 will receive score 0.").
    assert result == {
        "exact": pytest.approx(100 / 3),
        "f1": pytest.approx(100 * (2 / 3) / 3),
        "total": 3,
        "missing": 1,
    }
    # v1.1 has no unanswerable questions and no no-answer scores.
    with pytest.raises(ValueError, match="no unanswerable questions"):
        metrics.squad_evaluate({"q1": []}, {"q1": ""}, version="1.1")
    with pytest.raises(ValueError, match="version='2.0'"):
        metrics.squad_evaluate(gold, predictions, version="1.1", na_probs={"q1": 0.0})
    with pytest.raises(ValueError, match="version must be one of"):
        metrics.squad_evaluate(gold, predictions, version="1")


def test_squad_v2_0_refuses_missing_predictions_as_evaluate_v2_0():
    # evaluate-v2.0.py leaves an unpredicted question out of its raw scores, then fails with a
    # KeyError when it scores the HasAns_ (or NoAns_) group that holds it.
    gold = {"q1": ["Denver Broncos"], "q2": [], "q3": ["Carolina"]}
    with pytest.raises(KeyError, match="1 of 3 questions have no prediction.*q3.*version='1.1'"):
        metrics.squad_evaluate(gold, {"q1": "Denver", "q2": ""})
    with pytest.raises(KeyError, match="na_probs lacks 1 predicted question.*q2"):
        metrics.squad_evaluate(
            gold, {"q1": "Denver", "q2": "", "q3": ""}, na_probs={"q1": 0.5, "q3": 0.1}
        )
