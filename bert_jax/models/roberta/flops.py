"""Model FLOPs of RoBERTa's encoder (its rows' `Family.encoder_flops`; `training.flops` counts
steps): BERT's count, the layers being BERT's.

Counted as `bert_jax.training.flops` says (2 per multiply-add, padding counts nothing). Per real
token and layer: the Q, K, V and output projections 4 * 2E^2 and the feed-forward layer (E -> F
-> E) 2 * 2EF; attention scores and context 2 * 2E per (query, key) pair, every pair of a
sequence's n real tokens (n^2, bidirectional).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.roberta.config import RobertaConfig


def encoder_forward_flops(cfg: RobertaConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    per_layer = 2.0 * (4 * e * e + 2 * e * f) * n.sum() + 2.0 * 2.0 * e * (n**2).sum()
    return cfg.num_hidden_layers * per_layer
