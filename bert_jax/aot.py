"""Ahead-of-time compilation of the real training step for a TPU topology, on any machine.

libtpu (the `tpu` extra) compiles for a TPU slice it is not running on: a topology name such as
`v5e:4x4` gives compile-only devices, the configured mesh is laid over them, and the train step
that the `loop.Trainer` would run is lowered with the same shardings and compiled. What comes back
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
"""

from __future__ import annotations

import collections
import glob
import importlib.util
import json
import os
import pathlib
import re
import time
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bert_jax import flops, sharding

# TPU generations by topology prefix: the chip config libtpu compiles them with. v4 and v5p run
# as megacore (both TensorCores of a chip as one device); the others have one core per chip.
GENERATIONS = {"v4": "megacore", "v5p": "megacore", "v5e": "default", "v6e": "default"}
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
    if importlib.util.find_spec("libtpu") is None or _tpu_attached():
        return
    gpu = glob.glob("/dev/nvidia[0-9]*") and any(
        importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13)
    )
    jax.config.update("jax_platforms", "cuda,cpu" if gpu else "cpu")


def _tpu_attached() -> bool:
    """Whether a Google PCI device (a TPU chip) is attached, as JAX's own probe looks."""
    vendors = glob.glob("/sys/bus/pci/devices/*/vendor")
    return any(pathlib.Path(v).read_text().strip() == "0x1ae0" for v in vendors)


def topology_devices(topology: str, num_slices: int = 1) -> list:
    """The compile-only devices of `num_slices` TPU slices of `topology` ("v5e:4x4", "v4:2x2x4",
    "v5p:4x4x4"; generations in `GENERATIONS`)."""
    generation, _, dims = topology.partition(":")
    if generation not in GENERATIONS or not re.fullmatch(r"\d+(x\d+){1,2}", dims):
        raise ValueError(
            f"unknown TPU topology {topology!r}: expected <generation>:<chips per axis> with a "
            f"generation in {sorted(GENERATIONS)}, e.g. v5e:4x4, v4:2x2x4, v5p:4x4x4"
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
    if not _tpu_attached():
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
            chip_config_name=GENERATIONS[generation],
            num_slices=num_slices,
        )
    except jax.errors.JaxRuntimeError as e:
        raise ValueError(f"libtpu rejects the topology {topology!r}: {e}") from e
    return list(desc.devices)


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
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def compile_step(
    exp,
    batch: Mapping[str, jax.ShapeDtypeStruct],
    *,
    model_flops: float,
    hlo_path: str | None = None,
) -> dict:
    """Compiles `exp`'s train step (and eval step) for its mesh and reports on them.

    Args:
      exp: a `loop.Experiment` built over a topology's devices.
      batch: the global batch's shapes and dtypes (e.g.
        `bert_jax.pretrain.run.pretraining_batch(config)`).
      model_flops: model FLOPs of one global step (forward + backward), for the MFU bound.
      hlo_path: where to write the compiled train step's optimized HLO text (None: nowhere).

    Returns:
      A JSON-able dict: sizes in GiB per device, times in seconds, FLOPs and bytes per device.
      `fits` is False (with `error`) when XLA finds the step larger than the device's HBM.
    """
    devices = list(exp.mesh.devices.flat)
    kind = devices[0].device_kind
    chip = flops.tpu_chip(kind)
    chips = len({(getattr(d, "slice_index", 0), *d.coords) for d in devices})
    per_chip = len(devices) // chips
    capacity = chip.hbm_bytes / per_chip
    peak, bandwidth = chip.peak_bf16_flops / per_chip, chip.hbm_bytes_per_s / per_chip
    rt = exp.runtime
    report: dict[str, Any] = {
        "device_kind": kind,
        "chips": chips,
        "devices": len(devices),
        "mesh": dict(exp.mesh.shape),
        "batch": list(batch["input_ids"].shape),
        "num_microbatches": exp.num_microbatches,
        "scan_layers": rt.scan_layers,
        "remat_policy": rt.remat_policy,
        "dtype": rt.dtype,
        "attention": rt.attention,
        "collective_matmul": rt.collective_matmul,
        "hbm_capacity_gib": capacity / 2**30,
    }
    batch_sh = sharding.batch_shardings(batch, exp.mesh)
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sh[k]) for k, v in batch.items()
    }
    state = exp.targets()
    with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
        start = time.perf_counter()
        lowered = exp.jit_train_step(batch_sh).lower(state, batch)
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            report.update(fits=False, error=str(e).splitlines()[0][:500])
            report["compile_s"] = time.perf_counter() - start
            return report
        report["compile_s"] = time.perf_counter() - start
        start = time.perf_counter()
        jit_eval = exp.eval_fn()
        eval_compiled = jit_eval.lower(state.params, batch).compile()
        report["eval_compile_s"] = time.perf_counter() - start
    memory = _memory(compiled)
    report["hbm_gib"] = {k: v / 2**30 for k, v in memory.items()}
    report["eval_hbm_gib"] = _memory(eval_compiled)["total"] / 2**30
    report["fits"] = memory["total"] <= capacity
    hlo = compiled.as_text()
    if hlo_path:
        pathlib.Path(hlo_path).write_text(hlo)
    report["collectives"] = count_collectives(hlo)
    xla_flops, xla_bytes = _cost(compiled)
    report["xla_flops_per_device"] = xla_flops
    report["xla_bytes_per_device"] = xla_bytes
    report["model_flops_per_device"] = model_flops / len(devices)
    looped = rt.scan_layers or exp.num_microbatches > 1
    if looped:
        report["roofline"] = None
        report["roofline_note"] = (
            "XLA counts a loop body once (scan_layers or micro-batches): no roofline; compile "
            "with --config.runtime.scan_layers=False --config.num_microbatches=1 for it"
        )
    else:
        compute_s, memory_s = xla_flops / peak, xla_bytes / bandwidth
        step_s = max(compute_s, memory_s)
        report["roofline"] = {
            "compute_s": compute_s,
            "memory_s": memory_s,
            "bound": "memory" if memory_s > compute_s else "compute",
            "mfu_bound": report["model_flops_per_device"] / peak / step_s if step_s else None,
        }
    return report


def format_report(report: Mapping[str, Any]) -> str:
    """A readable table of `compile_step`'s report (plus topology/num_slices if present)."""
    gib = lambda x: f"{x:.2f} GiB"  # noqa: E731
    rows = [
        ("topology", f"{report.get('topology', '?')} x {report.get('num_slices', 1)} slice(s)"),
        ("chips / devices", f"{report['chips']} / {report['devices']} ({report['device_kind']})"),
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
        m = report["hbm_gib"]
        rows += [
            ("HBM arguments", gib(m["arguments"])),
            ("HBM temporaries", gib(m["temporaries"])),
            ("HBM outputs (not aliased)", gib(m["outputs"] - m["aliased"])),
            ("HBM total / capacity", f"{gib(m['total'])} / {gib(report['hbm_capacity_gib'])}"),
            (
                "eval step compile / HBM",
                f"{report['eval_compile_s']:.1f} s / {gib(report['eval_hbm_gib'])}",
            ),
        ]
    rows.append(("fits", "yes" if report["fits"] else f"NO: {report.get('error', 'over HBM')}"))
    if "collectives" in report:
        rows.append(
            ("collectives", ", ".join(f"{k} {v}" for k, v in report["collectives"].items()))
        )
        rows += [
            ("XLA FLOPs / device", f"{report['xla_flops_per_device'] / 1e12:.3f} TFLOP"),
            ("XLA HBM bytes / device", f"{report['xla_bytes_per_device'] / 1e9:.2f} GB"),
            ("model FLOPs / device", f"{report['model_flops_per_device'] / 1e12:.3f} TFLOP"),
        ]
        r = report["roofline"]
        if r is None:
            rows.append(("roofline", report["roofline_note"]))
        else:
            rows += [
                (
                    "roofline step",
                    f"compute {r['compute_s'] * 1e3:.1f} ms, memory "
                    f"{r['memory_s'] * 1e3:.1f} ms ({r['bound']}-bound)",
                ),
                ("MFU bound (not measured)", f"{100 * r['mfu_bound']:.1f}%"),
            ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def report_json(report: Mapping[str, Any]) -> str:
    """One JSON line of the report."""
    return json.dumps(report, sort_keys=True, default=lambda x: float(np.asarray(x)))
