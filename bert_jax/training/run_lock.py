"""One run at a time in a run directory: `<workdir>/run.lock`.

    with run_lock.hold(workdir):   # RunLockedError if another run holds it
        train(...)

Two runs in one directory would overwrite each other's checkpoints, metrics and config, so the
second one stops at start, before it writes anything, with one line naming the directory and the
process holding it. The lock is a small JSON file (pid, host, start time, heartbeat), created
atomically on a local disk (a hard link) and removed when the run ends, however it ends short of a
kill. Only process 0 of a multi-process run takes it (the others stop with it: parallel.multihost).

A lock left by a run that was killed is taken over, with a warning, when
1. it names this host and a pid that is no longer running; or
2. its heartbeat (rewritten every `HEARTBEAT_S` by the holder) is older than `STALE_S`: the only
   test possible for a run on another host, and on a bucket (gs://...), where a preempted job
   comes back on new machines.
Otherwise the run stops. On a bucket the lock is written without an atomic create (object stores
have none through etils.epath): two runs started within the same second may both go on.

Leaf module: the standard library, etils (through `paths`) and jax's process index.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import jax
from absl import logging

from bert_jax.paths import as_path, is_url, write_text_whole

LOCK_NAME = "run.lock"
# The holder rewrites its heartbeat this often (seconds) ...
HEARTBEAT_S = 60.0
# ... and a lock whose heartbeat is older than this (seconds) is stale, wherever its holder ran.
STALE_S = 600.0


class RunLockedError(RuntimeError):
    """Another run holds the run directory's lock."""


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _record(started: str) -> str:
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": started,
            "heartbeat": time.time(),
        }
    )


def _stale_reason(held: dict) -> str | None:
    """Why the lock `held` is stale (its holder is gone), or None while it may still run."""
    age = time.time() - float(held.get("heartbeat", 0))
    if held.get("host") == socket.gethostname() and not _pid_running(int(held.get("pid", -1))):
        return f"pid {held.get('pid')} is no longer running on this host"
    if held.get("host") != socket.gethostname() and age > STALE_S:
        return f"its heartbeat is {age:.0f} s old (over {STALE_S:.0f} s)"
    return None


def _create(path, text: str) -> bool:
    """Writes `text` to `path` if nothing is there; whether it did. On a local disk the file
    appears whole or not at all (a hard link of a written temporary file), so that a run
    starting at the same moment never reads it half written."""
    if is_url(path):
        if path.exists():
            return False
        path.write_text(text)
        return True
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    try:
        os.link(tmp, os.fspath(path))
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


def acquire(workdir, *, flag: str = "--workdir") -> dict:
    """Takes `<workdir>/run.lock` (creating the directory); returns what it wrote.

    `flag` is the command-line flag that names the directory (the refusal says to change it).

    Raises:
      RunLockedError: another run holds it (the line names the directory, pid, host and start).
    """
    directory = as_path(workdir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    text = _record(started)
    for _ in range(3):  # a stale lock removed, then created again: a race lost to another run
        if _create(path, text):
            return json.loads(text)
        try:
            held = json.loads(path.read_text())
        except FileNotFoundError:
            continue  # released meanwhile
        except (OSError, ValueError):
            held = {}
        reason = _stale_reason(held) if held else "it is unreadable"
        if reason is None:
            raise RunLockedError(
                f"{directory} is in use by another run: pid {held.get('pid')} on host "
                f"{held.get('host')}, started {held.get('started')} ({path}). Use another "
                f"{flag}, or stop that run; if it is gone, remove {path}"
            )
        logging.warning("%s: taking over the lock of a run that ended (%s): %s", path, reason, held)
        path.unlink(missing_ok=True)
    raise RunLockedError(f"{directory}: could not take {path}; another run is starting there")


def release(workdir, record: dict) -> None:
    """Removes `<workdir>/run.lock` if it is still the one `record` describes."""
    path = as_path(workdir) / LOCK_NAME
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if (held.get("pid"), held.get("host")) == (record["pid"], record["host"]):
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def hold(workdir, *, flag: str = "--workdir") -> Iterator[None]:
    """Holds the run directory's lock for the block (process 0; a no-op on the others), its
    heartbeat rewritten every `HEARTBEAT_S` by a daemon thread."""
    if jax.process_index() != 0:
        yield
        return
    created = not as_path(workdir).exists()  # a refused start leaves no empty run directory
    record = acquire(workdir, flag=flag)
    path, done = as_path(workdir) / LOCK_NAME, threading.Event()

    def beat():
        while not done.wait(HEARTBEAT_S):
            try:
                write_text_whole(path, _record(record["started"]))
            except OSError as e:  # a heartbeat missed is no reason to stop training
                logging.warning("could not refresh %s: %s", path, e)

    thread = threading.Thread(target=beat, name="run-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        release(workdir, record)
        if created:
            with contextlib.suppress(OSError):  # not empty, or already gone: leave it
                if not any(as_path(workdir).iterdir()):
                    as_path(workdir).rmdir()
