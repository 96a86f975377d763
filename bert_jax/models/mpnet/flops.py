"""Model FLOPs of MPNet's encoder (its row's `Family.encoder_flops`; `training.flops` counts
steps): BERT's count (`models.layers.post_ln_layer_flops`), the layers' matmuls being BERT's;
the relative-position bias adds one number per (query, key) pair, which the count leaves out
as it leaves out the softmax. Counted as `bert_jax.training.flops` says (2 per multiply-add,
padding counts nothing).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.layers import post_ln_layer_flops
from bert_jax.models.mpnet.config import MPNetConfig


def encoder_forward_flops(cfg: MPNetConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    return cfg.num_hidden_layers * post_ln_layer_flops(cfg, seq_lengths)
