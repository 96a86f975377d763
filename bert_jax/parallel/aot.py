"""Compile-only devices for a TPU slice or NVIDIA GPUs on this machine, and what a compiled
program says of them.

libtpu (the `tpu` extra) compiles for a TPU slice it is not running on: a topology name such as
`v5e:4x4` gives compile-only devices (`topology_devices`). JAX's CUDA plugin does the same for
GPUs (`gpu:t4`, `gpu:h100x8`: N cards of one host) from a target description built from the
card's facts (`hardware.GPU_CARDS`, `gpu_target_config`); it needs no GPU and no CUDA driver, only
the plugin and ptxas (`make setup` installs them into `.venv/cuda-compile`, `CUDA_COMPILE_DIR`).
Beside the devices: their facts per device (`device_facts`), a compiled program's memory plan
(`memory_sizes`), XLA's FLOP and byte counts (`cost_counts`) and its collectives
(`count_collectives`). Compiling a run's step over these devices and reporting on it is
`bert_jax.training.compile_report`'s.

Sizes are per device, which is one chip: v4 and v5p compile as megacore chips (both TensorCores
as one device), as they run; v5e and v6e have one TensorCore per chip.

On GPUs: a step fits when XLA's plan of its buffers, plus `GPU_MARGIN`, fits in the memory pool
JAX's allocator takes (`XLA_PYTHON_CLIENT_MEM_FRACTION` of the card, 0.75 unless set). cuBLAS
and cuDNN calls count no FLOPs in XLA's cost analysis; nothing is autotuned deviceless (the
plan's sizes are right, kernel choices are not those a real card would time) and cuDNN's
workspace is not sized.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import pathlib
import re
import sys
from typing import NamedTuple

import jax

from bert_jax import hardware

# Room above XLA's plan for what a deviceless compile does not size (cuBLAS / cuDNN workspaces,
# the allocator's rounding). On an H100 the allocator's peak over real steps was 0.2-0.9% above
# the plan (benchmarks/RESULTS_gpu.md).
GPU_MARGIN = 0.05
CUDA_COMPILE_DIR = os.path.join(sys.prefix, "cuda-compile")  # where `make setup` puts the plugin
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
_COLLECTIVE_RE = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def skip_absent_tpu_backend() -> None:
    """Keeps JAX from starting libtpu on a machine without TPU chips.

    With the `tpu` extra installed and JAX_PLATFORMS unset, JAX's platform search loads libtpu
    first; without a chip it logs errors about unreachable TPU metadata and falls back to the
    CPU. This lists the platforms that can work instead (a visible NVIDIA GPU with its plugin,
    then the CPU). Compiling for a topology needs only libtpu's compiler, not its backend.
    Does nothing when JAX_PLATFORMS is set or a TPU chip (Google PCI vendor id) is attached.
    """
    if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms:
        return
    if importlib.util.find_spec("libtpu") is None or hardware.tpu_attached():
        return
    gpu = hardware.nvidia_gpu_attached() and any(
        importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13)
    )
    jax.config.update("jax_platforms", "cuda,cpu" if gpu else "cpu")


def topology_devices(topology: str, num_slices: int = 1) -> list:
    """The compile-only devices of `num_slices` TPU slices of `topology` ("v5e:4x4", "v4:2x2x4",
    "v5p:4x4x4"; generations in `hardware.TPU_GENERATIONS`), or of N NVIDIA cards ("gpu:t4",
    "gpu:h100x8"; cards in `hardware.GPU_CARDS`)."""
    if topology.startswith("gpu:"):
        if num_slices != 1:
            raise ValueError(f"num_slices applies to TPU slices, not to {topology!r}")
        card, count = parse_gpu_topology(topology)
        return gpu_devices(card, count)
    generation, _, dims = topology.partition(":")
    if generation not in hardware.TPU_GENERATIONS or not re.fullmatch(r"\d+(x\d+){1,2}", dims):
        raise ValueError(
            f"unknown TPU topology {topology!r}: expected <generation>:<chips per axis> with a "
            f"generation in {sorted(hardware.TPU_GENERATIONS)}, e.g. v5e:4x4, v4:2x2x4, v5p:4x4x4"
        )
    if num_slices < 1:
        raise ValueError(f"num_slices must be 1 or more, got {num_slices}")
    if importlib.util.find_spec("libtpu") is None:
        raise RuntimeError(
            "compiling for a TPU topology needs libtpu: pip install -e '.[tpu]' (jax[tpu] at the "
            f"installed jax {jax.__version__})"
        )
    from jax.experimental import topologies

    skip_absent_tpu_backend()
    if not hardware.tpu_attached():
        # libtpu's start-up otherwise asks the cloud metadata server which TPU host this is and
        # logs errors when there is none: here it is one host that only compiles. With no chip
        # to guard, several processes may compile at once (libtpu otherwise takes a lock file
        # and fails every other process, e.g. parallel tests).
        for key, value in (
            ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
            ("TPU_SKIP_MDS_QUERY", "1"),
            ("TPU_HOST_BOUNDS", "1,1,1"),
            ("TPU_WORKER_HOSTNAMES", "localhost"),
        ):
            os.environ.setdefault(key, value)
    try:
        desc = topologies.get_topology_desc(
            platform="tpu",
            topology_name=topology,
            chip_config_name=hardware.TPU_GENERATIONS[generation],
            num_slices=num_slices,
        )
    except jax.errors.JaxRuntimeError as e:
        raise ValueError(f"libtpu rejects the topology {topology!r}: {e}") from e
    return list(desc.devices)


def parse_gpu_topology(topology: str) -> tuple[str, int]:
    """("h100", 8) from "gpu:h100x8"; ("t4", 1) from "gpu:t4"; ("rtx4090", 2) from
    "gpu:rtx4090x2"."""
    name = topology.removeprefix("gpu:") if topology.startswith("gpu:") else ""
    card, count = (name, "1") if name in hardware.GPU_CARDS else name.rpartition("x")[::2]
    if card not in hardware.GPU_CARDS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"unknown GPU topology {topology!r}: expected gpu:CARD or gpu:CARDxN (N cards on one "
            f"host) with CARD one of {', '.join(hardware.GPU_CARDS)}, e.g. gpu:t4, gpu:h100x8"
        )
    return card, int(count)


def gpu_target_config(card: hardware.GpuCard) -> str:
    """The card as XLA's GpuTargetConfigProto text: what XLA:GPU asks a real card for.

    Per-SM limits are CUDA's for the card's compute capability (`hardware.SM_LIMITS`: threads,
    shared memory); the rest comes from the card's row in `hardware.GPU_CARDS`.
    """
    major, minor = card.compute_capability.split(".")
    shared, optin, threads, lanes = card.sm_limits
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {shared * 1024}
  threads_per_core_limit: {threads}
  core_count: {card.sms}
  fpus_per_core: {lanes}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(card.memory_bytes_per_s)}
  l2_cache_size: {int(card.l2_mib * 2**20)}
  clock_rate_ghz: {card.clock_ghz}
  device_memory_size: {card.memory_bytes}
  shared_memory_per_block_optin: {optin * 1024}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
device_description_str: "{card.name}"
"""


def cuda_plugin_installed() -> bool:
    """Whether JAX's CUDA 12 plugin can be imported (beside jax, or from `CUDA_COMPILE_DIR` once
    `_register_cuda_compiler` has put it on the path)."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


def _register_cuda_compiler() -> None:
    """Makes JAX's CUDA plugin available for compiling, on a machine with or without a GPU.

    Where the plugin is installed beside jax (`jax[cuda12]`) JAX has registered it already. Else
    it is loaded from `CUDA_COMPILE_DIR`, kept off the import path so that its libraries do not
    announce a missing CUDA driver on every CPU run. No GPU is needed: the plugin's check of the
    CUDA runtime's version is skipped (nothing is run).
    """
    from jax._src import xla_bridge

    xla_bridge._discover_and_register_pjrt_plugins()  # the plugins installed beside jax
    if "cuda" in xla_bridge._topology_factories:
        return
    if not cuda_plugin_installed() and os.path.isdir(CUDA_COMPILE_DIR):
        sys.path.append(CUDA_COMPILE_DIR)
        importlib.invalidate_caches()
    if not cuda_plugin_installed():
        raise RuntimeError(
            "compiling for a GPU needs JAX's CUDA plugin and ptxas: make setup installs them "
            f"into {CUDA_COMPILE_DIR}, or pip install jax-cuda12-plugin=={jax.__version__} "
            f"jax-cuda12-pjrt=={jax.__version__} nvidia-cuda-nvcc-cu12"
        )
    import jax_plugins.xla_cuda12 as plugin

    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    plugin.initialize()
    # What JAX does for the plugins it finds at start-up: the callbacks that give the plugin
    # the custom calls' partitioners (cuDNN attention's, sharded), and the plugin's version
    # queries, which jax looked for when it was imported (cuDNN attention asks cuDNN's).
    c_api = xla_bridge._backend_factories["cuda"].c_api
    for callback in xla_bridge._plugin_callbacks:
        callback(c_api=c_api)
    from jax._src import lib
    from jax._src.cudnn import fused_attention_stablehlo

    if lib.cuda_versions is None:
        import jax_cuda12_plugin._versions as versions

        lib.cuda_versions = fused_attention_stablehlo.cuda_versions = versions
    # jax also found no CUDA directory then, and XLA took the first ptxas on the PATH (a CUDA 13
    # one no longer builds for the V100's sm_70): point every compile at the plugin's ptxas.
    site = pathlib.Path(plugin.__file__).parents[2]  # <site>/jax_plugins/xla_cuda12/__init__.py
    nvcc = str(site / "nvidia" / "cuda_nvcc")
    if not os.path.isdir(str(lib.cuda_path)) and os.path.isdir(nvcc):  # (jax 0.10 says "None")
        lib.cuda_path = nvcc


def gpu_devices(card: str, count: int = 1) -> list:
    """The compile-only devices of `count` cards `card` ("t4", "h100", ...) on one host."""
    _register_cuda_compiler()
    from jax.experimental import topologies

    target = gpu_target_config(hardware.gpu_card(card))
    return list(
        topologies.get_topology_desc(
            platform="cuda", target_config=target, topology=f"1x1x{count}"
        ).devices
    )


def _gpu_memory_fraction() -> float:
    """The share of a card's memory JAX's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION)."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))


def count_collectives(hlo_text: str) -> dict[str, int]:
    """How many of each collective op the (optimized) HLO text holds; async pairs count once."""
    found = collections.Counter(m.group(1) for m in _COLLECTIVE_RE.finditer(hlo_text))
    return {name: found.get(name, 0) for name in COLLECTIVES}


def memory_sizes(compiled) -> dict[str, float]:
    """The compiled program's buffers in bytes per device: arguments, outputs, aliased,
    temporaries, code and their total (what the device must hold)."""
    m = compiled.memory_analysis()
    out = {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "code": m.generated_code_size_in_bytes,
    }
    out["total"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
    out["total"] += out["code"]
    return out


def cost_counts(compiled) -> tuple[float, float]:
    """XLA's FLOPs and bytes accessed of the compiled program, per device."""
    cost = compiled.cost_analysis()
    if cost is None:  # deviceless GPU executables: XLA's generic analysis of the optimized HLO
        from jax._src.lib import _jax

        module = compiled._executable.xla_executable.hlo_modules()[0]
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


class DeviceFacts(NamedTuple):
    """What a step's report needs of the compile-only devices (per device unless said)."""

    gpu: bool
    kind: str  # the devices' device_kind
    chips: int  # chips (TPU) or cards (GPU) in all
    capacity: float  # bytes the step may take: HBM (TPU), JAX's memory pool (GPU)
    margin: float  # share of room kept above XLA's plan (GPU_MARGIN on GPUs)
    peak: float  # peak FLOP/s in the run's dtype (bfloat16 on TPUs)
    bandwidth: float  # HBM bytes/s
    compute_capability: str | None  # GPUs only


def device_facts(devices: list, dtype: str) -> DeviceFacts:
    """The devices' chip facts (`hardware.GPU_CARDS` or `hardware.tpu_chip`), split per device."""
    kind = devices[0].device_kind
    if devices[0].platform == "gpu":
        card = hardware.gpu_card_of_kind(kind)
        return DeviceFacts(
            gpu=True,
            kind=kind,
            chips=len(devices),
            capacity=card.memory_bytes * _gpu_memory_fraction(),
            margin=GPU_MARGIN,
            peak=card.peak_flops(dtype),
            bandwidth=card.memory_bytes_per_s,
            compute_capability=card.compute_capability,
        )
    chip = hardware.tpu_chip(kind)
    chips = len({(getattr(d, "slice_index", 0), *d.coords) for d in devices})
    per_chip = len(devices) // chips
    return DeviceFacts(
        gpu=False,
        kind=kind,
        chips=chips,
        capacity=chip.hbm_bytes / per_chip,
        margin=0.0,
        peak=chip.peak_bf16_flops / per_chip,
        bandwidth=chip.hbm_bytes_per_s / per_chip,
        compute_capability=None,
    )
