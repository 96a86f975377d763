"""Model FLOPs of GTE's encoder (its row `Family.encoder_flops`; `training.flops` counts
steps).

Counted as `bert_jax.training.flops` says (2 per multiply-add, padding counts nothing). Per real
token and layer: the Q, K, V and output projections 4 * 2E^2 and the gated feed-forward layer
(gate, up, down) 3 * 2EF; attention scores and context 2 * 2E per (query, key) pair of a
sequence's real tokens. The embeddings' lookups, biases and norms count nothing.
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.gte.config import GteConfig


def encoder_forward_flops(cfg: GteConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    per_token = 2.0 * (4 * e * e + 3 * e * f)
    return float(cfg.num_hidden_layers * (per_token * n.sum() + 4.0 * e * (n**2).sum()))
