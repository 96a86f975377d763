"""The README's main-job command, as a user runs it (`make pretrain`), on a small step count."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_make_pretrain_runs_the_main_job(tmp_path):
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
    assert any("eval/mlm_accuracy" in r for r in rows)
    assert (workdir / "hf" / "model.safetensors").exists() and (
        workdir / "hf" / "vocab.txt"
    ).exists()
