"""Model FLOPs of training steps, for MFU and the compiled step's roofline, for any family.

Counted as the MLPerf / PaLM convention counts model FLOPs: 2 per multiply-add of every matmul the
model needs, the backward pass twice the forward (3x in all), and no recomputation (remat costs
hardware FLOPs, not model FLOPs). For an encoder:

* per real token and layer: the projections and the feed-forward layer, and attention scores and
  context, bidirectional and in full (no causal halving) or within a local layer's window: the
  family's count (`Family.encoder_flops`, `models/<family>/flops.py`), so packed rows count
  sum(n_i^2), not L^2;
* heads: the pooler and NSP per sequence, the MLM transform and decoder only at the P masked
  positions that are really predicted (the masked-only head), not over the whole vocabulary at
  every position;
* padding counts nothing: a padded slot is work the hardware did, not work the model needed.

Embedding lookups, LayerNorm, softmax and activations are a few percent and, as usual, not counted.
Peak FLOP/s of the devices (the other half of MFU) are hardware facts: `bert_jax.hardware`.
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.families import EncoderConfig, family_of


def pretraining_step_flops(
    cfg: EncoderConfig,
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
    d = getattr(cfg, "embedding_size", None) or e  # the tied table's width (ELECTRA's may be less)
    seqs = np.size(seq_lengths) if num_sequences is None else num_sequences
    forward = family_of(cfg).encoder_flops(cfg, seq_lengths)
    forward += num_predictions * 2.0 * (e * d + d * v)  # transform (E -> D) + tied decoder
    if nsp:
        forward += seqs * 2.0 * (e * e + 2 * e)  # pooler + seq_relationship
    return 3.0 * forward


def classification_step_flops(
    cfg: EncoderConfig, seq_lengths: np.ndarray, num_outputs: int, *, pooled: bool = True
) -> float:
    """Model FLOPs of one fine-tuning step: encoder + pooler + a small output layer per sequence
    (`pooled`) or per token (token classification / QA)."""
    n = np.asarray(seq_lengths, np.float64)
    e = cfg.hidden_size
    forward = family_of(cfg).encoder_flops(cfg, n)
    if pooled:
        forward += n.size * 2.0 * (e * e + e * num_outputs)
    else:
        forward += n.sum() * 2.0 * e * num_outputs
    return 3.0 * forward


def padded_step_flops(cfg: EncoderConfig, batch: int, seq_len: int, max_predictions: int) -> float:
    """Pretraining FLOPs for a batch of full-length sequences (the benchmark's convention)."""
    return pretraining_step_flops(cfg, np.full(batch, seq_len), batch * max_predictions)
