"""Lossless conversion between bert_jax parameters and other BERT checkpoint formats.

Formats:
  * Hugging Face PyTorch directories: `config.json` + `model.safetensors` or `pytorch_model.bin`,
    sharded (`*.index.json`) or not, with or without the `bert.` prefix, old `gamma`/`beta`
    LayerNorm names, the tied decoder and either spelling of the MLM output bias. ModernBERT
    directories too (`model_type: "modernbert"` in config.json picks the family,
    `bert_jax.models.families`), with or without the `model.` prefix.
  * google-research/bert TF checkpoints: `bert_model.ckpt.*` or `model.ckpt-N.*` +
    `bert_config.json` (`find_tf_checkpoint`; its "gelu" is erf unless told otherwise,
    `TF_GELU_NOTE`). TensorFlow is an optional extra, imported only here.
  * transformers' Flax classes (4.x): `config.json` + `flax_model.msgpack`, sharded or not, with
    or without the `bert` prefix (`bert_jax.checkpoints.hf_flax`).
  * bert_jax's own directory: `config.json` + an Orbax `params/` checkpoint.

One table (`parameter_table`) maps every bert_jax parameter to its Hugging Face and TF name and to
the reshape/transpose between them; loading and saving both read it. Nothing is silent: a missing
weight raises unless new task heads are asked for (and the report lists them), every unused source
weight is listed, and a shape mismatch names the key and both shapes.

Python API:
    config, params = load_pytorch(hf_dir, model="BertForPreTraining")
    save_pytorch(config, params, out_dir, model="BertForPreTraining")
    config, params = load_tf(ckpt_prefix, model="BertForPreTraining")
    save_pretrained(out_dir, config, params, model=...)
    config, params, model = load_pretrained(dir)

Command line: `python -m bert_jax.convert SRC DST [--to hf|hf_flax|bert_jax] [--model NAME]
[--verify] [--model-card]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from etils import epath
from flax import traverse_util

from bert_jax.checkpoints import hf_flax, hub, model_card, run_params
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import (
    MODEL_CLASSES,
    ModelConfig,
    config_from_hf_dict,
    config_from_json_file,
    family_of,
    get_model_class,
    head_in_family,
)
from bert_jax.models.params import init_params, is_stacked, stack_layers, unstack_layers
from bert_jax.parallel import multihost
from bert_jax.paths import as_path, is_url, missing_path_error

PyTree = Any
HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    *hf_flax.WEIGHT_FILES,  # read when a directory has no PyTorch weights
)
# Non-parameter entries some checkpoints carry.
_BUFFER_RE = re.compile(r"(^|\.)(position_ids|token_type_ids)$")
_TF_SKIP_RE = re.compile(r"(^global_step$|/adam_[mv]$|^bad_steps$|^good_steps$|^loss_scale$)")


class ConversionError(ValueError):
    """A checkpoint cannot be converted without losing or inventing weights."""


@dataclasses.dataclass(frozen=True)
class HfLayout:
    """How a family's Hugging Face state dict is laid out around the names `_hf_key` derives.

    Attributes:
      prefix: the encoder's prefix in a head's state dict (absent in the encoder's own).
      roots: the encoder's top-level names (keys starting with them may lack the prefix).
      structural: flax keys that must come from the checkpoint (never newly initialized).
      tied_decoder: the MLM decoder weight, tied to the word embeddings (often omitted).
      word_embeddings: the word-embedding table's flax key, without the prefix.
    """

    prefix: str
    roots: tuple[str, ...]
    structural: str
    tied_decoder: str
    word_embeddings: str


HF_LAYOUTS = {
    "bert": HfLayout(
        "bert.",
        ("embeddings.", "encoder.", "pooler."),
        r"^(bert/)?(embeddings|encoder)/",
        "cls.predictions.decoder.weight",
        "embeddings/word_embeddings/embedding",
    ),
    "modernbert": HfLayout(
        "model.",
        ("embeddings.", "layers.", "final_norm."),
        r"^(model/)?(embeddings|layers_\d+|final_norm)/",
        "decoder.weight",
        "embeddings/tok_embeddings/embedding",
    ),
}


def _layout(config: ModelConfig) -> HfLayout:
    return HF_LAYOUTS[family_of(config).model_type]


@dataclasses.dataclass
class ConversionReport:
    """What a load did: every target weight is either `loaded` or `newly_initialized`."""

    loaded: list[str] = dataclasses.field(default_factory=list)
    newly_initialized: list[str] = dataclasses.field(default_factory=list)
    unused: list[str] = dataclasses.field(default_factory=list)
    ignored: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # choices made while reading

    def summary(self) -> str:
        lines = [f"loaded {len(self.loaded)} weights"]
        lines += [f"note: {n}" for n in self.notes]
        if self.newly_initialized:
            lines.append(f"newly initialized ({len(self.newly_initialized)}):")
            lines += [f"  {k}" for k in self.newly_initialized]
        if self.unused:
            lines.append(f"unused source weights ({len(self.unused)}):")
            lines += [f"  {k}" for k in self.unused]
        if self.ignored:
            shown = ", ".join(self.ignored[:3]) + (", ..." if len(self.ignored) > 3 else "")
            lines.append(
                f"skipped {len(self.ignored)} stored entries that are not weights ({shown}: "
                "PyTorch buffers, TF optimizer slots or step counters); expected, nothing to do"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ParamRule:
    """One bert_jax parameter and its names and layouts elsewhere.

    `flax_key` is the "/"-joined path in the (unstacked) parameter tree; `shape` its shape there.
    PyTorch stores Linear weights [out, in] with heads flattened; TF stores kernels [in, out].
    `vocab_rows` is set (to V) for the word embeddings and the MLM bias: bert_jax holds them with
    `BertConfig.padded_vocab_size` rows, other formats with V; loading pads zeros, saving strips.
    """

    flax_key: str
    shape: tuple[int, ...]
    hf_key: str
    tf_key: str
    kind: str  # "kernel" (2-D or head-split), "tf_out_weights" (TF [out, in]), "vector", "table"
    vocab_rows: int | None = None

    @property
    def source_size(self) -> int:
        """Elements of the parameter in a Hugging Face or TF checkpoint (unpadded)."""
        rows = self.shape[0] if self.vocab_rows is None else self.vocab_rows
        return rows * math.prod(self.shape[1:])

    def _pad(self, w: np.ndarray) -> np.ndarray:
        if self.vocab_rows is None:
            return w
        w = w.reshape(self.vocab_rows, *self.shape[1:])
        return _fit_rows(w, self.vocab_rows, self.shape[0])

    @property
    def _n_in(self) -> int:
        """Leading kernel axes that are inputs: 2 for projections out of the heads [H, D, E]."""
        return (
            2 if self.flax_key.endswith(("attention/output/dense/kernel", "attn/Wo/kernel")) else 1
        )

    def _flat(self, x: np.ndarray) -> np.ndarray:
        """flax kernel -> [in, out]."""
        n_in = math.prod(self.shape[: self._n_in])
        return x.reshape(n_in, -1)

    def from_hf(self, w: np.ndarray) -> np.ndarray:
        if self.kind in ("kernel", "tf_out_weights"):
            return np.ascontiguousarray(w.T).reshape(self.shape)
        return self._pad(w).reshape(self.shape)

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        if self.kind in ("kernel", "tf_out_weights"):
            return np.ascontiguousarray(self._flat(x).T)
        if self.vocab_rows is not None:
            x = x[: self.vocab_rows]
        return np.ascontiguousarray(x.reshape(-1) if x.ndim > 1 and self.kind == "vector" else x)

    def from_tf(self, w: np.ndarray) -> np.ndarray:
        if self.kind == "tf_out_weights":
            return np.ascontiguousarray(w.T).reshape(self.shape)
        return self._pad(w).reshape(self.shape)


def _hf_key(flax_key: str) -> str:
    key = re.sub(r"(layers?)_(\d+)", r"\1.\2", flax_key).replace("/", ".")
    return re.sub(r"\.(kernel|embedding|scale)$", ".weight", key)


_TF_RENAMES = (
    (r"^cls/predictions/bias$", "cls/predictions/output_bias"),
    (r"^cls/seq_relationship/kernel$", "cls/seq_relationship/output_weights"),
    (r"^cls/seq_relationship/bias$", "cls/seq_relationship/output_bias"),
    (r"^classifier/kernel$", "output_weights"),  # run_classifier.py
    (r"^classifier/bias$", "output_bias"),
    (r"^qa_outputs/kernel$", "cls/squad/output_weights"),  # run_squad.py
    (r"^qa_outputs/bias$", "cls/squad/output_bias"),
    (r"/embedding$", ""),
    (r"LayerNorm/scale$", "LayerNorm/gamma"),
    (r"LayerNorm/bias$", "LayerNorm/beta"),
)


def _tf_key(flax_key: str) -> str:
    key = (
        flax_key
        if flax_key.startswith(("bert/", "cls/", "classifier/", "qa_outputs/"))
        else ("bert/" + flax_key)
    )
    for pattern, repl in _TF_RENAMES:
        key = re.sub(pattern, repl, key)
    return key


def parameter_table(config: ModelConfig, model: str) -> list[ParamRule]:
    """One rule per parameter of `model` (a head class name) under `config`, unstacked layout."""
    shapes = expected_shapes(config, model)
    rules = []
    for key, shape in shapes.items():
        if key.endswith(("/kernel",)):
            kind = "kernel"
            if re.search(r"(^|/)(seq_relationship|classifier|qa_outputs)/kernel$", key):
                kind = "tf_out_weights"
        elif key.endswith("/embedding"):
            kind = "table"
        else:
            kind = "vector"
        rows = config.vocab_size if _VOCAB_KEY_RE.search(key) else None
        rules.append(ParamRule(key, shape, _hf_key(key), _tf_key(key), kind, rows))
    return rules


def expected_shapes(config: ModelConfig, model: str) -> dict[str, tuple[int, ...]]:
    """{"/"-joined path: shape} of every parameter of `model`, unstacked, without allocating."""
    module = get_model_class(model)(config, RuntimeConfig())
    abstract = jax.eval_shape(lambda: init_params(module, jax.random.PRNGKey(0)))
    from flax import linen as nn

    flat = traverse_util.flatten_dict(nn.meta.unbox(abstract), sep="/")
    return {k: tuple(v.shape) for k, v in flat.items()}


def _flatten(params: PyTree) -> dict[str, np.ndarray]:
    from flax import linen as nn

    params = nn.meta.unbox(params)
    if is_stacked(params):
        params = unstack_layers(params)
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}


# Parameters with a row per token: the word embeddings and the MLM output bias of either family.
_VOCAB_KEY_RE = re.compile(
    r"(^|/)(embeddings/(word|tok)_embeddings/embedding|predictions/bias)$|^decoder/bias$"
)


def _fit_rows(x: np.ndarray, keep: int, rows: int) -> np.ndarray:
    """The first `keep` rows of `x`, then zero rows up to `rows`."""
    x = np.asarray(x)[:keep]
    return np.pad(x, [(0, rows - x.shape[0])] + [(0, 0)] * (x.ndim - 1))


def fit_vocab_rows(params: PyTree, config: ModelConfig) -> PyTree:
    """Host `params` (unstacked) with the word embeddings and MLM bias cut to V rows and padded
    with zeros to `config.padded_vocab_size`: weights saved under another `vocab_pad_multiple`
    (a Hugging Face model has none) made to fit this config's model."""
    flat = traverse_util.flatten_dict(params, sep="/")
    rows = config.padded_vocab_size
    for key, x in flat.items():
        if _VOCAB_KEY_RE.search(key) and np.shape(x)[0] != rows:
            flat[key] = _fit_rows(x, config.vocab_size, rows)
    return traverse_util.unflatten_dict(flat, sep="/")


def _unflatten(flat: Mapping[str, np.ndarray], scan_layers: bool) -> PyTree:
    tree = traverse_util.unflatten_dict(dict(flat), sep="/")
    return stack_layers(tree) if scan_layers else tree


def check_params(config: ModelConfig, params: PyTree, model: str) -> dict[str, np.ndarray]:
    """Flattens `params` and checks names and shapes against `model`; raises naming any mismatch."""
    flat = _flatten(params)
    shapes = expected_shapes(config, model)
    missing = sorted(set(shapes) - set(flat))
    extra = sorted(set(flat) - set(shapes))
    if missing or extra:
        raise ConversionError(
            f"parameters do not match {model}: missing {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''}, unexpected {extra[:10]}"
            f"{' ...' if len(extra) > 10 else ''}"
        )
    for key, shape in shapes.items():
        if flat[key].shape != shape:
            raise ConversionError(f"{key}: parameter has shape {flat[key].shape}, expected {shape}")
    return flat


# --------------------------------------------------------------------------------------------
# Loading into bert_jax
# --------------------------------------------------------------------------------------------
# A layer's index in any spelling: HF "encoder.layer.3." / "layers.3.", TF and flax
# "encoder/layer_3/" / "layers_3/".
_LAYER_INDEX_RE = re.compile(r"(?:^|[./])layers?[._](\d+)[./]")
# (weight name pattern, config field, axis of that weight the field sizes): the same axis in
# every format, so a config is checked against a checkpoint by names and shapes alone.
_SIZED_BY_CONFIG = (
    (r"(word|tok)_embeddings(\.weight|/embedding)?$", "vocab_size", 0),
    (r"(word|tok)_embeddings(\.weight|/embedding)?$", "hidden_size", -1),
    (r"position_embeddings(\.weight|/embedding)?$", "max_position_embeddings", 0),
    (r"token_type_embeddings(\.weight|/embedding)?$", "type_vocab_size", 0),
)


def check_config_fits(
    config: ModelConfig,
    shapes: Mapping[str, Sequence[int]],
    config_path: str | os.PathLike,
    weights: str | os.PathLike,
) -> None:
    """Checks `config` against a checkpoint's {weight name: shape}, before anything is built from
    the config: its number of layers (the layer indices the names hold) and the sizes its
    embedding tables have. A config.json that does not describe the weights (a stranger's, with
    num_hidden_layers=100000) fails here, instead of building 100000 layers' shapes.

    Raises:
      ConversionError: naming the config field, `config_path`, both values and `weights`.
    """
    layers = {int(m.group(1)) for k in shapes for m in [_LAYER_INDEX_RE.search(k)] if m}
    if layers and len(layers) != config.num_hidden_layers:
        raise ConversionError(
            f"{config_path}: num_hidden_layers={config.num_hidden_layers!r}, but the weights "
            f"({weights}) hold {len(layers)} layers (indices {min(layers)}..{max(layers)}); this "
            "config does not describe these weights"
        )
    rows = {"vocab_size": {config.vocab_size, config.padded_vocab_size}}
    for pattern, field, axis in _SIZED_BY_CONFIG:
        value = getattr(config, field, None)
        for key, shape in shapes.items():
            if value is None or not re.search(pattern, key) or not len(shape):
                continue
            if int(shape[axis]) not in rows.get(field, {value}):
                found = tuple(int(n) for n in shape)
                wanted = list(found)
                wanted[axis] = value
                raise ConversionError(
                    f"{key}: checkpoint shape {found} in {weights} does not fit {config_path}'s "
                    f"{field}={value!r} (which makes it {tuple(wanted)}); this config does not "
                    "describe these weights"
                )


def _is_head_key(flax_key: str, layout: HfLayout) -> bool:
    """Weights that may be newly initialized when asked for: everything but embeddings/encoder."""
    return not re.match(layout.structural, flax_key)


def _assemble(
    config: ModelConfig,
    model: str,
    lookup,
    source_keys: Sequence[str],
    *,
    allow_new_heads: bool,
    scan_layers: bool,
    dtype,
    seed: int,
    report: ConversionReport,
) -> PyTree:
    """Builds the parameter tree of `model` from `lookup(rule) -> (source_key, array) | None`."""
    flat: dict[str, np.ndarray] = {}
    used: set[str] = set()
    missing = []
    for rule in parameter_table(config, model):
        found = lookup(rule, used)
        if found is None:
            missing.append(rule.flax_key)
            continue
        src_key, value = found
        if value.size != math.prod(rule.shape):
            raise ConversionError(
                f"{src_key}: checkpoint shape {tuple(value.shape)} does not fit {rule.flax_key} "
                f"of shape {rule.shape} (config: hidden_size={config.hidden_size}, "
                f"vocab_size={config.vocab_size}, ...)"
            )
        flat[rule.flax_key] = value
        used.add(src_key)
        report.loaded.append(rule.flax_key)
    unexpected = sorted(k for k in source_keys if k not in used)
    if missing:
        structural = [k for k in missing if not _is_head_key(k, _layout(config))]
        if structural or not allow_new_heads:
            raise ConversionError(
                f"checkpoint lacks {len(missing)} weight(s) of {model}: {missing[:12]}"
                + (" ..." if len(missing) > 12 else "")
                + (f"; it has unexpected weights {unexpected[:12]}" if unexpected else "")
                + (
                    ""
                    if structural
                    else "; pass allow_new_heads=True (--allow-new-heads) to initialize new heads"
                )
            )
        fresh = _flatten(init_params(get_model_class(model)(config), jax.random.PRNGKey(seed)))
        for key in missing:
            flat[key] = fresh[key]
        report.newly_initialized.extend(missing)
        logging.warning("newly initialized weights: %s", missing)
    report.unused.extend(unexpected)
    if report.unused:
        logging.warning("unused checkpoint weights: %s", report.unused)
    flat = {k: np.asarray(v, dtype=dtype) for k, v in flat.items()}
    return _unflatten(flat, scan_layers)


def read_hf_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a Hugging Face checkpoint directory (or one weight file) as numpy arrays,
    named as in the PyTorch state dict.

    safetensors and Flax msgpack files are read without torch; `pytorch_model.bin` needs torch.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        for name in HF_WEIGHT_FILES:
            if os.path.exists(os.path.join(path, name)):
                return read_hf_state_dict(os.path.join(path, name))
        raise FileNotFoundError(f"no weights in {path}: expected one of {list(HF_WEIGHT_FILES)}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    flax = hf_flax.is_flax_file(path)  # transformers' Flax classes: the same names, "/"-joined
    if path.endswith(".index.json"):
        with open(path, encoding="utf-8") as f:
            try:
                weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise ConversionError(f"{path} is not a valid sharded index: {e}") from e
        if not isinstance(weight_map, dict):
            raise ConversionError(f"{path} is not a valid sharded index: weight_map is no object")
        state = {}
        read_shard = _read_flax_file if flax else read_hf_state_dict
        for shard in sorted({_shard_path(path, name) for name in weight_map.values()}):
            state.update(read_shard(shard))
        absent = sorted(set(weight_map) - set(state))
        if absent:
            raise ConversionError(f"{path} lists tensors no shard holds: {absent[:10]}")
        return hf_flax.to_torch_names(state) if flax else state
    if flax:
        return hf_flax.to_torch_names(_read_flax_file(path))
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError
        from safetensors.flax import load_file

        try:
            return {k: np.asarray(v) for k, v in load_file(path).items()}
        except (SafetensorError, OSError, ValueError) as e:
            raise ConversionError(
                f"cannot read {path}: corrupt or not a safetensors file ({e})"
            ) from e
    import torch  # pytorch_model.bin: a torch pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
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


def _shard_path(index_path: str, shard: Any) -> str:
    """The file a shard index names, refused unless it is a plain file name in the index's folder
    (no directories, no absolute path, no link resolving outside): an index from elsewhere must
    not make the loader read other files."""
    folder = os.path.dirname(os.path.abspath(index_path))
    entry = f"{index_path}: weight_map entry {shard!r}"
    if not isinstance(shard, str) or shard in ("", ".", "..") or os.path.basename(shard) != shard:
        raise ConversionError(f"{entry} is not a file name in the checkpoint directory {folder}")
    target = os.path.join(folder, shard)
    real = os.path.realpath(target)
    if os.path.dirname(real) != os.path.realpath(folder):
        raise ConversionError(
            f"{entry} resolves to {real}, outside the checkpoint directory {folder}"
        )
    return target


def _read_flax_file(path: str) -> dict[str, np.ndarray]:
    """One Flax msgpack file as {Flax name: array}; a bad file is a ConversionError."""
    try:
        return hf_flax.read_file(path)
    except hf_flax.FlaxFormatError as e:
        raise ConversionError(str(e)) from e


def _normalize_hf(state: Mapping[str, np.ndarray], report: ConversionReport) -> dict:
    out = {}
    for key, value in state.items():
        if _BUFFER_RE.search(key):
            report.ignored.append(key)
            continue
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
        key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
        out[key] = value
    return out


def hf_state_to_params(
    config: ModelConfig,
    state: Mapping[str, np.ndarray],
    model: str = "BertForPreTraining",
    *,
    allow_new_heads: bool = False,
    scan_layers: bool = False,
    dtype=np.float32,
    seed: int = 0,
) -> tuple[PyTree, ConversionReport]:
    """Maps a Hugging Face state dict onto `model`'s parameter tree. Returns (params, report)."""
    report = ConversionReport()
    state = _normalize_hf(state, report)
    layout = _layout(config)

    def candidates(hf_key: str) -> list[str]:
        if hf_key.startswith(layout.prefix):
            keys = [hf_key, hf_key[len(layout.prefix) :]]
        elif hf_key.startswith(layout.roots):
            keys = [hf_key, layout.prefix + hf_key]
        else:
            keys = [hf_key]
        if hf_key == "cls.predictions.bias":
            keys.append("cls.predictions.decoder.bias")
        return keys

    def lookup(rule: ParamRule, used: set[str]):
        present = [k for k in candidates(rule.hf_key) if k in state]
        if not present:
            return None
        if rule.hf_key == "cls.predictions.bias" and len(present) == 2:
            a, b = state[present[0]], state[present[1]]
            if a.shape != b.shape or not np.array_equal(a, b):
                raise ConversionError(
                    "cls.predictions.bias and cls.predictions.decoder.bias differ; "
                    "they are one tied parameter in BERT"
                )
            used.add(present[1])
        w = state[present[0]]
        if w.size != rule.source_size:
            return present[0], w  # reported with both shapes by _assemble
        return present[0], rule.from_hf(w)

    params = _assemble(
        config,
        model,
        lookup,
        list(state),
        allow_new_heads=allow_new_heads,
        scan_layers=scan_layers,
        dtype=dtype,
        seed=seed,
        report=report,
    )
    # The tied decoder: an explicit decoder.weight must equal the word embeddings.
    for key in (layout.tied_decoder,):
        if key in state:
            flat = _flatten(params)
            emb_key = next(k for k in flat if k.endswith(layout.word_embeddings))
            ours = flat[emb_key][: config.vocab_size]  # without the padding rows
            if not np.array_equal(state[key].astype(np.float32), ours.astype(np.float32)):
                raise ConversionError(
                    f"{key} differs from the word embeddings; bert_jax ties the MLM decoder to "
                    "them (an untied decoder would be silently lost)"
                )
            if key in report.unused:
                report.unused.remove(key)
    return params, report


def _default_model(config_path: str, fallback: str) -> str:
    with open(config_path, encoding="utf-8") as f:
        archs = json.load(f).get("architectures") or []
    known = [a for a in archs if a in MODEL_CLASSES]
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
      path: directory with config.json and model.safetensors / pytorch_model.bin /
        flax_model.msgpack (sharded or not); config.json's `model_type` picks the family (BERT
        or ModernBERT) and its config class.
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
    path = os.fspath(path)
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise missing_path_error(path)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{path} has no config.json; is it a Hugging Face model directory?")
    config = config_from_json_file(config_path)
    model = model or _default_model(config_path, family_of(config).base_model)
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
        logging.info("loaded %s from %s: %s", model, path, report.summary())
    return (config, params, report) if return_report else (config, params)


_TF_DATA_RE = re.compile(r"\.data-\d{5}-of-\d{5}$")
_TF_STEP_RE = re.compile(r"-(\d+)$")


def _tf_prefixes(folder: str) -> list[str]:
    """The checkpoint prefixes in `folder`: names with an `.index` file, newest step last."""
    names = [f[: -len(".index")] for f in os.listdir(folder) if f.endswith(".index")]
    names = [n for n in names if n and not n.startswith(".")]

    def step(name: str) -> tuple[int, str]:
        m = _TF_STEP_RE.search(name)
        return (int(m.group(1)) if m else -1, name)

    return sorted(names, key=step)


def _tf_state_file_choice(folder: str) -> tuple[str | None, str | None]:
    """(the prefix, in `folder`, that TF's `checkpoint` file there names, or None; the name as
    written). A path to another folder (or one written on the machine that trained) gives None."""
    state = os.path.join(folder, "checkpoint")
    if not os.path.isfile(state):
        return None, None
    with open(state, encoding="utf-8", errors="replace") as f:
        m = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', f.read(), re.MULTILINE)
    if not m:
        return None, None
    name = m.group(1)
    where = os.path.dirname(name if os.path.isabs(name) else os.path.join(folder, name))
    local = os.path.join(folder, os.path.basename(name))
    if os.path.realpath(where) == os.path.realpath(folder) and os.path.exists(local + ".index"):
        return local, name
    return None, name


def find_tf_checkpoint(path: str | os.PathLike) -> tuple[str, str | None]:
    """The TF checkpoint prefix `path` stands for, and a note on the choice when there was one.

    `path` is a prefix (`.../bert_model.ckpt`, `.../model.ckpt-1000`), one of its files
    (`.index`, `.data-00000-of-00001`) or a folder. In a folder, TF's `checkpoint` file is
    followed when it names a checkpoint in that folder; otherwise (no such file, or an absolute
    path from the machine that trained) the newest step among the folder's `*.index` files is
    taken (`model.ckpt-1000` as run_pretraining.py and run_classifier.py write them).

    Raises:
      FileNotFoundError: no checkpoint there (naming what was looked for).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        prefix = re.sub(r"\.index$", "", _TF_DATA_RE.sub("", path))
        if not os.path.exists(prefix + ".index"):
            raise FileNotFoundError(f"TF checkpoint not found: {prefix}.index")
        return prefix, None
    prefixes = _tf_prefixes(path)
    if not prefixes:
        raise FileNotFoundError(
            f"no TF checkpoint in {path}: no *.index file (e.g. bert_model.ckpt.index, "
            "model.ckpt-1000.index)"
        )
    named, written = _tf_state_file_choice(path)
    if named:
        return named, None if len(prefixes) == 1 else (
            f"read {os.path.basename(named)} (named by {path}/checkpoint) of {len(prefixes)} "
            "checkpoints in the folder"
        )
    ignored = f" ({path}/checkpoint names {written}, not in this folder)" if written else ""
    chosen = os.path.join(path, prefixes[-1])
    if len(prefixes) == 1:
        return chosen, f"read {prefixes[-1]}{ignored}" if ignored else None
    if not _TF_STEP_RE.search(prefixes[-1]):
        raise FileNotFoundError(
            f"{path} holds several TF checkpoints {prefixes} without step numbers{ignored}; "
            "pass the prefix of one"
        )
    return chosen, (
        f"read {prefixes[-1]}, the newest step of {len(prefixes)} checkpoints in {path} "
        f"({', '.join(prefixes)}){ignored}; pass another's prefix to read it"
    )


TF_GELU_NOTE = (
    "bert_config.json's hidden_act 'gelu' is the exact (erf) GELU in google-research/bert's first "
    "release (2018) and in transformers, but its tanh approximation in google-research/bert's code "
    "since February 2019 (outputs differ by up to about 1e-2); erf is assumed. A checkpoint "
    "trained with the later code: pass hidden_act='gelu_new' (--hidden-act gelu_new)"
)


def _tf_config(config_path: str | os.PathLike, hidden_act: str | None, report) -> BertConfig:
    """bert_config.json, with `hidden_act` (if given) in place of its activation; the choice
    made for an ambiguous "gelu" goes to the report's notes (and the log)."""
    config = BertConfig.from_json_file(config_path)
    if hidden_act is not None:
        if hidden_act != config.hidden_act:
            report.notes.append(
                f"hidden_act={hidden_act!r} (given) in place of {config_path}'s "
                f"{config.hidden_act!r}"
            )
        return config.replace(hidden_act=hidden_act)
    if config.hidden_act == "gelu":
        report.notes.append(TF_GELU_NOTE)
        logging.warning("%s", TF_GELU_NOTE)
    return config


def load_tf(
    ckpt: str | os.PathLike,
    model: str = "BertForPreTraining",
    *,
    config_path: str | os.PathLike | None = None,
    hidden_act: str | None = None,
    allow_new_heads: bool = False,
    scan_layers: bool = False,
    dtype=np.float32,
    seed: int = 0,
    return_report: bool = False,
):
    """Loads a google-research/bert TF checkpoint.

    Needs TensorFlow (`pip install bert-jax[tf]`). Optimizer slots (adam_m/adam_v) and
    global_step are ignored and counted in the report.

    Args:
      ckpt: a prefix (`.../bert_model.ckpt`, `.../model.ckpt-1000`), its `.index` or `.data-*`
        file, or a folder (`find_tf_checkpoint`: its newest step unless TF's `checkpoint` file
        names one in it; the report's notes say which).
      config_path: bert_config.json (default: beside the checkpoint).
      hidden_act: the activation, overriding bert_config.json's. Its "gelu" is ambiguous
        (`TF_GELU_NOTE`): erf is assumed and the report says so; "gelu_new" picks the tanh form
        of google-research/bert's code since February 2019.
      Others as `load_pytorch`.
    """
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(
            "reading TF checkpoints needs TensorFlow: pip install 'bert-jax[tf]'"
        ) from e
    ckpt, chosen = find_tf_checkpoint(ckpt)
    report = ConversionReport()
    if chosen:
        report.notes.append(chosen)
    config_path = config_path or os.path.join(os.path.dirname(ckpt), "bert_config.json")
    config = _tf_config(config_path, hidden_act, report)
    try:
        reader = tf.train.load_checkpoint(ckpt)
        names = reader.get_variable_to_shape_map()
    except Exception as e:  # noqa: BLE001 - TF raises its own error types
        raise ConversionError(f"cannot read TF checkpoint {ckpt}: {e}") from e
    check_config_fits(config, names, config_path, ckpt)
    if model in ("BertForSequenceClassification", "BertForTokenClassification"):
        # bert_config.json has no label count; run_classifier.py's output_weights is [N, E].
        if "output_weights" in names:
            config = config.replace(num_labels=int(names["output_weights"][0]))
    keys = []
    for name in sorted(names):
        if _TF_SKIP_RE.search(name):
            report.ignored.append(name)
        else:
            keys.append(name)

    def lookup(rule: ParamRule, used):
        if rule.tf_key not in names:
            return None
        w = reader.get_tensor(rule.tf_key)
        if w.size != rule.source_size:
            return rule.tf_key, w
        return rule.tf_key, rule.from_tf(w)

    params = _assemble(
        config,
        model,
        lookup,
        keys,
        allow_new_heads=allow_new_heads,
        scan_layers=scan_layers,
        dtype=dtype,
        seed=seed,
        report=report,
    )
    if not return_report:  # a caller asking for the report logs it (once)
        logging.info("loaded %s from %s: %s", model, ckpt, report.summary())
    return (config, params, report) if return_report else (config, params)


# --------------------------------------------------------------------------------------------
# Saving from bert_jax
# --------------------------------------------------------------------------------------------
def params_to_hf_state(
    config: ModelConfig, params: PyTree, model: str = "BertForPreTraining"
) -> dict[str, np.ndarray]:
    """The Hugging Face state dict (as `save_pretrained` writes it: tied decoder omitted)."""
    flat = check_params(config, params, model)
    return {rule.hf_key: rule.to_hf(flat[rule.flax_key]) for rule in parameter_table(config, model)}


def _prepare_out_dir(out_dir: epath.Path, names: Sequence[str], overwrite: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    clash = [n for n in names if (out_dir / n).exists()]
    if clash and not overwrite:
        raise FileExistsError(
            f"{out_dir} already holds {clash}; pass overwrite=True (--overwrite) to replace them"
        )


def save_pytorch(
    config: ModelConfig,
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

    out_dir = as_path(out_dir)
    state = params_to_hf_state(config, params, model)
    _prepare_out_dir(out_dir, ["model.safetensors", "config.json"], overwrite)
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
    _atomic_write(out_dir, "model.safetensors", lambda p: save_file(state, p, {"format": "pt"}))
    unpadded = config  # the state above has V rows
    if getattr(config, "vocab_pad_multiple", 1) != 1:
        unpadded = config.replace(vocab_pad_multiple=1)
    _atomic_write(out_dir, "config.json", lambda p: unpadded.to_json_file(p, architecture=model))
    return os.fspath(out_dir)


def save_hf_flax(
    config: BertConfig,
    params: PyTree,
    out_dir: str | os.PathLike,
    model: str = "BertForPreTraining",
    *,
    max_shard_size: int | str | None = None,
    overwrite: bool = False,
) -> str:
    """Writes the directory transformers' Flax classes (4.x) read: `flax_model.msgpack` (or shards
    of at most `max_shard_size` bytes, e.g. "10GB", and their index) + config.json.

    `transformers.Flax<model>.from_pretrained(out_dir)` (transformers <= 4.57) loads it with no
    missing and no unexpected keys; a BertModel is saved without the `bert/` prefix, as
    FlaxBertModel saves itself. Parameters keep their dtype (float32 or bfloat16).
    Returns `out_dir`.
    """
    out_dir = as_path(out_dir)
    flat = hf_flax.from_torch_names(params_to_hf_state(config, params, model))
    files, index = hf_flax.shards(flat, hf_flax.parse_size(max_shard_size))
    names = [*files, *([hf_flax.INDEX_NAME] if index else [])]
    _prepare_out_dir(out_dir, [*names, "config.json"], overwrite)
    stale = hf_flax.stale_files([p.name for p in out_dir.iterdir()], names)
    if stale:
        raise FileExistsError(f"{out_dir} holds {stale} from another save; remove them first")
    for name, part in files.items():
        data = hf_flax.to_bytes(part)
        _atomic_write(out_dir, name, lambda p, data=data: epath.Path(p).write_bytes(data))
    if index:
        text = json.dumps(index, indent=2, sort_keys=True) + "\n"
        _atomic_write(out_dir, hf_flax.INDEX_NAME, lambda p: epath.Path(p).write_text(text))
    unpadded = config.replace(vocab_pad_multiple=1)  # the tree above has V rows
    _atomic_write(out_dir, "config.json", lambda p: unpadded.to_json_file(p, architecture=model))
    return os.fspath(out_dir)


def _savable(x: np.ndarray) -> np.ndarray:
    if x.dtype.name == "bfloat16":  # safetensors' numpy writer has no bfloat16
        return x.astype(np.float32)
    return np.ascontiguousarray(x)


def _atomic_write(out_dir: epath.Path, name: str, write) -> None:
    """`write(local file)`, then the file becomes `out_dir/name` whole: renamed from a temporary
    name beside it, or for a URL (an object store, which replaces objects whole) copied there."""
    local = not is_url(out_dir)
    fd, tmp = tempfile.mkstemp(
        dir=os.fspath(out_dir) if local else None, prefix=f".{name}.", suffix=".tmp"
    )
    os.close(fd)
    try:
        write(tmp)
        if local:
            os.replace(tmp, out_dir / name)
        else:
            epath.Path(tmp).copy(out_dir / name, overwrite=True)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_pretrained(
    out_dir: str | os.PathLike,
    config: ModelConfig,
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
    refused = None
    if primary:
        try:
            _prepare_out_dir(out_dir, ["config.json", "params"], overwrite)
        except FileExistsError as e:
            refused = e
    # Every process stops, none waits at a barrier.
    if multihost.any_process("save_pretrained-refused", refused is not None):
        raise refused or FileExistsError(
            f"{out_dir} already holds an export; pass overwrite=True (--overwrite) to replace it"
        )
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
        _atomic_write(out_dir, "config.json", lambda p: config.to_json_file(p, architecture=model))
    multihost.barrier("save_pretrained-done")
    return os.fspath(out_dir)


def load_pretrained(
    path: str | os.PathLike, *, scan_layers: bool = False
) -> tuple[ModelConfig, PyTree, str]:
    """Reads a `save_pretrained` directory: (config, params, model class name)."""
    import orbax.checkpoint as ocp

    path = os.path.abspath(os.fspath(path))
    config_path = os.path.join(path, "config.json")
    params_dir = os.path.join(path, "params")
    if not os.path.exists(config_path) or not os.path.isdir(params_dir):
        raise FileNotFoundError(f"{path} is not a bert_jax checkpoint (config.json + params/)")
    config = config_from_json_file(config_path)
    model = _default_model(config_path, family_of(config).base_model)
    try:
        with ocp.StandardCheckpointer() as ckptr:
            tree = ckptr.restore(params_dir)
    except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
        raise ConversionError(
            f"cannot read {params_dir}: corrupt or incomplete checkpoint ({e})"
        ) from e
    shapes = traverse_util.flatten_dict(tree, sep="/")
    check_config_fits(config, {k: np.shape(v) for k, v in shapes.items()}, config_path, params_dir)
    check_params(config, tree, model)
    tree = jax.tree_util.tree_map(np.asarray, tree)
    return config, (stack_layers(tree) if scan_layers else tree), model


def load_training_checkpoint(
    workdir: str | os.PathLike, step: int | None = None, *, scan_layers: bool = False
) -> tuple[ModelConfig, PyTree, str, int]:
    """Params of a `train.py` checkpoint: (config, params, model class name, step).

    Reads `<workdir>/checkpoints/<step>` (the newest when `step` is None) as host numpy arrays,
    whatever mesh wrote it (`run_params.read_run_params`; the optimizer state is not read),
    and checks them against the head's parameter table.
    """
    try:
        run = run_params.read_run_params(workdir, step)
        config = config_from_hf_dict(run.config)
    except (run_params.RunCheckpointError, TypeError, ValueError) as e:
        raise ConversionError(str(e)) from e
    check_params(config, run.params, run.head)
    params = unstack_layers(run.params)
    return config, (stack_layers(params) if scan_layers else params), run.head, run.step


# --------------------------------------------------------------------------------------------
# Verification against PyTorch
# --------------------------------------------------------------------------------------------
def sample_inputs(
    config: ModelConfig, model: str, batch: int = 2, seq_len: int = 16, seed: int = 0
):
    """Random ids, token types (where the family has them) and a padding mask (later rows
    padded) for checking a model."""
    rng = np.random.default_rng(seed)
    seq_len = min(seq_len, config.max_position_embeddings)
    choices = getattr(get_model_class(model), "choices", False)
    shape = (batch, 3, seq_len) if choices else (batch, seq_len)
    ids = rng.integers(0, config.vocab_size, size=shape, dtype=np.int64)
    mask = np.ones(shape, np.int64)
    for b in range(1, batch):
        mask[b, ..., seq_len - 1 - (3 * b) % max(1, seq_len // 2) :] = 0
    if not hasattr(config, "type_vocab_size"):
        return dict(input_ids=ids, attention_mask=mask)
    types = rng.integers(0, config.type_vocab_size, size=shape, dtype=np.int64)
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask)


def _jax_outputs(config, params, model, inputs) -> dict[str, np.ndarray]:
    module = get_model_class(model)(config, RuntimeConfig())
    args = {k: np.asarray(v, np.int32) for k, v in inputs.items()}
    out = module.apply(
        {"params": params}, **args, output_hidden_states=True, output_attentions=True
    )
    return _named_outputs(out)


def _named_outputs(out) -> dict[str, np.ndarray]:
    named = {}
    for field in dataclasses.fields(out) if dataclasses.is_dataclass(out) else []:
        value = getattr(out, field.name)
        if value is None:
            continue
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                named[f"{field.name}[{i}]"] = np.asarray(v, np.float32)
        else:
            named[field.name] = np.asarray(value, np.float32)
    return named


def torch_outputs(torch_model, inputs) -> dict[str, np.ndarray]:
    """Runs a transformers model and names its outputs like bert_jax's."""
    import torch

    with torch.no_grad():
        out = torch_model(
            **{k: torch.as_tensor(v) for k, v in inputs.items()},
            output_hidden_states=True,
            output_attentions=True,
            return_dict=True,
        )
    named = {}
    for key, value in out.items():
        if value is None or key == "loss":
            continue
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                named[f"{key}[{i}]"] = v.float().numpy()
        else:
            named[key] = value.float().numpy()
    return named


def verify(config: ModelConfig, params: PyTree, model: str, hf_dir: str, *, seed: int = 0):
    """Runs bert_jax and PyTorch (transformers, eager attention) on the same sample inputs.

    Returns {output name: max abs difference} over every output, hidden state and attention map.
    """
    import transformers

    torch_model = (
        getattr(transformers, model).from_pretrained(hf_dir, attn_implementation="eager").eval()
    )
    inputs = sample_inputs(config, model, seed=seed)
    ours = _jax_outputs(config, params, model, inputs)
    theirs = torch_outputs(torch_model, inputs)
    if set(ours) != set(theirs):
        raise ConversionError(f"outputs differ in name: {sorted(set(ours) ^ set(theirs))}")
    return {k: float(np.max(np.abs(ours[k] - theirs[k]))) for k in sorted(ours)}


def _max_difference(params: PyTree, other: PyTree) -> float:
    """The largest |a - b| over two parameter trees of the same names (inf if they differ)."""
    a, b = _flatten(params), _flatten(other)
    if a.keys() != b.keys():
        return float("inf")
    return max(float(np.max(np.abs(a[k].astype(np.float32) - b[k]))) for k in a)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------
def detect_format(path: str) -> str:
    """The format of the checkpoint at `path`: "hf" (PyTorch weights), "hf_flax" (only Flax
    weights), "tf", "bert_jax" or "train" (a workdir)."""
    if os.path.isdir(path):
        files = set(os.listdir(path))
        if "config.json" in files and "params" in files:
            return "bert_jax"
        if "checkpoints" in files and os.path.isdir(os.path.join(path, "checkpoints")):
            return "train"
        weights = files & set(HF_WEIGHT_FILES)
        if "config.json" in files and weights:
            return "hf_flax" if weights <= set(hf_flax.WEIGHT_FILES) else "hf"
        if "bert_config.json" in files or any(f.endswith(".index") for f in files):
            return "tf"
        raise ValueError(
            f"{path} holds no recognizable checkpoint (config.json + weights, config.json + "
            "params/, or bert_config.json + a TF checkpoint's *.index)"
        )
    if os.path.exists(path + ".index") or (
        os.path.isfile(path) and (path.endswith(".index") or _TF_DATA_RE.search(path))
    ):
        return "tf"
    raise missing_path_error(path)


def load_any(
    path: str, model: str | None, *, allow_new_heads: bool = False, hidden_act: str | None = None
):
    """(config, params, model, report) from an HF (PyTorch or Flax), TF, bert_jax or train.py
    checkpoint path. A BERT class name as `model` stands for its role in the checkpoint's family
    ("BertModel" loads a ModernBERT checkpoint's ModernBertModel). `hidden_act` is for TF
    checkpoints only (`load_tf`): the other formats' config.json names the activation."""
    fmt = detect_format(path)
    if hidden_act is not None and fmt != "tf":
        raise ValueError(
            f"--hidden-act / hidden_act is for TF checkpoints (bert_config.json's ambiguous "
            f"'gelu'); {path} is a {fmt} checkpoint whose config.json names its activation"
        )
    if fmt in ("bert_jax", "train"):
        if fmt == "bert_jax":
            config, params, stored = load_pretrained(path)
        else:
            config, params, stored, _ = load_training_checkpoint(path)
        model = model and head_in_family(config, model)
        if model and model != stored:  # change the head by re-mapping through the HF names
            state = params_to_hf_state(config, params, stored)
            params, report = hf_state_to_params(
                config, state, model, allow_new_heads=allow_new_heads
            )
            return config, params, model, report
        return config, params, stored, ConversionReport(loaded=list(_flatten(params)))
    if fmt in ("hf", "hf_flax"):
        model = model and head_in_family(config_from_json_file(path), model)
        config, params, report = load_pytorch(
            path, model, allow_new_heads=allow_new_heads, return_report=True
        )
        return (
            config,
            params,
            model or _default_model(os.path.join(path, "config.json"), ""),
            report,
        )
    model = model or "BertForPreTraining"
    config, params, report = load_tf(
        path, model, allow_new_heads=allow_new_heads, hidden_act=hidden_act, return_report=True
    )
    return config, params, model, report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bert_jax.convert",
        description="Convert BERT checkpoints between Hugging Face PyTorch and Flax, TF and "
        "bert_jax.",
    )
    parser.add_argument(
        "src",
        help="HF directory (PyTorch or Flax weights), TF checkpoint (prefix or folder), bert_jax "
        "directory, or a train.py workdir (its newest checkpoint); a local path or a Hugging Face "
        "Hub id (the cache, else a download unless HF_HUB_OFFLINE=1)",
    )
    parser.add_argument("dst", help="output directory")
    parser.add_argument(
        "--to",
        choices=("hf", "hf_flax", "bert_jax"),
        help="output format (default: the other one); hf_flax: flax_model.msgpack",
    )
    parser.add_argument("--max-shard-size", help="hf_flax: shard above this size, e.g. 10GB")
    parser.add_argument("--model", help="head class, e.g. BertForPreTraining (default: source's)")
    parser.add_argument("--allow-new-heads", action="store_true", help="initialize missing heads")
    parser.add_argument(
        "--hidden-act",
        choices=("gelu", "gelu_new", "relu"),
        help="TF checkpoints only: the activation, in place of bert_config.json's. Its 'gelu' is "
        "the erf GELU (assumed, as google-research/bert's 2018 release and transformers) or the "
        "tanh form of google-research/bert's code since February 2019: pass gelu_new for that",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace files in dst")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare bert_jax and PyTorch outputs after converting",
    )
    model_card.add_flags(parser)
    args = parser.parse_args(argv)
    try:
        args.src = hub.resolve(args.src)  # a Hub id: its snapshot directory
        config, params, model, report = load_any(
            args.src, args.model, allow_new_heads=args.allow_new_heads, hidden_act=args.hidden_act
        )
        to = args.to or ("hf" if detect_format(args.src) in ("bert_jax", "train") else "bert_jax")
        if to == "hf":
            save_pytorch(config, params, args.dst, model, overwrite=args.overwrite)
        elif to == "hf_flax":
            save_hf_flax(
                config, params, args.dst, model, max_shard_size=args.max_shard_size,
                overwrite=args.overwrite,
            )  # fmt: skip
        else:
            save_pretrained(args.dst, config, params, model, overwrite=args.overwrite)
    except (ConversionError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{model}: {report.summary()}")
    print(f"wrote {to} checkpoint to {args.dst}")
    if args.model_card:
        print(f"wrote {model_card.write_from_flags(args, config, model, detect_format(args.src))}")
    if args.verify:
        hf_dir = args.dst if to == "hf" else args.src
        if to != "hf" and detect_format(args.src) != "hf":
            hf_dir = tempfile.mkdtemp(prefix="bert_jax_verify_")
            save_pytorch(config, params, hf_dir, model)
        diffs = verify(config, params, model, hf_dir)
        if to == "hf_flax":  # and what was written reads back as the same parameters
            diffs["reloaded flax_model.msgpack"] = _max_difference(
                params, load_pytorch(args.dst, model)[1]
            )
        width = max(len(k) for k in diffs)
        for k, v in diffs.items():
            print(f"  {k:<{width}}  max |jax - torch| = {v:.3e}")
        worst = max(diffs.values())
        print(f"verify: worst max abs difference {worst:.3e} over {len(diffs)} outputs")
        if not worst < 1e-3:
            print("verify: FAILED (difference above 1e-3)", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    from bert_jax import cli  # a user's mistake: `error: <message>`, status 1; Ctrl-C: 130

    sys.exit(cli.run(main))
