"""Real multi-process runs: 2 local processes x 4 CPU devices (gloo collectives) train exactly as
1 process x 8 devices, with the default settings (export at the end included): same batches row
for row, same dropout masks, same losses, for meshes that split the batch across the hosts and
meshes whose tensor or fsdp axis spans both hosts (the hosts then share batch shards)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from bert_jax.parallel import multihost
from tests import faults
from tests.train_test import ROOT, env, losses, run, train_cmd

pytestmark = pytest.mark.multiprocess

STEPS, RESUME_AT = 8, 4  # a checkpoint at step 4: the elastic runs resume from it
# (data, fsdp, tensor): batch split over the hosts; fsdp and tensor inside each host; one model
# axis across both hosts (every host holds every batch row); fsdp across both hosts.
MESHES = [(8, 1, 1), (2, 2, 2), (1, 1, 8), (1, 8, 1)]
# CI's e2e stage runs (2, 2, 2) (the batch split over the hosts, fsdp and tensor inside each;
# the elastic resume below uses it too; 70 s of 2 cores, out of the default stage for its time);
# the other three run with -m full (`make test-full`), out of CI for its time (about four
# minutes of 2 cores); the rows each host feeds on every mesh are checked by the host-rows test
# below, in the default stage.
E2E_MESHES = [(2, 2, 2)]
EXPORT_ON = "--config.export_hf_at_end=True"  # the default (the tiny test overrides turn it off)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mesh_flags(mesh) -> list[str]:
    return [f"--config.mesh.{a}={n}" for a, n in zip(("data", "fsdp", "tensor"), mesh)]


# Every 2-process launch ends within this (or the test fails with both processes' last output).
LAUNCH_TIMEOUT_S = 600


class TwoProcesses:
    """Process 0 and 1 of a 2-process job (4 CPU devices each), their output in files.

    `make_cmd(process flags)` gives each command; `fault` (optional) is each process's
    BERT_JAX_FAULT_INJECT (tests/faults.py, whose program then runs it); `extra_env`, variables
    both processes get. Every wait has a timeout that kills both processes and fails the test
    with both processes' last output."""

    def __init__(self, make_cmd, directory, fault=(None, None), extra_env=None):
        port = free_port()
        directory.mkdir(parents=True, exist_ok=True)
        self.logs = [directory / f"process{i}.{s}" for i in range(2) for s in ("out", "err")]
        self.procs = []
        for i in range(2):
            e = {**env(4), **(extra_env or {})}
            e.pop(faults.FAULT_ENV, None)
            cmd = make_cmd(
                [
                    f"--coordinator_address=127.0.0.1:{port}",
                    "--num_processes=2",
                    f"--process_id={i}",
                ]
            )
            if fault[i]:  # train.py run by the program that installs the fault hooks
                e[faults.FAULT_ENV] = fault[i]
                cmd = faults.command(cmd)
            with open(self.logs[2 * i], "w") as out, open(self.logs[2 * i + 1], "w") as err:
                self.procs.append(subprocess.Popen(cmd, env=e, cwd=ROOT, stdout=out, stderr=err))
        self.exited_at = [None, None]

    def output(self, i: int) -> tuple[str, str]:
        return tuple(self.logs[2 * i + k].read_text() for k in range(2))

    def last_output(self) -> str:
        return "".join(
            f"\n--- process {i} (exit status {p.poll()}):\n{out[-2000:]}{err[-4000:]}"
            for i, p in enumerate(self.procs)
            for out, err in [self.output(i)]
        )

    def _poll(self) -> None:
        for i, p in enumerate(self.procs):
            if self.exited_at[i] is None and p.poll() is not None:
                self.exited_at[i] = time.monotonic()

    def _fail(self, why: str):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        pytest.fail(f"{why}{self.last_output()}")

    def wait_for(self, i: int, text: str, timeout: float = LAUNCH_TIMEOUT_S) -> None:
        """Waits until process i's stderr shows `text`."""
        self.wait_until(lambda: text in self.output(i)[1], f"process {i} printed {text!r}", timeout)

    def wait_until(self, condition, what: str, timeout: float = LAUNCH_TIMEOUT_S) -> None:
        """Waits, both processes running, until `condition()` holds (`what` names it)."""
        deadline = time.monotonic() + timeout
        while not condition():
            self._poll()
            if any(t is not None for t in self.exited_at) or time.monotonic() > deadline:
                self._fail(f"never true while both processes ran: {what}")
            time.sleep(0.2)

    def wait(self, timeout: float = LAUNCH_TIMEOUT_S) -> list[int]:
        """Both exit statuses, once both processes ended."""
        deadline = time.monotonic() + timeout
        while None in self.exited_at:
            self._poll()
            if time.monotonic() > deadline:
                self._fail(f"the 2-process job did not end within {timeout:.0f} s")
            time.sleep(0.1)
        return [p.returncode for p in self.procs]

    def check(self, timeout: float = LAUNCH_TIMEOUT_S) -> list[tuple[str, str]]:
        """(stdout, stderr) of each process, after checking that both succeeded."""
        codes = self.wait(timeout)
        if codes != [0, 0]:
            self._fail(f"exit statuses {codes}, expected [0, 0]")
        return [self.output(i) for i in range(2)]


def two_processes(make_cmd, directory, timeout=LAUNCH_TIMEOUT_S) -> list[tuple[str, str]]:
    """Runs make_cmd(process flags) as process 0 and 1 of 2 (4 devices each), their output in
    `directory`; (stdout, stderr) of each, after checking that both succeeded within `timeout`."""
    return TwoProcesses(make_cmd, directory).check(timeout)


def pretrain_cmd(workdir, build, mesh, *extra):
    """train.py with the defaults (export on), checkpoints every RESUME_AT steps."""
    return train_cmd(
        workdir,
        build,
        *mesh_flags(mesh),
        EXPORT_ON,
        f"--config.checkpoint_every_steps={RESUME_AT}",
        *extra,
        steps=STEPS,
    )


def resumed_from(workdir, source) -> None:
    """A new run directory holding only `source`'s checkpoint of step RESUME_AT."""
    os.makedirs(workdir / "checkpoints")
    shutil.copytree(
        source / "checkpoints" / str(RESUME_AT), workdir / "checkpoints" / str(RESUME_AT)
    )


def assert_same_losses(got, want, first=1):
    a, b = losses(want), losses(got)  # only process 0 writes metrics
    steps = list(range(first, STEPS + 1))
    assert sorted(b) == steps and sorted(a) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([b[s] for s in steps], [a[s] for s in steps], rtol=1e-5)


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_pretraining_build):
    """One process x 8 devices, mesh (8, 1, 1): the run every 2-process run must reproduce."""
    workdir = tmp_path_factory.mktemp("single") / "run"
    run(pretrain_cmd(workdir, tiny_pretraining_build, MESHES[0]), devices=8)
    return workdir


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory, tiny_pretraining_build):
    """mesh -> the directory of a 2-process run from scratch on it (each mesh runs once)."""
    done = {}

    def get(mesh):
        if mesh not in done:
            workdir = tmp_path_factory.mktemp("multi") / "run"
            two_processes(
                lambda flags: pretrain_cmd(workdir, tiny_pretraining_build, mesh, *flags),
                workdir.parent / "logs",
            )
            done[mesh] = workdir
        return done[mesh]

    return get


@pytest.mark.parametrize(
    "mesh",
    [
        pytest.param(m, marks=pytest.mark.e2e if m in E2E_MESHES else pytest.mark.full)
        for m in MESHES
    ],
    ids=lambda m: "x".join(map(str, m)),
)
def test_two_processes_equal_one(mesh, single, two_process_run):
    multi = two_process_run(mesh)
    assert_same_losses(multi, single)
    # Both processes took part in the checkpoint (grain writes one data file per process).
    data_files = [
        f for f in os.listdir(multi / "checkpoints" / str(STEPS) / "data") if f.endswith(".json")
    ]
    assert sorted(data_files) == ["process_0-of-2.json", "process_1-of-2.json"]
    # The export at the end (every process in the Orbax save) holds the trained parameters.
    from bert_jax.checkpoints import native, table

    cfg, exported, model = native.load_pretrained(multi / "export")
    _, expected, _ = native.load_pretrained(single / "export")
    assert model == "BertForPreTraining"
    got, want = (
        table.check_params(cfg, exported, model),
        table.check_params(cfg, expected, model),
    )
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-6, err_msg=key)
    transformers = pytest.importorskip("transformers")
    _, info = transformers.BertForPreTraining.from_pretrained(
        multi / "hf", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert (multi / "hf" / "tokenizer.json").is_file()


@pytest.mark.full  # about 45 s of three runs (-m full); resharding a checkpoint: checkpointing_test
def test_elastic_resume_one_to_two_processes_and_back(
    single, two_process_run, tmp_path, tiny_pretraining_build
):
    """Step 4 of a 1 x 8 run resumed on 2 x 4 (and step 4 of a 2 x 4 run on 1 x 8) trains steps
    5 to 8 exactly as the straight run: same step, same global batches, same losses."""
    up = tmp_path / "up"
    resumed_from(up, single)
    outputs = two_processes(
        lambda flags: pretrain_cmd(up, tiny_pretraining_build, (2, 2, 2), *flags),
        tmp_path / "logs",
    )
    assert all(f"restored checkpoint {RESUME_AT}" in err for _, err in outputs)
    assert_same_losses(up, single, first=RESUME_AT + 1)

    down = tmp_path / "down"
    resumed_from(down, two_process_run((2, 2, 2)))
    proc = run(pretrain_cmd(down, tiny_pretraining_build, MESHES[0]), devices=8)
    assert f"restored checkpoint {RESUME_AT}" in proc.stderr
    assert_same_losses(down, single, first=RESUME_AT + 1)


# Runs in both processes of a 2 x 4 device job: the rows each host feeds for the meshes above,
# the startup check on batches that do not fit the mesh, an export that process 0 refuses, and
# the shared file system check of the default corpus.
CHECKS = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
    import numpy as np
    from bert_jax.checkpoints import native
    from bert_jax.parallel import sharding
    from bert_jax.models.bert.config import BertConfig

    out = {}
    for mesh in [(8, 1, 1), (2, 2, 2), (1, 1, 8), (1, 8, 1)]:
        m = sharding.make_mesh(dict(zip(("data", "fsdp", "tensor"), mesh)))
        rows = sharding.host_batch_rows(m, 16)
        glob = sharding.global_batch_from_local({"x": np.stack([rows, rows * 10], 1)}, m)["x"]
        local = np.concatenate([s.data for s in sorted(
            glob.addressable_shards, key=lambda s: (s.index[0].start or 0))])
        out[str(mesh)] = {
            "rows": rows.tolist(),
            "shape": list(glob.shape),
            "fraction": sharding.host_batch_fraction(m),
            "devices_see_their_rows": bool(all(
                (np.asarray(s.data)[:, 0] == np.arange(16)[s.index[0]]).all()
                for s in glob.addressable_shards)),
        }
        sharding.check_host_batches({"x": np.stack([rows, rows * 10], 1)}, m)
    shared = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 8})
    try:  # both hosts hold every row, but read different data
        sharding.check_host_batches({"x": np.full((16, 2), jax.process_index())}, shared)
        out["mismatch"] = None
    except ValueError as e:
        out["mismatch"] = str(e)
    cfg = BertConfig(vocab_size=99, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=5, max_position_embeddings=16)
    from bert_jax.models.families import get_model_class
    from bert_jax.models.params import init_params
    import flax.linen as nn
    params = jax.device_get(nn.meta.unbox(
        init_params(get_model_class("BertModel")(cfg), jax.random.PRNGKey(0))))
    native.save_pretrained(sys.argv[3], cfg, params, "BertModel")
    try:  # exists: process 0 refuses, and every process raises instead of waiting
        native.save_pretrained(sys.argv[3], cfg, params, "BertModel")
        out["refused"] = None
    except FileExistsError as e:
        out["refused"] = str(e)
    from bert_jax.pretrain import inputs
    inputs.require_shared_directory(sys.argv[4])  # both processes see it
    try:  # a directory of each host's own (no shared file system)
        inputs.require_shared_directory(sys.argv[5] + f"/host{jax.process_index()}")
        out["unshared"] = None
    except ValueError as e:
        out["unshared"] = str(e)
    print("RESULT " + json.dumps(out))
    """
)


def test_host_rows_startup_check_refused_export_and_unshared_directory(tmp_path):
    export = tmp_path / "export"
    outputs = two_processes(
        lambda flags: [
            sys.executable,
            "-c",
            CHECKS,
            flags[0].split("=", 1)[1],
            flags[2].split("=", 1)[1],
            str(export),
            str(tmp_path / "shared"),
            str(tmp_path),
        ],
        tmp_path / "logs",
        timeout=300,
    )
    results = [
        json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
        for out, _ in outputs
    ]
    for mesh in map(str, MESHES):
        rows = [r[mesh]["rows"] for r in results]
        for r in results:  # every device got its own rows of a [16, 2] global batch
            assert r[mesh]["shape"] == [16, 2] and r[mesh]["devices_see_their_rows"], mesh
            assert r[mesh]["fraction"] == len(r[mesh]["rows"]) / 16
        if mesh == str((1, 1, 8)):  # the tensor axis spans both hosts: both read every row
            assert rows == [list(range(16))] * 2
        else:  # the batch is split over the hosts: disjoint halves
            assert sorted(rows[0] + rows[1]) == list(range(16)) and len(rows[0]) == 8, mesh
    for r in results:
        assert "read different data for rows [0, 1, 2" in r["mismatch"]
        assert "already holds ['config.json', 'params']" in r["refused"] or (
            "already holds an export" in r["refused"]
        )
    assert (export / "params").is_dir() and (export / "config.json").is_file()
    for r in results:  # the default corpus needs a shared file system: every process says so
        assert r["unshared"].startswith("process(es) [1] cannot see the files process 0 writes")


# Fine-tunes the sentiment task of tests/finetune/run_test.py with defaults (dev evaluation every
# epoch, prediction files and export at the end): argv = data dir, vocab dir, workdir, and in a
# 2-process run the coordinator address and process id.
FINETUNE = textwrap.dedent(
    """
    import sys
    import jax
    if len(sys.argv) > 4:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(sys.argv[4], 2, int(sys.argv[5]))
    from bert_jax.finetune import run as finetune_run
    from tests.finetune.run_test import finetune_config

    config = finetune_config("custom", sys.argv[1], sys.argv[2], **{
        "finetune.num_epochs": 2, "mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 8})
    finetune_run.train_and_evaluate(config, sys.argv[3])
    """
)


# About 45 s of two processes (-m full); the pretraining step: test_two_processes_equal_one.
@pytest.mark.full
def test_finetuning_on_two_processes_equals_one(tmp_path):
    from tests.finetune.run_test import sentiment_files, write_vocab

    data = tmp_path / "data"
    data.mkdir()
    sentiment_files(data)
    vocab = write_vocab(tmp_path / "vocab")
    single, multi = tmp_path / "single", tmp_path / "multi"
    script = [sys.executable, "-c", FINETUNE, str(data), str(vocab)]
    run([*script, str(single)], devices=8)
    two_processes(
        lambda flags: [
            *script,
            str(multi),
            flags[0].split("=", 1)[1],
            flags[2].split("=", 1)[1],
        ],
        tmp_path / "logs",
    )
    a = json.loads((single / "results.json").read_text())
    b = json.loads((multi / "results.json").read_text())
    assert a["mean"].keys() == b["mean"].keys() and "accuracy" in a["mean"]
    for key in a["mean"]:
        np.testing.assert_allclose(b["mean"][key], a["mean"][key], rtol=1e-6, err_msg=key)
    for name in ("dev_predictions.tsv", "test_predictions.tsv"):
        assert (multi / "predictions" / name).read_text() == (
            single / "predictions" / name
        ).read_text()
    assert (multi / "hf" / "model.safetensors").is_file()
    assert (multi / "export" / "params").is_dir()


# ---- failures: one process fails, every process ends (bert_jax.parallel.multihost) ----
# The job's defaults as a new user runs them (the default corpus, export on), made small.
DEFAULT_RUN = [
    "--config=" + os.path.join(ROOT, "configs", "pretrain.py") + ":size=tiny",
    "--config.num_train_steps=4",
    "--config.global_batch_size=16",
    "--config.mesh.data=8",
    "--config.checkpoint_every_steps=2",
    "--config.num_eval_steps=2",
]


def default_cmd(workdir, flags, *extra):
    return [sys.executable, os.path.join(ROOT, "train.py"), f"--workdir={workdir}",
            *DEFAULT_RUN, *extra, *flags]  # fmt: skip


def checkpoints(workdir) -> list[int]:
    return sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())


def assert_statuses(job: TwoProcesses, statuses) -> None:
    """Both exit statuses are `statuses`; process 1 may instead have been aborted by the end of
    process 0, which holds the coordination service (process 0 leaves last, 1 s after the others
    say they are exiting, but a loaded machine can stretch that)."""
    codes = job.wait()
    assert codes[0] == statuses[0] and codes[1] in (statuses[1], -signal.SIGABRT), (
        f"exit statuses {codes}, expected {list(statuses)}{job.last_output()}"
    )


def fails_together(job: TwoProcesses, failed: int) -> float:
    """Checks that both processes exited with status 1, the other one naming process `failed`'s
    error; returns the seconds between the two exits (at most multihost.FAILURE_BOUND_S)."""
    assert_statuses(job, (1, 1))
    gap = abs(job.exited_at[0] - job.exited_at[1])
    assert gap < multihost.FAILURE_BOUND_S, job.last_output()
    other = 1 - failed
    assert f"process {failed} failed: InjectedFault" in job.output(other)[1], job.last_output()
    assert f"process {failed} failed: InjectedFault" in job.output(failed)[1]
    return gap


@pytest.mark.e2e  # 60-75 s of two processes; the one-process races: multihost_test
def test_default_run_survives_failures_and_resumes(tmp_path):
    """The README's 2-process run with every default (the default corpus built once, export on),
    with an exception in process 1 at the data build, at step 3 and at the export: each ends both
    processes (status 1, the other naming the error), and each later run resumes from the last
    complete checkpoint, until a run without faults exports."""
    workdir = tmp_path / "run"

    def job(name, fault1=None, *extra):
        return TwoProcesses(
            lambda flags: default_cmd(workdir, flags, *extra), tmp_path / name, (None, fault1)
        )

    # Process 0 is building the corpus when process 1 fails: its build ends unfinished.
    fails_together(job("build", "process=1,at=data_build"), failed=1)
    assert not (workdir / "checkpoints").exists()
    # The build is finished by the next run (idempotent); step 3 fails after checkpoint 2.
    fails_together(job("step", "process=1,at=step:3"), failed=1)
    assert checkpoints(workdir) == [2]
    # Trained to the end (checkpoint 4 saved), the export fails.
    fails_together(job("export", "process=1,at=export"), failed=1)
    assert checkpoints(workdir) == [2, 4] and not (workdir / "hf").exists()
    outputs = job("done").check()
    assert all("restored checkpoint 4" in err for _, err in outputs)
    assert (workdir / "hf" / "model.safetensors").is_file()
    assert (workdir / "hf" / "tokenizer.json").is_file() and (workdir / "export").is_dir()
    assert not (workdir / "data" / ".shared-by-all-processes").exists()


@pytest.mark.full  # 60-75 s of two processes (-m full); a failed process ends the job and it
# resumes in CI: test_default_run_survives_failures_and_resumes; Ctrl-C: the default suite
def test_killed_or_terminated_process_ends_the_job_and_it_resumes(tmp_path, tiny_pretraining_build):
    """SIGKILL of process 1 mid-run ends process 0 (the coordination service misses its
    heartbeats); SIGTERM of both while process 1 waits at a barrier ends both at once (status
    143); each later run resumes from the last complete checkpoint."""
    workdir = tmp_path / "run"

    def job(name, fault, steps=4):
        cmd = lambda flags: train_cmd(  # noqa: E731
            workdir, tiny_pretraining_build, EXPORT_ON, "--config.checkpoint_every_steps=2",
            "--config.num_eval_steps=1", *flags, steps=steps,
        )  # fmt: skip
        return TwoProcesses(cmd, tmp_path / name, fault)

    killed = job("kill", (None, "process=1,at=step:3,sleep=600"))
    killed.wait_for(1, "sleeping 600 s at step:3")
    # Checkpoint 2 is saved in the background; on a loaded machine its commit can still be in
    # flight when process 1 sleeps (a kill then leaves no complete checkpoint, rightly).
    committed = lambda: (workdir / "checkpoints").is_dir() and checkpoints(workdir) == [2]  # noqa: E731
    killed.wait_until(committed, "checkpoint 2 committed")
    killed.procs[1].kill()
    start = time.monotonic()
    assert killed.wait()[1] == -signal.SIGKILL
    assert killed.procs[0].returncode != 0, killed.last_output()
    took = killed.exited_at[0] - start
    assert took < multihost.FAILURE_BOUND_S, killed.last_output()
    assert "stopped sending heartbeats" in killed.output(0)[1], killed.last_output()
    assert checkpoints(workdir) == [2]

    terminated = job("term", ("process=0,at=export,sleep=600", None))
    terminated.wait_for(0, "sleeping 600 s at export")
    terminated.wait_for(1, "waiting at barrier 'export'")
    for p in terminated.procs:
        p.send_signal(signal.SIGTERM)
    start = time.monotonic()
    assert_statuses(terminated, (143, 143))
    assert max(terminated.exited_at) - start < multihost.TERM_GRACE_S + 5
    assert "restored checkpoint 2" in terminated.output(0)[1]
    assert checkpoints(workdir) == [2, 4] and not (workdir / "hf").exists()

    outputs = job("done", (None, None)).check()
    assert all("restored checkpoint 4" in err for _, err in outputs)
    assert (workdir / "hf" / "model.safetensors").is_file()


@pytest.mark.e2e  # two processes, 25-30 s; one process's Ctrl-C: train_test
def test_ctrl_c_on_one_host_stops_every_host_at_one_step_with_130(tmp_path, tiny_pretraining_build):
    """SIGINT reaches process 1 only (after step 2): both processes agree at the next step's
    stop check, save that step's checkpoint together, and both exit 130 (stopped, not done)."""
    workdir = tmp_path / "run"
    cmd = lambda flags: train_cmd(  # noqa: E731
        workdir, tiny_pretraining_build, "--config.checkpoint_every_steps=1000", *flags, steps=6
    )
    job = TwoProcesses(cmd, tmp_path / "logs", (None, "process=1,at=step:2,signal=INT"))
    assert_statuses(job, (130, 130))
    assert checkpoints(workdir) == [3]
    assert "Stopped by SIGINT at step 3 of 6" in job.output(0)[0], job.last_output()
