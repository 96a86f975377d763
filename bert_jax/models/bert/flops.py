"""Model FLOPs of BERT's encoder (its row `Family.encoder_flops`; `training.flops` counts steps).

Counted as `bert_jax.training.flops` says (2 per multiply-add, padding counts nothing). Per real
token and layer: the Q, K, V and output projections 4 * 2E^2 and the feed-forward layer (E -> F
-> E) 2 * 2EF; attention scores and context 2 * 2E per (query, key) pair, every pair of a
sequence's n real tokens (n^2, bidirectional, no causal halving).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.bert.config import BertConfig


def encoder_forward_flops(cfg: BertConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    dense = 2.0 * (4 * e * e + 2 * e * f) * n.sum()
    total = 0.0
    for _ in range(cfg.num_hidden_layers):
        total += dense + 2.0 * 2.0 * e * (n**2).sum()
    return total
