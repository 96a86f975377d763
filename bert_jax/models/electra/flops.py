"""Model FLOPs of ELECTRA's encoder (its row's `Family.encoder_flops`; `training.flops` counts
steps): BERT's count for its layers, plus the embeddings' projection M -> E where M != E.

Counted as `bert_jax.training.flops` says (2 per multiply-add, padding counts nothing). Per real
token: the projection 2ME (when it is there); per real token and layer: the Q, K, V and output
projections 4 * 2E^2 and the feed-forward layer (E -> F -> E) 2 * 2EF; attention scores and
context 2 * 2E per (query, key) pair, every pair of a sequence's n real tokens (n^2,
bidirectional).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.electra.config import ElectraConfig


def encoder_forward_flops(cfg: ElectraConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f, m = cfg.hidden_size, cfg.intermediate_size, cfg.embedding_size
    per_layer = 2.0 * (4 * e * e + 2 * e * f) * n.sum() + 2.0 * 2.0 * e * (n**2).sum()
    project = 2.0 * m * e * n.sum() if cfg.projects_embeddings else 0.0
    return project + cfg.num_hidden_layers * per_layer
