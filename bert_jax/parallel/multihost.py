"""Multi-process runs that end together: waits with timeouts, and a failure on one process ends all.

A process that raises while the others wait for it in a collective would leave them waiting
forever. This module makes every way a process can end reach the others (what a user sees:
docs/pod.md, "When a host fails"):

* An exception is caught by `guard` around the job: the process logs it (`bert_jax.cli`),
  publishes "process i failed: <error>" in the key-value store of JAX's coordination service,
  waits up to `ACK_TIMEOUT_S` for the others to read it, and exits with status 1. It never enters
  `jax.distributed`'s shutdown barrier, which would wait for processes that wait for it.
* A watcher thread in every process reads those records every `POLL_INTERVAL_S` and, on another
  process's, logs it and exits with status 1 at once, whatever the main thread waits for.
* A process that dies without a word stops sending heartbeats: the coordination service aborts
  every other after `HEARTBEAT_TIMEOUT_S` (status 134); when process 0 dies, at once.
* SIGTERM (or SIGINT) outside the training loop raises `Terminated` in the main thread; one
  blocked in a collective is ended by the watcher after `TERM_GRACE_S`. The stop is published
  like a failure; the status is 128 + the signal. Inside the loop SIGTERM is the loop's
  (`bert_jax.parallel.preemption`).
* Every barrier outside the compiled step (`barrier`, `all_gather`, `broadcast`) runs on the
  key-value store with a timeout and raises `BarrierTimeoutError` naming the absent processes.

So every process exits within `FAILURE_BOUND_S` of a failure; tests/faults.py puts those faults
at named points of a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator

import jax
from absl import logging

from bert_jax import cli

# A process that stops sending heartbeats is dead after this long. JAX's default is 100 s; the
# heartbeats come from a thread of their own, so long compiles and host work do not delay them.
HEARTBEAT_TIMEOUT_S = 20
# How long a process waits at exit for every other process to reach jax.distributed's shutdown
# (the end barrier of `guard` has already brought them together, so this only bounds a hang).
SHUTDOWN_TIMEOUT_S = 60
# How often the watcher thread reads the failure records.
POLL_INTERVAL_S = 0.5
# How long a failing process keeps running (process 0 holds the coordination service) so that the
# others read its error before it goes.
ACK_TIMEOUT_S = 10
# A main thread that a SIGTERM outside the loop has not ended in this long is blocked in a
# collective: the watcher ends the process.
TERM_GRACE_S = 5
# Barriers outside the step wait this long by default (the default corpus's build and the end of
# the job wait longer, see the callers).
BARRIER_TIMEOUT_S = 600
# Every process exits within this long of a failure anywhere: about a second after an
# exception's record, HEARTBEAT_TIMEOUT_S plus a second or two after a silent death,
# TERM_GRACE_S after a SIGTERM outside the loop.
FAILURE_BOUND_S = 60

# Process 0 outlives the other exiting processes by this much (its end aborts them).
_EXIT_MARGIN_S = 1.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PREFIX = "bert_jax"


class BarrierTimeoutError(TimeoutError):
    """Some processes never reached a barrier within its timeout."""


class Terminated(BaseException):
    """SIGTERM/SIGINT outside the training loop (like KeyboardInterrupt, not an Exception)."""

    def __init__(self, signum: int):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """`jax.distributed.initialize` with this module's heartbeat and shutdown timeouts (arguments
    left None are detected from the cluster: TPU pods, SLURM, Open MPI)."""
    jax.distributed.initialize(
        coordinator_address,
        num_processes,
        process_id,
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
        shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
    )


def initialize_job(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """jax.distributed for a job's command line (train.py, bulk inference): with
    --coordinator_address, those flags (CPU processes then talk over gloo); else on a cluster JAX
    detects itself (TPU pods, SLURM, Open MPI with more than one task); else nothing (one
    process)."""
    env = os.environ
    if coordinator_address:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes only
        initialize(coordinator_address, num_processes, process_id)
    elif (
        int(env.get("SLURM_NTASKS", "1")) > 1
        or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
        or "," in env.get("TPU_WORKER_HOSTNAMES", "")
    ):
        initialize()


def _client():
    """The coordination service's client (None without jax.distributed)."""
    from jax._src import distributed

    return distributed.global_state.client


_calls: dict[str, int] = {}  # barrier name -> calls so far (every process calls in one order)


def all_gather(name: str, value: str, *, timeout_s: float = BARRIER_TIMEOUT_S) -> list[str]:
    """Every process's `value`, in process order: a barrier that carries a string.

    Every process must call it with the same `name` (in the same order as its other calls of that
    name). Waits on the coordination service's key-value store, so the watcher thread's exit on a
    peer's failure and a SIGTERM (`Terminated`) both end the wait.

    Raises:
      BarrierTimeoutError: some processes did not arrive within `timeout_s`; names them.
    """
    n = jax.process_count()
    if n == 1:
        return [value]
    client = _client()
    if client is None:
        raise RuntimeError(f"barrier {name!r}: {n} processes but no jax.distributed client")
    count = _calls[name] = _calls.get(name, 0) + 1
    prefix = f"{_PREFIX}/barrier/{name}/{count}/"
    client.key_value_set(prefix + str(jax.process_index()), value)
    deadline, pause = time.monotonic() + timeout_s, 0.01
    while True:
        entries = dict(client.key_value_dir_get(prefix))
        found = {int(k.rsplit("/", 1)[1]): v for k, v in entries.items()}
        if len(found) == n:
            return [found[i] for i in range(n)]
        if time.monotonic() > deadline:
            missing = sorted(set(range(n)) - set(found))
            raise BarrierTimeoutError(
                f"barrier {name!r}: process(es) {missing} did not arrive within {timeout_s:.0f} s"
            )
        time.sleep(pause)  # a Python wait: signal handlers run between sleeps
        pause = min(pause * 2, 0.2)


def barrier(name: str, *, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Waits until every process calls `barrier(name)`; see `all_gather`."""
    if jax.process_count() > 1:
        logging.info("waiting at barrier %r", name)
    all_gather(name, "", timeout_s=timeout_s)


def broadcast(name: str, value: str, *, timeout_s: float = BARRIER_TIMEOUT_S) -> str:
    """Process 0's `value` on every process (a barrier; see `all_gather`)."""
    return all_gather(name, value, timeout_s=timeout_s)[0]


def any_process(name: str, flag: bool, *, timeout_s: float = BARRIER_TIMEOUT_S) -> bool:
    """Whether `flag` is set on any process (a barrier; see `all_gather`)."""
    return "1" in all_gather(name, "1" if flag else "0", timeout_s=timeout_s)


class _Guard:
    """What `guard` runs: the watcher thread, the signal handlers and the exits."""

    def __init__(self):
        self.client = _client()
        self.me, self.n = jax.process_index(), jax.process_count()
        self.exit_lock = threading.Lock()
        self.closing = threading.Event()
        self.term_at = None  # monotonic time of a signal the watcher saw
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous_handler = signal.signal(signal.SIGTERM, self.on_signal)
        self.previous_wakeup = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self.watch, name="multihost-watcher", daemon=True)
        self.thread.start()

    def on_signal(self, signum, frame):
        del frame
        raise Terminated(signum)

    def processes(self, directory: str) -> set[int]:
        """The other processes with a key in `directory` (keys end in the process index)."""
        keys = (k for k, _ in self.client.key_value_dir_get(directory))
        return {int(k.rsplit("/", 1)[1]) for k in keys} - {self.me}

    def records(self) -> dict[int, dict]:
        """Other processes' failure records (process -> record)."""
        out = {}
        for key, value in self.client.key_value_dir_get(f"{_PREFIX}/failed/"):
            process = int(key.rsplit("/", 1)[1])
            if process != self.me:
                out[process] = json.loads(value)
        return out

    def watch(self) -> None:
        while not self.closing.is_set():
            ready, _, _ = select.select([self.read_fd], [], [], POLL_INTERVAL_S)
            if ready:
                signums = [s for s in os.read(self.read_fd, 64) if s in _STOP_SIGNALS]
                # Inside the loop its own handler is installed: the loop stops cleanly.
                if signums and signal.getsignal(signal.SIGTERM) == self.on_signal:
                    self.term_at = self.term_at or (time.monotonic(), signums[-1])
            if self.closing.is_set():
                return
            try:
                records = self.records()
            except Exception:  # the client is shutting down
                return
            for process, record in sorted(records.items()):
                self.peer_failed(process, record)
            if self.term_at and time.monotonic() - self.term_at[0] > TERM_GRACE_S:
                signum = self.term_at[1]  # the main thread is blocked in a collective
                name = signal.Signals(signum).name
                self.fail(f"{name} outside the training loop", 128 + signum, kind="stopped")

    def peer_failed(self, process: int, record: dict) -> None:
        """Ends this process because `process` failed (or stopped)."""
        with self.exit_lock:
            word = "stopped" if record["kind"] == "stopped" else "failed"
            logging.error(
                "process %d %s: %s; ending process %d too", process, word, record["error"], self.me
            )
            self.client.key_value_set(f"{_PREFIX}/ack/{process}/{self.me}", "")
            self.leave(1 if word == "failed" else record["code"], [process])

    def fail(self, error: str, code: int, *, kind: str = "failed") -> None:
        """Publishes this process's failure, waits for the others to read it, and exits."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one cannot cut this short
        with self.exit_lock:
            others = self.records()
            if others:  # this process's error follows another's (e.g. a collective it left)
                process, record = min(others.items())
                logging.error(
                    "process %d %s: %s; ending process %d too (here: %s)",
                    process, record["kind"], record["error"], self.me, error,
                )  # fmt: skip
                self.leave(code if kind == "stopped" else 1, list(others))
            logging.error("process %d %s: %s; ending every process", self.me, kind, error)
            record = {"kind": kind, "error": error, "code": code}
            self.client.key_value_set(f"{_PREFIX}/failed/{self.me}", json.dumps(record))
            deadline, gone = time.monotonic() + ACK_TIMEOUT_S, set()
            while time.monotonic() < deadline:
                acks = self.processes(f"{_PREFIX}/ack/{self.me}/")
                # A process that failed (or stopped) as well, or that is leaving, is on its way
                # out too: it may never acknowledge (of two processes stopped at once, the second
                # leaves on reading the first's record; the first waited 10 s for it).
                gone = set(self.records()) | self.processes(f"{_PREFIX}/exiting/")
                if len(acks | gone) >= self.n - 1:
                    break
                time.sleep(0.05)
            self.leave(code, sorted(gone))

    def leave(self, code: int, failed: list[int]) -> None:
        """Exits; process 0 (which holds the coordination service, whose end aborts the others)
        first waits up to 2 s for the `failed` processes, which are exiting too, to be gone."""
        with contextlib.suppress(Exception):
            self.client.key_value_set(f"{_PREFIX}/exiting/{self.me}", "")
        if self.me == 0 and failed:
            deadline = time.monotonic() + 2
            for process in failed:
                wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
                with contextlib.suppress(Exception):
                    self.client.blocking_key_value_get(f"{_PREFIX}/exiting/{process}", wait_ms)
            # They said so just before their exit: give them the time to receive the reply.
            time.sleep(_EXIT_MARGIN_S)
        _exit(code)

    def close(self) -> None:
        self.closing.set()
        self.thread.join()
        signal.set_wakeup_fd(self.previous_wakeup)
        signal.signal(signal.SIGTERM, self.previous_handler)
        os.close(self.read_fd)
        os.close(self.write_fd)


def _exit(code: int) -> None:
    """Flushes the logs and ends the process now: no atexit handlers, so no jax.distributed
    shutdown barrier that waits for processes that are waiting for this one."""
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) < 2000 else text[:2000] + " ..."


@contextlib.contextmanager
def guard(end_timeout_s: float = BARRIER_TIMEOUT_S) -> Iterator[None]:
    """Runs a multi-process job so that any process's failure ends every process (module
    docstring); at the end, waits up to `end_timeout_s` for every process to finish. A no-op in a
    single-process run."""
    if jax.process_count() == 1 or _client() is None:
        yield
        return
    state = _Guard()
    try:
        yield
        barrier("end", timeout_s=end_timeout_s)
    except Terminated as e:
        state.fail(f"{e} outside the training loop", 128 + e.signum, kind="stopped")
    except KeyboardInterrupt:
        state.fail("received SIGINT", 128 + signal.SIGINT, kind="stopped")
    except BaseException as e:  # noqa: BLE001  (every way out must reach the other processes)
        if isinstance(e, SystemExit) and not e.code:
            raise
        mistake = cli.users_mistake(e)  # a user's mistake: its message; a bug: its traceback
        if mistake is not None:
            logging.error("error: %s", mistake)
        else:
            logging.error("%s", "".join(traceback.format_exception(e)))
        state.fail(_describe(mistake or e), 1)
    finally:
        state.close()
