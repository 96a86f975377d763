"""The checkpoint format of transformers' Flax classes (FlaxBertModel, FlaxBertFor*; transformers
4.x, removed in v5): `flax_model.msgpack` (a msgpack of the nested parameter dict, written by
`flax.serialization.to_bytes`), or shards `flax_model-0000i-of-0000n.msgpack` listed by
`flax_model.msgpack.index.json`, beside a Hugging Face `config.json`.

The Flax tree names a parameter as the PyTorch state dict does, with "/" for "." and a few leaf
names changed, and stores Linear kernels transposed:

    Flax                                           PyTorch
    bert/encoder/layer/0/attention/self/query/kernel [in, out]   ...query.weight [out, in]
    bert/embeddings/word_embeddings/embedding        [V, E]      ...word_embeddings.weight
    .../LayerNorm/scale, .../LayerNorm/bias                      ...LayerNorm.weight, .bias
    cls/predictions/bias                              [V]        cls.predictions.bias

A base model (FlaxBertModel) saves its tree without the `bert/` prefix, as its PyTorch twin does.
This module reads one file (`read_file`), translates between the two namings (`to_torch_names`,
`from_torch_names`), splits and serializes what is written (`shards`, `to_bytes`) and writes a
directory (`save_hf_flax`); `bert_jax.checkpoints.hf` reads directories and shard indexes of every
Hugging Face format alike and maps PyTorch names onto bert_jax's parameters through the one
parameter table (`bert_jax.checkpoints.table`), so this format shares every check the others have.
Files are read and written through `etils.epath` (a local path or a URL).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

import numpy as np

from bert_jax.checkpoints.table import PyTree, params_to_hf_state, write_hf_config
from bert_jax.models.families import EncoderConfig
from bert_jax.paths import as_path, prepare_out_dir, write_bytes_whole, write_text_whole

WEIGHTS_NAME = "flax_model.msgpack"
INDEX_NAME = "flax_model.msgpack.index.json"
WEIGHT_FILES = (WEIGHTS_NAME, INDEX_NAME)
_SHARD_RE = re.compile(r"^flax_model-\d{5}-of-\d{5}\.msgpack$")
# A Linear layer's weight: every PyTorch ".weight" that is neither an embedding table nor a
# norm's scale (1-D: BERT's LayerNorm.weight, ModernBERT's norm.weight).
_EMBEDDING_RE = re.compile(r"(^|\.)\w+_embeddings\.weight$")


class FlaxFormatError(ValueError):
    """A file is not a readable transformers Flax checkpoint."""


def is_flax_file(path: str | os.PathLike) -> bool:
    """Whether `path` names a Flax weight file or its shard index (by name)."""
    return os.fspath(path).endswith((".msgpack", INDEX_NAME))


def read_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """One msgpack file's parameters as {"/"-joined Flax name: numpy array} (float32 or the
    stored dtype, e.g. bfloat16 after `model.to_bf16`)."""
    from flax import traverse_util
    from flax.serialization import msgpack_restore

    path = as_path(path)
    if not path.exists():
        raise FileNotFoundError(f"Flax weight file not found: {path}")
    data = path.read_bytes()
    if data.startswith(b"version https://git-lfs"):
        raise FlaxFormatError(
            f"{path} is a git-lfs pointer, not the weights: run `git lfs pull` in the repository"
        )
    try:
        tree = msgpack_restore(data)
    except Exception as e:  # noqa: BLE001 - msgpack raises many types for a bad file
        raise FlaxFormatError(f"cannot read {path}: corrupt or not a Flax msgpack ({e})") from e
    if not isinstance(tree, dict) or not tree:
        raise FlaxFormatError(f"{path} holds no parameter tree (found {type(tree).__name__})")
    flat = traverse_util.flatten_dict(tree, sep="/")
    bad = sorted(k for k, v in flat.items() if not isinstance(v, np.ndarray))
    if bad:
        raise FlaxFormatError(f"{path}: entries that are not arrays: {bad[:10]}")
    return flat


def to_torch_names(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{Flax name: array} -> the PyTorch state dict of the same model (names, [out, in] weights).

    Args:
      flat: "/"-joined Flax names, e.g. `bert/encoder/layer/0/attention/self/query/kernel`
        [E, E] (in, out).

    Returns:
      {PyTorch name: array}, e.g. `bert.encoder.layer.0.attention.self.query.weight` [E, E]
      (out, in); arrays are transposed copies or the same arrays.
    """
    state = {}
    for key, value in flat.items():
        *module, leaf = key.split("/")
        if leaf == "kernel" and value.ndim == 2:
            leaf, value = "weight", np.ascontiguousarray(value.T)
        elif leaf in ("embedding", "scale"):
            leaf = "weight"
        state[".".join([*module, leaf])] = value
    return state


def from_torch_names(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of `to_torch_names`: a PyTorch state dict as {Flax name: array} (a 1-D
    `.weight` is a norm's scale, an `*_embeddings.weight` a table, any other a Linear kernel)."""
    flat = {}
    for key, value in state.items():
        *module, leaf = key.split(".")
        if leaf == "weight":
            if _EMBEDDING_RE.search(key):
                leaf = "embedding"
            elif np.ndim(value) == 1:
                leaf = "scale"
            else:
                leaf, value = "kernel", np.ascontiguousarray(value.T)
        flat["/".join([*module, leaf])] = value
    return flat


def shards(
    flat: Mapping[str, np.ndarray], max_shard_bytes: int | None
) -> tuple[dict[str, dict[str, np.ndarray]], dict | None]:
    """Splits {Flax name: array} as transformers' `flax_shard_checkpoint` does: in key order, a
    new shard whenever the next array would take the current one past `max_shard_bytes` (an array
    larger than that gets a shard to itself).

    Returns:
      ({file name: its part}, the index dict or None when everything fits in one file).
    """
    parts: list[dict[str, np.ndarray]] = [{}]
    size = total = 0
    for key, value in flat.items():
        if max_shard_bytes is not None and parts[-1] and size + value.nbytes > max_shard_bytes:
            parts.append({})
            size = 0
        parts[-1][key] = value
        size += value.nbytes
        total += value.nbytes
    if len(parts) == 1:
        return {WEIGHTS_NAME: parts[0]}, None
    named = {
        WEIGHTS_NAME.replace(".msgpack", f"-{i + 1:05d}-of-{len(parts):05d}.msgpack"): part
        for i, part in enumerate(parts)
    }
    weight_map = {key: name for name, part in named.items() for key in part}
    return named, {"metadata": {"total_size": total}, "weight_map": weight_map}


def to_bytes(flat: Mapping[str, np.ndarray]) -> bytes:
    """The msgpack bytes transformers writes for {Flax name: array} (the nested dict)."""
    from flax import traverse_util
    from flax.serialization import msgpack_serialize

    return msgpack_serialize(traverse_util.unflatten_dict(dict(flat), sep="/"))


def stale_files(files: list[str], keep: list[str]) -> list[str]:
    """Flax weight files in `files` (a directory listing) that a save writing `keep` would leave
    behind: transformers would read an old index or shard."""
    return sorted(
        f for f in files if (f in WEIGHT_FILES or _SHARD_RE.match(f)) and f not in set(keep)
    )


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20}
_UNITS["GIB"] = 2**30


def parse_size(size: int | str | None) -> int | None:
    """Bytes of a shard size given as transformers takes it: an int, or "5GB", "500MB", "1GiB"."""
    if size is None or isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]I?B|B?)\s*", size.upper())
    if not match:
        raise ValueError(f"shard size {size!r}: expected bytes or e.g. '10GB', '500MB', '1GiB'")
    return int(match.group(1)) * _UNITS[match.group(2)]


def save_hf_flax(
    config: EncoderConfig,
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
    missing and no unexpected keys; a base model is saved without the encoder's prefix, as
    FlaxBertModel saves itself. Parameters keep their dtype (float32 or bfloat16).
    Returns `out_dir`.
    """
    flat = from_torch_names(params_to_hf_state(config, params, model))
    files, index = shards(flat, parse_size(max_shard_size))
    names = [*files, *([INDEX_NAME] if index else [])]
    out_dir = prepare_out_dir(out_dir, [*names, "config.json"], overwrite)
    stale = stale_files([p.name for p in out_dir.iterdir()], names)
    if stale:
        raise FileExistsError(f"{out_dir} holds {stale} from another save; remove them first")
    for name, part in files.items():
        write_bytes_whole(out_dir / name, to_bytes(part))
    if index:
        write_text_whole(out_dir / INDEX_NAME, json.dumps(index, indent=2, sort_keys=True) + "\n")
    write_hf_config(out_dir, config, model)
    return os.fspath(out_dir)
