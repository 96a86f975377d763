"""Model FLOPs of BERT training steps, and peak FLOP/s (and memory) of TPUs and GPUs, for MFU.

Counted as the MLPerf / PaLM convention counts model FLOPs: 2 per multiply-add of every matmul the
model needs, the backward pass twice the forward (3x in all), and no recomputation (remat costs
hardware FLOPs, not model FLOPs). For an encoder:

* per real token and layer: Q, K, V and output projections 4 * 2E^2, feed-forward 2 * 2EF
  (ModernBERT's GeGLU: 3 * 2EF);
* attention scores and context, bidirectional and in full (no causal halving): 2 * 2 * n * E per
  token of a sequence of n real tokens, so packed rows count sum(n_i^2), not L^2 (a local
  layer's sliding window: only the keys inside it);
* heads: the pooler and NSP per sequence, the MLM transform and decoder only at the P masked
  positions that are really predicted (the masked-only head), not over the whole vocabulary at
  every position;
* padding counts nothing: a padded slot is work the hardware did, not work the model needed.

Embedding lookups, LayerNorm, softmax and activations are a few percent and, as usual, not counted.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bert_jax.models.bert.config import BertConfig
from bert_jax.models.modernbert.config import ModernBertConfig

ModelConfig = BertConfig | ModernBertConfig


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


GIB = 2**30
# Keyed by `jax.Device.device_kind` (lower case): v5e and v6e report themselves as "lite".
TPU_CHIPS = {
    "tpu v2": TpuChip(45e12, 700e9, 16 * GIB),
    "tpu v3": TpuChip(123e12, 900e9, 32 * GIB),
    "tpu v4": TpuChip(275e12, 1228e9, 32 * GIB),
    "tpu v5 lite": TpuChip(197e12, 819e9, 16 * GIB),  # v5e
    "tpu v5": TpuChip(459e12, 2765e9, 95 * GIB),  # v5p
    "tpu v6 lite": TpuChip(918e12, 1640e9, 32 * GIB),  # v6e (Trillium)
}


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
# SXM2 card, a100-* and h100 the SXM ones.
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
}
# fmt: on


def gpu_card(name: str) -> GpuCard:
    """The `GpuCard` called `name` in `GPU_CARDS` ("h100", "t4", ...)."""
    if name not in GPU_CARDS:
        raise ValueError(f"unknown GPU card {name!r}; known: {', '.join(GPU_CARDS)}")
    return GPU_CARDS[name]


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


def tpu_chip(device_kind: str) -> TpuChip:
    """The `TpuChip` of a TPU `jax.Device.device_kind` ("TPU v5 lite", "TPU v4", ...)."""
    kind = device_kind.lower()
    if kind not in TPU_CHIPS:
        raise ValueError(f"no chip data for TPU kind {device_kind!r}; known: {sorted(TPU_CHIPS)}")
    return TPU_CHIPS[kind]


def peak_flops_per_device(device_kind: str) -> float | None:
    """Peak dense bf16 FLOP/s of one device from its `jax.Device.device_kind`, or None if unknown
    (CPUs, unlisted chips: MFU is then not reported)."""
    kind = device_kind.lower()
    for name in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if name in kind:
            return PEAK_BF16_FLOPS[name]
    return None


def attended_pairs(n: np.ndarray, window: int | None = None) -> np.ndarray:
    """(query, key) pairs a sequence of n tokens scores: n^2 in full, or with a sliding window
    of `window` keys on either side (|i - j| <= window) n(2w + 1) - w(w + 1), w = min(window,
    n - 1)."""
    n = np.asarray(n, np.float64)
    if window is None:
        return n**2
    w = np.minimum(window, np.maximum(n - 1, 0))
    return n * (2 * w + 1) - w * (w + 1)


def encoder_forward_flops(cfg: ModelConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape).

    ModernBERT: a GeGLU feed-forward layer (Wi makes 2F, Wo takes F: 3EF multiply-adds a token)
    and, in its local layers, only the keys within the window (`attended_pairs`)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    modern = isinstance(cfg, ModernBertConfig)
    dense = 2.0 * (4 * e * e + (3 if modern else 2) * e * f) * n.sum()
    total = 0.0
    for layer in range(cfg.num_hidden_layers):
        window = cfg.window if modern and not cfg.is_global(layer) else None
        total += dense + 2.0 * 2.0 * e * attended_pairs(n, window).sum()
    return total


def pretraining_step_flops(
    cfg: ModelConfig,
    seq_lengths: np.ndarray,
    num_predictions: float,
    num_sequences: int | None = None,
    *,
    nsp: bool = True,
) -> float:
    """Model FLOPs of one training step (forward + backward) of BertForPreTraining.

    Args:
      seq_lengths: real (unpadded) length of every sequence in the global batch; for packed rows,
        the length of every packed sequence.
      num_predictions: masked positions really predicted (sum of masked_lm_weights).
      num_sequences: sequences that get a pooler + NSP head; defaults to len(seq_lengths).
      nsp: whether the NSP head (and pooler) run.
    """
    e, v = cfg.hidden_size, cfg.vocab_size
    seqs = np.size(seq_lengths) if num_sequences is None else num_sequences
    forward = encoder_forward_flops(cfg, seq_lengths)
    forward += num_predictions * 2.0 * (e * e + e * v)  # transform + tied decoder
    if nsp:
        forward += seqs * 2.0 * (e * e + 2 * e)  # pooler + seq_relationship
    return 3.0 * forward


def classification_step_flops(
    cfg: ModelConfig, seq_lengths: np.ndarray, num_outputs: int, *, pooled: bool = True
) -> float:
    """Model FLOPs of one fine-tuning step: encoder + pooler + a small output layer per sequence
    (`pooled`) or per token (token classification / QA)."""
    n = np.asarray(seq_lengths, np.float64)
    e = cfg.hidden_size
    forward = encoder_forward_flops(cfg, n)
    if pooled:
        forward += n.size * 2.0 * (e * e + e * num_outputs)
    else:
        forward += n.sum() * 2.0 * e * num_outputs
    return 3.0 * forward


def padded_step_flops(cfg: BertConfig, batch: int, seq_len: int, max_predictions: int) -> float:
    """Pretraining FLOPs for a batch of full-length sequences (the benchmark's convention)."""
    return pretraining_step_flops(cfg, np.full(batch, seq_len), batch * max_predictions)
