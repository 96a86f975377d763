"""MetricWriter and its sinks: metrics.jsonl, TensorBoard, the console line and bar, curves.png
at each evaluation, log lines above the bar, the closing summary."""

import json
import re
from types import SimpleNamespace

import pytest
from absl import logging

from bert_jax.paths import as_path
from bert_jax.pretrain.run import VIEW
from bert_jax.training import summaries
from tests import paths_test

SHOWN = summaries.MetricView(
    console=("eval/", "loss"),
    summary=("loss",),
    progress=("train/loss", "eval/accuracy", "train/tokens_per_s"),
    baselines={"eval/floor": ("a floor", "--")},
)


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def test_jsonl_sink_appends_a_line_per_write(tmp_path):
    path = as_path(tmp_path / "metrics.jsonl")
    path.write_text('{"step": 1, "train/loss": 9.0}\n')
    sink = summaries.JsonlSink(path)
    sink.write(2, {"train/loss": 8.0, "train/grad_norm": "nan"})
    sink.write(3, {"eval/loss": 7.5})
    sink.close()
    assert _jsonl(path) == [
        {"step": 1, "train/loss": 9.0},
        {"step": 2, "train/loss": 8.0, "train/grad_norm": "nan"},
        {"step": 3, "eval/loss": 7.5},
    ]


def test_jsonl_sink_rewrites_a_url_whole(fake_bucket):
    root, seen = fake_bucket
    (root / "run").mkdir()
    earlier = '{"step": 1, "train/loss": 9.0}\n'
    (root / "run" / "metrics.jsonl").write_text(earlier)
    sink = summaries.JsonlSink(as_path(f"{paths_test.BUCKET}/run/metrics.jsonl"), earlier)
    sink.write(2, {"train/loss": 8.0})
    assert [r["step"] for r in _jsonl(root / "run" / "metrics.jsonl")] == [1, 2]
    sink.write(3, {"train/loss": 7.0})
    sink.close()
    assert [r["step"] for r in _jsonl(root / "run" / "metrics.jsonl")] == [1, 2, 3]
    assert f"{paths_test.BUCKET}/run/metrics.jsonl" in seen


def test_tensorboard_sink_writes_the_finite_scalars(tmp_path):
    pytest.importorskip("tensorboardX")
    sink = summaries.TensorBoardSink.create(as_path(tmp_path / "tensorboard"))
    sink.write(3, {"train/loss": 2.5, "train/grad_norm": "inf"})
    sink.write(4, {"eval/accuracy": 0.75})
    sink.close()
    assert paths_test._scalars(tmp_path / "tensorboard") == {
        ("train/loss", 3, 2.5),
        ("eval/accuracy", 4, 0.75),
    }


def test_console_sink_shows_only_the_view(tmp_path, monkeypatch):
    logged = []
    monkeypatch.setattr(summaries.logging, "info", lambda fmt, *args: logged.append(fmt % args))
    sink = summaries.ConsoleSink(SHOWN, total_steps=20, initial_step=0, progress=True)
    sink.write(10, {"train/loss": 2.5, "train/grad_norm": 1.0, "train/tokens_per_s": 12345.6})
    sink.write(10, {"eval/accuracy": 0.75, "eval/f1": "nan"})
    sink.advance(10)
    assert sink._bar.n == 10
    assert sink._bar.postfix == "train/loss=2.5 eval/acc=0.75 12,346 tok/s"
    sink.close()
    assert logged == ["step 10: train/loss=2.5", "step 10: eval/accuracy=0.75 eval/f1=nan"]


def test_curves_sink_draws_at_held_out_metrics_only(tmp_path):
    png = as_path(tmp_path / "curves.png")
    history = {"train/loss": [(10, 8.0)], "eval/loss": [(10, 7.5)], "eval/floor": [(0, 0.1)]}
    sink = summaries.CurvesSink(png, history, SHOWN)
    sink.write(10, {"train/loss": 8.0})
    assert not png.exists()
    sink.write(10, {"eval/loss": 7.5})
    assert png.read_bytes()[:4] == b"\x89PNG"
    sink.close()


def test_the_writer_hands_every_sink_the_same_metrics(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    logged = []
    monkeypatch.setattr(summaries.logging, "info", lambda fmt, *args: logged.append(fmt % args))
    w = summaries.MetricWriter(str(tmp_path), total_steps=20, progress=False, view=SHOWN)
    w.write(10, {"train/loss": 8.0, "train/grad_norm": float("nan")})
    assert not (tmp_path / "curves.png").exists()
    w.write(10, {"eval/loss": 7.5})
    w.close()
    assert _jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 10, "train/loss": 8.0, "train/grad_norm": "nan"},
        {"step": 10, "eval/loss": 7.5},
    ]
    assert paths_test._scalars(tmp_path / "tensorboard") == {
        ("train/loss", 10, 8.0),
        ("eval/loss", 10, 7.5),
    }
    assert logged == ["step 10: train/loss=8", "step 10: eval/loss=7.5"]
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert w.history == {"train/loss": [(10, 8.0)], "eval/loss": [(10, 7.5)]}
    assert w.latest == {"train/loss": 8.0, "train/grad_norm": "nan", "eval/loss": 7.5}


def test_other_processes_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(summaries.jax, "process_index", lambda: 1)
    w = summaries.MetricWriter(str(tmp_path / "run"), total_steps=20, view=SHOWN)
    w.write(10, {"train/loss": 8.0})
    w.write(10, {"eval/loss": 7.5})
    w.advance(10)
    w.close()
    assert not (tmp_path / "run").exists()
    assert w.history == {} and w.latest == {}


def test_curves_are_drawn_at_each_evaluation_and_kept_on_resume(tmp_path):
    w = summaries.MetricWriter(str(tmp_path), total_steps=20, progress=False, view=VIEW)
    w.write(0, {"eval/loss": 9.7, "eval/mlm_accuracy": 0.0, "eval/commonest_token_share": 0.07})
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    first = png.stat().st_mtime_ns
    w.write(10, {"train/loss": 8.0, "train/mlm_accuracy": 0.05})
    assert png.stat().st_mtime_ns == first  # train metrics alone do not redraw
    w.write(10, {"eval/loss": 7.5, "eval/mlm_accuracy": 0.09})
    assert png.stat().st_mtime_ns > first
    w.close()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 10, 10]

    # A resumed run's curves start from the beginning, without the steps it will redo.
    resumed = summaries.MetricWriter(str(tmp_path), total_steps=20, initial_step=5, progress=False)
    assert resumed.history["eval/mlm_accuracy"] == [(0, 0.0)]
    resumed.close()


def _pretraining_run(tmp_path) -> summaries.MetricWriter:
    w = summaries.MetricWriter(str(tmp_path), total_steps=20, progress=False, view=VIEW)
    baselines = {"eval/commonest_token_share": 0.07, "eval/nsp_majority_share": 0.55}
    w.write(0, {"eval/loss": 9.7, "eval/mlm_accuracy": 0.07, **baselines})
    w.write(10, {"train/loss": 8.0, "train/tokens_per_s": 1000.0, "train/step_time_s": 0.5})
    w.write(20, {"train/loss": 7.0, "train/tokens_per_s": 3000.0, "train/step_time_s": 0.5})
    w.write(20, {"eval/loss": 7.1, "eval/mlm_accuracy": 0.21, "eval/nsp_accuracy": 0.6})
    return w


def test_summary_reports_throughput_metrics_and_places(tmp_path):
    w = _pretraining_run(tmp_path)
    # 10 steps of 0.5 s at 1,000 tokens/s, then 10 at 3,000: 20,000 tokens in 10 s.
    timing = SimpleNamespace(train_seconds=10.0, train_tokens=20_000.0)
    text = w.summary(20, {"hf": "/x/hf (transformers)"}, timing=timing)
    w.close()
    assert re.match(
        r"Done: step 20 in [\d.]+ min \(0\.2 min of training steps at 2,000 tokens/s; the rest "
        r"is compilation, evaluation, data and saving\)\n",
        text,
    )
    # The floors the accuracies are read against stand beside them.
    assert (
        "held-out: loss 7.1, mlm_accuracy 0.21, commonest_token_share 0.07, "
        "nsp_majority_share 0.55, nsp_accuracy 0.6"
    ) in text
    assert "train (last window): loss 7\n" in text
    assert "hf: /x/hf (transformers)" in text and str(tmp_path / "curves.png") in text
    assert f"TensorBoard: tensorboard --logdir {tmp_path / 'tensorboard'}" in text


def test_the_final_evaluation_is_the_result_in_the_summary_and_after_the_bar(tmp_path):
    """Fine-tuning scores its final model once more at the end ("final/..."): the summary and the
    bar give those scores, labelled final, not the last evaluation during training."""
    view = summaries.MetricView(
        summary=("loss", "accuracy"),
        progress=("train/loss", "eval/accuracy"),
        final_title="final dev",
    )
    w = summaries.MetricWriter(str(tmp_path), total_steps=20, progress=True, view=view)
    w.write(10, {"train/loss": 0.9, "eval/accuracy": 0.33})
    w.write(20, {"train/loss": 0.7})
    assert "held-out: accuracy 0.33" in w.summary(20)  # no final evaluation yet
    w.write(20, {"final/accuracy": 0.38, "final/test_accuracy": 0.35})
    text = w.summary(20)
    assert w._console._bar.postfix == "train/loss=0.7 final/acc=0.38"
    w.close()
    assert "  final dev: accuracy 0.38\n" in text and "held-out" not in text, text


def test_summary_without_timing_leaves_the_throughput_out(tmp_path):
    w = _pretraining_run(tmp_path)
    for timing in (None, SimpleNamespace(train_seconds=0.0, train_tokens=0.0)):
        first, *_ = w.summary(20, timing=timing).splitlines()
        assert re.fullmatch(r"Done: step 20 in [\d.]+ min", first)
    w.close()


def test_log_lines_print_above_the_bar_where_no_absl_app_parsed_the_flags(
    tmp_path, capsys, monkeypatch
):
    """Outside an absl app (the inference command, a notebook) absl's handler wrote each line
    straight to stderr, after the bar's text on its line, once its one pre-parsing warning had
    gone: the console marks the flags parsed (their defaults)."""
    from absl import flags
    from absl import logging as absl_logging

    monkeypatch.setattr(absl_logging, "_warn_preinit_stderr", False)  # said once per process
    was_parsed = flags.FLAGS.is_parsed()
    flags.FLAGS.unparse_flags()
    try:
        test_log_lines_print_above_the_progress_bar(tmp_path, capsys)
    finally:
        flags.FLAGS.unparse_flags()
        if was_parsed:
            flags.FLAGS.mark_as_parsed()


def test_log_lines_print_above_the_progress_bar(tmp_path, capsys):
    summaries.configure_console()
    w = summaries.MetricWriter(str(tmp_path), total_steps=4, progress=True)
    w.advance(2)
    logging.warning("a message for the user")
    w.advance(2)
    w.close()
    # What a terminal shows: tqdm moves the cursor (ESC [A) to clear other bars still open in
    # this process (earlier tests may leave some), then prints the line.
    err = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", capsys.readouterr().err)
    lines = err.replace("\r", "\n").splitlines()
    (line,) = [x for x in lines if "a message for the user" in x]
    assert re.fullmatch(r"W \d\d:\d\d:\d\d a message for the user", line.strip())
    # The handler writes to the console stream again once the bar is closed.
    assert logging.get_absl_handler().python_handler.stream is not None
    assert not isinstance(logging.get_absl_handler().python_handler.stream, summaries._LogAboveBar)
