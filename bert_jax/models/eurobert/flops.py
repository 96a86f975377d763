"""Model FLOPs of EuroBERT's encoder (its row `Family.encoder_flops`; `training.flops` counts
steps).

Counted as `bert_jax.training.flops` says (2 per multiply-add, padding counts nothing). Per real
token and layer: the query and output projections 2 * 2E(HD), the key and value projections
2 * 2E(KD) (grouped-query attention: K key/value heads), the SwiGLU layer 3 * 2EF; attention
scores and context 2 * 2(HD) per (query, key) pair of a sequence.
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.eurobert.config import EuroBertConfig


def encoder_forward_flops(cfg: EuroBertConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    per_token = 2.0 * (2 * e * q + 2 * e * kv + 3 * e * f)
    return cfg.num_hidden_layers * (per_token * n.sum() + 4.0 * q * (n**2).sum())
