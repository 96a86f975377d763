"""Damaged checkpoints, a full disk and two runs in one directory, as a user meets them: train.py,
`python -m bert_jax.convert` and `python -m bert_jax.inference fill-mask` in subprocesses on a
small run (15 steps, a checkpoint every 5)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bert_jax.checkpoints import native, run_params
from tests import faults
from tests.commands_test import clean_env
from tests.commands_test import run as run_command
from tests.pretrain.rerun_test import snapshot
from tests.train_test import ROOT, env, losses, run, train_cmd

EVERY = ("--config.checkpoint_every_steps=5",)


@pytest.fixture(scope="module")
def finished_run(tiny_pretraining_build, tmp_path_factory):
    """A run directory of 15 steps (checkpoints 5, 10, 15) with the build's tokenizer beside
    them (as fill-mask needs)."""
    workdir = tmp_path_factory.mktemp("finished") / "run"
    run(train_cmd(workdir, tiny_pretraining_build, *EVERY, steps=15))
    assert sorted(os.listdir(workdir / "checkpoints"), key=int) == ["5", "10", "15"]
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copy(os.path.join(tiny_pretraining_build, name), workdir / name)
    return workdir


def array_files(workdir, step) -> list[str]:
    """The array data files of checkpoint `step` (tensorstore's OCDBT `d/` files)."""
    return [
        os.path.join(root, f)
        for root, _, names in os.walk(workdir / "checkpoints" / str(step) / "state")
        for f in names
        if os.path.basename(root) == "d" and "ocdbt.process_" in root
    ]


def damage(files, how):
    for path in files:
        os.truncate(path, 1000) if how == "truncate" else os.remove(path)


def copy_run(src, dst, how=None, every_file=False):
    """A copy of a run whose checkpoint 15 has its largest array file (or every one) truncated
    to 1,000 bytes or deleted."""
    shutil.copytree(src, dst)
    if how:
        files = array_files(dst, 15)
        damage(files if every_file else [max(files, key=os.path.getsize)], how)
    return dst


# A deleted file with -m e2e, for the suite's time (about 15 s): the truncated one takes the same
# set-aside and resume, and the convert tests below read both.
@pytest.mark.parametrize("how", ["truncate", pytest.param("delete", marks=pytest.mark.e2e)])
def test_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_resumed(
    finished_run, tiny_pretraining_build, tmp_path, how
):
    workdir = copy_run(finished_run, tmp_path / "run", how)
    proc = run(train_cmd(workdir, tiny_pretraining_build, *EVERY, steps=17))
    assert "restored checkpoint 10" in proc.stderr
    assert "checkpoint 15" in proc.stderr and "corrupt-15" in proc.stderr
    names = set(os.listdir(workdir / "checkpoints"))
    assert {"corrupt-15", "15", "17"} <= names, names  # kept aside; 15 trained again
    assert max(losses(workdir)) == 17


def _same_params(a, b) -> bool:
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b)
    )


def convert_run(workdir, out) -> str:
    """`python -m bert_jax.convert RUN OUT --to bert_jax`; its stderr."""
    cmd = [sys.executable, "-m", "bert_jax.convert", str(workdir), str(out), "--to", "bert_jax"]
    proc = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def fill_mask(model) -> tuple[str, str]:
    """`python -m bert_jax.inference fill-mask --model MODEL --json TEXT`: (stdout, stderr)."""
    args = ["fill-mask", "--model", str(model), "--json", "to be or not to [MASK] ."]
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.inference", *args],
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_convert_of_a_run_with_a_damaged_largest_array_file_succeeds_and_moves_nothing(
    finished_run, tmp_path, how
):
    """The readers read the parameters only: where the damaged file held none (here it holds
    optimizer moments), step 15's whole parameters are read; where it did, step 10's."""
    workdir = copy_run(finished_run, tmp_path / "run", how)
    before = sorted(os.listdir(workdir / "checkpoints"))
    err = convert_run(workdir, tmp_path / "out")
    assert sorted(os.listdir(workdir / "checkpoints")) == before
    _, converted, _ = native.load_pretrained(tmp_path / "out")
    passed_over = "passed over as damaged: 15" in err
    step = 10 if passed_over else 15
    assert _same_params(converted, run_params.load_training_checkpoint(finished_run, step)[1])


@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_convert_and_fill_mask_of_a_run_with_damaged_parameters_read_the_previous_checkpoint(
    finished_run, tmp_path, how
):
    workdir = copy_run(finished_run, tmp_path / "run", how, every_file=True)
    before = sorted(os.listdir(workdir / "checkpoints"))
    err = convert_run(workdir, tmp_path / "out")
    assert "reading checkpoint 10" in err and "passed over as damaged: 15" in err
    assert sorted(os.listdir(workdir / "checkpoints")) == before  # reading moves nothing
    _, converted, _ = native.load_pretrained(tmp_path / "out")
    _, step10, _, _ = run_params.load_training_checkpoint(finished_run, 10)
    _, step15, _, _ = run_params.load_training_checkpoint(finished_run, 15)
    assert _same_params(converted, step10) and not _same_params(converted, step15)
    if how == "delete":
        return  # the reader is the same; one fill-mask run shows it
    out, err = fill_mask(workdir)
    assert "reading checkpoint 10" in err and "passed over as damaged: 15" in err
    only10 = copy_run(finished_run, tmp_path / "only10")
    shutil.rmtree(only10 / "checkpoints" / "15")
    assert out == fill_mask(only10)[0] != fill_mask(finished_run)[0]
    assert sorted(os.listdir(workdir / "checkpoints")) == before


# A full disk, injected into the background save of step 10 (the JSON items that Orbax writes in
# its own threads raise ENOSPC), then train.py as the user runs it.
ENOSPC_AT_10 = """
import errno, runpy, sys
from orbax.checkpoint._src.handlers import json_checkpoint_handler as j
real = j.JsonCheckpointHandler._save_fn
async def full(self, x, directory):
    if "/10.orbax-checkpoint-tmp" in str(directory):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / self._filename))
    return await real(self, x, directory)
j.JsonCheckpointHandler._save_fn = full
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_rerun_of_a_finished_run_trains_nothing_and_rewrites_nothing(
    finished_run, tiny_pretraining_build, tmp_path
):
    """The same command again, as a user reruns it (a clean environment): the run is finished,
    so nothing trains and no file is rewritten; the export it lacks (it ran without one) is
    written, and once there it is kept as it was, with no masked-word guesses printed."""
    workdir = copy_run(finished_run, tmp_path / "run")
    (tmp_path / "home").mkdir()
    env = clean_env(tmp_path / "home")
    export = "--config.export_hf_at_end=true"
    cmd = train_cmd(workdir, tiny_pretraining_build, *EVERY, export, steps=15)
    before = snapshot(workdir)
    proc = run_command(cmd, env, ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    finished = f"{workdir} finished at step 15 in an earlier run (its checkpoint 15): "
    more = "rerun with --config.num_train_steps above 15 to train on, or use another --workdir"
    assert proc.stdout.strip().splitlines() == [
        f"{finished}nothing to train; exported it ({workdir / 'export'} (bert_jax), "
        f"{workdir / 'hf'} (transformers)); {more}"
    ]
    exported = snapshot(workdir)
    assert {k: exported[k] for k in before} == before  # checkpoints, metrics, config.json
    assert {k.split(os.sep)[0] for k in set(exported) - set(before)} == {"hf", "export"}
    assert (workdir / "hf" / "model.safetensors").is_file()

    proc = run_command(cmd, env, ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == [
        f"{finished}nothing to train; its export is kept as it was ({workdir / 'hf'}); {more}"
    ]
    assert snapshot(workdir) == exported


@pytest.mark.e2e  # three train.py runs, 30-40 s
def test_full_disk_stops_the_run_with_one_line_and_leaves_no_tmp_dir(
    tiny_pretraining_build, tmp_path
):
    workdir = tmp_path / "run"
    cmd = train_cmd(workdir, tiny_pretraining_build, *EVERY, steps=20)
    proc = run([cmd[0], "-c", ENOSPC_AT_10, *cmd[1:]], check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "error: checkpoint 10: saving to " in last, proc.stderr[-3000:]  # bert_jax.cli's line
    assert str(workdir / "checkpoints" / "10") in last and "No space left on device" in last
    assert "Removed the unfinished 10.orbax-checkpoint-tmp" in last
    assert max(losses(workdir)) <= 11  # stopped at the next step, not at the next save
    assert os.listdir(workdir / "checkpoints") == ["5"]
    proc = run(train_cmd(workdir, tiny_pretraining_build, *EVERY, steps=12))
    assert "restored checkpoint 5" in proc.stderr


@pytest.mark.e2e  # two train.py runs at once, 30-35 s
def test_a_second_run_in_the_same_workdir_stops_at_start(tiny_pretraining_build, tmp_path):
    workdir = tmp_path / "run"
    cmd = train_cmd(workdir, tiny_pretraining_build, *EVERY, steps=20)
    first = subprocess.Popen(
        faults.command(cmd),
        env={**env(), faults.FAULT_ENV: "process=0,at=step:1,sleep=120"},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while not (workdir / "run.lock").exists() and time.time() < deadline:
            time.sleep(0.2)
        config_before = (
            (workdir / "config.json").read_text() if (workdir / "config.json").exists() else None
        )
        second = run(cmd + ["--config.seed=7"], check=False, timeout=120)
        assert second.returncode == 1
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"error: {workdir} is in use by another run: pid {first.pid} on host"
        )
        if config_before is not None:  # nothing of the first run was overwritten
            assert (workdir / "config.json").read_text() == config_before
    finally:
        first.send_signal(signal.SIGKILL)  # killed: its lock stays behind
        first.wait()
    assert (workdir / "run.lock").exists()
    third = run(train_cmd(workdir, tiny_pretraining_build, *EVERY, steps=3))
    assert f"taking over the lock of a run that ended (pid {first.pid} is no longer running" in (
        third.stderr
    )
    assert not (workdir / "run.lock").exists()  # released at the end
