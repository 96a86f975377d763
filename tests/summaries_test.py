"""MetricWriter: metrics.jsonl, curves.png at each evaluation, log lines above the bar, summary."""

import json
import re

from absl import logging

from bert_jax import summaries


def test_curves_are_drawn_at_each_evaluation_and_kept_on_resume(tmp_path):
    w = summaries.MetricWriter(str(tmp_path), total_steps=20, progress=False)
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


def test_summary_reports_throughput_metrics_and_places(tmp_path):
    w = summaries.MetricWriter(str(tmp_path), total_steps=20, progress=False)
    baselines = {"eval/commonest_token_share": 0.07, "eval/nsp_majority_share": 0.55}
    w.write(0, {"eval/loss": 9.7, "eval/mlm_accuracy": 0.07, **baselines})
    w.write(10, {"train/loss": 8.0, "train/tokens_per_s": 1000.0, "train/step_time_s": 0.5})
    w.write(20, {"train/loss": 7.0, "train/tokens_per_s": 3000.0, "train/step_time_s": 0.5})
    w.write(20, {"eval/loss": 7.1, "eval/mlm_accuracy": 0.21, "eval/nsp_accuracy": 0.6})
    text = w.summary(20, {"hf": "/x/hf (transformers)"})
    w.close()
    # 10 steps of 0.5 s at 1,000 tokens/s, then 10 at 3,000: 20,000 tokens in 10 s.
    assert re.search(
        r"Done: step 20 in [\d.]+ min \(0\.2 min of training steps at 2,000 tokens/s", text
    )
    # The floors the accuracies are read against stand beside them.
    assert (
        "held-out: loss 7.1, mlm_accuracy 0.21, commonest_token_share 0.07, "
        "nsp_majority_share 0.55, nsp_accuracy 0.6"
    ) in text
    assert "hf: /x/hf (transformers)" in text and str(tmp_path / "curves.png") in text


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
