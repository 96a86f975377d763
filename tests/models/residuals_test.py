"""What the backward pass keeps: in bfloat16 no float32 copy of an activation, and the exact GELU's
input and output alone (as PyTorch keeps them); the gradients those of the plain layers."""

import flax.linen as nn
import jax
import numpy as np
from jax._src.ad_checkpoint import saved_residuals

from bert_jax.models import layers
from bert_jax.models.bert import model as M
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.params import init_params
from bert_jax.training import objectives
from tests.training.steps_test import CFG, pretraining_batch

OBJECTIVE = objectives.get_objective("pretraining")


def _loss_fn(runtime, cfg=CFG):
    """(loss of params, params, batch) of a tiny pretraining model in `runtime`."""
    model = M.BertForPreTraining(cfg, runtime)
    params = jax.jit(lambda: nn.unbox(init_params(model, jax.random.PRNGKey(0))))()
    batch = pretraining_batch(cfg)

    def loss(p):
        sums = OBJECTIVE.sums(model, p, batch, jax.random.PRNGKey(1), False)
        return OBJECTIVE.loss(sums, OBJECTIVE.counts(batch))

    return loss, params


def test_bfloat16_layers_keep_no_float32_activation_and_two_mlp_activations():
    """Scanned layers stack what each keeps ([layers, ...]): in bfloat16 none of it is float32
    (LayerNorm recomputes its float32 statistics), and of the [B, L, F] activations only GELU's
    input and output are kept (its derivative's intermediates are recomputed)."""
    loss, params = _loss_fn(RuntimeConfig(dtype="bfloat16", scan_layers=True))
    stacked = [
        aval
        for aval, _ in saved_residuals(loss, params)
        if aval.ndim >= 3 and aval.shape[0] == CFG.num_hidden_layers
    ]
    assert stacked, "the scanned layers keep nothing?"
    assert [a.str_short() for a in stacked if a.dtype == np.float32] == []
    # float32 layers (the CPU's, and the equivalence tests') are the plain ones, as before.
    assert type(layers.layer_norm(RuntimeConfig(), 1e-12)) is nn.LayerNorm
    activations = [a for a in stacked if a.shape[1:3] == (16, 12)]  # [layers, B, L, ...]
    mlp = [a for a in activations if a.shape[-1] == CFG.intermediate_size]
    assert len(mlp) == 2, [a.str_short() for a in mlp]


def test_bfloat16_gradients_equal_the_plain_layers(monkeypatch):
    """The recomputing LayerNorm and GELU give the gradients of the plain ones: GELU's are the
    same arithmetic; LayerNorm's differ only where XLA rounds float32 intermediates to bfloat16
    in another place (its excess-precision choices): under 2% of each gradient's norm here (and
    the gradients that should be zero, such as the key bias's, stay at noise level)."""
    cfg = CFG.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    runtime = RuntimeConfig(dtype="bfloat16")

    def grads():
        loss, params = _loss_fn(runtime, cfg)
        return jax.device_get(jax.jit(jax.grad(loss))(params))

    shipped = grads()
    monkeypatch.setattr(layers.nn, "remat", lambda cls, **kwargs: cls)
    monkeypatch.setattr(layers, "kept_input_only", lambda fn, scanned: fn)
    plain = grads()
    norms = [float(np.linalg.norm(g)) for g in jax.tree.leaves(plain)]
    for a, b, norm in zip(jax.tree.leaves(shipped), jax.tree.leaves(plain), norms, strict=True):
        assert np.linalg.norm(a - b) <= 0.03 * norm + 1e-4 * max(norms), a.shape


def test_roberta_layers_keep_what_berts_keep():
    """The third family's scanned bfloat16 layers keep what BERT's keep: no float32 copy, and of
    the [B, L, F] activations GELU's input and output alone."""
    from bert_jax.models.roberta.config import RobertaConfig
    from bert_jax.models.roberta.model import RobertaForMaskedLM

    cfg = RobertaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=20, hidden_act="gelu",
    )  # fmt: skip
    model = RobertaForMaskedLM(cfg, RuntimeConfig(dtype="bfloat16", scan_layers=True))
    ids = np.asarray(jax.random.randint(jax.random.PRNGKey(2), (3, 12), 3, 99), np.int32)
    params = jax.jit(lambda: nn.unbox(init_params(model, jax.random.PRNGKey(0))))()

    def loss(p):
        logits = model.apply({"params": p}, ids, attention_mask=np.ones_like(ids)).logits
        return (logits.astype(np.float32) ** 2).mean()

    stacked = [
        aval
        for aval, _ in saved_residuals(loss, params)
        if aval.ndim >= 3 and aval.shape[0] == cfg.num_hidden_layers
    ]
    assert stacked and [a.str_short() for a in stacked if a.dtype == np.float32] == []
    mlp = [a for a in stacked if a.shape[1:3] == (3, 12) and a.shape[-1] == cfg.intermediate_size]
    assert len(mlp) == 2, [a.str_short() for a in mlp]
