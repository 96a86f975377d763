"""Model FLOPs of ModernBERT's encoder (its row `Family.encoder_flops`; `training.flops` counts
steps).

Counted as `bert_jax.training.flops` says (2 per multiply-add, padding counts nothing). Per real
token and layer: the fused Q, K, V projection and the output projection 4 * 2E^2, and the GeGLU
feed-forward layer (Wi makes 2F, Wo takes F) 3 * 2EF; attention scores and context 2 * 2E per
(query, key) pair: every pair of a sequence's n real tokens in a global layer, only the pairs
within the sliding window in a local one (`attended_pairs`).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.modernbert.config import ModernBertConfig


def attended_pairs(n: np.ndarray, window: int | None = None) -> np.ndarray:
    """(query, key) pairs a sequence of n tokens scores: n^2 in full, or with a sliding window
    of `window` keys on either side (|i - j| <= window) n(2w + 1) - w(w + 1), w = min(window,
    n - 1)."""
    n = np.asarray(n, np.float64)
    if window is None:
        return n**2
    w = np.minimum(window, np.maximum(n - 1, 0))
    return n * (2 * w + 1) - w * (w + 1)


def encoder_forward_flops(cfg: ModernBertConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    dense = 2.0 * (4 * e * e + 3 * e * f) * n.sum()
    total = 0.0
    for layer in range(cfg.num_hidden_layers):
        window = None if cfg.is_global(layer) else cfg.window
        total += dense + 2.0 * 2.0 * e * attended_pairs(n, window).sum()
    return total
