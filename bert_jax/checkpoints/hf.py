"""Hugging Face PyTorch checkpoints: `config.json` + `model.safetensors` or `pytorch_model.bin`,
sharded (`*.index.json`) or not, with or without the encoder's prefix (`bert.`, `model.`), old
`gamma`/`beta` LayerNorm names, the tied decoder and either spelling of a tied tensor
(`FamilyConversion.hf_aliases`). config.json's `model_type` picks the family. A directory with
only transformers' Flax weights (`flax_model.msgpack`, `hf_flax`) reads alike.

Files are read and written through `etils.epath`: a local path or a URL (gs://...).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import logging
from etils import epath

from bert_jax.checkpoints import hf_flax
from bert_jax.checkpoints.table import (
    ConversionError,
    ConversionReport,
    ParamRule,
    PyTree,
    assemble_params,
    check_config_fits,
    conversion_of,
    flatten_params,
    params_to_hf_state,
    write_hf_config,
)
from bert_jax.models.families import MODEL_CLASSES, EncoderConfig, config_from_json_file, family_of
from bert_jax.paths import as_path, is_url, missing_path_error, prepare_out_dir, write_file_whole

HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    *hf_flax.WEIGHT_FILES,  # read when a directory has no PyTorch weights
)
# Non-parameter entries some checkpoints carry.
_BUFFER_RE = re.compile(r"(^|\.)(position_ids|token_type_ids)$")


def read_hf_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a Hugging Face checkpoint directory (or one weight file) as numpy arrays,
    named as in the PyTorch state dict.

    safetensors and Flax msgpack files are read without torch; `pytorch_model.bin` needs torch.
    """
    path = as_path(path)
    if path.is_dir():
        for name in HF_WEIGHT_FILES:
            if (path / name).exists():
                return read_hf_state_dict(path / name)
        raise FileNotFoundError(f"no weights in {path}: expected one of {list(HF_WEIGHT_FILES)}")
    if not path.exists():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    flax = hf_flax.is_flax_file(path)  # transformers' Flax classes: the same names, "/"-joined
    if path.name.endswith(".index.json"):
        state = _read_sharded(path, flax)
        return hf_flax.to_torch_names(state) if flax else state
    if flax:
        return hf_flax.to_torch_names(_read_flax_file(path))
    if path.name.endswith(".safetensors"):
        return _read_safetensors(path)
    return _read_torch_pickle(path)


def _read_sharded(path: epath.Path, flax: bool) -> dict[str, np.ndarray]:
    """Every shard a `*.index.json` lists, as one {name: array}."""
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
        raise ConversionError(f"{path} is not a valid sharded index: {e}") from e
    if not isinstance(weight_map, dict):
        raise ConversionError(f"{path} is not a valid sharded index: weight_map is no object")
    state = {}
    read_shard = _read_flax_file if flax else read_hf_state_dict
    for shard in sorted({_shard_path(path, name) for name in weight_map.values()}, key=str):
        state.update(read_shard(shard))
    absent = sorted(set(weight_map) - set(state))
    if absent:
        raise ConversionError(f"{path} lists tensors no shard holds: {absent[:10]}")
    return state


def _read_safetensors(path: epath.Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.flax import load, load_file  # flax: bfloat16 too (numpy has none)

    try:
        tensors = load(path.read_bytes()) if is_url(path) else load_file(os.fspath(path))
        return {k: np.asarray(v) for k, v in tensors.items()}
    except (SafetensorError, OSError, ValueError) as e:
        raise ConversionError(f"cannot read {path}: corrupt or not a safetensors file ({e})") from e


def _read_torch_pickle(path: epath.Path) -> dict[str, np.ndarray]:
    """`pytorch_model.bin`: a torch pickle, read with weights_only (no code runs)."""
    import torch

    try:
        state = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a bad pickle
        raise ConversionError(
            f"cannot read {path}: corrupt or not a PyTorch checkpoint ({e})"
        ) from e
    out = {}
    for k, t in state.items():
        if t.dtype == torch.bfloat16:
            t = t.float()  # numpy has no bfloat16; float32 holds it exactly
        out[k] = t.numpy()
    return out


def _shard_path(index_path: epath.Path, shard: Any) -> epath.Path:
    """The file a shard index names, refused unless it is a plain file name in the index's folder
    (no directories, no absolute path, no link resolving outside): an index from elsewhere must
    not make the loader read other files."""
    folder = index_path.parent
    entry = f"{index_path}: weight_map entry {shard!r}"
    if not isinstance(shard, str) or shard in ("", ".", "..") or os.path.basename(shard) != shard:
        raise ConversionError(f"{entry} is not a file name in the checkpoint directory {folder}")
    target = folder / shard
    if is_url(target):  # an object store has no links
        return target
    real = os.path.realpath(target)
    if os.path.dirname(real) != os.path.realpath(folder):
        raise ConversionError(
            f"{entry} resolves to {real}, outside the checkpoint directory {folder}"
        )
    return target


def _read_flax_file(path: epath.Path) -> dict[str, np.ndarray]:
    """One Flax msgpack file as {Flax name: array}; a bad file is a ConversionError."""
    try:
        return hf_flax.read_file(path)
    except hf_flax.FlaxFormatError as e:
        raise ConversionError(str(e)) from e


def _normalize_hf(state: Mapping[str, np.ndarray], report: ConversionReport) -> dict:
    out = {}
    for key, value in state.items():
        if _BUFFER_RE.search(key):  # computed from the config: nothing to carry
            report.buffers.append(key)
            continue
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
        key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
        out[key] = value
    return out


def _hf_lookup(config: EncoderConfig, state: Mapping[str, np.ndarray]):
    """The `assemble_params` lookup of a state dict: a rule's HF key with or without the encoder
    prefix, or its alias (both present: they must agree)."""
    conv = conversion_of(config)
    aliases = dict(conv.hf_aliases)

    def candidates(hf_key: str) -> list[str]:
        if hf_key.startswith(conv.hf_prefix):
            keys = [hf_key, hf_key[len(conv.hf_prefix) :]]
        elif hf_key.startswith(conv.hf_roots):
            keys = [hf_key, conv.hf_prefix + hf_key]
        else:
            keys = [hf_key]
        return keys + [aliases[hf_key]] if hf_key in aliases else keys

    def lookup(rule: ParamRule, used: set[str]):
        present = [k for k in candidates(rule.hf_key) if k in state]
        if not present:
            return None
        if rule.hf_key in aliases and len(present) == 2:
            a, b = state[present[0]], state[present[1]]
            if a.shape != b.shape or not np.array_equal(a, b):
                raise ConversionError(
                    f"{present[0]} and {present[1]} differ; they are one tied parameter in "
                    f"{config.display_name}"
                )
            used.add(present[1])
        w = state[present[0]]
        if w.size != rule.source_size:
            return present[0], w  # reported with both shapes by assemble_params
        return present[0], rule.from_hf(w)

    return lookup


def _check_tied_decoder(config, state, params, report: ConversionReport) -> None:
    """An explicit tied decoder weight must equal the word embeddings (it is not a parameter).
    A config that unties it (EuroBERT's `tie_word_embeddings=False`) reads it as a parameter."""
    conv = conversion_of(config)
    key = conv.tied_decoder
    if key not in state or not getattr(config, "tie_word_embeddings", True):
        return
    flat = flatten_params(params)
    emb_key = next(k for k in flat if k.endswith(conv.word_embeddings))
    ours = flat[emb_key][: config.vocab_size]  # without the padding rows
    if not np.array_equal(state[key].astype(np.float32), ours.astype(np.float32)):
        raise ConversionError(
            f"{key} differs from the word embeddings; bert_jax ties the MLM decoder to "
            "them (an untied decoder would be silently lost)"
        )
    if key in report.unused:
        report.unused.remove(key)


def hf_state_to_params(
    config: EncoderConfig,
    state: Mapping[str, np.ndarray],
    model: str,
    *,
    allow_new_heads: bool = False,
    scan_layers: bool = False,
    dtype=np.float32,
    seed: int = 0,
) -> tuple[PyTree, ConversionReport]:
    """Maps a Hugging Face state dict onto `model`'s parameter tree. Returns (params, report)."""
    report = ConversionReport()
    state = _normalize_hf(state, report)
    legacy = conversion_of(config).hf_legacy
    if legacy is not None:
        state = legacy(state)
    params = assemble_params(
        config,
        model,
        _hf_lookup(config, state),
        list(state),
        allow_new_heads=allow_new_heads,
        scan_layers=scan_layers,
        dtype=dtype,
        seed=seed,
        report=report,
    )
    _check_tied_decoder(config, state, params, report)
    if report.buffers:
        logging.debug("stored buffers not read (the model computes them): %s", report.buffers)
    return params, report


def default_model(config_path: str | os.PathLike, fallback: str) -> str:
    """The first head class config.json's `architectures` names that bert_jax has, else
    `fallback`."""
    archs = json.loads(as_path(config_path).read_text(encoding="utf-8")).get("architectures")
    known = [a for a in archs or [] if a in MODEL_CLASSES]
    return known[0] if known else fallback


def load_pytorch(
    path: str | os.PathLike,
    model: str | None = "BertForPreTraining",
    *,
    allow_new_heads: bool = False,
    scan_layers: bool = False,
    dtype=np.float32,
    seed: int = 0,
    return_report: bool = False,
):
    """Loads a Hugging Face directory as (config, params) for bert_jax's `model` class.

    Args:
      path: directory (local or a URL) with config.json and model.safetensors /
        pytorch_model.bin / flax_model.msgpack (sharded or not); config.json's `model_type`
        picks the family (BERT or ModernBERT) and its config class.
      model: bert_jax head class name ("BertForPreTraining", "ModernBertForMaskedLM", ...) of
        that family; None takes config.json's `architectures`.
      allow_new_heads: initialize task-head weights the checkpoint lacks (listed in the report)
        instead of raising.
      scan_layers: return the stacked-layer layout for `RuntimeConfig(scan_layers=True)`.
      dtype: parameter dtype of the result.
      seed: seed for newly initialized heads.
      return_report: also return the `ConversionReport`.

    Returns:
      (config, params) or (config, params, report); params is a plain dict of numpy arrays.
    """
    given, path = path, as_path(path)
    config_path = path / "config.json"
    if not path.exists():
        raise missing_path_error(given)  # as given: a Hub id reads as one
    if not config_path.exists():
        raise FileNotFoundError(f"{path} has no config.json; is it a Hugging Face model directory?")
    config = config_from_json_file(config_path)
    model = model or default_model(config_path, family_of(config).base_model)
    state = read_hf_state_dict(path)
    check_config_fits(config, {k: np.shape(v) for k, v in state.items()}, config_path, path)
    params, report = hf_state_to_params(
        config,
        state,
        model,
        allow_new_heads=allow_new_heads,
        scan_layers=scan_layers,
        dtype=dtype,
        seed=seed,
    )
    if not return_report:  # a caller asking for the report logs it (once)
        report.log(f"loaded {model} from {path}")
    return (config, params, report) if return_report else (config, params)


def save_pytorch(
    config: EncoderConfig,
    params: PyTree,
    out_dir: str | os.PathLike,
    model: str = "BertForPreTraining",
    *,
    overwrite: bool = False,
) -> str:
    """Writes a Hugging Face directory (model.safetensors + config.json) for `model`.

    `transformers.<model>.from_pretrained(out_dir)` loads it with no missing and no unexpected
    keys. Needs neither torch nor transformers. Files are written to temporary names and renamed,
    so an interrupted save leaves any previous files intact. Returns `out_dir`.
    """
    from safetensors.numpy import save_file

    state = params_to_hf_state(config, params, model)
    out_dir = prepare_out_dir(out_dir, ["model.safetensors", "config.json"], overwrite)
    for stale in (
        "pytorch_model.bin",
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
    ):
        if (out_dir / stale).exists():
            raise FileExistsError(
                f"{out_dir} holds {stale}, which transformers would load instead; remove it first"
            )
    state = {k: _savable(v) for k, v in state.items()}
    write_file_whole(out_dir / "model.safetensors", lambda p: save_file(state, p, {"format": "pt"}))
    write_hf_config(out_dir, config, model)
    return os.fspath(out_dir)


def _savable(x: np.ndarray) -> np.ndarray:
    if x.dtype.name == "bfloat16":  # safetensors' numpy writer has no bfloat16
        return x.astype(np.float32)
    return np.ascontiguousarray(x)
