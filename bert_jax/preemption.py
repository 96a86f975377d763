"""Clean stops on SIGTERM / SIGINT (preemptible TPUs, spot GPUs, Ctrl-C).

The training loop asks `should_stop(step)` once per step; when it answers True the loop saves a
checkpoint and exits normally. With several processes, all must stop at the same step: JAX's
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


class PreemptionWatcher:
    """Turns SIGTERM/SIGINT into a flag the loop polls; restores the old handlers on `close`."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self._event = threading.Event()
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
            return self._event.is_set()
        try:
            if multihost_utils.reached_preemption_sync_point(step):
                return True
        except RuntimeError:  # no preemption sync manager (jax.distributed not initialized)
            pass
        if not sync_point:
            return False
        flags = multihost_utils.process_allgather(np.array(self._event.is_set()))
        return bool(np.any(flags))

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
