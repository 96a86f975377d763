"""Training checkpoints with Orbax's CheckpointManager.

A checkpoint step directory `<workdir>/checkpoints/<step>/` holds three items:

    state     the train state pytree (params, optimizer state, step, RNG key), sharded as in memory
    data      the input iterator's position (grain's own checkpoint handler; one file per process)
    meta      JSON: the model config (Hugging Face fields), the head class and the step

Saves are asynchronous (training continues while the arrays are written) and atomic: Orbax writes
to a temporary directory and renames it when complete, so an interrupted save is never mistaken
for a checkpoint. A finalized checkpoint that fails to restore (corrupt or truncated files) is
reported, moved aside to `<workdir>/checkpoints/corrupt-<step>` (kept, never deleted) and the
previous good one is used.

Leaf module: stores pytrees; knows nothing of the model.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

PyTree = Any


def _grain_args():
    import grain

    return grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore


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
        self.directory = os.path.abspath(directory)
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
            items["data"] = save_args(data_iterator)
        if meta is not None:
            items["meta"] = ocp.args.JsonSave(meta)
        saved = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        if saved:
            logging.info("saving checkpoint %d to %s", step, self.directory)
        return saved

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    # ---- restoring ----
    def restore(self, step: int, abstract_state: PyTree, *, data_iterator=None):
        """Restores `step`: (state, meta). `abstract_state` gives shapes, dtypes and shardings
        (e.g. `jax.ShapeDtypeStruct`s with `.sharding`); `data_iterator` is updated in place."""
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if data_iterator is not None:
            _, restore_args = _grain_args()
            items["data"] = restore_args(data_iterator)
        has_meta = os.path.exists(os.path.join(self.directory, str(step), "meta"))
        if has_meta:
            items["meta"] = ocp.args.JsonRestore()
        out = self._manager.restore(step, args=ocp.args.Composite(**items))
        return out["state"], (out["meta"] if has_meta else None)

    def restore_latest(self, abstract_state: PyTree, *, data_iterator=None):
        """Restores the newest checkpoint that loads: (step, state, meta), or None if none does.

        A checkpoint that fails to load is reported and moved aside, and the one before it is
        tried, so a corrupt latest checkpoint costs the steps since the previous save, not the run.
        """
        for step in reversed(self.all_steps()):
            try:
                state, meta = self.restore(step, abstract_state, data_iterator=data_iterator)
            except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many error types
                self._quarantine(step, e)
                continue
            logging.info("restored checkpoint %d from %s", step, self.directory)
            return step, state, meta
        return None

    def _quarantine(self, step: int, error: Exception) -> None:
        src = os.path.join(self.directory, str(step))
        dst = os.path.join(self.directory, f"corrupt-{step}")
        logging.error(
            "checkpoint %d in %s cannot be restored (%s: %s); moving it to %s and trying the "
            "previous one",
            step,
            self.directory,
            type(error).__name__,
            str(error)[:500],
            dst,
        )
        multihost_utils.sync_global_devices(f"quarantine-{step}")
        if jax.process_index() == 0 and os.path.exists(src):
            if os.path.exists(dst):
                shutil.rmtree(dst)
            os.replace(src, dst)
        multihost_utils.sync_global_devices(f"quarantined-{step}")
        self._manager.close()
        self._manager = self._new_manager()
