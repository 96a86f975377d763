"""Model FLOPs of both families (each family's `encoder_flops` row, `bert_jax/training/flops.py`'s
steps), against counts made another way."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import FAMILIES, family_of
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.modernbert.flops import attended_pairs
from bert_jax.training import flops


def encoder_flops(cfg, n):
    return family_of(cfg).encoder_flops(cfg, n)


@pytest.mark.parametrize("window", [None, 0, 1, 3, 64])
def test_attended_pairs_counts_the_window(window):
    for n in (1, 2, 5, 9, 100):
        i, j = np.indices((n, n))
        allowed = np.ones((n, n), bool) if window is None else abs(i - j) <= window
        assert attended_pairs(n, window) == allowed.sum(), (n, window)


def test_bert_encoder_flops_are_the_textbook_count():
    cfg = BertConfig.preset("tiny")
    e, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    n = np.array([7, 64])
    expected = layers * (2 * (4 * e * e + 2 * e * f) * n.sum() + 4 * e * (n**2).sum())
    assert encoder_flops(cfg, n) == pytest.approx(expected)


def test_modernbert_encoder_flops_count_geglu_and_the_local_windows():
    cfg = ModernBertConfig.preset("tiny")  # layer 0 global, 1 and 2 local (window 32)
    e, f = cfg.hidden_size, cfg.intermediate_size
    n = np.array([20, 128])
    distances = [abs(np.subtract.outer(np.arange(k), np.arange(k))) for k in n]
    local_pairs = sum(int((d <= 32).sum()) for d in distances)
    dense = 2 * (4 * e * e + 3 * e * f) * n.sum()  # GeGLU: Wi makes 2F, Wo takes F
    expected = 3 * dense + 4 * e * ((n**2).sum() + 2 * local_pairs)
    assert encoder_flops(cfg, n) == pytest.approx(expected)
    # Short sequences see every key in a local layer too.
    short = np.array([10])
    full = encoder_flops(cfg.replace(global_attn_every_n_layers=1), short)
    assert encoder_flops(cfg, short) == pytest.approx(full)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_family_counts_its_encoder_flops(model_type):
    """Each registered family has a FLOPs row, positive, linear in the sequences (two batches
    count their sum) and growing with the length; the step counts go through it."""
    family = FAMILIES[model_type]
    assert callable(family.encoder_flops), model_type
    cfg = family.config_class.preset("tiny")
    a, b = np.array([5, 17]), np.array([64])
    one = family.encoder_flops(cfg, a)
    assert one > 0
    assert family.encoder_flops(cfg, np.concatenate([a, b])) == pytest.approx(
        one + family.encoder_flops(cfg, b)
    )
    assert family.encoder_flops(cfg, a + 1) > one
    step = flops.pretraining_step_flops(cfg, a, num_predictions=3, nsp=False)
    e, d = cfg.hidden_size, getattr(cfg, "embedding_size", None) or cfg.hidden_size
    head = 3 * 2.0 * (e * d + d * cfg.vocab_size)  # transform E -> D, decoder D -> V
    assert step == pytest.approx(3 * one + 3 * head)


def _layer_kernel_sizes(family, cfg) -> int:
    """Weights of the encoder layers' matmuls, summed from the initialised model's shapes."""
    model = family.model_classes[family.base_model](cfg, RuntimeConfig())
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
    return sum(
        leaf.size
        for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]
        if any(str(getattr(k, "key", "")).startswith(("layer", "embeddings_project")) for k in path)
        and getattr(path[-2], "key", None) == "kernel"
    )


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_family_counts_two_flops_a_weight_of_its_layers(model_type):
    """A one-token sequence: 2 FLOPs per weight of every layer's matmuls and of ELECTRA's
    embeddings projection (read from the model itself) plus one (query, key) pair a layer
    (scores and context, 2 * 2E), and 2E more for each of DeBERTa's relative score terms (c2p,
    p2c)."""
    family = FAMILIES[model_type]
    cfg = family.config_class.preset("tiny")
    weights = _layer_kernel_sizes(family, cfg)
    terms = len(cfg.pos_att_type) if getattr(cfg, "relative_attention", False) else 0
    attention = cfg.num_hidden_layers * (4 + 2 * terms) * cfg.hidden_size
    assert weights > 0
    assert family.encoder_flops(cfg, np.array([1])) == pytest.approx(2 * weights + attention)
