"""Device mesh and logical-axis sharding rules.

The mesh has three axes, sized in the experiment config (-1 takes the devices left over):

    data    pure data parallelism (parameters replicated)
    fsdp    data parallelism with parameters and optimizer state sharded (ZeRO-3 style)
    tensor  tensor parallelism over heads / mlp / vocab (Megatron style)

Parameters carry logical axis names (vocab, embed, heads, kv, mlp, layers; see `models.bert.model`)
and activations act_batch, act_len, act_embed, act_heads, act_mlp. `DEFAULT_RULES` maps those to
mesh axes; a config may replace them. Batches are split over (data, fsdp) on their leading axis.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax.parallel import multihost

PyTree = Any
MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

DEFAULT_RULES: Rules = (
    ("act_batch", BATCH_AXES),
    ("act_len", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("layers", None),
)


def mesh_shape(sizes: dict[str, int], num_devices: int) -> tuple[int, int, int]:
    """Resolves {data, fsdp, tensor} sizes (one may be -1) against the device count.

    `dcn_data` (how many slices the data axis spans, see `make_mesh`) may be among the keys; it
    does not change the shape.
    """
    unknown = set(sizes) - set(MESH_AXES) - {"dcn_data"}
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)}; expected {MESH_AXES} (+ dcn_data)")
    dims = [int(sizes.get(a, 1)) for a in MESH_AXES]
    if dims.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, dims))}")
    if any(d == 0 or d < -1 for d in dims):
        raise ValueError(f"mesh sizes must be positive or -1, got {dict(zip(MESH_AXES, dims))}")
    known = math.prod(d for d in dims if d != -1)
    if -1 in dims:
        if num_devices % known:
            raise ValueError(
                f"mesh {dict(zip(MESH_AXES, dims))} does not divide {num_devices} devices"
            )
        dims[dims.index(-1)] = num_devices // known
    if math.prod(dims) != num_devices:
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, dims))} needs {math.prod(dims)} devices; "
            f"there are {num_devices}"
        )
    return tuple(dims)


def _num_slices(devices: Sequence[jax.Device], dcn_data: int) -> int:
    """The slices the data axis spans: `dcn_data`, checked against the devices' `slice_index`
    (-1: as many as the devices come from)."""
    found = len({getattr(d, "slice_index", None) or 0 for d in devices})
    if dcn_data == -1:
        return found
    if dcn_data < 1:
        raise ValueError(f"mesh.dcn_data={dcn_data}: must be -1 (the slices found) or >= 1")
    if dcn_data != found:
        raise ValueError(
            f"mesh.dcn_data={dcn_data} but the {len(devices)} devices come from {found} "
            "slice(s) (their slice_index); set mesh.dcn_data to the number of slices, or -1"
        )
    return dcn_data


def make_mesh(sizes: dict[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (all devices of all processes by default).

    Tensor-parallel groups are laid out on neighbouring devices (within one host where possible),
    since they communicate most. TPU devices (attached, or a topology's compile-only devices) are
    placed by their physical coordinates. Devices of several slices get a hybrid mesh whose data
    axis spans the slices (data-center network, `sizes["dcn_data"]` of them: -1 or absent for as
    many as the devices come from) while fsdp and tensor stay inside each slice.

    Any fallback to a plain reshape of the device list (devices with no known layout, or a
    layout JAX cannot build) is logged as a warning that names the reason.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(sizes, len(devices))
    # Auto axes: shardings propagate through the program (GSPMD), steered by the constraints.
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    num_slices = _num_slices(devices, int(sizes.get("dcn_data", -1)))
    if num_slices > 1:
        if shape[0] % num_slices:
            raise ValueError(
                f"mesh {dict(zip(MESH_AXES, shape))} over {num_slices} slices: the data axis "
                f"({shape[0]}) must be a multiple of the number of slices, since only data "
                "parallelism crosses slices; shrink mesh.fsdp or mesh.tensor"
            )
        per_slice = (shape[0] // num_slices, *shape[1:])
        grid = mesh_utils.create_hybrid_device_mesh(
            per_slice, (num_slices, 1, 1), devices, allow_split_physical_axes=True
        )
        return Mesh(grid, MESH_AXES, axis_types=axis_types)
    if devices[0].platform == "tpu":  # physical placement or a clear error, never a reshape
        return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=axis_types)
    if devices[0].platform == "gpu" and devices[0] not in jax.devices():
        # A deviceless compile's GPUs of one host (parallel.aot): no layout to follow, and none
        # needed (the cards of one host reach each other alike, over NVLink or PCIe).
        return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=axis_types)
    if len(devices) == jax.device_count() and devices == list(jax.devices()):
        try:
            return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=axis_types)
        except (TypeError, ValueError, NotImplementedError) as e:
            reason = f"jax.make_mesh cannot lay out {dict(zip(MESH_AXES, shape))}: {e}"
    else:
        reason = (
            f"{len(devices)} of the {jax.device_count()} devices were given, whose layout is "
            "not known"
        )
    logging.warning(
        "mesh %s: %s; placing the devices in the order given (a plain reshape)",
        dict(zip(MESH_AXES, shape)),
        reason,
    )
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=axis_types)


def _divisible(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
    """`spec` with every mesh axis dropped that does not divide its dimension evenly.

    BERT's vocabulary (30,522 = 2 x 3 x 5087) splits 2 ways, not 4 or 8; such a table is then
    replicated along that axis rather than failing (or silently padding the checkpoint).
    """
    fixed = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        if axes is None:
            fixed.append(None)
            continue
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        kept = []
        for name in names:
            size = math.prod(mesh.shape[n] for n in kept) * mesh.shape[name]
            if dim % size == 0:
                kept.append(name)
        fixed.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return P(*fixed)


def logical_shardings(boxed: PyTree, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> PyTree:
    """NamedShardings for a tree whose leaves are `nn.Partitioned` boxes (or plain arrays,
    which are replicated), e.g. the result of `jax.eval_shape(init)`.

    A dimension that its mesh axes do not divide evenly is replicated along them instead.
    """
    specs = nn.get_partition_spec(boxed)
    values = nn.meta.unbox(boxed)
    shapes = jax.tree_util.tree_map(lambda x: tuple(np.shape(x)), values)
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    flat_specs, treedef = jax.tree_util.tree_flatten(specs, is_leaf=is_spec)
    flat_shapes = treedef.flatten_up_to(shapes)
    mesh_specs = [
        _divisible(nn.logical_to_mesh_axes(tuple(spec), list(rules)), shape, mesh)
        for spec, shape in zip(flat_specs, flat_shapes)
    ]
    return treedef.unflatten([NamedSharding(mesh, spec) for spec in mesh_specs])


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading (batch) axis split over data x fsdp; the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def batch_shardings(batch: PyTree, mesh: Mesh) -> PyTree:
    """`batch_sharding` for every array of a (host-side) batch."""
    return jax.tree_util.tree_map(lambda x: batch_sharding(mesh, np.ndim(x)), batch)


def data_parallel_size(mesh: Mesh) -> int:
    """How many ways the batch is split."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def host_batch_shards(mesh: Mesh) -> list[int]:
    """Which of the `data_parallel_size(mesh)` batch shards this process's devices hold, sorted.

    Read from the batch sharding's addressable indices, so it holds for any device order: hosts
    whose devices differ only along the tensor axis (or a model axis spanning hosts) hold the
    same shards and must feed the same rows.
    """
    num_shards = data_parallel_size(mesh)
    indices = batch_sharding(mesh, 1).addressable_devices_indices_map((num_shards,))
    return sorted({index[0].start or 0 for index in indices.values()})


def host_batch_fraction(mesh: Mesh) -> float:
    """The share of every global batch this process reads (1 / process_count when no two hosts
    hold the same batch shard): host-side counts divided by it are global counts."""
    return len(host_batch_shards(mesh)) / data_parallel_size(mesh)


def host_batch_rows(mesh: Mesh, global_batch_size: int) -> np.ndarray:
    """The rows of every global batch this process reads and feeds to its devices, in order.

    Args:
      mesh: the run's mesh; the batch is split over (data, fsdp).
      global_batch_size: G, rows per global batch (all hosts together).

    Returns:
      int64 [G * len(host_batch_shards) / data_parallel_size] row indices in [0, G): the host's
      shards' rows, shard after shard. `global_batch_from_local` expects the rows in this order.
    """
    num_shards = data_parallel_size(mesh)
    if global_batch_size < 1 or global_batch_size % num_shards:
        raise ValueError(
            f"global_batch_size={global_batch_size} does not split into the {num_shards} batch "
            f"shards of mesh {dict(mesh.shape)} (data x fsdp)"
        )
    per_shard = global_batch_size // num_shards
    return np.concatenate(
        [np.arange(s * per_shard, (s + 1) * per_shard) for s in host_batch_shards(mesh)]
    )


def global_batch_from_local(batch: PyTree, mesh: Mesh) -> PyTree:
    """Assembles each host's rows of the batch into global arrays sharded over (data, fsdp).

    Args:
      batch: this process's rows, `host_batch_rows(mesh, G)` of every global batch in that
        order (numpy arrays [R, ...], R = len(host_batch_rows(mesh, G))). Arrays may lead with
        different counts (a packed batch's [R] rows and its [B] pairs), each split alike.
      mesh: the run's mesh.

    Returns:
      The same keys as global jax.Arrays [G, ...]. The global shape is always given to JAX, so
      hosts that share a batch shard (a model axis across hosts) add no rows.
    """
    num_local = len(host_batch_shards(mesh))

    def assemble(x):
        rows = np.shape(x)[0]
        if rows % num_local:
            raise ValueError(
                f"this host's batch has {rows} rows, which do not split over the {num_local} "
                f"batch shard(s) its devices hold in mesh {dict(mesh.shape)}"
            )
        sharding = batch_sharding(mesh, np.ndim(x))
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        shape = (rows // num_local * data_parallel_size(mesh), *np.shape(x)[1:])
        return jax.make_array_from_process_local_data(sharding, x, shape)

    return jax.tree_util.tree_map(assemble, batch)


def check_host_batches(batch: PyTree, mesh: Mesh) -> None:
    """Fails loudly unless the hosts' batches fit together: every row of the global batch is
    held by some host, and hosts holding the same row hold the same values.

    A barrier with a timeout (`parallel.multihost`: every process calls it with its rows of the
    same global batch); a no-op in a single-process run. Meant for the first batch of a run, where
    a pipeline that slices the global batch differently from the mesh would otherwise train
    silently on wrong data.
    """
    if jax.process_count() == 1:
        return
    groups = {}  # the arrays by their leading count (a packed batch's rows and its pairs)
    for x in jax.tree_util.tree_leaves(batch):
        groups.setdefault(np.shape(x)[0], []).append(x)
    num_local = len(host_batch_shards(mesh))
    for rows, leaves in sorted(groups.items()):
        _check_host_rows(leaves, rows // num_local * data_parallel_size(mesh), mesh)


def _check_host_rows(leaves: list, global_rows: int, mesh: Mesh) -> None:
    """`check_host_batches` for arrays that lead with the same rows of a global batch."""
    mine = host_batch_rows(mesh, global_rows)
    digests = np.full((global_rows,), -1, np.int32)  # int32: what JAX gathers without x64
    for i, row in enumerate(mine):
        data = b"".join(np.ascontiguousarray(x[i]).tobytes() for x in leaves)
        digests[row] = zlib.crc32(data) & 0x7FFFFFFF
    name = f"host-batch-digests-{global_rows}"
    gathered = multihost.all_gather(name, json.dumps(digests.tolist()))
    everyone = np.asarray([json.loads(d) for d in gathered])  # [P, G]
    held = everyone >= 0
    missing = np.flatnonzero(~held.any(0))
    if missing.size:
        raise ValueError(
            f"no host feeds rows {missing[:10].tolist()} of the global batch of {global_rows}: "
            "the input pipeline's host slices do not cover the batch sharding"
        )
    first = np.where(held, everyone, -1).max(0)
    disagree = np.flatnonzero((held & (everyone != first)).any(0))
    if disagree.size:
        raise ValueError(
            f"hosts that share batch shards of mesh {dict(mesh.shape)} read different data for "
            f"rows {disagree[:10].tolist()} of the global batch: every host must read the rows "
            "`sharding.host_batch_rows` gives it"
        )


def describe(boxed: PyTree, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> list[str]:
    """One line per parameter: path, shape, logical axes, mesh PartitionSpec, bytes per device."""
    specs = nn.get_partition_spec(boxed)
    shardings = logical_shardings(boxed, mesh, rules)
    lines = []
    flat = jax.tree_util.tree_flatten_with_path(
        boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    )[0]
    flat_shard = jax.tree_util.tree_leaves(shardings)
    flat_spec = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, P))
    for (path, leaf), sharding, logical in zip(flat, flat_shard, flat_spec):
        value = leaf.value if isinstance(leaf, nn.Partitioned) else leaf
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        local = sharding.shard_shape(value.shape)
        nbytes = math.prod(local) * np.dtype(value.dtype).itemsize
        lines.append(
            f"{name:<70} {str(tuple(value.shape)):<18} {str(tuple(logical)):<32} "
            f"{str(sharding.spec):<36} {nbytes / 2**20:9.2f} MiB/device"
        )
    return lines


class DevicePrefetcher:
    """Places host batches on the mesh `size` steps ahead, so transfers overlap compute.

    Each item is (global batch, host batch): the second is this host's numpy batch, for cheap
    host-side statistics such as real token counts. The first batch goes through
    `check_host_batches` (a barrier), so a pipeline that does not feed the mesh's rows stops
    the run at its first step. The source iterator runs ahead of what the loop has consumed;
    `consumed()` moves it back to just after the last batch handed out (and drops the
    read-ahead), so that saving the iterator's state records exactly the consumed position.
    """

    def __init__(self, iterator, mesh: Mesh, size: int = 2):
        self._it = iterator
        self._mesh = mesh
        self._size = max(size, 1)
        self._queue: list = []
        self._stateful = hasattr(iterator, "get_state") and hasattr(iterator, "set_state")
        self._consumed_state = iterator.get_state() if self._stateful else None
        self._checked = False

    def __iter__(self):
        return self

    def _fill(self) -> None:
        while len(self._queue) < self._size:
            try:
                host = next(self._it)
            except StopIteration:
                break
            state = self._it.get_state() if self._stateful else None
            if not self._checked:
                check_host_batches(host, self._mesh)
                self._checked = True
            self._queue.append((global_batch_from_local(host, self._mesh), host, state))

    def __next__(self):
        self._fill()
        if not self._queue:
            raise StopIteration
        batch, host, state = self._queue.pop(0)
        self._consumed_state = state
        return batch, host

    @property
    def stateful(self) -> bool:
        """Whether the source iterator has a position to save (get_state/set_state)."""
        return self._stateful

    def consumed(self):
        """The source iterator, put back at the consumed position (just after the last batch
        handed out; the read-ahead is dropped and read again): what a checkpoint saves."""
        if not self._stateful:
            raise TypeError("the source iterator has no get_state/set_state")
        self._it.set_state(self._consumed_state)
        self._queue.clear()
        return self._it
