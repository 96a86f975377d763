"""A model's parameter tree, of any family: initialized, counted, its layers stacked or not.

Under `RuntimeConfig.scan_layers` a family's encoder holds one layer whose weights carry a
leading [n] axis (the logical axis `layers`) in place of n per-layer subtrees; checkpoints and
conversion use per-layer trees, and `stack_layers` / `unstack_layers` go between the two. Where
the layers sit and how they are named are each family's facts, read from its registry row
(`models.families.Family`: encoder_name, layers_path, layer_name, scanned_layer).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.families import FAMILIES, Family


def init_params(model: nn.Module, rng: jax.Array, seq_len: int = 8) -> Any:
    """`model`'s parameters (boxed with logical axes), initialized from a dummy batch of ids
    [1, seq_len] ([1, 2, seq_len] for a multiple-choice head)."""
    shape = (1, 2, seq_len) if getattr(model, "choices", False) else (1, seq_len)
    ids = jnp.zeros(shape, jnp.int32)
    return model.init({"params": rng}, ids)["params"]


def count_params(params: Any) -> int:
    """Total number of parameter scalars in a (possibly boxed) parameter tree."""
    return sum(x.size for x in jax.tree_util.tree_leaves(nn.meta.unbox(params)))


def _layers_path(params: dict, family: Family) -> tuple[str, ...] | None:
    """The keys from the tree's root to the dict holding `family`'s layers (a head's tree goes
    through its encoder, `family.encoder_name`; a bare encoder's starts at it), or None when the
    tree holds no layers of `family`."""
    path = ((family.encoder_name,) if family.encoder_name in params else ()) + family.layers_path
    node = params
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    names = (family.layer_name.format(0), family.scanned_layer)
    return path if isinstance(node, dict) and any(n in node for n in names) else None


def _layers_of(params: dict) -> tuple[Family, tuple[str, ...], dict]:
    """The family whose layers the tree holds, the keys down to them and the dict holding them.
    Where several families' names fit, the deepest layers' (a toy family's `model/layers/
    layer_<i>` are no scanned EuroBERT `model/layers`), then the family whose word-embedding
    table the tree holds (ModernBERT's and EuroBERT's layers are both `model/layers_<i>`)."""
    found = [(f, p) for f in FAMILIES.values() if (p := _layers_path(params, f)) is not None]
    if len(found) > 1:
        found.sort(key=lambda fp: (-len(fp[1]), not _has_word_table(params, fp[0])))
    if found:
        family, path = found[0]
        return family, path, get_at(params, path)
    where = ", ".join(
        f"{f.model_type}: {'/'.join((f'[{f.encoder_name}]', *f.layers_path, f.layer_name))}"
        for f in FAMILIES.values()
    )
    raise ValueError(
        f"parameter tree holds the layers of no known family ({where}); "
        f"its top-level names: {sorted(params)}"
    )


def _has_word_table(params: dict, family: Family) -> bool:
    """Whether the tree (a head's or its encoder's) holds `family`'s word-embedding table."""
    tree = params.get(family.encoder_name, params)
    for key in family.conversion.word_embeddings.split("/"):
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True


def get_at(tree: dict, path: tuple[str, ...]):
    """The node of a parameter tree at `path` (a tuple of keys)."""
    for key in path:
        tree = tree[key]
    return tree


def replace_at(tree: dict, path: tuple[str, ...], value) -> dict:
    """`tree` with the node at `path` set to `value` (the rest shared, not copied); None
    removes it, and a dict it leaves empty with it (a parameter tree has no empty nodes)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if rest:
        value = replace_at(tree.get(head, {}), rest, value) or None
    if value is None:
        return {k: v for k, v in tree.items() if k != head}
    return {**tree, head: value}


def is_stacked(params: dict) -> bool:
    """True when the layers are stacked on a leading axis (the `scan_layers` layout); False for
    per-layer trees, for trees of a family never stacked and for trees without layers."""
    try:
        family, _, layers = _layers_of(params)
    except ValueError:
        return False
    return family.scanned_layer is not None and family.scanned_layer in layers


def stack_layers(params: dict) -> dict:
    """Per-layer subtrees (BERT's `encoder/layer_i/...`) -> the family's one stacked layer
    (`encoder/layer/...`) whose arrays have a leading [n] axis; a stacked tree as it is.

    The inverse of `unstack_layers`; used to load per-layer checkpoints into a scanned model.
    Raises ValueError for a tree of a family whose layers are never scanned.
    """
    family, path, layers = _layers_of(params)
    if family.scanned_layer is None:
        raise ValueError(
            f"{family.model_type}'s layers are never scanned (scan_layers), so never stacked"
        )
    if family.scanned_layer in layers:
        return params
    n = 0
    while family.layer_name.format(n) in layers:
        n += 1
    names = [family.layer_name.format(i) for i in range(n)]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *(layers[n] for n in names))
    rest = {k: v for k, v in layers.items() if k not in names}
    return replace_at(params, path, {**rest, family.scanned_layer: stacked})


def unstack_layers(params: dict) -> dict:
    """The stacked layer with a leading [n] axis (BERT's `encoder/layer/...`) -> one subtree per
    layer (`encoder/layer_i/...`); a per-layer tree (or one without layers) as it is."""
    if not is_stacked(params):
        return params
    family, path, layers = _layers_of(params)
    rest = dict(layers)
    stacked = rest.pop(family.scanned_layer)
    n = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    for i in range(n):
        rest[family.layer_name.format(i)] = jax.tree_util.tree_map(lambda x, i=i: x[i], stacked)
    return replace_at(params, path, rest)
