"""The XLA options this project sets, per platform, in one place, and where they come from.

Importing this module (`import bert_jax` does, first) calls `apply()`, which adds them to the
environment variables that XLA reads when JAX starts a backend: `XLA_FLAGS` (the CPU and GPU
compilers) and `LIBTPU_INIT_ARGS` (libtpu, on a TPU host and for deviceless TPU compiles). They
must be in place before the first use of a backend (`jax.devices()`, the first jit): a process
that started one before importing bert_jax gets none of them, and `apply()` logs that. A flag
already named in the variable (set by the user) is never overridden; `BERT_JAX_XLA_FLAGS=0` in
the environment applies none.

Every flag here is kept only with a measurement that shows it helps and leaves results exact
(equal to XLA's default within float rounding; the equivalence tests run with them): the CPU's in
benchmarks/RESULTS.md (`benchmarks/cpu_options.py`, per CPU family: `hardware.cpu_family`), the
TPU's in benchmarks/RESULTS_tpu.md (deviceless compiles of the recipes). Options that a config
chooses per run (TPU windowed einsum: `RuntimeConfig.collective_matmul`) stay with the config and
reach XLA per program (`RuntimeConfig.compiler_options`), not through here.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping

from bert_jax import hardware

DISABLE_VARIABLE = "BERT_JAX_XLA_FLAGS"  # "0": apply none

# --------------------------------------------------------------------------------------------
# CPU (XLA:CPU, jaxlib 0.10.2): by `hardware.cpu_family`. XLA's defaults run the dots in
# XNNPACK/YNNPACK; `benchmarks/cpu_options.py` measures every XLA:CPU option against them
# (benchmarks/RESULTS.md, "XLA:CPU options per CPU family").
# - AMD (EPYC): none. No option set that changes the program measured faster beyond the spread
#   of those that leave it unchanged; with jaxlib 0.10.2 the oneDNN options change nothing there
#   (YNNPACK or XLA's own dots keep every matmul).
# - Intel with AVX-512 / AMX: none yet. oneDNN's matmul custom calls
#   (`xla_cpu_experimental_onednn_custom_call`) ran the step 10-18% faster on a 2-core Xeon, but
#   their exactness could not be checked on the project's AMD machine, where they never appear in
#   the compiled program: `benchmarks/cpu_options.py` on an Intel machine checks both; add
#   `"intel_avx512"` / `"intel_amx"` rows here once it finds them exact and faster.
# --------------------------------------------------------------------------------------------
CPU_BY_FAMILY: dict[str, dict[str, str]] = {}

# XLA:CPU options of the inference programs only (`inference_options`: the compile options of
# `python -m bert_jax.inference`'s steps, never of training's), by CPU family.
# - Intel with AMX (a 2-core Xeon): no YNNPACK fusions. The MiniLM encoder's forward ran
#   1.03-1.40x faster with them off (32x32 1.03, 128x32 1.14, 64x64 1.16-1.18, 16x160 1.40;
#   `benchmarks/cpu_options.py --what=embed`), exact at every shape; the base pretraining step ran
#   0.97x and not exact within the script's rtol, so training keeps XLA's default.
CPU_INFERENCE_BY_FAMILY: dict[str, dict[str, str]] = {
    "intel_amx": {"xla_cpu_experimental_ynn_fusion_type": ""},
}

# --------------------------------------------------------------------------------------------
# GPU (XLA:GPU through JAX's CUDA plugin, jaxlib 0.10.2): applied to XLA_FLAGS.
#
# Empty: no GPU was available to time a flag on, and a deviceless compile cannot (it is not
# autotuned: benchmarks/RESULTS_gpu.md, section 6). The candidates below are those the JAX GPU
# performance guide (docs.jax.dev, "GPU performance tips") and NVIDIA's JAX-Toolbox ("Tips for
# High-Performance LLMs with JAX and XLA", the flags baked into its JAX image) give for H100s;
# each goes into `GPU` once `benchmarks/pretrain_step.py` measures it faster on a card, with the
# figures in RESULTS_gpu.md. The latency-hiding scheduler and the collective options matter only
# where a step has collectives (gpu=h100x8: the data-parallel gradient all-reduce); one card's
# step has none.
# --------------------------------------------------------------------------------------------
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

# --------------------------------------------------------------------------------------------
# TPU (libtpu, LIBTPU_INIT_ARGS): none yet; no libtpu flag has been compiled against the recipes
# (benchmarks/RESULTS_tpu.md). Windowed einsum is the config's (`collective_matmul`).
# --------------------------------------------------------------------------------------------
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
