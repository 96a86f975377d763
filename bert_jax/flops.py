"""Model FLOPs of BERT training steps, and peak FLOP/s (and TPU memory) of accelerators, for MFU.

Counted as the MLPerf / PaLM convention counts model FLOPs: 2 per multiply-add of every matmul the
model needs, the backward pass twice the forward (3x in all), and no recomputation (remat costs
hardware FLOPs, not model FLOPs). For an encoder:

* per real token and layer: Q, K, V and output projections 4 * 2E^2, feed-forward 2 * 2EF;
* attention scores and context, bidirectional and in full (no causal halving): 2 * 2 * n * E per
  token of a sequence of n real tokens, so packed rows count sum(n_i^2), not L^2;
* heads: the pooler and NSP per sequence, the MLM transform and decoder only at the P masked
  positions that are really predicted (the masked-only head), not over the whole vocabulary at
  every position;
* padding counts nothing: a padded slot is work the hardware did, not work the model needed.

Embedding lookups, LayerNorm, softmax and activations are a few percent and, as usual, not counted.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bert_jax.config import BertConfig


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

# Dense bf16 peak FLOP/s per chip (no sparsity), from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    "h200": 989e12,
    "h100": 989e12,  # SXM; the PCIe card is 756e12
    "h100 pcie": 756e12,
    "h800": 989e12,
    "a100": 312e12,
    "a10g": 125e12,
    "l4": 121e12,
    "v100": 125e12,  # fp16 tensor cores
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


def encoder_forward_flops(cfg: BertConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    dense = 2.0 * (4 * e * e + 2 * e * f) * n.sum()
    attention = 2.0 * 2.0 * e * (n**2).sum()
    return cfg.num_hidden_layers * (dense + attention)


def pretraining_step_flops(
    cfg: BertConfig,
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
    cfg: BertConfig, seq_lengths: np.ndarray, num_outputs: int, *, pooled: bool = True
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
