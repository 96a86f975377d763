"""SQuAD: reading with offset checks, windows and positions, postprocessing back to exact text."""

import json

import numpy as np
import pytest

from bert_jax.data import batching
from bert_jax.finetune import metrics, squad
from tests.finetune.conftest import TESTDATA

SQUAD_FILE = TESTDATA / "squad_v2_tiny.json"


def _examples():
    return {e.qas_id: e for e in squad.read_squad(SQUAD_FILE)}


def test_read_squad():
    stats = squad.SquadStats()
    examples = squad.read_squad(SQUAD_FILE, stats=stats)
    assert [e.qas_id for e in examples] == ["b1", "b2", "b3", "l1", "l2", "l3"]
    assert (stats.questions, stats.unanswerable) == (6, 2)
    b1 = examples[0]
    assert b1.title == "Bridge" and b1.question == "Who designed the Río Grande Bridge?"
    assert [t for t, _ in b1.answers] == [
        "Dr. Ana O'Neil-Smith",
        "Ana O'Neil-Smith",
        "Dr. Ana O'Neil-Smith",
    ]
    assert b1.context[b1.answers[1][1] :].startswith("Ana O'Neil-Smith")
    b3 = examples[2]
    assert b3.is_impossible and b3.answers == ()  # plausible_answers are not answers.
    assert squad.gold_answers(examples)["b3"] == []
    assert squad.gold_answers(examples)["l1"] == ["the Night of Bells", "Night of Bells"]


def _write(tmp_path, qas, context="Alpha beta gamma."):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": qas}]}]}))
    return path


def test_bad_squad_input(tmp_path):
    good = {"id": "ok", "question": "Q?", "answers": [{"text": "beta", "answer_start": 6}]}
    bad = {"id": "off", "question": "Q?", "answers": [{"text": "beta", "answer_start": 5}]}
    path = _write(tmp_path, [good, bad])
    with pytest.raises(
        ValueError,
        match=r"bad.json: data\[0\].paragraphs\[0\].qas\[1\] \(id off\).answers\[0\]: "
        r"answer_start=5 gives ' bet', not the answer text 'beta'",
    ):
        squad.read_squad(path)
    stats = squad.SquadStats()
    examples = squad.read_squad(path, on_bad_answer="skip", stats=stats)
    assert [e.qas_id for e in examples] == ["ok"]
    assert len(stats.bad_answers) == 1 and stats.dropped_questions == ["off"]
    assert stats.to_dict()["dropped_questions"] == 1

    with pytest.raises(ValueError, match=r"qas\[1\] \(id ok\): duplicate question id 'ok'"):
        squad.read_squad(_write(tmp_path, [good, good]))
    with pytest.raises(ValueError, match=r"qas\[0\] \(id x\): missing field 'question'"):
        squad.read_squad(_write(tmp_path, [{"id": "x", "answers": []}]))
    with pytest.raises(ValueError, match=r"answers\[0\].answer_start: expected int, got str"):
        squad.read_squad(
            _write(
                tmp_path,
                [{"id": "x", "question": "Q", "answers": [{"text": "a", "answer_start": "0"}]}],
            )
        )
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(ValueError, match="empty.json is empty"):
        squad.read_squad(tmp_path / "empty.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="list.json: missing field 'data'"):
        squad.read_squad(tmp_path / "list.json")
    # A test file without answers reads as unlabelled.
    examples = squad.read_squad(_write(tmp_path, [{"id": "t", "question": "Q?"}]))
    assert examples[0].answers == () and not examples[0].is_impossible


def _check_is_max_context(spans, span_index, position):
    """run_squad.py's rule, written out: best min(left, right) context + 0.01 * length."""
    best_score, best_index = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if start <= position <= end:
            score = min(position - start, end - position) + 0.01 * length
            if best_score is None or score > best_score:
                best_score, best_index = score, i
    return best_index == span_index


def test_windows_positions_and_max_context(tokenizer):
    examples = _examples()
    lake = [examples["l1"], examples["l2"], examples["l3"]]
    stats = squad.SquadStats()
    features, windows, _ = squad.featurize(
        lake, tokenizer, max_seq_length=40, doc_stride=10, max_query_length=64, stats=stats
    )
    assert {k: (v.shape[0], v.dtype) for k, v in features.items()} == {
        "input_ids": (len(windows), np.int32),
        "token_type_ids": (len(windows), np.int32),
        "attention_mask": (len(windows), np.int32),
        "start_positions": (len(windows), np.int32),
        "end_positions": (len(windows), np.int32),
        "example_weights": (len(windows), np.float32),
    }
    assert features["input_ids"].shape[1] == 40
    num_context_tokens = len(tokenizer.encode(lake[0].context))
    for example_index, example in enumerate(lake):
        own = [(f, w) for f, w in enumerate(windows) if w.example_index == example_index]
        assert [w.window_index for _, w in own] == list(range(len(own))) and len(own) > 3
        question = tokenizer.encode(example.question)
        spans = [(w.doc_start, w.doc_length) for _, w in own]
        # Windows start doc_stride apart and cover every context token.
        assert [s for s, _ in spans] == list(range(0, 10 * len(spans), 10))
        assert spans[-1][0] + spans[-1][1] == num_context_tokens
        assert all(n == 40 - len(question) - 3 for _, n in spans[:-1])
        answer = tokenizer.encode(example.answers[0][0]) if example.answers else None
        for f, window in own:
            row = features["input_ids"][f]
            length = features["attention_mask"][f].sum()
            assert list(row[: len(question) + 2]) == [tokenizer.cls_id, *question, tokenizer.sep_id]
            assert row[length - 1] == tokenizer.sep_id
            np.testing.assert_array_equal(
                features["token_type_ids"][f, :length],
                [0] * (len(question) + 2) + [1] * (length - len(question) - 2),
            )
            for k in range(window.doc_length):
                assert window.is_max_context[k] == _check_is_max_context(
                    spans, window.window_index, window.doc_start + k
                )
            start, end = features["start_positions"][f], features["end_positions"][f]
            if start == 0:
                assert end == 0
                continue
            text, _ = example.answers[0]
            assert list(row[start : end + 1]) == answer
            assert example.context[window.char_span(start)[0] : window.char_span(end)[1]] == text
        # Each context token is "max context" in exactly one window.
        flags = np.zeros(num_context_tokens, int)
        for _, w in own:
            flags[w.doc_start : w.doc_start + w.doc_length] += w.is_max_context
        assert np.all(flags == 1)
    # l3 is unanswerable: all its windows point at [CLS].
    l3 = [f for f, w in enumerate(windows) if w.qas_id == "l3"]
    assert features["start_positions"][l3].max() == 0
    assert stats.multi_window_examples == 3 and stats.windows == len(windows)
    assert stats.answers_in_no_window == 0
    offsets = windows[0].token_to_char()
    assert (offsets[: windows[0].context_start] == -1).all() and offsets[-1].tolist() == [-1, -1]


def test_answer_split_across_windows(tokenizer):
    context = " ".join(f"w{i}" for i in range(30)) + " the answer is Mount Kea Ridge today ."
    start_char = context.index("Mount Kea Ridge")
    example = squad.SquadExample("s", "Where?", context, (("Mount Kea Ridge", start_char),))
    tokens = tokenizer.tokenizer.encode(context, add_special_tokens=False)
    answer_first = next(i for i, (s, _) in enumerate(tokens.offsets) if s == start_char)
    answer_last = answer_first + len(tokenizer.encode("Mount Kea Ridge")) - 1
    question_length = len(tokenizer.encode("Where?"))
    # Windows of answer_first + 2 context tokens: the first one ends inside the answer.
    window_tokens = answer_first + 2
    max_seq_length = window_tokens + question_length + 3
    assert answer_first < window_tokens - 1 < answer_last
    stats = squad.SquadStats()
    features, windows, _ = squad.featurize(
        [example], tokenizer, max_seq_length=max_seq_length, doc_stride=8, stats=stats
    )
    assert len(windows) >= 2
    starts, ends = features["start_positions"], features["end_positions"]
    for f, window in enumerate(windows):
        inside = (
            window.doc_start <= answer_first and answer_last < window.doc_start + window.doc_length
        )
        if inside:
            assert starts[f] == answer_first - window.doc_start + window.context_start
            assert ends[f] == answer_last - window.doc_start + window.context_start
        else:
            assert starts[f] == ends[f] == 0
    assert (starts[0], ends[0]) == (0, 0)  # The window that cuts the answer.
    assert starts[1] > 0
    assert stats.answers_outside_window == sum(starts == 0)

    # Logits that point at the answer in every window that holds it: postprocessing picks the
    # window where the start token has the most context and recovers the exact text.
    start_logits = np.zeros(features["input_ids"].shape, np.float32)
    end_logits = np.zeros_like(start_logits)
    for f in range(len(windows)):
        if starts[f]:
            start_logits[f, starts[f]] = 5.0
            end_logits[f, ends[f]] = 5.0
        start_logits[f, 1] = end_logits[f, 1] = 9.0  # A question token: never a candidate.
    result = squad.postprocess([example], windows, start_logits, end_logits)
    assert result.predictions == {"s": "Mount Kea Ridge"}
    # A higher-scoring span is ignored where its start token is not "max context".
    # Window 1's first context token has more context in window 0.
    w = windows[1]
    assert not w.is_max_context[0]
    start_logits[1, w.context_start] = 7.0
    end_logits[1, w.context_start + 1] = 7.0
    result = squad.postprocess([example], windows, start_logits, end_logits)
    assert result.predictions == {"s": "Mount Kea Ridge"}
    assert result.nbest["s"][0]["start"] == start_char


# With 450 tokens, windows of 300 every 128: token 342 has one more token of context in the
# last (194-token) window, but the 0.01 * length term gives it to the middle one.
@pytest.mark.parametrize(
    "num_tokens,max_tokens,stride",
    [(0, 5, 3), (1, 5, 3), (7, 1, 1), (50, 5, 3), (50, 24, 16), (333, 150, 128), (450, 300, 128)],
)
def test_max_context_equals_run_squad_rule(num_tokens, max_tokens, stride):
    spans = squad.features._window_starts(num_tokens, max_tokens, stride)
    assert spans[-1][0] + spans[-1][1] == num_tokens
    flags = squad.features._max_context(spans)
    for i, (start, length) in enumerate(spans):
        expected = [_check_is_max_context(spans, i, start + k) for k in range(length)]
        assert flags[i].tolist() == expected, i


def _peaked_logits(features, windows, targets, width=None):
    """Logits with a peak at the (start, end) row positions given per window, 0 elsewhere."""
    shape = features["input_ids"].shape
    start_logits = np.zeros(shape, np.float32)
    end_logits = np.zeros(shape, np.float32)
    for f, (start, end, value) in targets.items():
        start_logits[f, start] = value
        end_logits[f, end] = value
    return start_logits, end_logits


def _target_window(features, windows, qas_id):
    """The window whose gold start is a max-context token."""
    for f, w in enumerate(windows):
        start = features["start_positions"][f]
        if w.qas_id == qas_id and start and w.is_max_context[start - w.context_start]:
            return f
    raise AssertionError(qas_id)


def test_postprocess_recovers_exact_text_and_scores(tokenizer, tmp_path):
    examples = list(_examples().values())
    features, windows, _ = squad.featurize(
        examples, tokenizer, max_seq_length=48, doc_stride=16, max_query_length=12
    )
    targets = {}
    for qas_id in ("b1", "b2", "l1", "l2"):
        f = _target_window(features, windows, qas_id)
        targets[f] = (features["start_positions"][f], features["end_positions"][f], 8.0)
    for f, w in enumerate(windows):
        if w.qas_id in ("b3", "l3"):
            targets[f] = (0, 0, 6.0)  # The null answer scores 12 in every window.
    start_logits, end_logits = _peaked_logits(features, windows, targets)
    # Through batches with fillers and dynamic padding, as training code would run it.
    outputs, indices = [], []
    for batch, idx in batching.batches(
        {**features, "s": start_logits, "e": end_logits},
        5,
        bucket_boundaries=(32, 48),
        return_indices=True,
    ):
        width = batch["input_ids"].shape[1]
        outputs.append(np.stack([batch["s"][:, :width], batch["e"][:, :width]], -1))
        indices.append(idx)
    logits = batching.unbatch(outputs, indices, len(windows))
    result = squad.postprocess(
        examples, windows, logits[..., 0], logits[..., 1], version_2_with_negative=True
    )
    assert result.predictions == {
        "b1": "Dr. Ana O'Neil-Smith",
        "b2": '"a ribbon of steel!"',
        "b3": "",
        "l1": "the Night of Bells",
        "l2": "blue",
        "l3": "",
    }
    # Null odds: the lowest null score (0) minus the best span (16) for answerable questions;
    # unanswerable ones have a null score of 12 and spans scoring at most 6 + 0.
    assert result.null_odds["b1"] == pytest.approx(-16.0)
    assert result.null_odds["b3"] > 0
    best = result.nbest["b1"][0]
    assert best["text"] == "Dr. Ana O'Neil-Smith" and best["probability"] > 0.9
    assert sum(e["probability"] for e in result.nbest["b1"]) == pytest.approx(1.0)
    assert [e["text"] for e in result.nbest["b3"]].count("") == 1
    scores = metrics.squad_evaluate(squad.gold_answers(examples), result.predictions)
    assert scores["exact"] == scores["f1"] == 100.0

    paths = squad.write_predictions(tmp_path, result)
    assert sorted(p.split("/")[-1] for p in paths.values()) == [
        "nbest_predictions.json",
        "null_odds.json",
        "predictions.json",
    ]
    assert json.loads(open(paths["predictions"], encoding="utf-8").read()) == result.predictions
    nbest = json.loads(open(paths["nbest"], encoding="utf-8").read())
    assert nbest["b2"][0]["text"] == '"a ribbon of steel!"'

    # A threshold above the answerable questions' odds turns their predictions into "".
    strict = squad.postprocess(
        examples,
        windows,
        logits[..., 0],
        logits[..., 1],
        version_2_with_negative=True,
        null_score_diff_threshold=-20.0,
    )
    assert set(strict.predictions.values()) == {""}
    # v1.1 mode never predicts "" when a span exists and writes no null odds.
    v1 = squad.postprocess(examples, windows, logits[..., 0], logits[..., 1])
    assert v1.null_odds is None and v1.predictions["b1"] == "Dr. Ana O'Neil-Smith"
    assert v1.predictions["b3"] != ""


def test_postprocess_span_rules(tokenizer):
    example = _examples()["l1"]
    features, windows, _ = squad.featurize([example], tokenizer, max_seq_length=384)
    assert len(windows) == 1
    w = windows[0]
    start_logits = np.zeros(features["input_ids"].shape, np.float32)
    end_logits = np.zeros_like(start_logits)
    gold_start, gold_end = features["start_positions"][0], features["end_positions"][0]
    start_logits[0, gold_start] = 4.0
    end_logits[0, gold_end] = 4.0
    # A higher-scoring span longer than max_answer_length, and one that ends before it starts.
    start_logits[0, w.context_start] = 6.0
    end_logits[0, w.context_start + 40] = 6.0
    end_logits[0, w.context_start + 1] = 0.5
    start_logits[0, w.context_start + 3] = 5.0
    result = squad.postprocess([example], windows, start_logits, end_logits, max_answer_length=30)
    assert result.predictions["l1"] == "the Night of Bells"
    texts = [e["text"] for e in result.nbest["l1"]]
    assert len(texts) == len(set(texts)) <= 20
    result = squad.postprocess([example], windows, start_logits, end_logits, max_answer_length=50)
    assert result.predictions["l1"].startswith("Lake Veronne")
    with pytest.raises(ValueError, match="drop the batch fillers"):
        squad.postprocess([example], windows, start_logits[:0], end_logits[:0])


def test_long_questions_are_truncated_and_counted(tokenizer):
    example = squad.SquadExample("q", "why " * 30, "A short context here.", ())
    stats = squad.SquadStats()
    features, windows, _ = squad.featurize(
        [example], tokenizer, max_seq_length=32, max_query_length=8, stats=stats
    )
    assert stats.truncated_questions == 1 and windows[0].context_start == 10
    assert features["attention_mask"][0].sum() == 10 + len(tokenizer.encode(example.context)) + 1
    with pytest.raises(ValueError, match="leaves no room for context"):
        squad.featurize([example], tokenizer, max_seq_length=12, max_query_length=9)
