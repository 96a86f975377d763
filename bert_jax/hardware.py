"""What the project knows of the machines it runs on: TPU chips, NVIDIA cards, CPUs, platforms.

One home for hardware facts, read by the run-time config (which dtype "auto" means), the attention
kernels (where cuDNN's flash attention runs), the loop (peak FLOP/s for MFU) and ahead-of-time
compilation (a card's or a chip's memory, peaks and limits, deviceless). Peaks are dense (no
sparsity) from the vendors' public data sheets; sizes in bytes unless a name says GiB, bandwidths
in bytes/s unless it says GB/s.
"""

from __future__ import annotations

import glob
import pathlib
from typing import NamedTuple

import jax

GIB = 2**30

# ---- Platforms ----
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def current_platform(mesh: jax.sharding.Mesh | None = None) -> str:
    """The platform programs are being built for: "cpu", "cuda", "rocm" or "tpu".

    That of `mesh`'s devices, else of the mesh in context (`jax.set_mesh`), so that a program
    compiled deviceless for a TPU topology on a CPU host resolves as TPU; else the default backend.
    """
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh.abstract_mesh
    platform = jax.default_backend() if mesh.empty else mesh.abstract_device.platform
    if platform == "gpu":
        try:
            version = jax.devices("gpu")[0].client.platform_version.lower()
        except RuntimeError:  # compile-only devices (parallel.aot): only CUDA compiles deviceless
            version = "cuda"
        platform = "rocm" if "rocm" in version else "cuda"
    return platform


def check_platform(platform: str) -> str:
    """`platform` if it is one of `PLATFORMS` ("gpu" read as "cuda"); else a ValueError."""
    platform = "cuda" if platform == "gpu" else platform
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}: expected one of {PLATFORMS} (or 'gpu' = cuda)")
    return platform


def compute_capability(mesh: jax.sharding.Mesh | None = None) -> str | None:
    """The compute capability ("7.5", "9.0") of the mesh's first device (of JAX's first device
    without a mesh) where it has one (CUDA GPUs); None elsewhere."""
    device = jax.devices()[0] if mesh is None else mesh.devices.flat[0]
    return getattr(device, "compute_capability", None)


# ---- NVIDIA compute capabilities ----
# bfloat16 matrix units (tensor cores): Ampere (8.0) and later. dtype "auto" computes in float16
# below it (V100 7.0, T4 7.5), in bfloat16 from it on (A100 8.0 and later).
BFLOAT16_MIN_COMPUTE_CAPABILITY = (8, 0)
# cuDNN's flash attention: Ampere and later, heads up to 128 wide (256 on Hopper and later; 128
# holds on every card cuDNN supports).
CUDNN_MIN_COMPUTE_CAPABILITY = (8, 0)
CUDNN_MAX_HEAD_DIM = 128


def parse_capability(compute_capability: str) -> tuple[int, ...]:
    """ "7.5" -> (7, 5); "10.0" -> (10, 0); anything else a ValueError naming it."""
    try:
        return tuple(int(part) for part in str(compute_capability).split("."))
    except ValueError:
        raise ValueError(
            f"compute_capability={compute_capability!r}: expected a version such as '7.5'"
        ) from None


def has_bfloat16_matrix_units(compute_capability: str) -> bool:
    """Whether a CUDA card of this compute capability multiplies bfloat16 matrices natively."""
    return parse_capability(compute_capability) >= BFLOAT16_MIN_COMPUTE_CAPABILITY


def has_cudnn_flash_attention(compute_capability: str | None) -> bool:
    """Whether cuDNN's flash attention runs on a CUDA card of this compute capability (None:
    unknown, taken as able)."""
    if compute_capability is None:
        return True
    return parse_capability(compute_capability) >= CUDNN_MIN_COMPUTE_CAPABILITY


class SmLimits(NamedTuple):
    """CUDA's limits of one streaming multiprocessor for a compute capability.

    Attributes:
      shared_kib: shared memory per SM, KiB.
      optin_kib: the most shared memory one block can opt into, KiB.
      threads: resident threads per SM.
      fp32_lanes: FP32 lanes per SM.
    """

    shared_kib: int
    optin_kib: int
    threads: int
    fp32_lanes: int


SM_LIMITS = {
    "7.0": SmLimits(96, 96, 2048, 64),
    "7.5": SmLimits(64, 64, 1024, 64),
    "8.0": SmLimits(164, 163, 2048, 64),
    "8.6": SmLimits(100, 99, 1536, 128),
    "8.9": SmLimits(100, 99, 1536, 128),
    "9.0": SmLimits(228, 227, 2048, 128),
}


# ---- GPU cards ----
class GpuCard(NamedTuple):
    """One NVIDIA card, from NVIDIA's public data sheets and CUDA's per-architecture limits.

    The facts XLA needs to compile for the card without it (`parallel.aot.gpu_target_config`)
    and those a report bounds the step with. Peaks are dense (no sparsity), tensor cores with
    float32 accumulation, at the boost clock.

    Attributes:
      name: the card's name as CUDA reports it (`jax.Device.device_kind`).
      compute_capability: "major.minor"; bfloat16 tensor cores from 8.0 (Ampere) on.
      sms: streaming multiprocessors.
      clock_ghz: boost clock, GHz.
      memory_gib: device memory as the card reports it (a little under its marketing GB), GiB.
      bandwidth_gb_s: memory bandwidth, GB/s.
      l2_mib: L2 cache, MiB.
      bf16_tflops: bfloat16 TFLOP/s, None where there are no bfloat16 tensor cores.
      fp16_tflops: float16 TFLOP/s.
      fp32_tflops: TFLOP/s of XLA's default float32 matmuls (TF32 tensor cores from 8.0 on, the
        CUDA cores before).
    """

    name: str
    compute_capability: str
    sms: int
    clock_ghz: float
    memory_gib: float
    bandwidth_gb_s: float
    l2_mib: float
    bf16_tflops: float | None
    fp16_tflops: float
    fp32_tflops: float

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def memory_bytes_per_s(self) -> float:
        return self.bandwidth_gb_s * 1e9

    @property
    def sm_limits(self) -> SmLimits:
        """CUDA's per-SM limits of the card's compute capability (`SM_LIMITS`)."""
        return SM_LIMITS[self.compute_capability]

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s of matmuls in `dtype` ("bfloat16", "float16" or "float32")."""
        tflops = {
            "bfloat16": self.bf16_tflops,
            "float16": self.fp16_tflops,
            "float32": self.fp32_tflops,
        }[dtype]
        if tflops is None:
            raise ValueError(
                f"{self.name} (compute capability {self.compute_capability}) has no {dtype} "
                "tensor cores: compute in float16 (runtime.dtype=float16 or auto)"
            )
        return tflops * 1e12


# The cards people fine-tune on, by the names `--topology=gpu:CARD` takes; v100 is the 16 GB
# SXM2 card, a100-*, h100 and h200 the SXM ones.
# fmt: off
GPU_CARDS = {
        #       name                       cc     SMs  GHz    GiB   GB/s  L2   bf16   fp16   fp32
    "h100":
        GpuCard("NVIDIA H100 80GB HBM3",   "9.0", 132, 1.98,  79.1, 3352, 50, 989.0, 989.0, 494.7),
    "a100-80g":
        GpuCard("NVIDIA A100-SXM4-80GB",   "8.0", 108, 1.41,  79.2, 2039, 40, 312.0, 312.0, 156.0),
    "a100-40g":
        GpuCard("NVIDIA A100-SXM4-40GB",   "8.0", 108, 1.41,  39.4, 1555, 40, 312.0, 312.0, 156.0),
    "a10":
        GpuCard("NVIDIA A10",              "8.6", 72,  1.695, 22.0, 600,  6,  125.0, 125.0, 62.5),
    "l4":
        GpuCard("NVIDIA L4",               "8.9", 58,  2.04,  22.0, 300,  48, 121.0, 121.0, 60.0),
    "rtx4090":
        GpuCard("NVIDIA GeForce RTX 4090", "8.9", 128, 2.52,  23.6, 1008, 72, 165.2, 165.2, 82.6),
    "t4":
        GpuCard("Tesla T4",                "7.5", 40,  1.59,  14.6, 320,  4,  None,  65.0,  8.1),
    "v100":
        GpuCard("Tesla V100-SXM2-16GB",    "7.0", 80,  1.53,  15.8, 900,  6,  None,  125.0, 15.7),
    "h200":
        GpuCard("NVIDIA H200",             "9.0", 132, 1.98,  139.8, 4800, 60, 989.0, 989.0, 494.7),
}
# fmt: on


def gpu_card(name: str) -> GpuCard:
    """The `GpuCard` called `name` in `GPU_CARDS` ("h100", "t4", ...)."""
    if name not in GPU_CARDS:
        raise ValueError(f"unknown GPU card {name!r}; known: {', '.join(GPU_CARDS)}")
    return GPU_CARDS[name]


def gpu_card_of_kind(device_kind: str) -> GpuCard:
    """The `GpuCard` whose CUDA name is `device_kind` ("Tesla T4", ...)."""
    for card in GPU_CARDS.values():
        if card.name == device_kind:
            return card
    names = ", ".join(c.name for c in GPU_CARDS.values())
    raise ValueError(f"no card data for GPU kind {device_kind!r}; known: {names}")


def nvidia_gpu_attached() -> bool:
    """Whether an NVIDIA GPU's device file (/dev/nvidia0, ...) is visible."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


# ---- TPU chips ----
class TpuChip(NamedTuple):
    """One TPU chip (all its TensorCores) from Google Cloud's data sheets.

    Attributes:
      peak_bf16_flops: dense bfloat16 FLOP/s.
      hbm_bytes_per_s: HBM bandwidth, bytes/s.
      hbm_bytes: HBM capacity, bytes.
    """

    peak_bf16_flops: float
    hbm_bytes_per_s: float
    hbm_bytes: float


# Keyed by `jax.Device.device_kind` (lower case): v5e and v6e report themselves as "lite".
TPU_CHIPS = {
    "tpu v2": TpuChip(45e12, 700e9, 16 * GIB),
    "tpu v3": TpuChip(123e12, 900e9, 32 * GIB),
    "tpu v4": TpuChip(275e12, 1228e9, 32 * GIB),
    "tpu v5 lite": TpuChip(197e12, 819e9, 16 * GIB),  # v5e
    "tpu v5": TpuChip(459e12, 2765e9, 95 * GIB),  # v5p
    "tpu v6 lite": TpuChip(918e12, 1640e9, 32 * GIB),  # v6e (Trillium)
}
# TPU generations by topology prefix ("v5e:4x4"): the chip config libtpu runs them with. v4 and
# v5p run as megacore (both TensorCores of a chip as one device); the others have one core a chip.
TPU_GENERATIONS = {"v4": "megacore", "v5p": "megacore", "v5e": "default", "v6e": "default"}
GOOGLE_PCI_VENDOR = "0x1ae0"  # a TPU chip on the PCI bus


def tpu_chip(device_kind: str) -> TpuChip:
    """The `TpuChip` of a TPU `jax.Device.device_kind` ("TPU v5 lite", "TPU v4", ...)."""
    kind = device_kind.lower()
    if kind not in TPU_CHIPS:
        raise ValueError(f"no chip data for TPU kind {device_kind!r}; known: {sorted(TPU_CHIPS)}")
    return TPU_CHIPS[kind]


def tpu_attached() -> bool:
    """Whether a Google PCI device (a TPU chip) is attached, as JAX's own probe looks."""
    vendors = glob.glob("/sys/bus/pci/devices/*/vendor")
    return any(pathlib.Path(v).read_text().strip() == GOOGLE_PCI_VENDOR for v in vendors)


# Dense bf16 peak FLOP/s per chip (no sparsity), from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    "h200": 989e12,
    "h100": 989e12,  # SXM; the PCIe card is 756e12
    "h100 pcie": 756e12,
    "h800": 989e12,
    "a100": 312e12,
    "a10g": 125e12,
    "a10": 125e12,
    "l4": 121e12,
    "rtx 4090": 165.2e12,
    "v100": 125e12,  # fp16 tensor cores
    "t4": 65e12,  # fp16 tensor cores
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v6e": 918e12,
    **{kind: chip.peak_bf16_flops for kind, chip in TPU_CHIPS.items()},
}


def peak_flops_per_device(device_kind: str) -> float | None:
    """Peak dense bf16 FLOP/s of one device from its `jax.Device.device_kind`, or None if unknown
    (CPUs, unlisted chips: MFU is then not reported)."""
    kind = device_kind.lower()
    for name in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if name in kind:
            return PEAK_BF16_FLOPS[name]
    return None


# ---- CPUs ----
# /proc/cpuinfo flags of the units that multiply bfloat16 matrices natively: Intel AMX, AVX-512 BF16
# (Intel since Cooper Lake, AMD since Zen 4) and aarch64's BF16 extension (BFMMLA). Without one,
# bfloat16 matmuls are emulated through float32 and run no faster than float32 ones.
BFLOAT16_MATRIX_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")


def read_cpuinfo() -> str | None:
    """/proc/cpuinfo's text on Linux; None elsewhere (or where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return None


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU feature flags named on the `flags` (x86) or `Features` (aarch64) lines of
    /proc/cpuinfo text."""
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


# CPU families whose XLA:CPU settings may differ (`bert_jax.xla_flags`): by /proc/cpuinfo's vendor
# and the matrix flags that choose kernels.
CPU_FAMILIES = ("intel_amx", "intel_avx512", "intel", "amd", "arm", "other")


def cpu_family(cpuinfo: str) -> str:
    """One of `CPU_FAMILIES` from /proc/cpuinfo text: Intel with AMX tiles, Intel with AVX-512,
    other Intel, AMD (with or without AVX-512), aarch64 (`CPU implementer` lines), or other."""
    flags = cpu_flags(cpuinfo)
    if "GenuineIntel" in cpuinfo:
        if "amx_tile" in flags:
            return "intel_amx"
        return "intel_avx512" if "avx512f" in flags else "intel"
    if "AuthenticAMD" in cpuinfo:
        return "amd"
    return "arm" if "CPU implementer" in cpuinfo else "other"


def emulated_bfloat16_warning(dtype: str, platform: str, cpuinfo: str | None) -> str | None:
    """The warning for a run computing in bfloat16 on a CPU without bfloat16 matrix units, or None.

    Pure, so any CPU can be simulated from its /proc/cpuinfo text.

    Args:
      dtype: the run's concrete compute dtype ("float32" or "bfloat16").
      platform: "cpu", "cuda", "rocm" or "tpu".
      cpuinfo: /proc/cpuinfo's text, or None where there is none (not Linux): then no warning.

    Returns:
      The message naming the missing flags (`BFLOAT16_MATRIX_FLAGS`), or None.
    """
    if dtype != "bfloat16" or platform != "cpu" or cpuinfo is None:
        return None
    if cpu_flags(cpuinfo) & set(BFLOAT16_MATRIX_FLAGS):
        return None
    return (
        "RuntimeConfig.dtype='bfloat16' on a CPU without bfloat16 matrix units: /proc/cpuinfo "
        f"names none of {', '.join(BFLOAT16_MATRIX_FLAGS)}, so every bfloat16 matmul is "
        "emulated through float32 and the step runs no faster than in float32 (often slower). Use "
        "dtype='float32' (or 'auto') on this CPU; bfloat16 pays on CPUs with AMX or AVX-512 BF16."
    )
