"""Model FLOPs (bert_jax/training/flops.py) of both families, against counts made another way."""

import numpy as np
import pytest

from bert_jax.models.bert.config import BertConfig
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.training import flops


@pytest.mark.parametrize("window", [None, 0, 1, 3, 64])
def test_attended_pairs_counts_the_window(window):
    for n in (1, 2, 5, 9, 100):
        i, j = np.indices((n, n))
        allowed = np.ones((n, n), bool) if window is None else abs(i - j) <= window
        assert flops.attended_pairs(n, window) == allowed.sum(), (n, window)


def test_bert_encoder_flops_are_the_textbook_count():
    cfg = BertConfig.preset("tiny")
    e, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    n = np.array([7, 64])
    expected = layers * (2 * (4 * e * e + 2 * e * f) * n.sum() + 4 * e * (n**2).sum())
    assert flops.encoder_forward_flops(cfg, n) == pytest.approx(expected)


def test_modernbert_encoder_flops_count_geglu_and_the_local_windows():
    cfg = ModernBertConfig.preset("tiny")  # layer 0 global, 1 and 2 local (window 32)
    e, f = cfg.hidden_size, cfg.intermediate_size
    n = np.array([20, 128])
    distances = [abs(np.subtract.outer(np.arange(k), np.arange(k))) for k in n]
    local_pairs = sum(int((d <= 32).sum()) for d in distances)
    dense = 2 * (4 * e * e + 3 * e * f) * n.sum()  # GeGLU: Wi makes 2F, Wo takes F
    expected = 3 * dense + 4 * e * ((n**2).sum() + 2 * local_pairs)
    assert flops.encoder_forward_flops(cfg, n) == pytest.approx(expected)
    # Short sequences see every key in a local layer too.
    short = np.array([10])
    full = flops.encoder_forward_flops(cfg.replace(global_attn_every_n_layers=1), short)
    assert flops.encoder_forward_flops(cfg, short) == pytest.approx(full)
