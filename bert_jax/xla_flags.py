"""The XLA options this project sets, per platform, in one place, and where they come from.

Importing this module (`import bert_jax` does, first) calls `apply()`, which adds them to the
environment variables that XLA reads when JAX starts a backend: `XLA_FLAGS` (the CPU and GPU
compilers) and `LIBTPU_INIT_ARGS` (libtpu, on a TPU host and for deviceless TPU compiles). They
must be in place before the first use of a backend (`jax.devices()`, the first jit): a process
that started one before importing bert_jax gets none of them, and `apply()` logs that. A flag
already named in the variable (set by the user) is never overridden; `BERT_JAX_XLA_FLAGS=0` in
the environment applies none.

A flag is added only with a measurement showing it faster and exact (equal to XLA's default
within float rounding): benchmarks/RESULTS.md for the CPU, RESULTS_gpu.md, RESULTS_tpu.md. Options
a config chooses per run (`RuntimeConfig.collective_matmul`) reach XLA per program
(`RuntimeConfig.compiler_options`), not through here.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping

from bert_jax import hardware

DISABLE_VARIABLE = "BERT_JAX_XLA_FLAGS"  # "0": apply none

# XLA:CPU flags by `hardware.cpu_family`: none yet on any family. Measurements and what an
# Intel row still needs: benchmarks/RESULTS.md, "XLA:CPU options per CPU family".
CPU_BY_FAMILY: dict[str, dict[str, str]] = {}

# XLA:CPU options of the inference programs only (`inference_options`), never training's, by
# CPU family. Intel AMX without YNNPACK fusions: exact and faster for the encoder, slower and not
# exact for the training step (benchmarks/RESULTS.md, "Packed inference against ...").
CPU_INFERENCE_BY_FAMILY: dict[str, dict[str, str]] = {
    "intel_amx": {"xla_cpu_experimental_ynn_fusion_type": ""},
}

# XLA:GPU flags (XLA_FLAGS): none yet, as no card has timed one (benchmarks/RESULTS_gpu.md, "XLA
# GPU flags"). The candidates come from JAX's "GPU performance tips" and NVIDIA JAX-Toolbox's
# "Tips for High-Performance LLMs with JAX and XLA"; each moves into `GPU` once
# `benchmarks/pretrain_step.py` measures it faster on a card. The collective ones matter only
# where a step has collectives (gpu=h100x8's gradient all-reduce).
GPU: dict[str, str] = {}

GPU_CANDIDATES: dict[str, str] = {
    # Overlap collectives with compute (JAX's guide; NVIDIA's JAX image sets it by default).
    "xla_gpu_enable_latency_hiding_scheduler": "true",
    # Run the collectives on a stream of their own, ahead of compute (NVIDIA's guide).
    "xla_gpu_enable_highest_priority_async_stream": "true",
    # Let XLA pick Triton's GEMM for any matmul it supports (JAX's guide); the autotuner on a
    # real card then times it against cuBLAS.
    "xla_gpu_triton_gemm_any": "true",
    # Gradient all-reduces combined into fewer, larger ones (NVIDIA's guide; 8 cards, data
    # parallel: BERT-large's 1.3 GB of float32 gradients in 1 GiB buckets).
    "xla_gpu_all_reduce_combine_threshold_bytes": str(2**30),
}

# libtpu flags (LIBTPU_INIT_ARGS): none yet; none has been compiled against the recipes.
TPU: dict[str, str] = {}


def cpu_flags(cpuinfo: str | None) -> dict[str, str]:
    """The XLA:CPU flags for the CPU described by /proc/cpuinfo text (None: no /proc/cpuinfo,
    none)."""
    return dict(CPU_BY_FAMILY.get(hardware.cpu_family(cpuinfo), {})) if cpuinfo else {}


def inference_options(
    platform: str, environ: Mapping[str, str] | None = None, cpuinfo: str | None = None
) -> dict[str, str]:
    """The compile options of an inference program on `platform` ("cpu", "gpu", "tpu"): this
    CPU family's `CPU_INFERENCE_BY_FAMILY` row on the CPU, less any option the user's XLA_FLAGS
    names; none elsewhere or with `BERT_JAX_XLA_FLAGS=0`."""
    environ = os.environ if environ is None else environ
    if platform != "cpu" or environ.get(DISABLE_VARIABLE, "1") == "0":
        return {}
    cpuinfo = hardware.read_cpuinfo() if cpuinfo is None else cpuinfo
    wanted = CPU_INFERENCE_BY_FAMILY.get(hardware.cpu_family(cpuinfo), {}) if cpuinfo else {}
    named = {a.lstrip("-").split("=", 1)[0] for a in shlex.split(environ.get("XLA_FLAGS", ""))}
    return {k: v for k, v in wanted.items() if k not in named}


def merged(current: str, flags: Mapping[str, str]) -> str:
    """`current` (an XLA_FLAGS / LIBTPU_INIT_ARGS value) with `--name=value` added for each flag
    that it does not name already (the user's setting wins)."""
    named = {arg.lstrip("-").split("=", 1)[0] for arg in shlex.split(current)}
    added = [f"--{k}={v}" for k, v in flags.items() if k not in named]
    return " ".join([current.strip(), *added]).strip()


def apply(environ: os._Environ | dict | None = None, cpuinfo: str | None = None) -> dict:
    """Adds this module's flags to `environ` (os.environ): XLA_FLAGS for this machine's CPU
    family and for GPUs, LIBTPU_INIT_ARGS for libtpu. Returns {variable: its new value} for
    those changed.

    Does nothing when `BERT_JAX_XLA_FLAGS=0`. Logs (once) when a JAX backend is already up, as
    the flags then no longer reach it.
    """
    environ = os.environ if environ is None else environ
    if environ.get(DISABLE_VARIABLE, "1") == "0":
        return {}
    if cpuinfo is None:
        cpuinfo = hardware.read_cpuinfo()
    wanted = {"XLA_FLAGS": {**cpu_flags(cpuinfo), **GPU}, "LIBTPU_INIT_ARGS": TPU}
    changed = {}
    for variable, flags in wanted.items():
        value = merged(environ.get(variable, ""), flags)
        if value != environ.get(variable, "").strip() and value:
            environ[variable] = changed[variable] = value
    if changed and environ is os.environ and _backends_started():
        logging.warning(
            "bert_jax's XLA flags (%s) were set after a JAX backend started: they apply to "
            "backends started later only; import bert_jax before using JAX to get them",
            changed,
        )
    return changed


def _backends_started() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


APPLIED = apply()  # on import: {variable: value} of what this process got
