"""Model FLOPs of BERT's encoder (its row `Family.encoder_flops`; `training.flops` counts steps):
its layers' (`models.layers.post_ln_layer_flops`: the projections, the feed-forward layer and
attention over every pair of a sequence's real tokens), counted as `bert_jax.training.flops`
says (2 per multiply-add, padding counts nothing).
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.bert.config import BertConfig
from bert_jax.models.layers import post_ln_layer_flops


def encoder_forward_flops(cfg: BertConfig, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    return cfg.num_hidden_layers * post_ln_layer_flops(cfg, seq_lengths)
