"""A real multi-process run: 2 local processes x 4 CPU devices (gloo collectives) train exactly as
1 process x 8 devices: same batches row for row, same dropout masks, same losses."""

import os
import socket
import subprocess

import numpy as np
import pytest

from tests.train_test import ROOT, env, losses, run, train_cmd

pytestmark = pytest.mark.multiprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one(tmp_path, tiny_pretraining_build):
    steps = 4
    mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]
    single = tmp_path / "single"
    run(train_cmd(single, tiny_pretraining_build, *mesh, steps=steps), devices=8)

    multi = tmp_path / "multi"
    port = free_port()
    procs = [
        subprocess.Popen(
            train_cmd(
                multi,
                tiny_pretraining_build,
                *mesh,
                f"--coordinator_address=127.0.0.1:{port}",
                "--num_processes=2",
                f"--process_id={i}",
                steps=steps,
            ),
            env=env(4),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-4000:]
    a, b = losses(single), losses(multi)  # only process 0 writes metrics
    assert sorted(a) == sorted(b) == list(range(1, steps + 1))
    np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=1e-5)
    # Both processes took part in the checkpoint (grain writes one data file per process).
    data_files = [
        f for f in os.listdir(multi / "checkpoints" / str(steps) / "data") if f.endswith(".json")
    ]
    assert sorted(data_files) == ["process_0-of-2.json", "process_1-of-2.json"]
