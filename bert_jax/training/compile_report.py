"""A run's train and eval steps compiled for a TPU slice or GPUs on this machine, and the report.

The devices are `parallel.aot`'s compile-only ones (`aot.topology_devices`); the experiment's mesh
is laid over them and the train step that the `loop.Trainer` would run is lowered with the same
shardings and compiled. What comes back is what renting the slice would have told: whether the
step fits in HBM, how long it compiles, which collectives it runs, and XLA's own count of FLOPs
and HBM bytes per device, from which

    roofline step time = max(XLA FLOPs / peak FLOP/s, XLA bytes / HBM bandwidth)
    MFU bound          = model FLOPs / peak FLOP/s / roofline step time

The MFU bound is an upper bound from the compiled program, not a measurement: a real step also
waits on collectives, host input and whatever XLA's cost model leaves out. XLA counts the body of
a loop once, so with `scan_layers=True` or micro-batches the counts cover one layer / one
micro-batch; the report then leaves the roofline out and says so (compile unrolled to get it).
On GPUs the compute time is the model FLOPs' (cuBLAS and cuDNN calls count none in XLA).

    python train.py --config=configs/pretrain.py:size=large --mode=compile --topology=v5e:4x4 \\
        --config.mesh.data=1 --config.mesh.fsdp=-1

Every job's `--mode=compile` ends in `report_compiled_step`.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bert_jax.parallel import aot, sharding


def report_compiled_step(
    exp,
    batch: Mapping[str, jax.ShapeDtypeStruct],
    *,
    model_flops: float,
    topology: str,
    num_slices: int = 1,
    task: str | None = None,
    hlo_out: str | None = None,
) -> int:
    """Compiles `exp`'s steps for its (compile-only) mesh, prints the report and returns the
    exit status (1: the step does not fit in memory). The ending of every job's `--mode=compile`.

    Args:
      exp: an `experiment.Experiment` built over `aot.topology_devices(topology)`.
      batch: the global batch's shapes and dtypes.
      model_flops: model FLOPs of one global step (forward + backward).
      topology: the topology's name, for the report ("v5e:4x4", "gpu:h100").
      num_slices: TPU slices the mesh spans.
      task: the fine-tuning task or "embed", for the report; None: pretraining.
      hlo_out: where to write the train step's optimized HLO text (None: nowhere).
    """
    report = compile_step(exp, batch, model_flops=model_flops, hlo_path=hlo_out)
    report.update(topology=topology, num_slices=num_slices)
    if task is not None:
        report["task"] = task
    return print_report(report)


def _setup_report(exp, batch: Mapping[str, jax.ShapeDtypeStruct], hw: aot.DeviceFacts) -> dict:
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
    model_flops_per_device: float, xla_flops: float, xla_bytes: float, hw: aot.DeviceFacts
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
    hw = aot.device_facts(devices, exp.runtime.dtype)
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


def _program_report(compiled, eval_compiled, hw: aot.DeviceFacts, hlo_path: str | None) -> dict:
    """What the compiled programs say: memory (GiB per device) and whether it fits, the train
    step's collectives and cuDNN attention calls, and XLA's FLOPs and bytes per device."""
    memory = aot.memory_sizes(compiled)
    hlo = compiled.as_text()
    if hlo_path:
        pathlib.Path(hlo_path).write_text(hlo)
    xla_flops, xla_bytes = aot.cost_counts(compiled)
    return {
        "hbm_gib": {k: v / 2**30 for k, v in memory.items()},
        "eval_hbm_gib": aot.memory_sizes(eval_compiled)["total"] / 2**30,
        "fits": memory["total"] * (1 + hw.margin) <= hw.capacity,
        "collectives": aot.count_collectives(hlo),
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
