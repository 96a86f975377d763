"""bert_jax's own format: a directory of `config.json` (the family's Hugging Face fields,
`architectures` naming the head) and an Orbax checkpoint of the unstacked parameters under
`params/`. Written by `save_pretrained` (collectively in a multi-process run), read by
`load_pretrained`; paths through `etils.epath` (local or a URL).
"""

from __future__ import annotations

import os

import jax
import numpy as np
from flax import traverse_util

from bert_jax.checkpoints.hf import default_model
from bert_jax.checkpoints.table import (
    ConversionError,
    PyTree,
    check_config_fits,
    check_params,
    unflatten_params,
)
from bert_jax.models.families import EncoderConfig, config_from_json_file, family_of
from bert_jax.parallel import multihost
from bert_jax.paths import as_path, prepare_out_dir, write_file_whole


def _prepare(out_dir, overwrite: bool):
    """Process 0 makes `out_dir` (refusing to replace an export unless `overwrite`); every
    process stops when it refused, none waits at a barrier."""
    refused = None
    if jax.process_index() == 0:
        try:
            prepare_out_dir(out_dir, ["config.json", "params"], overwrite)
        except FileExistsError as e:
            refused = e
    if multihost.any_process("save_pretrained-refused", refused is not None):
        raise refused or FileExistsError(
            f"{out_dir} already holds an export; pass overwrite=True (--overwrite) to replace it"
        )


def save_pretrained(
    out_dir: str | os.PathLike,
    config: EncoderConfig,
    params: PyTree,
    model: str = "BertForPreTraining",
    *,
    overwrite: bool = False,
) -> str:
    """Writes bert_jax's own format: `config.json` (HF fields, architectures=[model]) and an
    Orbax checkpoint of the unstacked parameters under `params/`.

    In a multi-process run every process calls this with the same (host) parameters: the Orbax
    save is collective (its barriers wait for every process), process 0 writes the files and
    moves the directories, and all return once the export is complete.
    """
    import orbax.checkpoint as ocp

    out_dir = as_path(out_dir)
    flat = check_params(config, params, model)
    primary = jax.process_index() == 0
    _prepare(out_dir, overwrite)
    tree = traverse_util.unflatten_dict(flat, sep="/")
    tmp = out_dir / ".params.tmp"
    if primary and tmp.exists():
        tmp.rmtree()
    multihost.barrier("save_pretrained-prepared")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp, tree)
        ckptr.wait_until_finished()
    if primary:
        final = out_dir / "params"
        if final.exists():
            final.rmtree()
        tmp.rename(final)
        write_file_whole(
            out_dir / "config.json", lambda p: config.to_json_file(p, architecture=model)
        )
    multihost.barrier("save_pretrained-done")
    return os.fspath(out_dir)


def load_pretrained(
    path: str | os.PathLike, *, scan_layers: bool = False
) -> tuple[EncoderConfig, PyTree, str]:
    """Reads a `save_pretrained` directory: (config, params, model class name)."""
    import orbax.checkpoint as ocp

    path = as_path(path)
    config_path = path / "config.json"
    params_dir = path / "params"
    if not config_path.exists() or not params_dir.is_dir():
        raise FileNotFoundError(f"{path} is not a bert_jax checkpoint (config.json + params/)")
    config = config_from_json_file(config_path)
    model = default_model(config_path, family_of(config).base_model)
    try:
        with ocp.StandardCheckpointer() as ckptr:
            tree = ckptr.restore(params_dir)
    except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
        raise ConversionError(
            f"cannot read {params_dir}: corrupt or incomplete checkpoint ({e})"
        ) from e
    shapes = traverse_util.flatten_dict(tree, sep="/")
    check_config_fits(config, {k: np.shape(v) for k, v in shapes.items()}, config_path, params_dir)
    flat = check_params(config, tree, model)
    return config, unflatten_params(flat, scan_layers), model
