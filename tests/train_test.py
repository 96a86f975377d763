"""train.py end to end, as a user runs it: a subprocess per run, a real (small) data build."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import faults
from tests.checkpoints.model_card_test import card_metadata, held_out_metrics
from tests.conftest import TINY_DATA_OVERRIDES

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


# With -m e2e, for the default stage's time (about 18 s): a packed batch's loss equals its
# sequences' (tests/pretrain/packing_test.py, through the eval step), the packed iterator
# resumes from an Orbax checkpoint there, and packed rows go through the sharded steps in the
# embedding and reranker jobs' runs.
@pytest.mark.e2e
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


# With -m e2e, for the suite's time (about 16 s): the 2-process run in
# tests/parallel/multiprocess_test.py loads its export in transformers the same way, and
# tests/checkpoints/convert_test.py converts a bert_jax export with --verify.
@pytest.mark.e2e
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


@pytest.mark.e2e  # about 25 s; the resume at every moment: preemption_test; the signal: ctrl_c below
def test_sigterm_then_resume_equals_straight_run(tmp_path, tiny_pretraining_build):
    """2N steps straight equal N steps, a SIGTERM, a resume and the rest, loss for loss.

    The run sends itself SIGTERM after step N/2 (tests/faults.py's hook), as a scheduler
    would: the signal comes at a known step however fast the steps are. It stops after the next
    step with a checkpoint, and exits 143 (stopped, not done)."""
    n = 6
    straight = tmp_path / "straight"
    run(train_cmd(straight, tiny_pretraining_build, steps=2 * n))
    interrupted = tmp_path / "interrupted"
    cmd = train_cmd(
        interrupted, tiny_pretraining_build, "--config.checkpoint_every_steps=1000", steps=2 * n
    )
    term = {faults.FAULT_ENV: f"process=0,at=step:{n // 2},signal=TERM"}
    proc = subprocess.run(
        faults.command(cmd), env={**env(), **term}, cwd=ROOT, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "received SIGTERM" in proc.stderr
    stopped = n // 2 + 1  # the signal is seen at the next step's stop check
    assert max(losses(interrupted)) == stopped
    assert f"Stopped by SIGTERM at step {stopped} of {2 * n}" in proc.stdout
    assert "Done" not in proc.stdout
    assert os.listdir(interrupted / "checkpoints") == [str(stopped)]
    run(
        train_cmd(
            interrupted, tiny_pretraining_build, "--config.checkpoint_every_steps=1000", steps=2 * n
        )
    )
    a, b = losses(straight), losses(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, 2 * n + 1))
    np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=1e-6)


def test_ctrl_c_in_training_saves_and_exits_130(tmp_path, tiny_pretraining_build):
    """Ctrl-C during training: a checkpoint, "Stopped by SIGINT at step 3", status 130 (so
    `train.py && next` stops there), and the rerun finishes."""
    workdir = tmp_path / "run"
    cmd = train_cmd(workdir, tiny_pretraining_build, "--config.checkpoint_every_steps=1000")
    interrupt = {faults.FAULT_ENV: "process=0,at=step:2,signal=INT"}
    proc = subprocess.run(
        faults.command(cmd), env={**env(), **interrupt}, cwd=ROOT, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Stopped by SIGINT at step 3 of 6" in proc.stdout and "Done" not in proc.stdout
    assert os.listdir(workdir / "checkpoints") == ["3"]
    proc = run(cmd)
    assert "restored checkpoint 3" in proc.stderr and "Done: step 6" in proc.stdout


def _wait_for(proc, text: str, timeout: float = 300) -> str:
    """Reads `proc`'s stderr until a line holds `text`; returns what was read."""
    seen, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    proc.kill()
    raise AssertionError(f"never printed {text!r}:\n{''.join(seen)[-3000:]}")


def test_ctrl_c_while_train_py_builds_its_data_exits_130(tmp_path):
    """Ctrl-C while train.py tokenizes the default corpus (JAX's gc callback used to swallow
    it, and the run went on to the end with status 0): status 130 within seconds."""
    cmd = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config=" + os.path.join(ROOT, "configs", "pretrain.py") + ":size=tiny",
        f"--workdir={tmp_path / 'run'}",
        "--config.num_train_steps=2",
    ]
    proc = subprocess.Popen(
        cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _wait_for(proc, "WordPiece vocabulary")
    proc.send_signal(signal.SIGINT)
    start = time.time()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert time.time() - start < 30 and "stopped: interrupted (SIGINT)" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.e2e  # three train.py runs, 25-30 s
def test_refused_restart_keeps_config_and_resume_keeps_one_row_per_step(
    tmp_path, tiny_pretraining_build
):
    """A run that dies at step 6 (checkpoint 4), a restart with another model (refused by the
    run's config.json, and without it by its checkpoint: one `error:` line each; config.json
    unchanged, or not written), and a resume: metrics.jsonl has each step once (the dead run's
    row 5 gone) and TensorBoard is told to drop its events from step 5 on."""
    workdir = tmp_path / "run"
    every = "--config.checkpoint_every_steps=4"
    dies = {faults.FAULT_ENV: "process=0,at=step:6"}
    proc = subprocess.run(
        faults.command(train_cmd(workdir, tiny_pretraining_build, every, steps=8)),
        env={**env(), **dies}, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1 and "a fault injected at step:6" in proc.stderr
    assert sorted(losses(workdir)) == [1, 2, 3, 4, 5]  # the fault comes before row 6
    assert os.listdir(workdir / "checkpoints") == ["4"]
    record = (workdir / "config.json").read_text()

    other = "--config.model.intermediate_size=41"
    proc = run(train_cmd(workdir, tiny_pretraining_build, every, other, steps=8), check=False)
    assert _one_line_error(proc).endswith(
        "model.intermediate_size: 37 -> 41. Use another --workdir for a new run, or rerun with "
        "the earlier values: --config.model.intermediate_size=37"
    )
    assert (workdir / "config.json").read_text() == record
    # Without the run's config.json (a copied checkpoint), its checkpoint refuses the model.
    (workdir / "config.json").rename(workdir / "config.json.kept")
    proc = run(train_cmd(workdir, tiny_pretraining_build, every, other, steps=8), check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # One line, no traceback through the project's code (Orbax's reads, left running by the
    # failed restore, may print their own from their threads, and the line can then follow
    # their indentation).
    lines = [line for line in proc.stderr.splitlines() if line.lstrip().startswith("error: ")]
    assert len(lines) == 1 and "cannot be restored" in lines[0], proc.stderr[-3000:]
    assert "bert_jax/" not in proc.stderr.split(lines[0])[1], proc.stderr[-3000:]
    assert not (workdir / "config.json").exists()
    (workdir / "config.json.kept").rename(workdir / "config.json")

    proc = run(train_cmd(workdir, tiny_pretraining_build, every, steps=8))
    assert "restored checkpoint 4" in proc.stderr
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    train_steps = [r["step"] for r in rows if "train/loss" in r]
    assert train_steps == list(range(1, 9)), train_steps
    assert [r["step"] for r in rows if "eval/loss" in r] == [0, 8]
    assert _purge_steps(workdir / "tensorboard") == [5]


def _purge_steps(directory) -> list[int]:
    """The steps of the SessionLog START events (TensorBoard's "drop the events from here on")
    in the event files of `directory`."""
    import struct

    from tensorboardX.proto import event_pb2

    steps = []
    for name in sorted(os.listdir(directory)):
        data = (directory / name).read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == 1:
                steps.append(event.step)
    return steps


@pytest.mark.e2e  # train.py runs, 20 s
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
            "--config.resume_changes=optimizer.peak_learning_rate",  # a change on purpose
            no_clip,
            steps=12,
        ),
        check=False,
    )
    assert proc.returncode != 0 and "restored checkpoint 2" in proc.stderr
    assert "with changes on purpose: optimizer.peak_learning_rate: 0.004 -> 1e+30" in proc.stderr
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
    # One line, with the key it meant, not ml_collections' traceback.
    assert 'Did you mean "num_train_steps"' in _one_line_error(proc)
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


def _one_line_error(proc) -> str:
    """The `error: ...` line a user's mistake ends in (status 1, no traceback)."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), proc.stderr[-3000:]
    return last


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--config.global_batch_size=0", "config.global_batch_size=0: expected an integer >= 1"),
        ("--config.num_train_steps=-5", "config.num_train_steps=-5: expected an integer >= 1"),
        # What a T4 gets ("needs a GPU of compute capability 8.0 ..."), in its CPU version.
        ("--config.runtime.attention=cudnn", "RuntimeConfig.attention='cudnn' takes bfloat16"),
    ],
)
def test_a_bad_config_value_ends_in_one_error_line(tmp_path, tiny_pretraining_build, flag, message):
    proc = run(train_cmd(tmp_path / "run", tiny_pretraining_build, flag), check=False, timeout=120)
    assert message in _one_line_error(proc)
    assert not (tmp_path / "run" / "config.json").exists()


def _vocab(build_dir) -> list[str]:
    from bert_jax import tokenization

    return tokenization.load_tokenizer(os.path.join(build_dir, "tokenizer.json")).vocab


def test_a_vocabulary_that_does_not_fit_is_refused_at_start(tmp_path, tiny_pretraining_build):
    """A data.tokenizer of another size (it trained 4 steps into a NaN loss), and an init_from
    whose vocab.txt holds the same number of tokens in another order (accepted silently), are
    refused before any step, naming the sizes, the files and the first differing line."""
    tokens = _vocab(tiny_pretraining_build)
    bigger = tmp_path / "bigger.txt"
    bigger.write_text("\n".join(tokens + ["extra1", "extra2"]) + "\n")
    proc = run(
        train_cmd(tmp_path / "a", tiny_pretraining_build, f"--config.data.tokenizer={bigger}"),
        check=False,
        timeout=300,
    )
    line = _one_line_error(proc)
    assert f"config.data.tokenizer {bigger} has 402 tokens" in line
    assert "config.model.vocab_size=400" in line

    model = tmp_path / "model"
    model.mkdir()
    swapped = list(tokens)
    swapped[350], swapped[351] = swapped[351], swapped[350]
    (model / "vocab.txt").write_text("\n".join(swapped) + "\n")
    proc = run(
        train_cmd(tmp_path / "b", tiny_pretraining_build, f"--config.init_from={model}"),
        check=False,
        timeout=300,
    )
    line = _one_line_error(proc)
    assert f"{model / 'vocab.txt'}" in line and "differ at id 350 (line 351" in line
    assert repr(swapped[350]) in line and repr(tokens[350]) in line
    assert not (tmp_path / "b" / "checkpoints").exists()
