"""bert_jax.parallel.multihost in one process: the barriers, and tests/faults.py's fault hook
(tests/parallel/multiprocess_test.py runs them on two processes, with faults injected)."""

import json
import logging
import threading
import time

import pytest

from bert_jax.parallel import multihost
from tests import faults


def test_inject_fault_only_where_and_on_the_process_asked(monkeypatch):
    monkeypatch.delenv(faults.FAULT_ENV, raising=False)
    faults.inject_fault("step:3")  # no variable: nothing
    monkeypatch.setenv(faults.FAULT_ENV, "process=0,at=step:3")
    faults.inject_fault("step:2")
    faults.inject_fault("export")
    with pytest.raises(faults.InjectedFault, match="at step:3"):
        faults.inject_fault("step:3")
    monkeypatch.setenv(faults.FAULT_ENV, "process=1,at=step:3")  # another process's
    faults.inject_fault("step:3")
    monkeypatch.setenv(faults.FAULT_ENV, "process=0,at=export,sleep=0.01")
    faults.inject_fault("export")  # sleeps instead of raising


def test_barriers_of_one_process_return_at_once():
    multihost.barrier("alone", timeout_s=0)
    assert multihost.all_gather("alone", "x", timeout_s=0) == ["x"]
    assert multihost.broadcast("alone", "y") == "y"
    assert multihost.any_process("alone", True) and not multihost.any_process("alone", False)
    with multihost.guard():  # a no-op without other processes
        pass


def test_the_bound_covers_its_parts():
    assert multihost.HEARTBEAT_TIMEOUT_S + 2 * multihost.POLL_INTERVAL_S < multihost.FAILURE_BOUND_S
    assert multihost.ACK_TIMEOUT_S + multihost.TERM_GRACE_S < multihost.FAILURE_BOUND_S


class _Store:
    """The coordination service's key-value store, as `_Guard` uses it, shared by threads."""

    def __init__(self):
        self.kv, self.lock = {}, threading.Lock()

    def key_value_set(self, key, value):
        with self.lock:
            if key in self.kv:
                raise RuntimeError(f"ALREADY_EXISTS: {key}")
            self.kv[key] = value

    def key_value_dir_get(self, prefix):
        with self.lock:
            return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]

    def blocking_key_value_get(self, key, timeout_ms):
        deadline = time.monotonic() + timeout_ms / 1000
        while time.monotonic() < deadline:
            with self.lock:
                if key in self.kv:
                    return self.kv[key]
            time.sleep(0.01)
        raise TimeoutError(key)


class _Left(Exception):
    pass


def test_a_stop_of_every_process_at_once_ends_the_first_at_once_too(monkeypatch):
    """SIGTERM on both processes: process 0 publishes its stop first; process 1's main thread,
    failing second, reads it and leaves without acknowledging it. Process 0, waiting for
    acknowledgements, must take process 1's leaving for one, or it lingers ACK_TIMEOUT_S (10 s)
    past its stop, as a full run saw (both processes must end within TERM_GRACE_S + 5 s)."""

    def leave_now(code):
        raise _Left(code)

    monkeypatch.setattr(multihost, "_exit", leave_now)
    store = _Store()
    guards = []
    for me in (0, 1):
        guard = object.__new__(multihost._Guard)  # no watcher thread, no signal handlers
        guard.client, guard.me, guard.n, guard.exit_lock = store, me, 2, threading.Lock()
        guards.append(guard)
    ended = {}

    def process_0():
        start = time.monotonic()
        try:
            guards[0].fail("SIGTERM outside the training loop", 143, kind="stopped")
        except _Left as e:
            ended[0] = (e.args[0], time.monotonic() - start)

    thread = threading.Thread(target=process_0)
    thread.start()
    while not store.key_value_dir_get(f"{multihost._PREFIX}/failed/0"):
        time.sleep(0.01)
    with pytest.raises(_Left) as left:
        guards[1].fail("SIGTERM outside the training loop", 143, kind="stopped")
    thread.join(timeout=30)
    assert left.value.args[0] == 143
    code, seconds = ended[0]
    assert code == 143 and seconds < multihost.ACK_TIMEOUT_S / 2, seconds


def test_a_bucket_out_of_reach_under_the_guard_is_one_error_line(monkeypatch, caplog):
    """A process of a multi-process job (`inference embed --num_processes=2`, `embed.mine`) that
    cannot reach its gs:// bucket: `guard` logs "error: cannot reach gs://...", as a
    single-process command prints it, not the storage client's traceback, and tells the other
    processes that. (Two processes here are one process with the coordination store faked.)"""
    tf_errors = pytest.importorskip("tensorflow").errors
    from tests.paths_test import NO_HOST

    def leave_now(code):
        raise _Left(code)

    store = _Store()
    monkeypatch.setattr(multihost.jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost, "_client", lambda: store)
    monkeypatch.setattr(multihost, "ACK_TIMEOUT_S", 0.1)  # nobody acknowledges here
    monkeypatch.setattr(multihost, "_exit", leave_now)
    with caplog.at_level(logging.ERROR), pytest.raises(_Left) as left:
        with multihost.guard():
            raise tf_errors.FailedPreconditionError(None, None, NO_HOST)
    assert left.value.args[0] == 1
    said = "cannot reach gs://some-bucket/run: Could not resolve host: www.googleapis.com"
    logged = [r.getMessage() for r in caplog.records]
    assert f"error: {said}" in logged, logged
    assert not any("Traceback" in m for m in logged), logged
    (record,) = [json.loads(v) for k, v in store.kv.items() if "/failed/" in k]
    assert record["error"] == f"StorageUnreachableError: {said}"
