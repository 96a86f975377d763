"""The README's main-job command, as a user runs it (`make pretrain`), on a small step count:
its console, its picture, what it prints at the end, and fill-mask on its export."""

import json
import os
import re
import subprocess
import sys

import pytest

from bert_jax.inference.__main__ import main as inference_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.e2e  # make pretrain at 30 steps in a subprocess: 60-110 s of 2 cores
def test_make_pretrain_runs_the_main_job(tmp_path, capsys):
    venv = os.path.dirname(os.path.dirname(sys.executable))  # the environment running the tests
    if not os.path.exists(os.path.join(venv, ".installed")):
        pytest.skip("not a `make setup` environment (run `make test`)")
    workdir = tmp_path / "run"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.run(
        [
            "make",
            "pretrain",
            f"VENV={venv}",
            f"WORKDIR={workdir}",
            "PRETRAIN_ARGS=--config.num_train_steps=30 --config.log_every_steps=10 "
            "--config.eval_every_steps=30 --config.num_eval_steps=2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 3 and losses[-1] < losses[0]  # the loss falls
    evals = [r for r in rows if "eval/mlm_accuracy" in r]
    assert [r["step"] for r in evals] == [0, 30]  # the curves start before training
    share = evals[0]["eval/commonest_token_share"]
    assert 0.02 < share < 0.2
    # The MLM bias starts at the data's log frequencies: before any step the model guesses the
    # commonest token, and scores its share.
    assert abs(evals[0]["eval/mlm_accuracy"] - share) < 0.01
    assert 0.5 <= evals[0]["eval/nsp_majority_share"] < 0.7  # NSP's floor: random next's share
    assert (workdir / "hf" / "model.safetensors").exists() and (
        workdir / "hf" / "vocab.txt"
    ).exists()
    assert (workdir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The console: log lines start their own line, never inside the progress bar's.
    console = proc.stderr.replace("\r", "\n")  # what a terminal shows, a line per redraw
    for line in console.splitlines():
        assert not re.search(r"\|.*\d\d:\d\d:\d\d step \d+:", line), line
    assert re.search(r"^\d\d:\d\d:\d\d step 30: .*eval/mlm_accuracy=", console, re.M)
    assert "config:\n" not in proc.stderr  # the full config is in config.json, not the console

    # The end: held-out lines with a masked word, guesses before and after, and the summary.
    out = proc.stdout
    assert "Held-out lines with a word masked" in out
    assert len(re.findall(r"\[MASK\]", out)) >= 3
    assert len(re.findall(r"^    step 0: ", out, re.M)) == len(
        re.findall(r"^    step 30: ", out, re.M)
    )
    assert re.search(
        r"^Done: step 30 in [\d.]+ min \([\d.]+ min of training steps at [\d,]+ tokens/s", out, re.M
    )
    for place in ("curves.png", "tensorboard", "hf (transformers)", "export (bert_jax)"):
        assert place in out

    # fill-mask on the export: the top guesses are tokens of the vocabulary, probabilities sorted.
    capsys.readouterr()
    assert (
        inference_main(["fill-mask", "--model", str(workdir), "--json", "to be or not to [MASK]"])
        == 0
    )
    (masks,) = json.loads(capsys.readouterr().out)["masks"]
    scores = [c["score"] for c in masks]
    assert len(masks) == 5 and scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1
