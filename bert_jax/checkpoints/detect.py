"""Which format a checkpoint path holds (`detect_format`) and reading any of them as one record
(`load_any`): Hugging Face (PyTorch or Flax weights), TF, bert_jax's own, or a `train.py` run.
Paths through `etils.epath` (local or a URL).
"""

from __future__ import annotations

import os

from bert_jax.checkpoints import hf, hf_flax, native, run_params, table, tf
from bert_jax.checkpoints.table import ConversionReport, flatten_params
from bert_jax.models.families import Role, config_from_json_file, head_in_family
from bert_jax.paths import as_path, missing_path_error


def detect_format(path: str | os.PathLike) -> str:
    """The format of the checkpoint at `path`: "hf" (PyTorch weights), "hf_flax" (only Flax
    weights), "tf", "bert_jax" or "train" (a workdir: its `checkpoints/`, or the `export/` a
    finished run wrote, as a fine-tuning run keeps it once its checkpoints are removed)."""
    given, path = path, as_path(path)
    if path.is_dir():
        files = {p.name for p in path.iterdir()}
        if "config.json" in files and "params" in files:
            return "bert_jax"
        if any(d in files and (path / d).is_dir() for d in ("checkpoints", "export")):
            return "train"
        weights = files & set(hf.HF_WEIGHT_FILES)
        if "config.json" in files and weights:
            return "hf_flax" if weights <= set(hf_flax.WEIGHT_FILES) else "hf"
        if tf.tf_family().conversion.tf_config_file in files or any(
            f.endswith(".index") for f in files
        ):
            return "tf"
        error = several_seeds(path)
        if error is not None:
            raise error
        raise ValueError(
            f"{path} holds no recognizable checkpoint (config.json + weights, config.json + "
            "params/, or bert_config.json + a TF checkpoint's *.index)"
        )
    if tf.is_tf_path(path):
        return "tf"
    raise missing_path_error(given)  # as given: a Hub id reads as one


def several_seeds(path) -> ValueError | None:
    """The error for a run of several seeds at `path` (a directory that keeps one model per
    seed_<n>/), naming each seed's directory; None for any other directory."""
    path = as_path(path)
    seeds = sorted(p.name for p in path.iterdir() if p.name.startswith("seed_") and p.is_dir())
    if not seeds:
        return None
    return ValueError(
        f"{path} is a run of {len(seeds)} seeds, one model each: name one of "
        f"{', '.join(os.fspath(path / s) for s in seeds)}"
    )


def _load_own(path, fmt: str, model: str | None, allow_new_heads: bool):
    """`load_any` of bert_jax's format or a run (its `export/` where it has one, as the loader
    `pretrained.load` reads a run; else its newest checkpoint): the stored head, or another of
    the family's re-mapped through the Hugging Face names (new heads initialized when allowed)."""
    if fmt == "train" and (as_path(path) / "export").is_dir():
        path, fmt = as_path(path) / "export", "bert_jax"
    if fmt == "bert_jax":
        config, params, stored = native.load_pretrained(path)
    else:
        config, params, stored, _ = run_params.load_training_checkpoint(path)
    model = model and head_in_family(config, model)
    if model and model != stored:
        state = table.params_to_hf_state(config, params, stored)
        params, report = hf.hf_state_to_params(
            config, state, model, allow_new_heads=allow_new_heads
        )
        return config, params, model, report
    return config, params, stored, ConversionReport(loaded=list(flatten_params(params)))


def load_any(
    path: str | os.PathLike,
    model: Role | str | None,
    *,
    allow_new_heads: bool = False,
    hidden_act: str | None = None,
    config_path: str | os.PathLike | None = None,
):
    """(config, params, model, report) from an HF (PyTorch or Flax), TF, bert_jax or train.py
    checkpoint path. `model` is a `Role` (Role.ENCODER loads a ModernBERT checkpoint's
    ModernBertModel) or a class name of the checkpoint's family; another family's class name
    raises ValueError naming the family's own (`Family.head_for`).
    `hidden_act` and `config_path` (the config file in place of the one beside the checkpoint)
    are for TF checkpoints only (`load_tf`): the other formats' config.json names the
    activation."""
    fmt = detect_format(path)
    if hidden_act is not None and fmt != "tf":
        raise ValueError(
            f"--hidden-act / hidden_act is for TF checkpoints (bert_config.json's ambiguous "
            f"'gelu'); {path} is a {fmt} checkpoint whose config.json names its activation"
        )
    if config_path is not None and fmt != "tf":
        raise ValueError(
            f"--config / config_path is for TF checkpoints (whose config file may be elsewhere); "
            f"{path} is a {fmt} checkpoint with its own config.json"
        )
    if fmt in ("bert_jax", "train"):
        return _load_own(path, fmt, model, allow_new_heads)
    if fmt in ("hf", "hf_flax"):
        model = model and head_in_family(config_from_json_file(path), model)
        config, params, report = hf.load_pytorch(
            path, model, allow_new_heads=allow_new_heads, return_report=True
        )
        return config, params, model or hf.default_model(as_path(path) / "config.json", ""), report
    model = tf.tf_head(path, model, config_path=config_path)  # the config's family's class
    config, params, report = tf.load_tf(
        path, model, config_path=config_path, allow_new_heads=allow_new_heads,
        hidden_act=hidden_act, return_report=True,
    )  # fmt: skip
    return config, params, model, report
