"""The parameter table: every bert_jax parameter, its Hugging Face and TF name and the reshape or
transpose between them, for any family (its names come from the family's row,
`families.Family.conversion`). Every format's reader and writer goes through it; nothing here
names a family or reads a file (`write_hf_config` writes the config.json beside the weights
of every format that stores V vocabulary rows).

Also here: the checks every reader shares (`check_params`, `check_config_fits`), the vocabulary
rows padded here and not elsewhere (`fit_vocab_rows`), the tree built from a reader's lookup
(`assemble_params`) and what a load reports (`ConversionReport`, `ConversionError`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from flax import linen as nn
from flax import traverse_util

from bert_jax.models.config import RuntimeConfig
from bert_jax.models.conversion import FamilyConversion
from bert_jax.models.families import EncoderConfig, family_of, get_model_class
from bert_jax.models.params import init_params, is_stacked, stack_layers, unstack_layers
from bert_jax.paths import as_path, write_file_whole

PyTree = Any


class ConversionError(ValueError):
    """A checkpoint cannot be converted without losing or inventing weights."""


@dataclasses.dataclass
class ConversionReport:
    """What a load did: every target weight is either `loaded` or `newly_initialized`.

    Attributes:
      loaded: the flax keys read from the checkpoint.
      newly_initialized: the flax keys of head weights the checkpoint lacked, initialized.
      unused: the checkpoint's weights the model has no place for (another head's).
      ignored: stored training state that is not weights (TF optimizer slots, step counters):
        not carried over, and the summary says so.
      buffers: stored PyTorch buffers (`position_ids`, `token_type_ids`), which the model
        computes from its config: nothing is lost, so the summary leaves them out.
      notes: choices made while reading.
    """

    loaded: list[str] = dataclasses.field(default_factory=list)
    newly_initialized: list[str] = dataclasses.field(default_factory=list)
    unused: list[str] = dataclasses.field(default_factory=list)
    ignored: list[str] = dataclasses.field(default_factory=list)
    buffers: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether weights were left unused or newly initialized, or a choice was made while
        reading (`notes`): what a user should see."""
        return bool(self.newly_initialized or self.unused or self.notes)

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
                f"skipped {len(self.ignored)} stored entries of training state, not weights "
                f"({shown}: optimizer slots or step counters); the converted model has none"
            )
        return "\n".join(lines)

    def log(self, what: str) -> None:
        """Logs `what: <summary>` once: a warning where weights were left unused or newly
        initialized or a note says a choice (`changed`), else at info level."""
        log = logging.warning if self.changed else logging.info
        log("%s: %s", what, self.summary())


def conversion_of(config: EncoderConfig) -> FamilyConversion:
    """The conversion facts of `config`'s family."""
    return family_of(config).conversion


@dataclasses.dataclass(frozen=True)
class ParamRule:
    """One bert_jax parameter and its names and layouts elsewhere.

    `flax_key` is the "/"-joined path in the (unstacked) parameter tree; `shape` its shape there.
    PyTorch stores Linear weights [out, in] with heads flattened; TF stores kernels [in, out].
    `vocab_rows` is set (to V) for the word embeddings and the MLM bias: bert_jax holds them with
    `padded_vocab_size` rows, other formats with V; loading pads zeros, saving strips.
    `n_in` is the number of leading kernel axes that are inputs (2 for projections out of the
    heads [H, D, E], else 1).
    """

    flax_key: str
    shape: tuple[int, ...]
    hf_key: str
    tf_key: str
    kind: str  # "kernel" (2-D or head-split), "tf_out_weights" (TF [out, in]), "vector", "table"
    vocab_rows: int | None = None
    n_in: int = 1

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

    def _flat(self, x: np.ndarray) -> np.ndarray:
        """flax kernel -> [in, out]."""
        return x.reshape(math.prod(self.shape[: self.n_in]), -1)

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


def hf_key(flax_key: str) -> str:
    """The PyTorch state-dict name of a flax key: `layer_3` -> `layer.3`, "/" -> ".", and the
    flax leaf names `kernel`, `embedding`, `scale` -> `weight`."""
    key = re.sub(r"(layers?)_(\d+)", r"\1.\2", flax_key).replace("/", ".")
    return re.sub(r"\.(kernel|embedding|scale)$", ".weight", key)


def _kind(conv: FamilyConversion, key: str) -> str:
    if key.endswith("/kernel"):
        return "tf_out_weights" if re.search(conv.tf_out_weights, key) else "kernel"
    return "table" if key.endswith("/embedding") else "vector"


def parameter_table(config: EncoderConfig, model: str) -> list[ParamRule]:
    """One rule per parameter of `model` (a head class name) under `config`, unstacked layout."""
    conv = conversion_of(config)
    rules = []
    for key, shape in expected_shapes(config, model).items():
        rows = config.vocab_size if conv.vocab_keys.search(key) else None
        names = (hf_key(key), conv.tf_key(key, model), _kind(conv, key))
        rules.append(ParamRule(key, shape, *names, rows, conv.n_inputs(key)))
    return rules


def expected_shapes(config: EncoderConfig, model: str) -> dict[str, tuple[int, ...]]:
    """{"/"-joined path: shape} of every parameter of `model`, unstacked, without allocating.

    Raises:
      ValueError: `model` is a class of another family than `config`'s (`Family.head_for`).
    """
    module = get_model_class(family_of(config).head_for(model))(config, RuntimeConfig())
    abstract = jax.eval_shape(lambda: init_params(module, jax.random.PRNGKey(0)))
    flat = traverse_util.flatten_dict(nn.meta.unbox(abstract), sep="/")
    return {k: tuple(v.shape) for k, v in flat.items()}


def flatten_params(params: PyTree) -> dict[str, np.ndarray]:
    """{"/"-joined path: host array} of a parameter tree, unstacked (per-layer names)."""
    params = nn.meta.unbox(params)
    if is_stacked(params):
        params = unstack_layers(params)
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}


def unflatten_params(flat: Mapping[str, np.ndarray], scan_layers: bool) -> PyTree:
    """The tree of `flatten_params`' output; the layers stacked when `scan_layers`."""
    tree = traverse_util.unflatten_dict(dict(flat), sep="/")
    return stack_layers(tree) if scan_layers else tree


def max_difference(params: PyTree, other: PyTree) -> float:
    """The largest |a - b| over two parameter trees of the same names (inf if they differ)."""
    a, b = flatten_params(params), flatten_params(other)
    if a.keys() != b.keys():
        return float("inf")
    return max(float(np.max(np.abs(a[k].astype(np.float32) - b[k]))) for k in a)


def _fit_rows(x: np.ndarray, keep: int, rows: int) -> np.ndarray:
    """The first `keep` rows of `x`, then zero rows up to `rows`."""
    x = np.asarray(x)[:keep]
    return np.pad(x, [(0, rows - x.shape[0])] + [(0, 0)] * (x.ndim - 1))


def fit_vocab_rows(params: PyTree, config: EncoderConfig) -> PyTree:
    """Host `params` (unstacked) with the word embeddings and MLM bias cut to V rows and padded
    with zeros to `config.padded_vocab_size`: weights saved under another `vocab_pad_multiple`
    (a Hugging Face model has none) made to fit this config's model."""
    flat = traverse_util.flatten_dict(params, sep="/")
    rows = config.padded_vocab_size
    vocab_keys = conversion_of(config).vocab_keys
    for key, x in flat.items():
        if vocab_keys.search(key) and np.shape(x)[0] != rows:
            flat[key] = _fit_rows(x, config.vocab_size, rows)
    return traverse_util.unflatten_dict(flat, sep="/")


def unpadded_config(config: EncoderConfig) -> EncoderConfig:
    """`config` as another format stores it: no vocabulary padding (the tables have V rows);
    a family without `vocab_pad_multiple` is returned as it is."""
    if getattr(config, "vocab_pad_multiple", 1) != 1:
        return config.replace(vocab_pad_multiple=1)
    return config


def write_hf_config(out_dir: os.PathLike, config: EncoderConfig, model: str) -> None:
    """`out_dir/config.json` as other formats store it (no vocabulary padding: their tables have
    V rows), architectures=[model], written whole."""
    unpadded = unpadded_config(config)
    write_file_whole(
        as_path(out_dir) / "config.json", lambda p: unpadded.to_json_file(p, architecture=model)
    )


def check_params(config: EncoderConfig, params: PyTree, model: str) -> dict[str, np.ndarray]:
    """Flattens `params` and checks names and shapes against `model`; raises naming any mismatch."""
    flat = flatten_params(params)
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


def params_to_hf_state(config: EncoderConfig, params: PyTree, model: str) -> dict[str, np.ndarray]:
    """The Hugging Face state dict (as `save_pretrained` writes it: tied decoder omitted)."""
    flat = check_params(config, params, model)
    return {rule.hf_key: rule.to_hf(flat[rule.flax_key]) for rule in parameter_table(config, model)}


def check_config_fits(
    config: EncoderConfig,
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
    conv = conversion_of(config)
    layers = {int(m.group(1)) for k in shapes for m in [conv.layer_index.search(k)] if m}
    if layers and len(layers) != config.num_hidden_layers:
        raise ConversionError(
            f"{config_path}: num_hidden_layers={config.num_hidden_layers!r}, but the weights "
            f"({weights}) hold {len(layers)} layers (indices {min(layers)}..{max(layers)}); this "
            "config does not describe these weights"
        )
    rows = {"vocab_size": {config.vocab_size, config.padded_vocab_size}}
    for pattern, field, axis in conv.sized_by_config:
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


# A reader's lookup: (rule, source keys used so far) -> (source key, array) or None if absent.
Lookup = Callable[[ParamRule, set], "tuple[str, np.ndarray] | None"]


def _lookup_all(config, model, lookup: Lookup, report: ConversionReport):
    """({flax key: array} found, source keys used, flax keys missing)."""
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
    return flat, used, missing


def _refuse_missing(config, model, missing, unexpected, allow_new_heads: bool) -> None:
    """Raises unless every missing weight is a task head's and new heads were asked for."""
    structural = [k for k in missing if re.match(conversion_of(config).structural, k)]
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


def assemble_params(
    config: EncoderConfig,
    model: str,
    lookup: Lookup,
    source_keys: Sequence[str],
    *,
    allow_new_heads: bool,
    scan_layers: bool,
    dtype,
    seed: int,
    report: ConversionReport,
) -> PyTree:
    """Builds the parameter tree of `model` from a reader's `lookup`; the weights it lacks are
    refused or (task heads, `allow_new_heads`) newly initialized from `seed`; the report lists
    what was loaded, initialized and left unused of `source_keys`."""
    flat, used, missing = _lookup_all(config, model, lookup, report)
    unexpected = sorted(k for k in source_keys if k not in used)
    if missing:
        _refuse_missing(config, model, missing, unexpected, allow_new_heads)
        module = get_model_class(model)(config)
        fresh = flatten_params(init_params(module, jax.random.PRNGKey(seed)))
        for key in missing:
            flat[key] = fresh[key]
        report.newly_initialized.extend(missing)
    report.unused.extend(unexpected)  # the caller logs or prints the report, once
    flat = {k: np.asarray(v, dtype=dtype) for k, v in flat.items()}
    return unflatten_params(flat, scan_layers)
