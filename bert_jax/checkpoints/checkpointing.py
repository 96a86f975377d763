"""Training checkpoints with Orbax's CheckpointManager.

A checkpoint step directory `<workdir>/checkpoints/<step>/` holds these items:

    state     the train state pytree (params, optimizer state, step, RNG key), sharded as in memory
    data      the input iterator's position (grain's own checkpoint handler; one file per process)
    data_position  JSON: that position once for all processes, when every process is at the same
              one (batches are cut from one global stream); a run resumed with another number
              of processes (or devices per process) starts from it: elastic resume
    meta      JSON: the model config (Hugging Face fields), the head class and the step

Saves are asynchronous and atomic (Orbax renames a temporary directory when complete). Restoring
never loses progress; every process must agree on each failure (docs/pretraining.md):

1. corrupt or missing files on every process: the checkpoint is moved aside to
   `<workdir>/checkpoints/corrupt-<step>` (kept) and the previous one tried. Orbax wraps
   tensorstore's message in a generic one, so the whole `__cause__` chain is read;
2. transient I/O errors: retried a few times, then the run stops;
3. anything else: a `RestoreError` naming the cause; nothing is moved or deleted.

A run never starts from scratch while a checkpoint (even one set aside) exists; only a training
run moves checkpoints (`checkpoints.run_params` reads parameters only). A failed save raises
`CheckpointSaveError` at the next `check`, `save`, `wait` or `close`, after removing its
temporary directory.

Leaf module: stores pytrees; knows nothing of the model.
"""

from __future__ import annotations

import errno
import json
import re
import threading
import time
import zlib
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from bert_jax.parallel import multihost
from bert_jax.paths import as_path

PyTree = Any

# Outcomes of one restore attempt on one process, gathered so that all processes act alike.
OK, CORRUPT, TRANSIENT, OTHER = 0, 1, 2, 3
_OUTCOMES = {OK: "restored", CORRUPT: "corrupt or missing files", TRANSIENT: "transient I/O error"}
_OUTCOMES[OTHER] = "other error"
# Tensorstore/Orbax/grain messages of damaged files, and of storage that may come back.
_CORRUPT_RE = re.compile(
    r"DATA_LOSS|NOT_FOUND|does not exist|was not found in the checkpoint|Error decoding|"
    r"[Uu]nexpected end|[Tt]runcated|OUT_OF_RANGE|Requested byte range"
)
_TRANSIENT_RE = re.compile(
    r"UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|ABORTED|timed out|[Cc]onnection reset"
)
# Orbax writes a save to `<step>.orbax-checkpoint-tmp[-<n>]` and renames it when complete.
_TMP_MARK = ".orbax-checkpoint-tmp"
_PROCESS_FILE_RE = re.compile(r"^process_(\d+)-of-(\d+)\.json$")


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (a full disk, no permission, storage down).

    Its unfinished temporary directory has been removed; the checkpoints before it are intact,
    and rerunning resumes from the newest of them once the cause is fixed.
    """


class RestoreError(RuntimeError):
    """A checkpoint exists but cannot be restored, for a reason other than corrupt files.

    Nothing was moved or deleted: fix the cause (or move the checkpoints away on purpose) and
    rerun.
    """


def error_chain(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions it was raised from (`__cause__`, or `__context__` where Python
    shows it), outermost first: Orbax wraps tensorstore's message in a generic one."""
    chain: list[BaseException] = []
    while error is not None and all(error is not e for e in chain) and len(chain) < 32:
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return chain


def describe_error(error: BaseException, limit: int = 500) -> str:
    """'Type: message' of the innermost exception of `error`'s chain (the cause), cut to
    `limit` characters."""
    root = error_chain(error)[-1]
    text = f"{type(root).__name__}: {root}"
    return text if len(text) <= limit else text[:limit] + " ..."


def _classify_one(error: BaseException) -> int:
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, (TimeoutError, ConnectionError)) or _TRANSIENT_RE.search(text):
        return TRANSIENT
    if isinstance(error, (json.JSONDecodeError, FileNotFoundError, EOFError)):
        return CORRUPT
    return CORRUPT if _CORRUPT_RE.search(text) else OTHER


def classify_restore_error(error: BaseException) -> int:
    """CORRUPT, TRANSIENT or OTHER for an exception raised while restoring a checkpoint.

    Every exception of its chain counts (`error_chain`): a transient one anywhere makes it
    TRANSIENT (retrying moves nothing), else a corrupt one makes it CORRUPT, else OTHER.
    """
    codes = {_classify_one(e) for e in error_chain(error)}
    return TRANSIENT if TRANSIENT in codes else CORRUPT if CORRUPT in codes else OTHER


def _common_position(data_iterator) -> dict | None:
    """The iterator's state as JSON if every process is at the same one, else None.

    A collective. Pipelines that cut every host's rows from one global stream of batches (grain's
    `next_index`, `EpochIterator`'s epoch and batch) agree; packed rows, which depend on each
    host's examples, do not.
    """
    state = data_iterator.get_state()
    position = {"bytes": state.decode()} if isinstance(state, bytes) else {"state": state}
    try:
        text = json.dumps(position, sort_keys=True)
    except TypeError:
        text = ""  # not JSON: no process-independent copy
    digest = zlib.crc32(text.encode()) & 0x7FFFFFFF if text else -1
    digests = {digest}
    if jax.process_count() > 1:  # every process calls this once, whatever its state
        digests = {int(d) for d in multihost.all_gather("data-position", str(digest))}
    return position if len(digests) == 1 and digest >= 0 else None


class _JsonState:
    """An iterator whose state is a JSON dict (a wrapper around a grain `DatasetIterator`, such
    as a test's), seen by grain's checkpoint handler, which takes bytes from anything but a
    `DatasetIterator`: the same file a `DatasetIterator` writes, so either restores it."""

    def __init__(self, iterator):
        self.iterator = iterator

    def get_state(self) -> bytes:
        return json.dumps(self.iterator.get_state(), indent=4).encode()


def _as_grain_saves(data_iterator):
    """`data_iterator` as grain's checkpoint handler can save it."""
    import grain

    if isinstance(data_iterator, grain.DatasetIterator):
        return data_iterator
    return (
        data_iterator if isinstance(data_iterator.get_state(), bytes) else _JsonState(data_iterator)
    )


def _gather(code: int) -> list[int]:
    """Every process's `code`, in process order (a collective)."""
    if jax.process_count() == 1:
        return [code]
    return [int(c) for c in multihost.all_gather("checkpoint-codes", str(code))]


def _grain_args():
    import grain

    return grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore


def run_checkpoints(workdir) -> Any:
    """The checkpoint directory of a run directory: `<workdir>/checkpoints` (a URL stays one)."""
    return as_path(workdir) / "checkpoints"


def saved_steps(directory) -> list[int]:
    """The steps of the complete checkpoints in `directory` (a run's checkpoint directory),
    ascending; [] when there are none."""
    directory = as_path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(d.name) for d in directory.iterdir() if d.name.isdigit())


def item_path(directory, step: int, item: str) -> Any:
    """Where a checkpoint keeps one of its items (`state`, `data`, `data_position`, `meta`)."""
    return as_path(directory) / str(step) / item


def read_meta(directory, step: int) -> dict:
    """The `meta` item of a checkpoint (model config, head, step), read without Orbax."""
    return json.loads((item_path(directory, step, "meta") / "metadata").read_text())


def _join_orbax_threads(timeout_s: float = 60.0) -> None:
    """Waits up to `timeout_s` for Orbax's background threads (the other items of a save that
    failed) to end, so that none writes after its directory is removed or the process exits."""
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and type(thread).__module__.startswith(
            "orbax."
        ):
            thread.join(max(0.0, deadline - time.monotonic()))


class Checkpointer:
    """Saves and restores train state, data-iterator state and metadata under one directory.

    Args:
      directory: where step directories go (created if missing).
      max_to_keep: newest checkpoints kept; older ones are deleted after a newer save completes.
      async_save: write arrays in a background thread.

    The caller decides when to save: every `save` call writes.
    """

    def __init__(
        self,
        directory: str,
        *,
        max_to_keep: int | None = 3,
        async_save: bool = True,
    ):
        self.directory = as_path(directory)
        self._pending: int | None = None  # the step of a save that may still be in flight
        self._note_unfinished_saves()
        self._options = dict(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            create=True,
            cleanup_tmp_directories=True,
        )
        self._manager = self._new_manager()

    def _new_manager(self) -> ocp.CheckpointManager:
        import grain

        registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
        save_args, restore_args = _grain_args()
        registry.add("data", save_args, grain.checkpoint.CheckpointHandler)
        registry.add("data", restore_args, grain.checkpoint.CheckpointHandler)
        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(**self._options),
            handler_registry=registry,
        )

    # ---- queries ----
    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    # ---- saving ----
    def save(
        self,
        step: int,
        state: PyTree,
        *,
        data_iterator=None,
        meta: dict | None = None,
    ) -> bool:
        """Starts saving at `step`. Returns whether a save was started (False if `step` exists)."""
        items = {"state": ocp.args.StandardSave(state)}
        if data_iterator is not None:
            save_args, _ = _grain_args()
            items["data"] = save_args(_as_grain_saves(data_iterator))
            position = _common_position(data_iterator)
            if position is not None:
                items["data_position"] = ocp.args.JsonSave(position)
        if meta is not None:
            items["meta"] = ocp.args.JsonSave(meta)
        self._finish()  # the previous save's failure is named as its own
        try:
            saved = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
            raise self._save_failed(step, e) from e
        if saved:
            self._pending = step
            logging.info("saving checkpoint %d to %s", step, self.directory)
        return saved

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk.

        Raises:
          CheckpointSaveError: the save failed (its step, path and cause in one line).
        """
        self._finish()

    def check(self) -> None:
        """Raises CheckpointSaveError at once if a background save has failed; never blocks
        (a run calls it every step, so that a failed save stops it at the next step)."""
        if self._pending is not None and not self._manager.is_saving_in_progress():
            self._finish()

    def close(self) -> None:
        try:
            self._finish()
        finally:
            self._manager.close()

    def _finish(self) -> None:
        """Waits for the save in flight; a failure becomes a CheckpointSaveError."""
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
            raise self._save_failed(step, e) from e

    def _save_failed(self, step: int | None, error: BaseException) -> CheckpointSaveError:
        """The one-line error of a failed save of `step`, after its temporary directory is
        removed (process 0)."""
        full = any(
            getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e)
            for e in error_chain(error)
        )
        _join_orbax_threads()  # the save's other writers would recreate what is removed
        removed = self._remove_unfinished(step) if step is not None else []
        cause = "No space left on device" if full else "error"
        return CheckpointSaveError(
            f"checkpoint {step}: saving to {self.directory / str(step)} failed: {cause} "
            f"({describe_error(error, 300)}). "
            + (f"Removed the unfinished {', '.join(removed)}. " if removed else "")
            + f"Checkpoints kept: {self.all_steps() or 'none'}; rerunning resumes from the "
            "newest once the cause is fixed"
        )

    def _remove_unfinished(self, step: int) -> list[str]:
        """Removes `step`'s temporary save directories (process 0); their names."""
        if jax.process_index() != 0 or not self.directory.is_dir():
            return []
        removed = []
        for path in self.directory.iterdir():
            if path.name.startswith(f"{step}{_TMP_MARK}"):
                try:
                    path.rmtree()
                    removed.append(path.name)
                except OSError as e:
                    logging.warning("could not remove %s: %s", path, e)
        return removed

    def _note_unfinished_saves(self) -> None:
        """Logs the temporary directories of saves that never completed (Orbax removes them
        when the manager starts: `cleanup_tmp_directories`)."""
        if jax.process_index() != 0 or not self.directory.is_dir():
            return
        unfinished = sorted(p.name for p in self.directory.iterdir() if _TMP_MARK in p.name)
        if unfinished:
            logging.warning(
                "%s: removing unfinished save(s) %s (a run stopped, or failed, while writing "
                "them; they are not checkpoints)",
                self.directory,
                ", ".join(unfinished),
            )

    # ---- restoring ----
    def restore(self, step: int, abstract_state: PyTree, *, data_iterator=None):
        """Restores `step`: (state, meta). `abstract_state` gives shapes, dtypes and shardings
        (e.g. `jax.ShapeDtypeStruct`s with `.sharding`); `data_iterator` is updated in place,
        from the shared `data_position` when the checkpoint was saved by another number of
        processes."""
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        saved_counts = self._saved_process_counts(step)
        elastic = data_iterator is not None and saved_counts not in (set(), {jax.process_count()})
        if elastic:
            items["data_position"] = ocp.args.JsonRestore()
        elif data_iterator is not None:
            _, restore_args = _grain_args()
            items["data"] = restore_args(data_iterator)
        has_meta = (self.directory / str(step) / "meta").exists()
        if has_meta:
            items["meta"] = ocp.args.JsonRestore()
        out = self._manager.restore(step, args=ocp.args.Composite(**items))
        if elastic:
            position = out["data_position"]
            data_iterator.set_state(
                position["state"] if "state" in position else position["bytes"].encode()
            )
            logging.info(
                "checkpoint %d: saved by %s process(es), resumed by %d at the same data position",
                step,
                sorted(saved_counts),
                jax.process_count(),
            )
        return out["state"], (out["meta"] if has_meta else None)

    def restore_latest(
        self, abstract_state: PyTree, *, data_iterator=None, retries: int = 3, backoff_s=1.0
    ):
        """Restores the newest checkpoint that loads: (step, state, meta), or None if there is
        none at all.

        A checkpoint whose files are corrupt on every process is moved aside (kept) and the one
        before it is tried; transient I/O errors are retried `retries` times, `backoff_s`
        doubling each time. A collective: every process must call it.

        Raises:
          RestoreError: any other failure, processes that disagree, or no checkpoint left that
            loads while some exist (or were set aside): nothing is moved or deleted then.
        """
        for step in reversed(self.all_steps()):
            self._check_process_count(step, data_iterator)
            for attempt in range(retries + 1):
                try:
                    state, meta = self.restore(step, abstract_state, data_iterator=data_iterator)
                    code, error = OK, None
                except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many error types
                    code, error = classify_restore_error(e), e
                codes = _gather(code)
                if set(codes) == {OK}:
                    logging.info("restored checkpoint %d from %s", step, self.directory)
                    return step, state, meta
                if set(codes) <= {OK, TRANSIENT} and attempt < retries:
                    logging.warning(
                        "checkpoint %d: transient error (%s); retrying",
                        step,
                        describe_error(error, 300),
                    )
                    time.sleep(backoff_s * 2**attempt)
                    continue
                break
            if set(codes) == {CORRUPT}:
                self._quarantine(step, error)
                continue
            outcomes = ", ".join(f"process {i}: {_OUTCOMES[c]}" for i, c in enumerate(codes))
            detail = ""
            if error is not None:
                outer = f"{type(error).__name__}: {str(error)[:300]}"
                root = describe_error(error)
                detail = f" ({outer})" if root.startswith(outer) else f" ({outer}; cause: {root})"
            raise RestoreError(
                f"checkpoint {step} in {self.directory} cannot be restored [{outcomes}]"
                f"{detail}. Nothing was moved or deleted; fix the cause and rerun"
            ) from error
        aside = self.quarantined()
        if aside:
            raise RestoreError(
                f"{self.directory} holds no checkpoint that loads, only ones set aside as "
                f"corrupt ({', '.join(aside)}); refusing to start from scratch. Repair them, or "
                "move them out of the directory to start over"
            )
        return None

    def quarantined(self) -> list[str]:
        """Names of the checkpoints set aside as corrupt (`corrupt-<step>[-<n>]`)."""
        if not self.directory.is_dir():
            return []
        return sorted(p.name for p in self.directory.iterdir() if p.name.startswith("corrupt-"))

    def _saved_process_counts(self, step: int) -> set[int]:
        """The process counts of `step`'s per-process data files (grain writes one a process)."""
        data_dir = self.directory / str(step) / "data"
        if not data_dir.is_dir():
            return set()
        names = (p.name for p in data_dir.iterdir())
        return {int(m.group(2)) for m in map(_PROCESS_FILE_RE.match, names) if m}

    def _check_process_count(self, step: int, data_iterator) -> None:
        """Raises RestoreError if `step` was saved by another number of processes and holds no
        shared data position to resume from (the processes were at different positions)."""
        if data_iterator is None:
            return
        counts = self._saved_process_counts(step)
        shared = (self.directory / str(step) / "data_position").is_dir()
        if counts and counts != {jax.process_count()} and not shared:
            raise RestoreError(
                f"checkpoint {step} in {self.directory} holds the data position of "
                f"{sorted(counts)} process(es), which differed between them (packed sequences "
                f"or grain workers); this run has {jax.process_count()}. Resume with the same "
                "number of processes. Nothing was moved or deleted"
            )

    def _quarantine(self, step: int, error: Exception) -> None:
        src = self.directory / str(step)
        dst = self.directory / f"corrupt-{step}"
        n = 0
        while dst.exists():  # an earlier one of the same step is kept too
            n += 1
            dst = self.directory / f"corrupt-{step}-{n}"
        logging.error(
            "checkpoint %d in %s cannot be restored on any process: its files are corrupt or "
            "missing (%s); moving it to %s (kept) and trying the previous one",
            step,
            self.directory,
            describe_error(error),
            dst,
        )
        multihost.barrier(f"quarantine-{step}")
        if jax.process_index() == 0 and src.exists():
            src.rename(dst)
        multihost.barrier(f"quarantined-{step}")
        self._manager.close()
        self._manager = self._new_manager()
