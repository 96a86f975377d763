"""The parameters of a `train.py` run's checkpoint, without its optimizer state.

    run = run_params.read_run_params(workdir)        # host numpy, the newest that reads
    run = run_params.read_run_params(workdir, targets=abstract_params)  # into shardings

Readers (`checkpoints.pretrained.load`: from_pretrained, inference, `init_from`; convert) read a
run, its parameters checked against the head's table (`load_training_checkpoint`); only the
training run moves checkpoints (`checkpointing`), so a damaged newest checkpoint is passed over
here with a warning and left where it is.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from bert_jax.checkpoints.checkpointing import (
    CORRUPT,
    classify_restore_error,
    describe_error,
    item_path,
    read_meta,
    run_checkpoints,
    saved_steps,
)
from bert_jax.checkpoints.table import ConversionError, check_params, unflatten_params
from bert_jax.models.families import EncoderConfig, config_from_hf_dict


class RunCheckpointError(ValueError):
    """A run's checkpoint cannot be read as parameters (none there, no readable meta, corrupt).

    Attributes:
      corrupt: whether its files are damaged or missing (`classify_restore_error`), as opposed
        to absent or of another layout.
    """

    def __init__(self, message: str, *, corrupt: bool = False):
        super().__init__(message)
        self.corrupt = corrupt


@dataclasses.dataclass(frozen=True)
class RunParams:
    """The parameters of one checkpoint of a `train.py` run (`read_run_params`).

    Attributes:
      params: the `params` subtree of the saved state: host numpy arrays as stored (layers
        stacked if the run scanned them), or sharded jax.Arrays when read into targets.
      config: the model's config.json fields, from the checkpoint's meta.
      head: the model's head class name ("BertForPreTraining", ...).
      step: the checkpoint's step.
    """

    params: Any
    config: dict
    head: str
    step: int


def read_run_params(workdir, step: int | None = None, *, targets=None) -> RunParams | None:
    """The parameters of a run's checkpoint (the newest that reads when `step` is None); the
    optimizer state stays on disk (a partial restore).

    With `step` None, a newest checkpoint whose parameters' files (or meta) are damaged or
    missing is passed over for the one before it, with a warning naming it; reading moves
    nothing (the next `train.py` run in the directory sets it aside as `corrupt-<step>`). Only
    the parameters are read, so damage confined to the optimizer state goes unseen here: the
    weights read are whole, though a training run would resume from an earlier step.

    Args:
      workdir: a `train.py` run directory (`<workdir>/checkpoints/<step>`), local or a URL.
      step: the checkpoint's step, or None for the newest whose parameters read.
      targets: None to read host numpy arrays, whatever mesh wrote them; or the parameters to
        fill, as `jax.ShapeDtypeStruct`s with `.sharding` (every host reads only the pieces its
        devices hold; a stored dtype is cast to the target's).

    Returns:
      The parameters, or None when `targets` are given and the stored parameters do not have
      their tree and shapes (another head, or layers stacked differently).

    Raises:
      RunCheckpointError: no checkpoint (of that step), no readable meta, or corrupt arrays
        (of every checkpoint, when `step` is None).
    """
    root = run_checkpoints(workdir)  # a URL stays one (`paths.as_path`)
    steps = saved_steps(root)
    if not steps:
        raise RunCheckpointError(f"no training checkpoints in {root}")
    if step is not None:
        if step not in steps:
            raise RunCheckpointError(f"no checkpoint for step {step} in {root}; there are {steps}")
        return _read_step_params(root, step, targets)
    damaged: list[str] = []
    for candidate in reversed(steps):
        try:
            run = _read_step_params(root, candidate, targets)
        except RunCheckpointError as e:
            if not e.corrupt:
                raise
            damaged.append(f"{candidate} ({e})")
            continue
        if damaged:
            logging.warning(
                "%s: reading checkpoint %d, the newest whose parameters read; passed over as "
                "damaged: "
                "%s. Nothing was moved: the next train.py run in this directory sets damaged "
                "checkpoints aside as corrupt-<step>",
                root,
                candidate,
                "; ".join(damaged),
            )
        return run
    raise RunCheckpointError(
        f"every checkpoint in {root} is damaged: {'; '.join(damaged)}", corrupt=True
    )


def _read_step_params(root, step: int, targets) -> RunParams | None:
    """`read_run_params` of one existing step."""
    try:
        meta = read_meta(root, step)
        config, head = meta["config"], meta["model"]
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise RunCheckpointError(
            f"checkpoint {step} in {root} has no readable meta ({e})",
            corrupt=not isinstance(e, KeyError),
        ) from e
    state_path = os.fspath(item_path(root, step, "state"))
    restore_args = None
    if targets is not None:
        try:
            with ocp.PyTreeCheckpointer() as ckptr:
                stored = ckptr.metadata(state_path).item_metadata.tree.get("params")
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
            raise _unreadable(state_path, e) from e
        shape_of = lambda x: tuple(x.shape)  # noqa: E731
        try:
            same = jax.tree_util.tree_map(shape_of, stored) == jax.tree_util.tree_map(
                shape_of, targets
            )
        except (AttributeError, TypeError, ValueError):
            same = False
        if not same:
            return None
        restore_args = {
            "params": jax.tree_util.tree_map(
                lambda t: ocp.ArrayRestoreArgs(
                    sharding=t.sharding, global_shape=t.shape, dtype=t.dtype
                ),
                targets,
            )
        }
    return RunParams(_restore_params(state_path, restore_args), config, head, step)


def _unreadable(state_path: str, error: BaseException) -> RunCheckpointError:
    """The RunCheckpointError of a state that Orbax could not read."""
    corrupt = classify_restore_error(error) == CORRUPT
    return RunCheckpointError(
        f"cannot read {state_path}: {'corrupt or incomplete' if corrupt else 'error'} "
        f"({describe_error(error)})",
        corrupt=corrupt,
    )


def _restore_params(state_path: str, restore_args) -> Any:
    """The `params` subtree of a checkpoint's state, each leaf as `restore_args` (a tree of
    `ocp.RestoreArgs`, or None: host numpy)."""
    try:
        with ocp.PyTreeCheckpointer() as ckptr:
            tree = ckptr.metadata(state_path).item_metadata.tree
            wanted = {"params": tree["params"]}
            if restore_args is None:
                restore_args = jax.tree_util.tree_map(
                    lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted
                )
            state = ckptr.restore(
                state_path,
                args=ocp.args.PyTreeRestore(
                    item=wanted, restore_args=restore_args, partial_restore=True
                ),
            )
    except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
        raise _unreadable(state_path, e) from e
    return state["params"]


def load_training_checkpoint(
    workdir: str | os.PathLike, step: int | None = None, *, scan_layers: bool = False
) -> tuple[EncoderConfig, Any, str, int]:
    """Params of a `train.py` checkpoint: (config, params, model class name, step).

    Reads `<workdir>/checkpoints/<step>` (the newest when `step` is None) as host numpy arrays,
    whatever mesh wrote it (`read_run_params`; the optimizer state is not read), and checks them
    against the head's parameter table.
    """
    try:
        run = read_run_params(workdir, step)
        config = config_from_hf_dict(run.config)
    except (RunCheckpointError, TypeError, ValueError) as e:
        raise ConversionError(str(e)) from e
    flat = check_params(config, run.params, run.head)
    return config, unflatten_params(flat, scan_layers), run.head, run.step
