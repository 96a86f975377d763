"""Model FLOPs of ELECTRA's encoder (its row's `Family.encoder_flops`; `training.flops` counts
steps): BERT's count for its layers (`models.layers.post_ln_layer_flops`), plus the embeddings'
projection M -> E where M != E, 2ME per real token; counted as `bert_jax.training.flops` says
(2 per multiply-add, padding counts nothing).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.electra.config import ElectraConfig
from bert_jax.models.layers import post_ln_layer_flops


def encoder_forward_flops(cfg: ElectraConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e, m = cfg.hidden_size, cfg.embedding_size
    project = 2.0 * m * e * n.sum() if cfg.projects_embeddings else 0.0
    return project + cfg.num_hidden_layers * post_ln_layer_flops(cfg, n)
