"""train.py end to end, as a user runs it: a subprocess per run, a real (small) data build."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import TINY_DATA_OVERRIDES
from tests.model_card_test import card_metadata, held_out_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_cmd(workdir, build_dir, *extra, steps=6):
    return [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config=" + os.path.join(ROOT, "configs", "pretrain.py") + ":size=tiny",
        f"--workdir={workdir}",
        f"--config.data.paths={build_dir}",
        f"--config.num_train_steps={steps}",
        *TINY_DATA_OVERRIDES,
        *extra,
    ]


def env(devices=1):
    e = dict(os.environ)
    e["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"
    )
    e["PYTHONUNBUFFERED"] = "1"
    return e


def run(cmd, devices=1, check=True, timeout=600):
    proc = subprocess.run(
        cmd, env=env(devices), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def losses(workdir) -> dict[int, float]:
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "train/loss" in row:
                out[row["step"]] = row["train/loss"]
    return out


def test_smoke_train_checkpoint_resume_and_export(tmp_path, tiny_pretraining_build):
    workdir = tmp_path / "run"
    run(
        train_cmd(
            workdir,
            tiny_pretraining_build,
            "--config.eval_every_steps=3",
            "--config.num_eval_steps=2",
            "--config.checkpoint_every_steps=2",
            "--config.export_hf_at_end=True",
        ),
        devices=2,
    )
    assert sorted(os.listdir(workdir / "checkpoints")) == ["4", "6"] or "6" in os.listdir(
        workdir / "checkpoints"
    )
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4, 5, 6]
    evals = [r for r in rows if "eval/loss" in r]
    assert [r["step"] for r in evals] == [0, 3, 6] and 0 <= evals[-1]["eval/mlm_accuracy"] <= 1
    for key in (
        "train/mlm_loss",
        "train/mlm_accuracy",
        "train/nsp_loss",
        "train/nsp_accuracy",
        "train/nsp_auc",
        "train/learning_rate",
        "train/grad_norm",
        "train/tokens_per_s",
        "train/step_time_s",
    ):
        assert key in rows[-2] or key in rows[-1], key
    assert (workdir / "tensorboard").is_dir()
    assert (workdir / "hf" / "model.safetensors").exists() and (
        workdir / "export" / "params"
    ).is_dir()
    # The Hub card carries the run's last held-out evaluation (step 6).
    meta = card_metadata(workdir / "hf")
    assert meta["pipeline_tag"] == "fill-mask" and meta["license"] == "apache-2.0"
    assert held_out_metrics(meta) == {k: v for k, v in evals[-1].items() if k != "step"}
    # A second invocation resumes at step 6 and trains to 8.
    proc = run(train_cmd(workdir, tiny_pretraining_build, steps=8), devices=2)
    assert "restored checkpoint 6" in proc.stderr
    assert max(losses(workdir)) == 8


def test_packed_sequences_train_evaluate_and_checkpoint(tmp_path, tiny_pretraining_build):
    """data.pack_sequences: packed rows (segment ids, [B, S] NSP labels) go through the sharded
    train and eval steps, the FLOP count and the data checkpoint."""
    workdir = tmp_path / "run"
    extra = ("--config.data.pack_sequences=True", "--config.data.max_segments=3")
    run(
        train_cmd(
            workdir,
            tiny_pretraining_build,
            *extra,
            "--config.eval_every_steps=3",
            "--config.num_eval_steps=1",
            "--config.checkpoint_every_steps=3",
            steps=3,
        ),
        devices=2,
    )
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    train = {r["step"]: r for r in rows if "train/loss" in r}
    assert sorted(train) == [1, 2, 3]
    assert all(np.isfinite(r["train/nsp_loss"]) for r in train.values())
    assert [r["step"] for r in rows if "eval/nsp_loss" in r] == [0, 3]
    saved = list((workdir / "checkpoints" / "3").rglob("process_0-of-1.json"))
    assert len(saved) == 1 and '"next_row"' in saved[0].read_text()  # the packer's position


@pytest.mark.torch
def test_exported_model_loads_in_transformers(tmp_path, tiny_pretraining_build):
    transformers = pytest.importorskip("transformers")
    workdir = tmp_path / "run"
    run(train_cmd(workdir, tiny_pretraining_build, "--config.export_hf_at_end=True", steps=2))
    model, info = transformers.BertForPreTraining.from_pretrained(
        workdir / "hf", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    # And the converter reads the bert_jax export.
    from bert_jax import convert

    assert convert.main([str(workdir / "export"), str(tmp_path / "hf2"), "--verify"]) == 0


def test_sigterm_then_resume_equals_straight_run(tmp_path, tiny_pretraining_build):
    """2N steps straight equal N steps, a SIGTERM, a resume and the rest, loss for loss.

    The run sleeps 10 s after step N/2 (bert_jax.multihost's test hook), so that the signal
    reaches it mid-run however fast its steps are (they once finished before it)."""
    n = 6
    straight = tmp_path / "straight"
    run(train_cmd(straight, tiny_pretraining_build, steps=2 * n))
    interrupted = tmp_path / "interrupted"
    cmd = train_cmd(
        interrupted, tiny_pretraining_build, "--config.checkpoint_every_steps=1000", steps=2 * n
    )
    pause = {"BERT_JAX_FAULT_INJECT": f"process=0,at=step:{n // 2},sleep=10"}
    proc = subprocess.Popen(
        cmd,
        env={**env(), **pause},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        if (interrupted / "metrics.jsonl").exists() and len(losses(interrupted)) >= n // 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    stopped = max(losses(interrupted))
    assert stopped < 2 * n, "the run finished before the signal; no resume was tested"
    assert "received SIGTERM" in err
    assert os.listdir(interrupted / "checkpoints") == [str(stopped)]
    run(
        train_cmd(
            interrupted, tiny_pretraining_build, "--config.checkpoint_every_steps=1000", steps=2 * n
        )
    )
    a, b = losses(straight), losses(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, 2 * n + 1))
    np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=1e-6)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, tiny_pretraining_build):
    workdir = tmp_path / "run"
    # No clipping in both runs: the optimizer state has one structure, so the second run resumes
    # (a checkpoint that does not fit the config stops a run instead).
    no_clip = "--config.optimizer.clip_norm=0.0"
    run(
        train_cmd(
            workdir, tiny_pretraining_build, "--config.checkpoint_every_steps=2", no_clip, steps=2
        )
    )
    proc = run(
        train_cmd(
            workdir,
            tiny_pretraining_build,
            "--config.checkpoint_every_steps=2",
            "--config.optimizer.peak_learning_rate=1e30",
            no_clip,
            steps=12,
        ),
        check=False,
    )
    assert proc.returncode != 0 and "restored checkpoint 2" in proc.stderr
    assert "non-finite loss" in proc.stderr and "last good checkpoint is step" in proc.stderr
    steps = sorted(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit())
    last_logged_finite = max(
        s for s, v in losses(workdir).items() if isinstance(v, float) and np.isfinite(v)
    )
    assert steps and steps[-1] <= last_logged_finite


def test_unknown_config_key_and_wrong_type_fail_at_once(tmp_path, tiny_pretraining_build):
    proc = run(
        train_cmd(tmp_path, tiny_pretraining_build, "--config.num_train_stepz=5"),
        check=False,
        timeout=120,
    )
    assert proc.returncode != 0 and "num_train_stepz" in proc.stderr
    proc = run(
        train_cmd(tmp_path, tiny_pretraining_build, "--config.global_batch_size=abc"),
        check=False,
        timeout=120,
    )
    assert proc.returncode != 0 and "global_batch_size" in proc.stderr


def test_print_shardings(tiny_pretraining_build):
    proc = run(
        [
            sys.executable,
            os.path.join(ROOT, "train.py"),
            "--config=" + os.path.join(ROOT, "configs", "pretrain.py") + ":size=base",
            "--mode=shardings",
            "--config.mesh.data=2",
            "--config.mesh.fsdp=2",
            "--config.mesh.tensor=2",
        ],
        devices=8,
        timeout=300,
    )
    out = proc.stdout
    assert "bert/encoder/layer/attention/self/query/kernel" in out
    line = next(line for line in out.splitlines() if "layer/intermediate/dense/kernel" in line)
    assert "(12, 768, 3072)" in line and "'fsdp', 'tensor'" in line
