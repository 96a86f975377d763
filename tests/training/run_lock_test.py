"""run_lock: whose lock stops a run and whose is taken over (train.py's two real runs are in
checkpoint_faults_test)."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from bert_jax.training import run_lock


def write_lock(workdir, **fields):
    record = {"pid": 4242, "host": "other-host", "started": "then", "heartbeat": time.time()}
    record.update(fields)
    (workdir / run_lock.LOCK_NAME).write_text(json.dumps(record))


def test_held_then_released_and_a_second_holder_refused(tmp_path):
    with run_lock.hold(tmp_path):
        held = json.loads((tmp_path / run_lock.LOCK_NAME).read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        with pytest.raises(run_lock.RunLockedError, match=f"pid {os.getpid()} on host"):
            run_lock.acquire(tmp_path)
        with pytest.raises(run_lock.RunLockedError, match="Use another --output, or stop"):
            run_lock.acquire(tmp_path, flag="--output")  # the bulk inference job's folder
    assert not (tmp_path / run_lock.LOCK_NAME).exists()


def test_another_hosts_lock_stops_the_run_until_its_heartbeat_is_stale(tmp_path):
    write_lock(tmp_path)
    with pytest.raises(run_lock.RunLockedError, match="pid 4242 on host other-host"):
        run_lock.acquire(tmp_path)
    write_lock(tmp_path, heartbeat=time.time() - run_lock.STALE_S - 1)
    assert run_lock.acquire(tmp_path)["pid"] == os.getpid()


def test_a_dead_pid_on_this_host_is_taken_over(tmp_path):
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(ended.stdout)  # a pid that no longer runs
    write_lock(tmp_path, pid=pid, host=socket.gethostname(), heartbeat=time.time())
    assert run_lock.acquire(tmp_path)["pid"] == os.getpid()
