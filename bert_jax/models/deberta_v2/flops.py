"""Model FLOPs of DeBERTa-v2's encoder (its row's `Family.encoder_flops`; `training.flops` counts
steps).

Counted as `bert_jax.training.flops` says (2 per multiply-add, padding counts nothing). Per
layer: BERT's layer (`models.layers.post_ln_layer_flops`: the projections, the feed-forward
layer, content scores and context over every pair of a sequence's n real tokens); and, with
relative attention, each position term (c2p: the query against the key-projected table; p2c:
the key against the query-projected table) 2E per token and table row a sequence of n tokens
reads, min(R, 2n - 1) of the R = 2 x attention_span rows. The table's own projections (R rows,
once a forward whatever the batch) and the gathers are not counted.
"""

from __future__ import annotations

import numpy as np

from bert_jax.models.deberta_v2.config import DebertaV2Config
from bert_jax.models.layers import post_ln_layer_flops


def encoder_forward_flops(cfg: DebertaV2Config, seq_lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder for sequences of the given real lengths (any shape)."""
    n = np.asarray(seq_lengths, np.float64)
    e = cfg.hidden_size
    per_layer = post_ln_layer_flops(cfg, n)
    if cfg.attention_score_bias:
        rows = np.minimum(cfg.rel_embedding_rows, np.maximum(2 * n - 1, 0))
        per_layer += len(cfg.pos_att_type) * 2.0 * e * (n * rows).sum()
    return cfg.num_hidden_layers * per_layer
