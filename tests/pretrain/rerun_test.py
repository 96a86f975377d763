"""A pretraining rerun in the same workdir, as a user starts it (train.py in a subprocess, a clean
environment and a fresh HOME): a rerun of other settings is refused in one `error:` line naming
each change and the ways out, writing nothing, for every pretraining objective (MLM + NSP, MLM,
replaced-token detection); a rerun of a finished run trains and rewrites nothing (the finished
BERT run's reruns: tests/checkpoints/checkpoint_faults_test.py)."""

import json
import os
import sys

import pytest

from bert_jax.training import experiment
from tests import family_fixtures
from tests.commands_test import clean_env
from tests.commands_test import run as run_command
from tests.conftest import TINY_DATA_OVERRIDES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every objective of the pretraining job (`pretrain.run.JOBS`) by a recipe that trains it.
OBJECTIVES = {
    "pretraining": "size=tiny",
    "mlm": "size=tiny,mlm_only=1",
    "rtd": "arch=electra",
    "rtd-deberta": "arch=deberta_v3",
}
# The issue's rerun: a 250x learning rate and a quarter of the batch.
CHANGED = ("--config.optimizer.peak_learning_rate=0.5", "--config.global_batch_size=8")


def train_py(variant: str, workdir, *flags) -> list[str]:
    return [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        f"--config={os.path.join(ROOT, 'configs', 'pretrain.py')}:{variant}",
        f"--workdir={workdir}",
        "--compilation_cache_dir=off",
        *flags,
    ]


def snapshot(directory) -> dict[str, tuple[int, int]]:
    """Every file under `directory`: relative path -> (size, mtime in ns)."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            stat = os.stat(path)
            out[os.path.relpath(path, directory)] = (stat.st_size, stat.st_mtime_ns)
    return out


def error_line(proc) -> str:
    """The one `error: ...` line a refused command ends in (status 1, no traceback)."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and proc.stderr.strip().endswith(lines[0]), proc.stderr[-3000:]
    return lines[0]


# DeBERTa-v3's with -m e2e, for the suite's time: ELECTRA's recipe runs the same objective.
@pytest.mark.parametrize(
    "objective",
    [pytest.param(o, marks=pytest.mark.e2e) if o == "rtd-deberta" else o for o in OBJECTIVES],
)
def test_a_rerun_of_other_settings_is_refused_naming_each_change(objective, tmp_path):
    """A workdir holding a run's config.json (as the run writes it before its first step) and
    its checkpoints; the rerun with another learning rate and batch stops before anything is
    built, naming both changes with their old and new values, a new workdir and the flags of
    the earlier values; nothing in the workdir changes (no data built, config.json kept)."""
    variant = OBJECTIVES[objective]
    earlier = family_fixtures.load_config("pretrain.py", variant)
    workdir = tmp_path / "run"
    experiment.write_config(earlier, str(workdir))
    (workdir / "checkpoints" / "100").mkdir(parents=True)
    (workdir / "checkpoints" / "100" / "_CHECKPOINT_METADATA").write_text("{}")
    before = snapshot(workdir)
    (tmp_path / "home").mkdir()
    env = clean_env(tmp_path / "home")
    proc = run_command(train_py(variant, workdir, *CHANGED), env, tmp_path, timeout=120)
    line = error_line(proc)
    lr, batch = earlier.optimizer.peak_learning_rate, earlier.global_batch_size
    assert line.startswith(f"error: {workdir} holds a run (training checkpoints in "), line
    assert f"global_batch_size: {batch} -> 8" in line, line
    assert f"optimizer.peak_learning_rate: {lr!r} -> 0.5" in line, line
    assert "Use another --workdir" in line, line
    assert f"--config.global_batch_size={batch} " in line, line
    assert f"--config.optimizer.peak_learning_rate={lr!r}; or, to resume it with these " in line
    assert line.endswith("--config.resume_changes=global_batch_size,optimizer.peak_learning_rate")
    assert snapshot(workdir) == before
    assert json.loads((workdir / "config.json").read_text())["global_batch_size"] == batch


# About a minute on 2 cores (-m full): two steps of ELECTRA, its reruns, fill-mask.
@pytest.mark.full
def test_an_electra_run_refuses_other_settings_and_a_finished_rerun_rewrites_nothing(
    tmp_path, tiny_pretraining_build
):
    """The issue's ELECTRA run, trained: a rerun with another learning rate and batch is
    refused, the same command again trains and rewrites nothing (no masked-word guesses, the
    exports kept), and fill-mask on the run names its generator, which fills the masks."""
    workdir = tmp_path / "run"
    small = [f for f in TINY_DATA_OVERRIDES if "dropout" not in f and "export" not in f]
    flags = [
        *small, f"--config.data.paths={tiny_pretraining_build}", "--config.num_train_steps=2",
        "--config.num_eval_steps=1", "--config.async_checkpointing=false",
    ]  # fmt: skip
    (tmp_path / "home").mkdir()
    env = clean_env(tmp_path / "home")
    proc = run_command(train_py("arch=electra", workdir, *flags), env, tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (workdir / "generator" / "hf" / "model.safetensors").is_file()
    before = snapshot(workdir)

    proc = run_command(train_py("arch=electra", workdir, *flags, *CHANGED), env, tmp_path)
    line = error_line(proc)
    assert "global_batch_size: 16 -> 8; optimizer.peak_learning_rate: 0.002 -> 0.5" in line
    assert snapshot(workdir) == before

    proc = run_command(train_py("arch=electra", workdir, *flags), env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == [
        f"{workdir} finished at step 2 in an earlier run (its checkpoint 2): nothing to train; "
        f"its export is kept as it was ({workdir / 'hf'}, {workdir / 'generator' / 'hf'}); "
        "rerun with --config.num_train_steps above 2 to train on, or use another --workdir"
    ]
    assert snapshot(workdir) == before

    fill = [sys.executable, "-m", "bert_jax.inference", "fill-mask", "--model"]
    proc = run_command([*fill, str(workdir), "to be or not to [MASK]"], env, ROOT)
    assert f"fill-mask --model {workdir / 'generator' / 'hf'}" in error_line(proc)
    proc = run_command([*fill, str(workdir / "generator" / "hf"), "to be [MASK]"], env, ROOT)
    assert proc.returncode == 0 and "[MASK] 1:" in proc.stdout, proc.stderr[-3000:]
