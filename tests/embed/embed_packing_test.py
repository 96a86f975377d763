"""Packed contrastive batches (`bert_jax.retrieval.packing`): the texts of a batch several to a row
train as the padded batch does (loss and gradients, mean and CLS pooling, hard negatives, every
family), GradCache over chunks of packed rows equals the uncached packed batch, every host of a
split run computes the same rows, and no text is lost: too long ones are cut, a batch of long
texts takes more rows."""

import functools

import jax
import numpy as np
import pytest

from bert_jax.data import batching
from bert_jax.models import families
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import Role
from bert_jax.models.params import init_params
from bert_jax.retrieval import packing, pairs
from bert_jax.training import contrastive, steps

B, T, L, E = 6, 3, 12, 32  # pairs, texts a pair (anchor, positive, a hard negative), tokens, width
TINY = dict(vocab_size=99, hidden_size=E, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=L + 8)  # fmt: skip
FAMILY_FIELDS = {  # ModernBERT: layer 0 global, layer 1 a window of 2 tokens a side
    "bert": {},
    "modernbert": dict(
        model_type="modernbert", global_attn_every_n_layers=2, local_attention=4, pad_token_id=0
    ),  # fmt: skip
    "roberta": dict(model_type="roberta", pad_token_id=1),
}


def encoder(family: str, dropout: float = 0.0):
    fields = {**TINY, **FAMILY_FIELDS[family]}
    names = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    if family == "modernbert":
        names = ("attention_dropout", "embedding_dropout", "mlp_dropout")
    fields.update(dict.fromkeys(names, dropout))
    cfg = families.config_from_fields(fields)
    cls = families.get_model_class(families.head_in_family(cfg, Role.ENCODER))
    model = cls(cfg, RuntimeConfig(dtype="float32", attention="xla"))
    return model, init_params(model, jax.random.PRNGKey(0))


def pair_batch(seed=0, low=3, high=L):
    """[B, T, L] texts of random lengths in [low, high], [PAD] (id 0) after them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, size=(B, T))
    mask = (np.arange(L) < lengths[..., None]).astype(np.int32)
    return {
        "input_ids": (rng.integers(2, 99, size=(B, T, L)) * mask).astype(np.int32),
        "token_type_ids": np.zeros((B, T, L), np.int32),
        "attention_mask": mask,
        "example_weights": np.ones(B, np.float32),
    }


def loss_and_grads(model, objective, params, batch, chunks=1, rng=None):
    rng = jax.random.PRNGKey(0) if rng is None else rng
    return steps.loss_and_grads(
        params, batch, rng, model=model, objective=objective, num_microbatches=chunks
    )


def assert_same(got, want, tol=1e-5):
    """Loss and every gradient within `tol`, relative (gradients: or absolute against the
    largest gradient, for parameters whose gradient is rounding noise around 0)."""
    (loss, grads), (want_loss, want_grads) = got, want
    np.testing.assert_allclose(loss, want_loss, rtol=tol)
    leaves = jax.tree_util.tree_leaves(want_grads)
    scale = max(float(np.abs(w).max()) for w in leaves)
    for g, w in zip(jax.tree_util.tree_leaves(grads), leaves, strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("family", ["bert", "modernbert", "roberta"])
def test_packed_rows_train_as_the_padded_batch(family):
    """No dropout: the loss and gradients of the packed texts (3 empty rows among them) are the
    padded batch's within 1e-5, mean and CLS pooling, hard negatives, Matryoshka dims."""
    model, params = encoder(family, dropout=0.0)
    batch = pair_batch(1)
    packed = packing.pack_pairs(batch, max_segments=4, row_multiple=4)
    assert (packed["text_index"] >= 0).sum() == B * T and packed["segment_ids"][-1].max() == 0
    assert len(packed["input_ids"]) < B * T  # several texts a row

    def both(params, padded, packed):
        out = []
        for pooling in ("mean", "cls"):
            kwargs = dict(pooling=pooling, dims=(E, 8), symmetric=pooling == "cls")
            plain = contrastive.contrastive_objective(**kwargs)
            rows = contrastive.contrastive_objective(**kwargs, packed_shape=(B, T))
            for objective, b in ((plain, padded), (rows, packed)):
                loss, grads, sums = loss_and_grads(model, objective, params, b)
                out.append((loss, grads, sums["mnrl_count"]))
        return out

    padded = {k: v for k, v in batch.items() if k != "example_weights"}
    mean, mean_packed, cls, cls_packed = jax.jit(both)(params, padded, packed)
    for got, want in ((mean_packed, mean), (cls_packed, cls)):
        assert_same(got[:2], want[:2])
        assert got[2] == want[2] == B
    assert abs(float(mean[0]) - float(cls[0])) > 1e-3  # the two poolings differ: a real check


def test_grad_cache_over_packed_rows_equals_the_packed_batch():
    """Dropout on: GradCache over 2 chunks of packed rows gives the loss and gradients of
    differentiating through the whole packed batch (the same chunks' dropout keys)."""
    model, params = encoder("bert", dropout=0.1)
    objective = contrastive.contrastive_objective("mean", packed_shape=(B, T))
    packed = packing.pack_pairs(pair_batch(2), max_segments=4, row_multiple=2)
    rng = jax.random.PRNGKey(5)

    def uncached(p):
        e = steps.chunked_embeddings(p, packed, rng, model=model, objective=objective, num_chunks=2)
        sums = objective.embedding_sums(objective.texts(e, packed))
        return objective.loss(sums, objective.counts(packed))

    cached = functools.partial(loss_and_grads, model, objective, chunks=2, rng=rng)
    loss, grads, _ = jax.jit(cached)(params, packed)
    assert_same((loss, grads), jax.jit(jax.value_and_grad(uncached))(params))


@pytest.mark.parametrize("anchors_apart", [False, True])
def test_hosts_of_a_split_run_agree_on_the_rows(anchors_apart):
    """Two hosts (each the half of the rows `host_rows` names, R a multiple of 2 devices x 2
    chunks) feed, step for step, the halves of the one-process packing of the same batch; with
    `anchors_apart` (an inference-free model's batches) the rows hold texts 1.. only and each
    host its half of the anchors [B, L]."""
    features = {k: np.concatenate([v, v[::-1]]) for k, v in pair_batch(3).items()}  # 12 pairs

    def iterator(host=None):
        host_rows = None if host is None else (lambda r: np.arange(r).reshape(2, -1)[host])
        epochs = batching.EpochIterator(features, B, num_epochs=2, seed=7)
        return packing.PackedBatches(epochs, max_segments=3, row_multiple=4, host_rows=host_rows,
                                     anchors_apart=anchors_apart)  # fmt: skip

    one, first, second = iterator(), iterator(0), iterator(1)
    sizes = set()
    texts = np.arange(B * T).reshape(B, T)[:, 1 if anchors_apart else 0 :].reshape(-1)
    for whole, a, b in zip(one, first, second, strict=True):
        sizes.add(len(whole["input_ids"]))
        assert len(whole["input_ids"]) % 4 == 0 and len(a["input_ids"]) == len(b["input_ids"])
        assert ("anchor_ids" in whole) == anchors_apart
        for k in whole:
            np.testing.assert_array_equal(np.concatenate([a[k], b[k]]), whole[k])
        np.testing.assert_array_equal(np.sort(whole["text_index"][whole["text_index"] >= 0]),
                                      texts)  # fmt: skip
    assert one.steps_per_epoch == 2 and len(sizes) <= 2
    second.set_state(first.get_state())  # the position is the epoch iterator's


def test_a_jobs_batches_follow_the_experiment_they_feed():
    """`seed_run.group_batches` reads from the Experiment what its batches need: an
    inference-free objective's anchors come beside the rows, a dense one's and a reranker's
    stay in them; the plan before an Experiment (None) counts the same steps."""
    from types import SimpleNamespace

    from bert_jax.training import reranking, seed_run, splade
    from bert_jax.training.text_job import TextJob

    features = {k: np.concatenate([v, v[::-1]]) for k, v in pair_batch(3).items()}  # 12 pairs
    block = TextJob("embed", (0,), num_epochs=2, max_seq_length=L, pack=True, max_segments=3,
                    eval_batch_size=4)  # fmt: skip
    config = SimpleNamespace(global_batch_size=B, num_microbatches=1)
    plan = seed_run.group_batches(config, block, features, 0)
    rerank = reranking.rerank_objective("bce")
    for objective in (contrastive.ContrastiveObjective, splade.InferenceFreeObjective, rerank):
        exp = SimpleNamespace(mesh=None, objective=objective)
        batches = seed_run.group_batches(config, block, features, 0, exp)
        assert batches.steps_per_epoch == plan.steps_per_epoch == 2
        for batch in batches:
            assert ("anchor_ids" in batch) == (objective is splade.InferenceFreeObjective)


def test_long_texts_are_cut_and_take_more_rows(bert_tokenizer):
    """A text longer than max_seq_length is cut when featurized; a batch of texts that fill
    their rows packs one text a row (R = B T), every text kept."""
    long = " ".join(["fair is foul and foul is fair"] * 10)
    featurized = pairs.featurize_pairs(
        pairs.Pairs([long, "fog"], ["through the fog", long], [(), ()], "p.jsonl"),
        bert_tokenizer,
        8,
    )
    packed = packing.pack_pairs(featurized, max_segments=16)
    assert featurized["attention_mask"].sum(-1).tolist() == [[8, 5], [3, 8]]
    assert packed["input_ids"].shape == (3, 8)  # the two cut texts alone, the short two together
    full = pair_batch(4, low=L // 2 + 1)  # no two texts fit one row
    packed = packing.pack_pairs(full, max_segments=16, row_multiple=4)
    assert packed["input_ids"].shape == (20, L)  # 18 texts, 18 rows, rounded up to 4 x 5
    np.testing.assert_array_equal(np.sort(packed["text_index"][:, 0]), [-1, -1, *range(B * T)])
    assert packed["attention_mask"].sum() == full["attention_mask"].sum()


def test_bad_packing_settings_are_refused(tmp_path):
    from bert_jax.embed import run as embed_run
    from tests.embed.embed_test import embed_config

    config = embed_config(tmp_path, **{"embed.max_segments": 0})
    with pytest.raises(ValueError, match=r"config\.embed\.max_segments=0"):
        embed_run.check_config(config)
    assert embed_run.check_config(embed_config(tmp_path, **{"embed.pack": False})).seeds == (0,)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_dev_embeddings_of_packed_texts_equal_padded_ones_over_the_devices(pooling):
    """The embedding job's dev evaluation (`evaluation.embed_texts`) on a (4, 2, 1) mesh: texts
    packed several to a row (rows a multiple of the 8 data-parallel devices) give the padded
    texts' embeddings within 1e-5, in input order."""
    from types import SimpleNamespace

    from bert_jax.embed import evaluation
    from bert_jax.parallel import sharding

    model, params = encoder("roberta")
    objective = contrastive.contrastive_objective(pooling=pooling)
    fn = jax.jit(functools.partial(steps.embed_step, model=model, objective=objective))
    mesh = sharding.make_mesh({"data": 4, "fsdp": 2, "tensor": 1})
    exp = SimpleNamespace(mesh=mesh, embed_fn=lambda queries=False: fn)
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, L + 1, size=37)
    mask = (np.arange(L) < lengths[:, None]).astype(np.int32)
    features = {
        "input_ids": (rng.integers(2, 99, size=(37, L)) * mask).astype(np.int32),
        "token_type_ids": np.zeros((37, L), np.int32),
        "attention_mask": mask,
        "example_weights": np.ones(37, np.float32),
    }
    packed = evaluation.embed_texts(exp, params, features, 16, max_segments=4)
    padded = evaluation.embed_texts(exp, params, features, 16)
    alone = fn(params, {k: v for k, v in features.items() if k != "example_weights"})
    assert packed.shape == (37, E)
    np.testing.assert_allclose(padded, alone, atol=1e-5)
    np.testing.assert_allclose(packed, padded, atol=1e-5)
