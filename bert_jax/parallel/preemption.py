"""Clean stops on SIGTERM / SIGINT (preemptible TPUs, spot GPUs, Ctrl-C).

The training loop asks `should_stop(step)` once per step; when it answers True the loop saves a
checkpoint and ends; the command then exits with 128 + the signal (`stopped_by`, `bert_jax.cli`:
130 for Ctrl-C, 143 for SIGTERM), never 0, so an unfinished run is not taken for a finished one.
With several processes, all must stop at the same step: JAX's
preemption sync point (the coordination service notices SIGTERM on any host) decides, so no host
waits forever for a collective the others left.
"""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

# The signal that stopped this process's last training loop (None: none did), for its exit status.
_stopped_by: int | None = None


def stopped_by() -> int | None:
    """The signal number (SIGINT, SIGTERM) that stopped this process's last training loop, or
    None when it ran to its end (or no loop ran). A command exits with 128 + it."""
    return _stopped_by


class PreemptionWatcher:
    """Turns SIGTERM/SIGINT into a flag the loop polls; restores the old handlers on `close`."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        global _stopped_by
        _stopped_by = None
        self._event = threading.Event()
        self.signum: int | None = None  # the first signal received here
        self.stop_signal: int | None = None  # the signal every process agreed to stop on
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        del frame
        if self._event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        logging.warning(
            "received %s: saving a checkpoint and stopping", signal.Signals(signum).name
        )
        self.signum = self.signum or signum
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def should_stop(self, step: int, *, sync_point: bool = False) -> bool:
        """Whether every process should save and stop after `step`.

        Every process must call this at every step with the same arguments. With one process the
        local flag decides. With several, a SIGTERM anywhere is agreed through JAX's preemption
        sync point (cheap, each step); other local requests (SIGINT reaches one process only) are
        agreed by an all-gather of the flags at `sync_point` steps (the loop passes its logging
        steps, where it synchronizes anyway).
        """
        if jax.process_count() == 1:
            return self._stop(self.signum if self._event.is_set() else None)
        try:
            if multihost_utils.reached_preemption_sync_point(step):
                return self._stop(signal.SIGTERM)
        except RuntimeError:  # no preemption sync manager (jax.distributed not initialized)
            pass
        if not sync_point:
            return False
        # Each process's signal (0: none); every process stops with the first one's.
        signums = multihost_utils.process_allgather(np.array(self.signum or 0, np.int32))
        requested = [int(s) for s in np.ravel(signums) if s]
        return self._stop(requested[0] if requested else None)

    def _stop(self, signum: int | None) -> bool:
        """Keeps `signum` as the agreed stop's signal (`stop_signal`); whether there is one."""
        if signum is None:
            return False
        self.stop_signal = signum
        return True

    def stopped(self) -> None:
        """The loop stopped early on the agreed request: `stopped_by()` returns its signal."""
        global _stopped_by
        _stopped_by = self.stop_signal

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
