"""Ahead-of-time compilation of the real training step for a TPU slice or NVIDIA GPUs, anywhere.

libtpu (the `tpu` extra) compiles for a TPU slice it is not running on: a topology name such as
`v5e:4x4` gives compile-only devices, the configured mesh is laid over them, and the train step
that the `loop.Trainer` would run is lowered with the same shardings and compiled. JAX's CUDA
plugin does the same for GPUs (`gpu:t4`, `gpu:h100x8`: N cards of one host) from a target
description built from the card's facts (`hardware.GPU_CARDS`, `gpu_target_config`); it needs no
GPU and no CUDA driver, only the plugin and ptxas (`make setup` installs them into
`.venv/cuda-compile`, `CUDA_COMPILE_DIR`). What comes back
is what renting the slice would have told: whether the step fits in HBM, how long it compiles,
which collectives it runs, and XLA's own count of FLOPs and HBM bytes per device, from which

    roofline step time = max(XLA FLOPs / peak FLOP/s, XLA bytes / HBM bandwidth)
    MFU bound          = model FLOPs / peak FLOP/s / roofline step time

The MFU bound is an upper bound from the compiled program, not a measurement: a real step also
waits on collectives, host input and whatever XLA's cost model leaves out. XLA counts the body of
a loop once, so with `scan_layers=True` or micro-batches the counts cover one layer / one
micro-batch; the report then leaves the roofline out and says so (compile unrolled to get it).

    python train.py --config=configs/pretrain.py:size=large --mode=compile --topology=v5e:4x4 \\
        --config.mesh.data=1 --config.mesh.fsdp=-1

Sizes are per device, which is one chip: v4 and v5p compile as megacore chips (both TensorCores
as one device), as they run; v5e and v6e have one TensorCore per chip.

On GPUs: a step fits when XLA's plan of its buffers, plus `GPU_MARGIN`, fits in the memory pool
JAX's allocator takes (`XLA_PYTHON_CLIENT_MEM_FRACTION` of the card, 0.75 unless set). cuBLAS
and cuDNN calls count no FLOPs in XLA's cost analysis, so the GPU roofline takes its compute
time from the model FLOPs; nothing is autotuned deviceless (the plan's sizes are right, kernel
choices are not those a real card would time) and cuDNN's workspace is not sized.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import pathlib
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np

from bert_jax import hardware
from bert_jax.parallel import sharding

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


def _memory(compiled) -> dict[str, float]:
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


def _cost(compiled) -> tuple[float, float]:
    """XLA's FLOPs and bytes accessed of the compiled program, per device."""
    cost = compiled.cost_analysis()
    if cost is None:  # deviceless GPU executables: XLA's generic analysis of the optimized HLO
        from jax._src.lib import _jax

        module = compiled._executable.xla_executable.hlo_modules()[0]
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


class _Hardware(NamedTuple):
    """What a report needs of the compile-only devices, per device where not said otherwise."""

    gpu: bool
    kind: str  # the devices' device_kind
    chips: int  # chips (TPU) or cards (GPU) in all
    capacity: float  # bytes the step may take: HBM (TPU), JAX's memory pool (GPU)
    margin: float  # share of room kept above XLA's plan (GPU_MARGIN on GPUs)
    peak: float  # peak FLOP/s in the run's dtype (bfloat16 on TPUs)
    bandwidth: float  # HBM bytes/s
    compute_capability: str | None  # GPUs only


def _hardware(devices: list, dtype: str) -> _Hardware:
    """The devices' chip facts (`hardware.GPU_CARDS` or `hardware.tpu_chip`), split per device."""
    kind = devices[0].device_kind
    if devices[0].platform == "gpu":
        card = hardware.gpu_card_of_kind(kind)
        return _Hardware(
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
    return _Hardware(
        gpu=False,
        kind=kind,
        chips=chips,
        capacity=chip.hbm_bytes / per_chip,
        margin=0.0,
        peak=chip.peak_bf16_flops / per_chip,
        bandwidth=chip.hbm_bytes_per_s / per_chip,
        compute_capability=None,
    )


def _setup_report(exp, batch: Mapping[str, jax.ShapeDtypeStruct], hw: _Hardware) -> dict:
    """The report's first entries: the hardware, the mesh and the run's settings."""
    rt = exp.runtime
    report: dict[str, Any] = {
        "platform": "gpu" if hw.gpu else "tpu",
        "device_kind": hw.kind,
        "chips": hw.chips,
        "devices": exp.mesh.devices.size,
        "mesh": dict(exp.mesh.shape),
        "batch": list(batch["input_ids"].shape),
        "num_microbatches": exp.num_microbatches,
        "scan_layers": rt.scan_layers,
        "remat_policy": rt.remat_policy,
        "dtype": rt.dtype,
        "attention": rt.attention,
        "collective_matmul": rt.collective_matmul,
        "hbm_capacity_gib": hw.capacity / 2**30,
        "memory_margin": hw.margin,
    }
    if hw.gpu:
        report["compute_capability"] = hw.compute_capability
    return report


def _roofline(
    model_flops_per_device: float, xla_flops: float, xla_bytes: float, hw: _Hardware
) -> dict[str, Any]:
    """Compute and memory times of one step (seconds), its bound and the MFU bound."""
    # XLA counts no FLOPs in cuBLAS / cuDNN calls: on GPUs the compute time is the model's
    compute_s = (model_flops_per_device if hw.gpu else xla_flops) / hw.peak
    memory_s = xla_bytes / hw.bandwidth
    step_s = max(compute_s, memory_s)
    return {
        "compute_s": compute_s,
        "memory_s": memory_s,
        "bound": "memory" if memory_s > compute_s else "compute",
        "mfu_bound": model_flops_per_device / hw.peak / step_s if step_s else None,
    }


def compile_step(
    exp,
    batch: Mapping[str, jax.ShapeDtypeStruct],
    *,
    model_flops: float,
    hlo_path: str | None = None,
) -> dict:
    """Compiles `exp`'s train step (and eval step) for its mesh and reports on them.

    Args:
      exp: an `experiment.Experiment` built over a topology's devices.
      batch: the global batch's shapes and dtypes (e.g.
        `bert_jax.pretrain.run.pretraining_batch(config)`).
      model_flops: model FLOPs of one global step (forward + backward), for the MFU bound.
      hlo_path: where to write the compiled train step's optimized HLO text (None: nowhere).

    Returns:
      A JSON-able dict: sizes in GiB per device, times in seconds, FLOPs and bytes per device.
      `fits` is False (with `error`) when XLA finds the step larger than the device's HBM.
    """
    devices = list(exp.mesh.devices.flat)
    hw = _hardware(devices, exp.runtime.dtype)
    report = _setup_report(exp, batch, hw)
    compiled = _compile_train_and_eval(exp, batch, report)
    if compiled is None:  # out of memory: `fits` and `error` say so
        return report
    report.update(_program_report(*compiled, hw, hlo_path))
    report["model_flops_per_device"] = model_flops / len(devices)
    if exp.runtime.scan_layers or exp.num_microbatches > 1:
        report["roofline"] = None
        report["roofline_note"] = (
            "XLA counts a loop body once (scan_layers or micro-batches): no roofline; compile "
            "with --config.runtime.scan_layers=False --config.num_microbatches=1 for it"
        )
    else:
        report["roofline"] = _roofline(
            report["model_flops_per_device"],
            report["xla_flops_per_device"],
            report["xla_bytes_per_device"],
            hw,
        )
    return report


def _compile_train_and_eval(exp, batch: Mapping[str, jax.ShapeDtypeStruct], report: dict):
    """The compiled train and eval steps for the batch laid over `exp`'s mesh, their compile
    times in `report` ("compile_s", "eval_compile_s"); None when one does not fit."""
    batch_sh = sharding.batch_shardings(batch, exp.mesh)
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sh[k]) for k, v in batch.items()
    }
    state = exp.targets()
    with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
        lower_train = lambda: exp.jit_train_step(batch_sh).lower(state, batch)  # noqa: E731
        train = _timed_compile(lower_train, report, "compile_s", "")
        if train is None:
            return None
        lower_eval = lambda: exp.eval_fn().lower(state.params, batch)  # noqa: E731
        evaluate = _timed_compile(lower_eval, report, "eval_compile_s", "eval step: ")
    return None if evaluate is None else (train, evaluate)


def _timed_compile(lower, report: dict, key: str, what: str):
    """`lower().compile()`, its seconds in `report[key]`; None, with `fits` False and the
    error (prefixed by `what`) in `report`, when XLA finds it too large for the device."""
    start = time.perf_counter()
    try:
        compiled = lower().compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        report.update(fits=False, error=what + str(e).splitlines()[0][:500])
        compiled = None
    report[key] = time.perf_counter() - start
    return compiled


def _program_report(compiled, eval_compiled, hw: _Hardware, hlo_path: str | None) -> dict:
    """What the compiled programs say: memory (GiB per device) and whether it fits, the train
    step's collectives and cuDNN attention calls, and XLA's FLOPs and bytes per device."""
    memory = _memory(compiled)
    hlo = compiled.as_text()
    if hlo_path:
        pathlib.Path(hlo_path).write_text(hlo)
    xla_flops, xla_bytes = _cost(compiled)
    return {
        "hbm_gib": {k: v / 2**30 for k, v in memory.items()},
        "eval_hbm_gib": _memory(eval_compiled)["total"] / 2**30,
        "fits": memory["total"] * (1 + hw.margin) <= hw.capacity,
        "collectives": count_collectives(hlo),
        "cudnn_attention_calls": hlo.count('custom_call_target="__cudnn$fmha'),
        "xla_flops_per_device": xla_flops,
        "xla_bytes_per_device": xla_bytes,
    }


def _gib(x: float) -> str:
    return f"{x:.2f} GiB"


def format_report(report: Mapping[str, Any]) -> str:
    """A readable table of `compile_step`'s report (plus topology/num_slices if present)."""
    gpu = report.get("platform") == "gpu"
    hbm = "memory" if gpu else "HBM"
    rows = [
        *_hardware_rows(report, gpu),
        ("mesh", " ".join(f"{k}={v}" for k, v in report["mesh"].items())),
        ("global batch x length", " x ".join(map(str, report["batch"]))),
        (
            "run",
            f"dtype {report['dtype']}, scan_layers {report['scan_layers']}, remat "
            f"{report['remat_policy']}, micro-batches {report['num_microbatches']}, attention "
            f"{report['attention']}, collective matmul {report['collective_matmul']}",
        ),
        ("train step compile", f"{report['compile_s']:.1f} s"),
    ]
    if "hbm_gib" in report:
        rows += _memory_rows(report, gpu, hbm)
    rows.append(("fits", "yes" if report["fits"] else f"NO: {report.get('error', 'over ' + hbm)}"))
    if "collectives" in report:
        rows += _cost_rows(report, gpu, hbm)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _hardware_rows(report: Mapping[str, Any], gpu: bool) -> list[tuple[str, str]]:
    """The table's rows naming the topology and its cards or chips."""
    if gpu:
        return [
            ("topology", report.get("topology", "?")),
            (
                "cards",
                f"{report['devices']} x {report['device_kind']} (compute capability "
                f"{report['compute_capability']})",
            ),
        ]
    return [
        ("topology", f"{report.get('topology', '?')} x {report.get('num_slices', 1)} slice(s)"),
        ("chips / devices", f"{report['chips']} / {report['devices']} ({report['device_kind']})"),
    ]


def _memory_rows(report: Mapping[str, Any], gpu: bool, hbm: str) -> list[tuple[str, str]]:
    """The table's rows of the train step's memory per device, and the eval step's."""
    m = report["hbm_gib"]
    capacity = _gib(report["hbm_capacity_gib"])
    if gpu:
        capacity += f" (JAX's pool; fits with {100 * report['memory_margin']:.0f}% to spare)"
    return [
        (f"{hbm} arguments", _gib(m["arguments"])),
        (f"{hbm} temporaries", _gib(m["temporaries"])),
        (f"{hbm} outputs (not aliased)", _gib(m["outputs"] - m["aliased"])),
        (f"{hbm} total / capacity", f"{_gib(m['total'])} / {capacity}"),
        (
            f"eval step compile / {hbm}",
            f"{report['eval_compile_s']:.1f} s / {_gib(report['eval_hbm_gib'])}",
        ),
    ]


def _cost_rows(report: Mapping[str, Any], gpu: bool, hbm: str) -> list[tuple[str, str]]:
    """The table's rows of collectives, FLOPs and bytes per device, and the roofline."""
    rows = [
        ("collectives", ", ".join(f"{k} {v}" for k, v in report["collectives"].items())),
        ("XLA FLOPs / device", f"{report['xla_flops_per_device'] / 1e12:.3f} TFLOP"),
        (f"XLA {hbm} bytes / device", f"{report['xla_bytes_per_device'] / 1e9:.2f} GB"),
        ("model FLOPs / device", f"{report['model_flops_per_device'] / 1e12:.3f} TFLOP"),
    ]
    if gpu:
        rows.append(("cuDNN attention calls", str(report["cudnn_attention_calls"])))
    r = report["roofline"]
    if r is None:
        return [*rows, ("roofline", report["roofline_note"])]
    return [
        *rows,
        (
            "roofline step",
            f"compute {r['compute_s'] * 1e3:.1f} ms, memory "
            f"{r['memory_s'] * 1e3:.1f} ms ({r['bound']}-bound)",
        ),
        ("MFU bound (not measured)", f"{100 * r['mfu_bound']:.1f}%"),
    ]


def print_report(report: Mapping[str, Any]) -> int:
    """Prints the table and the JSON line; returns the exit status (1 if the step does not fit)."""
    print(format_report(report))
    print(report_json(report))
    return 0 if report["fits"] else 1


def report_json(report: Mapping[str, Any]) -> str:
    """One JSON line of the report."""
    return json.dumps(report, sort_keys=True, default=lambda x: float(np.asarray(x)))
