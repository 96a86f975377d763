"""SPLADE: the pooling (packed texts as unpacked), the objective's loss against
sentence-transformers' SpladeLoss (SparseMultipleNegativesRankingLoss plus FLOPS) on the same
vectors and, with the model, its loss and gradients through `SparseEncoder`, GradCache against the uncached batch; a tiny run of the embedding job as a SPLADE model,
its SparseEncoder export's `encode` against `inference embed --sparse`, and `inference search
--index sparse` against a brute-force numpy search with the evaluator's scores."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert, losses, tokenization
from bert_jax.checkpoints import pretrained
from bert_jax.checkpoints.sentence_transformers import (
    read_sentence_transformer,
    save_sentence_transformer,
)
from bert_jax.embed import mine
from bert_jax.inference import encoder
from bert_jax.inference.__main__ import main
from bert_jax.inference.commands import search
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.bert.model import BertForMaskedLM
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.family import Role
from bert_jax.models.params import init_params
from bert_jax.models.pooling import splade_activation, splade_pool, splade_pool_segments
from bert_jax.parallel import sharding
from bert_jax.retrieval import metrics as retrieval
from bert_jax.training import splade, steps
from tests import family_fixtures
from tests.embed.contrastive_test import B, L, T, pair_batch
from tests.embed.embed_test import WORDS, embed_config, pair_files  # noqa: F401 (a fixture)

V = 99


def tiny_mlm(dropout=0.1, vocab_size=V):
    cfg = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=16,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return BertForMaskedLM(cfg, RuntimeConfig(dtype="float32", attention="xla"))


def test_pooling_is_the_max_of_log_saturated_logits_over_real_tokens():
    """[B, L, V] logits -> [B, V]: max over the real tokens of log(1 + relu(x)); packed rows give
    each text the vector of its own tokens."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.int32)
    want = np.stack([np.log1p(np.maximum(x[: m.sum()], 0)).max(0) for x, m in zip(logits, mask)])
    np.testing.assert_allclose(splade_pool(logits, mask), want, rtol=1e-6)
    # The three texts packed in one row of 3 slots (the last slot of a second row empty).
    packed = np.concatenate([x[: m.sum()] for x, m in zip(logits, mask)])[None]  # [1, 9, V]
    rows = np.concatenate([packed, np.zeros_like(packed)])
    segments = np.array([[1, 1, 1, 2, 2, 2, 2, 2, 3], [0] * 9], np.int32)
    got = splade_pool_segments(rows, segments, 3)
    np.testing.assert_allclose(got[0], want, rtol=1e-6)
    assert got.shape == (2, 3, 11) and not np.asarray(got[1]).any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pooling_takes_the_maximum_first_with_the_definitions_values_and_gradients(dtype):
    """Both poolings take the maximum over the tokens before the logarithm: the values and
    gradients of the definition (the activation of every token, then the masked maximum), with
    ties, logits all below 0, a text of padding only and an empty slot."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
    logits[0, 1] = logits[0, 0]  # a tie between two real tokens in every entry
    logits[1, :, :4] = -np.abs(logits[1, :, :4])  # entries no token reaches above 0
    logits = jnp.asarray(logits, dtype)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], np.int32)
    weights = jnp.asarray(rng.normal(size=(3, 11)), jnp.float32)

    def definition(x):
        return (splade_activation(x) * mask[..., None]).max(axis=-2)

    def packed(x):  # each text in a row of its own, slot 0; the row of padding: an empty slot
        return splade_pool_segments(x, mask, 1)[:, 0]

    want, want_grad = jax.value_and_grad(lambda x: (definition(x) * weights).sum())(logits)
    for pool in (lambda x: splade_pool(x, mask), packed):
        got, grad = jax.value_and_grad(lambda x, p=pool: (p(x) * weights).sum())(logits)
        np.testing.assert_array_equal(np.asarray(pool(logits)), np.asarray(definition(logits)))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert grad.dtype == logits.dtype
        np.testing.assert_array_equal(
            np.asarray(grad, np.float32), np.asarray(want_grad, np.float32)
        )
    assert not np.asarray(splade_pool(logits, mask)[2]).any()  # padding only: 0


@pytest.mark.torch
def test_loss_equals_sentence_transformers_splade_loss():
    """The objective's loss of fixed vectors [B, T, V] (anchor, positive, hard negative) equals
    SpladeLoss's: SparseMultipleNegativesRankingLoss (dot product, its scale 1) plus each FLOPS
    regularizer x its weight (weights large enough to count)."""
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers.sparse_encoder.losses")
    rng = np.random.default_rng(1)
    vectors = np.maximum(rng.normal(size=(5, 3, 40)), 0).astype(np.float32)  # >= 0, many 0
    qw, dw = 0.3, 0.2
    loss = st.SpladeLoss(
        None,
        st.SparseMultipleNegativesRankingLoss(None),
        document_regularizer_weight=dw,
        query_regularizer_weight=qw,
    )
    columns = [torch.from_numpy(vectors[:, t]) for t in range(3)]
    expected = float(loss.loss.compute_loss_from_embeddings(columns, None))
    expected += dw * float(
        loss.document_regularizer.compute_loss_from_embeddings(torch.cat(columns[1:]))
    )
    expected += qw * float(loss.query_regularizer.compute_loss_from_embeddings(columns[0]))
    objective = splade.splade_objective(query_weight=qw, document_weight=dw)
    sums = objective.embedding_sums(vectors)
    counts = {k: np.float32(5) for k in ("mnrl_count", "qflops_count", "dflops_count")}
    np.testing.assert_allclose(float(objective.loss(sums, counts)), expected, rtol=1e-5)
    assert float(sums["dflops_loss_sum"]) > 0 and objective.scale == 1.0
    flops = float(losses.flops_loss(vectors[:, 0]))
    np.testing.assert_allclose(flops, (vectors[:, 0].mean(0) ** 2).sum(), rtol=1e-6)


@pytest.mark.torch
@pytest.mark.parametrize("ramp", ["quadratic", "linear"])
def test_the_regularizers_warm_up_as_sparse_encoder_trainers_callback(ramp):
    """`at_step(s)`'s FLOPS weights are those SpladeRegularizerWeightSchedulerCallback (which
    SparseEncoderTrainer adds by default) sets before update s, over a third of 10 updates; the
    loss of fixed vectors follows them, and jitted with a traced step too."""
    pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers.sparse_encoder")
    from transformers import TrainerState

    qw, dw, total = 0.3, 0.2, 10
    loss = st.losses.SpladeLoss(
        None, st.losses.SparseMultipleNegativesRankingLoss(None),
        document_regularizer_weight=dw, query_regularizer_weight=qw,
    )  # fmt: skip
    callback = st.callbacks.SpladeRegularizerWeightSchedulerCallback(loss, scheduler_type=ramp)
    state = TrainerState(max_steps=total)
    callback.on_train_begin(None, state, None)
    objective = splade.splade_objective(qw, dw, warmup_steps=int(total / 3), ramp=ramp)
    vectors = np.maximum(np.random.default_rng(2).normal(size=(4, 2, 30)), 0).astype(np.float32)
    sums = objective.embedding_sums(vectors)
    counts = {k: np.float32(4) for k in ("mnrl_count", "qflops_count", "dflops_count")}
    at = jax.jit(lambda step: objective.at_step(step).loss(sums, counts))
    for step in range(total):
        state.global_step = step
        callback.on_step_begin(None, state, None)
        now = objective.at_step(step)
        assert float(now.ramp_factor) * qw == pytest.approx(loss.query_regularizer_weight)
        assert float(now.ramp_factor) * dw == pytest.approx(loss.document_regularizer_weight)
        want = (
            sums["mnrl_loss_sum"] / 4
            + (
                loss.query_regularizer_weight * sums["qflops_loss_sum"]
                + loss.document_regularizer_weight * sums["dflops_loss_sum"]
            )
            / 4
        )
        np.testing.assert_allclose(float(at(np.int32(step))), float(want), rtol=1e-6)
    assert splade.splade_objective(qw, dw).at_step(0).ramp_factor == 1.0  # no warmup
    none = splade.splade_objective(qw, dw, warmup_steps=3, ramp="none")
    assert none.warmup_steps == 0 and none.at_step(0).ramp_factor == 1.0
    with pytest.raises(ValueError, match="ramp='cubic'"):
        splade.splade_objective(qw, dw, warmup_steps=3, ramp="cubic")


@pytest.mark.e2e  # 17 s on 2 cores, mostly compiling the two programs
def test_grad_cache_equals_the_uncached_batch():
    """GradCache in 4 chunks, dropout on: the loss and gradients of the whole batch at once."""
    objective = splade.splade_objective(query_weight=0.01, document_weight=0.02)
    batch, rng = pair_batch(), jax.random.PRNGKey(3)
    model = tiny_mlm(dropout=0.1)
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
    wants = jax.tree_util.tree_leaves(want_grads)
    scale = max(float(np.abs(w).max()) for w in wants)  # some leaves' gradients are ~0
    for got, want in zip(jax.tree_util.tree_leaves(grads), wants):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale)
    assert sums["mnrl_count"] == B and sums["dflops_loss_sum"] > 0
    assert batch["input_ids"].shape == (B, T, L)


@pytest.mark.e2e  # 3-17 s on 2 cores (two compiles); the contrastive test checks the path
def test_the_negatives_and_flops_are_the_global_batchs():
    """The loss of a batch sharded over 8 data-parallel devices is the loss of the same batch on
    one device: the negatives and the FLOPS means are the whole global batch's."""
    model = tiny_mlm(0.0)
    objective = splade.splade_objective(query_weight=0.1, document_weight=0.1)
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


def tiny_export(tmp_path):
    """A random tiny masked LM saved as a SparseEncoder directory: (its path, its tokenizer)."""
    tokenizer = tokenization.train_wordpiece(
        [" ".join([*WORDS, "is", "it"])] * 3, vocab_size=120, min_frequency=1
    )
    model = tiny_mlm(vocab_size=tokenizer.vocab_size)
    params = init_params(model, jax.random.PRNGKey(0))
    hf = tmp_path / "hf"
    save_sentence_transformer(
        hf, model.config, params, tokenizer_dir=tokenizer, pooling="splade", normalize=False,
        max_seq_length=16,
    )  # fmt: skip
    return hf, tokenizer


def training_without_dropout(model):
    """A sentence-transformers model in training mode with every dropout off (the attention's,
    sdpa's, too): its loss is deterministic."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_prob"):  # the attention's (sdpa)
            module.dropout_prob = 0.0
    model.train()
    return model


def padded_pairs(features) -> dict[str, np.ndarray]:
    """sentence-transformers' features of each of T columns (tensors [B, L_t]) as the job's
    padded batch of pairs: input_ids, attention_mask and token_type_ids int [B, T, L]."""
    length = max(f["input_ids"].shape[1] for f in features)
    batch = {
        k: np.stack(
            [np.pad(f[k].numpy(), ((0, 0), (0, length - f[k].shape[1]))) for f in features], 1
        )
        for k in ("input_ids", "attention_mask")
    }
    batch["token_type_ids"] = np.zeros_like(batch["input_ids"])
    return batch


@pytest.mark.torch
def test_the_models_loss_and_gradients_equal_splade_losss(tmp_path):
    """The whole objective on a tiny masked LM, dropout off: its loss and gradients equal
    SpladeLoss's through `SparseEncoder(<its export>)` (texts of different lengths, padding,
    the tied decoder): the model, the pooling and the loss as sentence-transformers trains
    them, not only the loss of given vectors."""
    pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers.sparse_encoder")
    hf, _ = tiny_export(tmp_path)
    theirs = training_without_dropout(st.SparseEncoder(str(hf), device="cpu"))
    qw, dw = 0.05, 0.03  # large enough to count
    loss = st.losses.SpladeLoss(
        theirs,
        st.losses.SparseMultipleNegativesRankingLoss(theirs),
        query_regularizer_weight=qw,
        document_regularizer_weight=dw,
    )
    texts = [[" ".join(WORDS[(3 * i + t + j) % len(WORDS)] for j in range(1 + (i + t) % 6))
              for t in range(3)] for i in range(5)]  # fmt: skip
    features = [theirs.preprocess([row[t] for row in texts]) for t in range(3)]
    total = sum(loss([dict(f) for f in features], None).values())
    total.backward()
    grads = dict(theirs[0].auto_model.named_parameters())

    loaded = pretrained.load(str(hf), Role.MASKED_LM)
    model = BertForMaskedLM(loaded.config, RuntimeConfig(dtype="float32", attention="xla"))
    batch = padded_pairs(features)
    objective = splade.splade_objective(query_weight=qw, document_weight=dw)

    def ours(params):  # deterministic: no dropout
        sums = objective.sums(model, params, batch, None, True)
        return objective.loss(sums, objective.counts(batch))

    value, got = jax.jit(jax.value_and_grad(ours))(loaded.params)
    np.testing.assert_allclose(float(value), float(total.detach()), rtol=1e-5)
    layer, head = got["bert"]["encoder"]["layer_0"], got["cls"]["predictions"]
    pairs = {  # torch's name: our gradient in torch's layout ([out, in] for a Linear)
        "bert.embeddings.word_embeddings.weight": got["bert"]["embeddings"]["word_embeddings"]["embedding"],
        "bert.encoder.layer.0.attention.self.query.weight": layer["attention"]["self"]["query"]["kernel"].reshape(32, -1).T,
        "cls.predictions.transform.dense.weight": head["transform"]["dense"]["kernel"].T,
        "cls.predictions.bias": head["bias"],
    }  # fmt: skip
    for name, grad in pairs.items():
        want = grads[name].grad.numpy()
        scale = float(np.abs(want).max())
        assert scale > 0, name
        np.testing.assert_allclose(np.asarray(grad), want, atol=1e-4 * scale, err_msg=name)


@pytest.mark.torch
def test_the_export_encodes_as_embed_sparse_and_search_finds_numpys_top_10(tmp_path):
    """A SparseEncoder directory of a random tiny masked LM: `SparseEncoder(DIR).encode` equals
    `inference embed --sparse` within 1e-5 (dense [N, V] .npy); `search --index sparse` finds the
    top 10 of numpy's dot products of those vectors, and scores that ranking; converted to
    bert_jax's format it embeds alike; mining refuses the model."""
    st = pytest.importorskip("sentence_transformers")
    hf, tokenizer = tiny_export(tmp_path)
    modules = json.loads((hf / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["MLMTransformer", "SpladePooling"]
    assert read_sentence_transformer(hf).pooling == "splade"
    with pytest.raises(ValueError, match="is a SPLADE model; mining searches dense embeddings"):
        mine.text_embedders(str(hf))

    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + i % 5)) for i in range(12)]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "sparse.npy"
    main(["embed", "--sparse", "--model", str(hf), "--input", str(tmp_path / "texts.txt"),
          "--output", str(out)])  # fmt: skip
    ours = np.load(out)
    theirs = st.SparseEncoder(str(hf), device="cpu").encode(texts, convert_to_tensor=True)
    np.testing.assert_allclose(ours, theirs.to_dense().numpy(), atol=1e-5)
    assert ours.shape == (len(texts), tokenizer.vocab_size) and (ours >= 0).all()
    # Converted to bert_jax's format, it keeps its modules: `embed` gives the same vectors.
    assert convert.main([str(hf), str(tmp_path / "native"), "--to", "bert_jax"]) == 0
    assert read_sentence_transformer(tmp_path / "native").pooling == "splade"
    main(["embed", "--model", str(tmp_path / "native"), "--input", str(tmp_path / "texts.txt"),
          "--output", str(tmp_path / "native.npy")])  # fmt: skip
    np.testing.assert_array_equal(np.load(tmp_path / "native.npy"), ours)

    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    qrels = [{"query_id": 0, "corpus_id": "d1"}, {"query_id": 1, "corpus_id": "d1"}]
    (tmp_path / "qrels.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qrels))
    run = tmp_path / "run.jsonl"
    main(["search", "--index", "sparse", "--model", str(hf), "--queries", str(tmp_path / "texts.txt"),
          "--corpus", str(tmp_path / "corpus.jsonl"), "--qrels", str(tmp_path / "qrels.jsonl"),
          "--output", str(run)])  # fmt: skip
    found = [json.loads(line) for line in run.read_text().splitlines()]
    dots = ours.astype(np.float64) @ ours.T.astype(np.float64)
    want = retrieval.top_k(dots, 10)
    assert [r["ids"] for r in found] == [[f"d{i}" for i in row] for row in want]
    got_scores = np.array([r["scores"] for r in found])
    np.testing.assert_allclose(got_scores, np.take_along_axis(dots, want, 1), rtol=1e-5)
    relevant = [{"d1"}, {"d1"}] + [set()] * (len(texts) - 2)
    ranked = [[f"d{i}" for i in row] for row in retrieval.top_k(dots, 100)]
    metrics = json.loads((tmp_path / "run.metrics.json").read_text())
    want_metrics = search.run_scores(relevant, ranked)
    for key in ("ndcg@10", "mrr@10", "recall@100"):
        assert metrics[key] == pytest.approx(want_metrics[key])


@pytest.mark.e2e  # 10 s on 2 cores: the bulk job
def test_the_bulk_jobs_sparse_corpus_searches_as_its_texts(tmp_path):
    """`embed --sparse` over a corpus into Parquet (`embedding`: list<float32>[V]) and `search
    --index sparse` over it: the same ranking and scores as over the corpus's texts."""
    hf, _ = tiny_export(tmp_path)
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + i % 5)) for i in range(12)]
    (tmp_path / "q.txt").write_text("\n".join(texts[:4]) + "\n")
    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    main(["embed", "--sparse", "--model", str(hf), "--input", str(tmp_path / "corpus.jsonl"),
          "--text_column=text", "--id_column=id", "--output", str(tmp_path / "emb")])  # fmt: skip
    runs = []
    for corpus in ("emb", "corpus.jsonl"):
        out = tmp_path / f"{corpus}.run.jsonl"
        main(["search", "--index", "sparse", "--model", str(hf), "--queries", str(tmp_path / "q.txt"),
              "--corpus", str(tmp_path / corpus), "--output", str(out)])  # fmt: skip
        runs.append([json.loads(line) for line in out.read_text().splitlines()])
    assert [r["ids"] for r in runs[0]] == [r["ids"] for r in runs[1]]
    np.testing.assert_allclose(
        [r["scores"] for r in runs[0]], [r["scores"] for r in runs[1]], atol=1e-5
    )


@pytest.mark.e2e
@pytest.mark.torch
def test_the_job_trains_a_splade_model(pair_files):  # noqa: F811
    """A tiny SPLADE run of the embedding job (model=splade's settings: the MLM head, dot
    product x 1, FLOPS): dev scores by dot product at the start and the end, a SparseEncoder
    export with its card, whose `encode` equals `inference embed --sparse`."""
    st = pytest.importorskip("sentence_transformers")
    from bert_jax.embed import run as embed_run

    workdir = pair_files / "run"
    settings = {"embed.pooling": "splade", "embed.scale": 1.0, "embed.num_epochs": 1}
    results = embed_run.train_and_evaluate(embed_config(pair_files, **settings), str(workdir))
    assert 0 <= results["seeds"]["0"]["ndcg@10"] <= 1
    assert "start_ndcg@10" in results["seeds"]["0"]
    hf = workdir / "hf"
    modules = json.loads((hf / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["MLMTransformer", "SpladePooling"]
    card = (hf / "README.md").read_text()
    assert "SpladeLoss" in card and "rising (quadratic) over the first" in card
    texts = ["fair is foul", "foul is fair and it is", "is it", "the"]
    (pair_files / "texts.txt").write_text("\n".join(texts) + "\n")
    out = pair_files / "sparse.npy"
    main(["embed", "--sparse", "--model", str(hf), "--input", str(pair_files / "texts.txt"),
          "--output", str(out)])  # fmt: skip
    theirs = st.SparseEncoder(str(hf), device="cpu").encode(texts, convert_to_tensor=True)
    np.testing.assert_allclose(np.load(out), theirs.to_dense().numpy(), atol=1e-5)


def test_bad_splade_settings_are_refused_before_any_data(pair_files):  # noqa: F811
    from bert_jax.embed import run as embed_run

    for key, value, message in (
        ("embed.normalize", "true", r"embed\.normalize=true: SPLADE"),
        ("embed.matryoshka_dims", "16", r"embed\.matryoshka_dims: SPLADE"),
        ("embed.query_regularizer_weight", -1.0, r"embed\.query_regularizer_weight=-1\.0"),
        ("embed.regularizer_warmup", "cubic", r"embed\.regularizer_warmup='cubic'; expected"),
        ("embed.regularizer_warmup_ratio", 0.0, r"embed\.regularizer_warmup_ratio=0\.0"),
        ("embed.query_encoder", "idf", r"embed\.query_encoder='idf'; expected model or static"),
        ("embed.query_learning_rate", 0.0, r"embed\.query_learning_rate=0\.0; expected"),
    ):
        config = embed_config(pair_files, **{"embed.pooling": "splade", key: value})
        with pytest.raises(ValueError, match=message):
            embed_run.train_and_evaluate(config, "unused")
    # inference-free query weights are a SPLADE model's
    config = embed_config(pair_files, **{"embed.pooling": "mean", "embed.query_encoder": "static"})
    with pytest.raises(ValueError, match="query_encoder=static with embed.pooling=mean: inference"):
        embed_run.train_and_evaluate(config, "unused")


@pytest.mark.e2e  # 10-40 s a family on 2 cores
@pytest.mark.torch
@pytest.mark.parametrize("model_type", sorted(family_fixtures.FIXTURES))
def test_every_family_with_a_masked_lm_exports_a_sparse_encoder(model_type, tmp_path):
    """Each family's random tiny masked LM, saved as a SparseEncoder directory: `encode` equals
    bert_jax's SPLADE vectors of it within 1e-5; saved as an inference-free one (random query
    weights), its `encode_query` and `encode_document` equal bert_jax's queries and documents;
    `encode(max_active_dims=3)` equals `--max_active_dims 3`'s vectors."""
    st = pytest.importorskip("sentence_transformers")
    fam = family_fixtures.make_family_dir(model_type, tmp_path / "mlm")
    if not hasattr(pytest.importorskip("transformers"), fam.head):
        pytest.skip(f"transformers has no {fam.head} (its code is the checkpoint's own)")
    out = tmp_path / "sparse"
    save_sentence_transformer(
        out, fam.config, fam.params, tokenizer_dir=fam.tokenizer, pooling="splade",
        normalize=False, max_seq_length=32,
    )  # fmt: skip
    texts = ["fair is foul and foul is fair", "the tempest", "is it"]
    ours = encoder.load_for_embedding(str(out)).embed(texts)
    sparse_encoder = st.SparseEncoder(str(out), device="cpu")
    theirs = sparse_encoder.encode(texts, convert_to_tensor=True)
    np.testing.assert_allclose(ours, theirs.to_dense().numpy(), atol=1e-5)
    cut = encoder.load_for_embedding(str(out), max_active_dims=3).embed(texts)  # each family's
    theirs = sparse_encoder.encode(texts, max_active_dims=3, convert_to_tensor=True)
    np.testing.assert_allclose(cut, theirs.to_dense().numpy(), atol=1e-5)

    routed = tmp_path / "inference_free"
    weights = np.random.default_rng(0).random(fam.config.vocab_size).astype(np.float32)
    save_sentence_transformer(
        routed, fam.config, fam.params, tokenizer_dir=fam.tokenizer, pooling="splade",
        normalize=False, max_seq_length=32, query_weights=weights,
    )  # fmt: skip
    ours, theirs = (
        encoder.load_for_embedding(str(routed)),
        st.SparseEncoder(str(routed), device="cpu"),
    )
    vectors = {}
    for task, encode in (("query", theirs.encode_query), ("document", theirs.encode_document)):
        want = encode(texts, convert_to_tensor=True).to_dense().numpy()
        vectors[task] = ours.for_task(task).embed(texts)
        np.testing.assert_allclose(vectors[task], want, atol=1e-5)
    assert not np.allclose(vectors["query"], vectors["document"])  # two routes, not one
