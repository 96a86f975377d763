"""The contrastive objective: the loss against sentence-transformers' own on the same embeddings,
GradCache against the uncached batch (loss and gradients), and the loss of a batch sharded over
8 devices against the same batch on one device (the negatives are the whole global batch's)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import losses
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.bert.model import BertModel
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.params import init_params
from bert_jax.parallel import sharding
from bert_jax.training import contrastive, steps

B, T, L, E = 8, 3, 7, 32  # pairs, texts a pair (anchor, positive, 1 hard negative), tokens, width


def tiny_model(dropout=0.1):
    cfg = BertConfig(
        vocab_size=99,
        hidden_size=E,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=16,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return BertModel(cfg, RuntimeConfig(dtype="float32", attention="xla"))


def pair_batch(seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, L + 1, size=(B, T))
    mask = (np.arange(L) < lengths[..., None]).astype(np.int32)
    return {
        "input_ids": (rng.integers(1, 99, size=(B, T, L)) * mask).astype(np.int32),
        "token_type_ids": np.zeros((B, T, L), np.int32),
        "attention_mask": mask,
    }


@pytest.mark.torch
def test_loss_equals_sentence_transformers():
    torch = pytest.importorskip("torch")
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    rng = np.random.default_rng(1)
    anchors, positives, negatives = (rng.normal(size=(5, 12)).astype(np.float32) for _ in range(3))
    for symmetric, dims in ((False, ()), (True, (12, 8, 4))):
        directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
        mnrl = st_losses.MultipleNegativesRankingLoss(
            None, scale=20.0, directions=directions, partition_mode="per_direction"
        )
        expected = sum(  # MatryoshkaLoss: the losses of the prefixes, weights 1, added
            float(
                mnrl.compute_loss_from_embeddings(
                    [torch.from_numpy(x[:, :d]) for x in (anchors, positives, negatives)], None
                )
            )
            for d in dims or (12,)
        )
        out = losses.in_batch_negatives_loss(
            anchors, np.concatenate([positives, negatives]), symmetric=symmetric, dims=dims
        )
        np.testing.assert_allclose(float(out["loss_sum"] / out["count"]), expected, rtol=1e-5)


def test_grad_cache_equals_the_uncached_batch():
    """GradCache in 4 chunks, dropout on: the loss and gradients of differentiating through the
    whole batch at once, the chunks' dropout keys the same (the two passes draw the same masks)."""
    objective = contrastive.contrastive_objective("mean", dims=(E, 16))
    batch, rng = pair_batch(), jax.random.PRNGKey(3)
    model = tiny_model(dropout=0.1)
    params = init_params(model, jax.random.PRNGKey(0))

    def uncached(p):
        e = steps.chunked_embeddings(p, batch, rng, model=model, objective=objective, num_chunks=4)
        return objective.loss(objective.embedding_sums(e), objective.counts(batch))

    cached = functools.partial(
        steps.loss_and_grads, model=model, objective=objective, num_microbatches=4
    )
    loss, grads, sums = jax.jit(cached)(params, batch, rng)
    want_loss, want_grads = jax.jit(jax.value_and_grad(uncached))(params)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert float(loss) > 0 and sums["mnrl_count"] == B


def test_the_negatives_are_the_global_batch():
    """The loss of a batch sharded over 8 data-parallel devices is the loss of the same batch on
    one device: no per-device loss (whose negatives would be a device's 1/8 of the batch)."""
    model = tiny_model(0.0)
    objective = contrastive.contrastive_objective("cls", scale=20.0)
    params = init_params(model, jax.random.PRNGKey(0))
    batch = pair_batch()
    loss_fn = jax.jit(
        lambda p, b: objective.loss(objective.sums(model, p, b, None, True), objective.counts(b))
    )
    one = loss_fn(params, batch)
    mesh = sharding.make_mesh({"data": 8, "fsdp": 1, "tensor": 1})
    with jax.set_mesh(mesh):
        sharded = loss_fn(params, sharding.global_batch_from_local(batch, mesh))
    np.testing.assert_allclose(sharded, one, rtol=1e-6)
    # What a per-device loss would give differs: the check can fail.
    per_device = np.mean(
        [loss_fn(params, {k: v[i : i + 1] for k, v in batch.items()}) for i in range(B)]
    )
    assert abs(per_device - float(one)) > 0.1
    assert jnp.isfinite(one)
