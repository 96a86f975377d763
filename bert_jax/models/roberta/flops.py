"""Model FLOPs of RoBERTa's encoder (its rows' `Family.encoder_flops`; `training.flops` counts
steps): BERT's count, the layers being BERT's (`models.layers.post_ln_layer_flops`), counted as
`bert_jax.training.flops` says (2 per multiply-add, padding counts nothing).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.layers import post_ln_layer_flops
from bert_jax.models.roberta.config import RobertaConfig


def encoder_forward_flops(cfg: RobertaConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    return cfg.num_hidden_layers * post_ln_layer_flops(cfg, seq_lengths)
