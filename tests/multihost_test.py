"""bert_jax.parallel.multihost in one process: the barriers, and tests/faults.py's fault hook
(tests/multiprocess_test.py runs them on two processes, with faults injected)."""

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
