"""Model FLOPs of Jina-embeddings-v3's encoder (its row's `Family.encoder_flops`;
`training.flops` counts steps): BERT's count, its layers holding BERT's projections and
feed-forward layer (`models.layers.post_ln_layer_flops`), counted as `bert_jax.training.flops`
says (2 per multiply-add, padding counts nothing; the rotations and norms count nothing).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.jina_embeddings_v3.config import JinaEmbeddingsV3Config
from bert_jax.models.layers import post_ln_layer_flops


def encoder_forward_flops(cfg: JinaEmbeddingsV3Config, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    return cfg.num_hidden_layers * post_ln_layer_flops(cfg, seq_lengths)
