"""Inference-free SPLADE: a sentence-transformers SparseEncoder whose Router sends queries to a
`SparseStaticEmbedding` (a weight per token, no model) and documents to a masked LM with
SpladePooling. `inference embed --task` and `inference search --index sparse` compute what
`encode_query` / `encode_document` do; routings bert_jax does not compute, and the tools that
would drop the query weights, fail naming the problem."""

import functools
import json

import jax
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import pretrained
from bert_jax.checkpoints.sentence_transformers import (
    read_sentence_transformer,
    save_sentence_transformer,
)
from bert_jax.inference import encoder
from bert_jax.inference.__main__ import main
from bert_jax.retrieval import metrics as retrieval
from bert_jax.retrieval import packing
from bert_jax.training import steps
from tests.embed.embed_test import WORDS, embed_config, pair_files  # noqa: F401 (a fixture)
from tests.embed.splade_test import padded_pairs, tiny_export, training_without_dropout

TEXTS = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + i % 5)) for i in range(12)]


def inference_free(tmp_path, **router):
    """A random tiny masked LM as the document route and random query weights, saved by
    sentence-transformers as `Router.for_query_document` (`router`: its arguments): (the
    directory, the loaded SparseEncoder)."""
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.models import Router
    from sentence_transformers.sparse_encoder.models import SparseStaticEmbedding

    hf, _ = tiny_export(tmp_path)
    documents = st.SparseEncoder(str(hf), device="cpu")
    mlm, pooling = documents[0], documents[1]
    weight = torch.rand(len(mlm.tokenizer.get_vocab()), generator=torch.Generator().manual_seed(0))
    queries = SparseStaticEmbedding(tokenizer=mlm.tokenizer, weight=weight)
    model = st.SparseEncoder(
        modules=[Router.for_query_document([queries], [mlm, pooling], **router)],
        similarity_fn_name="dot",
        device="cpu",
    )
    out = tmp_path / "inference_free"
    model.save(str(out))
    return out, st.SparseEncoder(str(out), device="cpu")


@pytest.mark.torch
def test_queries_and_documents_embed_and_search_as_sentence_transformers(tmp_path):
    """`embed --task query` equals `encode_query` (the static weights of each query's tokens),
    `--task document` and no task (the default route) equal `encode_document` within 1e-5;
    `search --index sparse` finds numpy's top 10 of those vectors' dot products."""
    out, theirs = inference_free(tmp_path)
    settings = read_sentence_transformer(out)
    assert settings.pooling == "splade" and settings.default_task == "document"
    assert settings.transformer_path == "document_0_MLMTransformer"
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    want = {
        "query": theirs.encode_query(TEXTS, convert_to_tensor=True),
        "document": theirs.encode_document(TEXTS, convert_to_tensor=True),
        None: theirs.encode(TEXTS, convert_to_tensor=True),
    }
    vectors = {}
    for task, vectors_of_theirs in want.items():
        npy = tmp_path / f"{task}.npy"
        flags = ["--task", task] if task else []
        main(["embed", "--model", str(out), "--input", str(tmp_path / "texts.txt"),
              "--output", str(npy), *flags])  # fmt: skip
        vectors[task] = np.load(npy)
        np.testing.assert_allclose(vectors[task], vectors_of_theirs.to_dense().numpy(), atol=1e-5)
    assert not np.allclose(vectors["query"], vectors["document"])

    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    run = tmp_path / "run.jsonl"
    main(["search", "--index", "sparse", "--model", str(out), "--queries",
          str(tmp_path / "texts.txt"), "--corpus", str(tmp_path / "corpus.jsonl"),
          "--output", str(run)])  # fmt: skip
    found = [json.loads(line) for line in run.read_text().splitlines()]
    dots = vectors["query"].astype(np.float64) @ vectors["document"].T.astype(np.float64)
    top = retrieval.top_k(dots, 10)
    assert [r["ids"] for r in found] == [[f"d{i}" for i in row] for row in top]
    scores = np.array([r["scores"] for r in found])
    np.testing.assert_allclose(scores, np.take_along_axis(dots, top, 1), rtol=1e-5)


@pytest.mark.torch
def test_what_bert_jax_cannot_compute_or_would_drop_fails_naming_it(tmp_path, pair_files, capsys):  # noqa: F811
    """No default route: a task must be given. Other routings, query weights of the wrong size
    and weights in an IDF file are refused naming the file; the bulk job refuses queries,
    convert and the embedding job refuse the directory (each would drop the query weights)."""
    out, _ = inference_free(tmp_path, default_route=None, allow_empty_key=False)
    assert read_sentence_transformer(out).default_task is None
    with pytest.raises(ValueError, match="give --task query or --task document"):
        encoder.load_for_embedding(str(out)).embed(["fair is foul"])
    model = encoder.load_for_embedding(str(out))
    assert model.for_task("document").embed(["fair is foul"]).shape == (1, model.config.vocab_size)
    with pytest.raises(ValueError, match="embeds SPLADE vectors, not mean pooling"):
        encoder.load_for_embedding(str(out), pooling="mean")
    queries = model.for_task("query")
    for options, message in (
        ({"normalize": True}, "take neither --layers nor --normalize"),
        ({"truncate_dim": 4}, "--truncate_dim keeps a dense embedding"),
    ):
        bad = queries._replace(options=queries.options._replace(**options))
        with pytest.raises(ValueError, match=message):
            bad.embed(["fair is foul"])
    with pytest.raises(ValueError, match="take neither --layers nor --normalize"):
        queries.embed(["fair is foul"], layers=(-1,))

    (tmp_path / "corpus.jsonl").write_text(json.dumps({"text": "fair is foul"}) + "\n")
    bulk = ["embed", "--model", str(out), "--input", str(tmp_path / "corpus.jsonl"),
            "--output", str(tmp_path / "bulk"), "--task", "query"]  # fmt: skip
    assert main(bulk) == 1
    assert "queries are a lookup of token weights" in capsys.readouterr().err
    assert convert.main([str(out), str(tmp_path / "converted"), "--to", "bert_jax"]) == 1
    assert not (tmp_path / "converted").exists()
    from bert_jax.embed import run as embed_run

    config = embed_config(pair_files, init_from=str(out))
    with pytest.raises(ValueError, match="inference-free SparseEncoder .* continue it with embed"):
        embed_run.train_and_evaluate(config, str(tmp_path / "job"))

    router_file = out / "router_config.json"
    router = json.loads(router_file.read_text())
    for change, message in (
        ({"structure": {"query": router["structure"]["document"]}}, "routes"),
        ({"parameters": {"route_mappings": {"x": "query"}}}, "route_mappings"),
        ({"types": None}, "no types and structure"),
    ):
        router_file.write_text(json.dumps({**router, **change}))
        with pytest.raises(ValueError, match=f"router_config.json.*{message}"):
            read_sentence_transformer(out)
    router_file.unlink()
    with pytest.raises(ValueError, match="lists a Router but there is no"):
        read_sentence_transformer(out)
    router_file.write_text(json.dumps(router))

    query = out / "query_0_SparseStaticEmbedding"
    (query / "config.json").write_text(json.dumps({"frozen": False, "path": "idf.json"}))
    with pytest.raises(ValueError, match="takes its weights from idf.json"):
        encoder.load_for_embedding(str(out))
    (query / "config.json").write_text(json.dumps({"frozen": False}))
    from safetensors.numpy import save_file

    save_file({"weight": np.ones(3, np.float32)}, str(query / "model.safetensors"))
    with pytest.raises(ValueError, match=r"query weights have shape \(3,\); its tokenizer has"):
        encoder.load_for_embedding(str(out))


@pytest.mark.torch
def test_bert_jax_writes_one_that_sentence_transformers_reads(tmp_path):
    """`save_sentence_transformer(..., query_weights=w)` writes the Router's folders:
    `encode_query` gives each query's tokens' weights, `encode_document` the masked LM's SPLADE
    vectors, both equal to bert_jax's within 1e-5; bad weights are refused naming them."""
    st = pytest.importorskip("sentence_transformers")
    hf, tokenizer = tiny_export(tmp_path)
    loaded = pretrained.load(str(hf))
    weight = np.random.default_rng(0).random(tokenizer.vocab_size).astype(np.float32)
    out = tmp_path / "written"
    save = functools.partial(
        save_sentence_transformer, out, loaded.config, loaded.params, tokenizer_dir=tokenizer,
        pooling="splade", normalize=False, max_seq_length=16,
    )  # fmt: skip
    save(query_weights=weight, card="trained on nothing")
    theirs = st.SparseEncoder(str(out), device="cpu")
    ours = encoder.load_for_embedding(str(out))
    assert ours.settings.query_module and ours.settings.default_task == "document"
    for task, encode in (("query", theirs.encode_query), ("document", theirs.encode_document)):
        want = encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
        np.testing.assert_allclose(ours.for_task(task).embed(TEXTS), want, atol=1e-5)
    first = tokenizer.encode(TEXTS[0])
    np.testing.assert_array_equal(np.flatnonzero(ours.for_task("query").embed(TEXTS[:1])[0]),
                                  np.unique(first))  # fmt: skip
    with pytest.raises(ValueError, match=r"query_weights of shape \(3,\)"):
        save(query_weights=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="query_weights with mean pooling"):
        save(query_weights=weight, pooling="mean")


@pytest.mark.torch
def test_the_job_trains_one(pair_files):  # noqa: F811
    """A tiny run of the embedding job with embed.query_encoder=static: the query weights move
    from ones at their own learning rate, dev scores at the start and the end, and the export
    is a Router whose `encode_query` / `encode_document` equal `inference embed --task`; a run
    that continues from the first run's directory starts where the first ended (its query
    weights and masked LM both read from its hf/)."""
    st = pytest.importorskip("sentence_transformers")
    from bert_jax.embed import run as embed_run

    workdir = pair_files / "run"
    settings = {"embed.pooling": "splade", "embed.scale": 1.0, "embed.query_encoder": "static",
                "embed.query_learning_rate": 0.05}  # fmt: skip
    results = embed_run.train_and_evaluate(embed_config(pair_files, **settings), str(workdir))
    assert 0 <= results["seeds"]["0"]["ndcg@10"] <= 1
    assert "start_ndcg@10" in results["seeds"]["0"]
    hf = workdir / "hf"
    assert read_sentence_transformer(hf).query_module
    assert "inference-free" in (hf / "README.md").read_text()
    theirs = st.SparseEncoder(str(hf), device="cpu")
    weight = theirs[0].sub_modules["query"][0].weight.detach().numpy()
    assert np.abs(weight - 1).max() > 0.01  # trained, from ones
    texts = ["fair is foul", "foul is fair and it is", "is it", "the"]
    (pair_files / "texts.txt").write_text("\n".join(texts) + "\n")
    for task, encode in (("query", theirs.encode_query), ("document", theirs.encode_document)):
        out = pair_files / f"{task}.npy"
        main(["embed", "--task", task, "--model", str(hf), "--input",
              str(pair_files / "texts.txt"), "--output", str(out)])  # fmt: skip
        want = encode(texts, convert_to_tensor=True).to_dense().numpy()
        np.testing.assert_allclose(np.load(out), want, atol=1e-5)

    # from the run's directory (its hf/), the tokenizer read from the Router's document folder
    # (no embed.tokenizer)
    again = embed_config(pair_files, init_from=str(workdir), **settings, **{"embed.tokenizer": ""})
    continued = embed_run.train_and_evaluate(again, str(pair_files / "again"))["seeds"]["0"]
    for key in ("ndcg@10", "mrr@10"):
        assert continued[f"start_{key}"] == pytest.approx(results["seeds"]["0"][key], abs=1e-6)


@pytest.mark.torch
def test_the_objectives_loss_and_gradients_equal_splade_losss(tmp_path):
    """`splade.InferenceFreeObjective` on a tiny masked LM and random query weights, dropout
    off: its loss and gradients, the masked LM's and the query weights', equal SpladeLoss's
    through the Router SparseEncoder (column 0 routed to the SparseStaticEmbedding, the others
    to the masked LM), with both FLOPS terms on."""
    pytest.importorskip("torch")
    from sentence_transformers.sparse_encoder import losses as st_losses

    from bert_jax.models.config import RuntimeConfig
    from bert_jax.models.family import Role
    from bert_jax.models.inference_free import InferenceFreeSplade
    from bert_jax.training import splade

    out, theirs = inference_free(tmp_path)
    training_without_dropout(theirs)
    qw, dw = 0.05, 0.03  # large enough to count
    loss = st_losses.SpladeLoss(
        theirs,
        st_losses.SparseMultipleNegativesRankingLoss(theirs),
        query_regularizer_weight=qw,
        document_regularizer_weight=dw,
    )
    texts = [[" ".join(WORDS[(3 * i + t + j) % len(WORDS)] for j in range(1 + (i + t) % 6))
              for t in range(3)] for i in range(5)]  # fmt: skip
    columns = [[row[t] for row in texts] for t in range(3)]
    tasks = ("query", "document", "document")
    features = [theirs.preprocess(c, task=task) for c, task in zip(columns, tasks)]
    total = sum(loss([dict(f) for f in features], None).values())
    total.backward()
    static = theirs[0].sub_modules["query"][0]
    grads = dict(theirs[0].sub_modules["document"][0].auto_model.named_parameters())

    # The job's padded batch [B, T, L]: every text with its special tokens (a query's vector
    # counts the tokens between them), tokenized as the documents are.
    batch = padded_pairs([theirs.preprocess(c, task="document") for c in columns])
    loaded = pretrained.load(str(out / "document_0_MLMTransformer"), Role.MASKED_LM)
    model = InferenceFreeSplade(loaded.config, RuntimeConfig(dtype="float32", attention="xla"))
    params = {"documents": loaded.params, "query_weight": static.weight.detach().numpy()}
    objective = splade.splade_objective(
        query_weight=qw, document_weight=dw, query_learning_rate_factor=1.0
    )
    assert isinstance(objective, splade.InferenceFreeObjective) and objective.anchors_apart

    def ours(params):  # deterministic: no dropout
        sums = objective.sums(model, params, batch, None, True)
        return objective.loss(sums, objective.counts(batch))

    value, got = jax.jit(jax.value_and_grad(ours))(params)
    np.testing.assert_allclose(float(value), float(total.detach()), rtol=1e-5)
    documents = got["documents"]
    layer, head = documents["bert"]["encoder"]["layer_0"], documents["cls"]["predictions"]
    pairs = {  # torch's name: our gradient in torch's layout ([out, in] for a Linear)
        "query weights": (static.weight, got["query_weight"]),
        "bert.embeddings.word_embeddings.weight": documents["bert"]["embeddings"]["word_embeddings"]["embedding"],
        "bert.encoder.layer.0.attention.self.query.weight": layer["attention"]["self"]["query"]["kernel"].reshape(32, -1).T,
        "cls.predictions.bias": head["bias"],
    }  # fmt: skip
    for name, grad in pairs.items():
        if isinstance(grad, tuple):
            (parameter, grad) = grad
        else:
            parameter = grads[name]
        want = parameter.grad.numpy()
        scale = float(np.abs(want).max())
        assert scale > 0, name
        np.testing.assert_allclose(np.asarray(grad), want, atol=1e-4 * scale, err_msg=name)

    # The same batch packed as the job packs it (the anchors beside the rows, which hold the
    # documents only), in 5 GradCache chunks (dropout 0, so the chunks' keys draw nothing):
    # the same loss and gradients, no anchor's tokens in the masked LM's rows.
    packed = packing.pack_pairs(batch, max_segments=2, row_multiple=5, anchors_apart=True)
    slots = packed["text_index"][packed["text_index"] >= 0]
    assert sorted(slots) == [b * 3 + t for b in range(5) for t in (1, 2)]
    np.testing.assert_array_equal(packed["anchor_ids"], batch["input_ids"][:, 0])
    objective = splade.splade_objective(
        query_weight=qw, document_weight=dw, query_learning_rate_factor=1.0, packed_shape=(5, 3)
    )
    quiet = loaded.config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = InferenceFreeSplade(quiet, RuntimeConfig(dtype="float32", attention="xla"))
    cached = functools.partial(
        steps.grad_cache_loss_and_grads, model=model, objective=objective, num_chunks=5
    )
    value_packed, got_packed, _ = jax.jit(cached)(params, packed, jax.random.key(0))
    np.testing.assert_allclose(float(value_packed), float(value), rtol=1e-5)
    for path, want in jax.tree_util.tree_leaves_with_path(got):
        grad = got_packed
        for key in path:
            grad = grad[key.key]
        scale = max(float(np.abs(want).max()), 1e-6)  # a gradient of 0 (key biases): rounding
        np.testing.assert_allclose(
            grad, want, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path)
        )


def test_only_an_inference_free_objective_embeds_queries_with_a_function_of_their_own():
    """`Experiment.embed_fn(queries=True)`: the documents' jitted function itself for an objective
    that embeds queries as documents (dense, SPLADE: dev scoring compiles one), another for
    inference-free SPLADE (its queries are token weights)."""
    from types import SimpleNamespace

    from bert_jax.training import contrastive, splade
    from bert_jax.training.experiment import Experiment

    for objective, shared in (
        (contrastive.contrastive_objective(), True),
        (splade.splade_objective(), True),
        (splade.splade_objective(query_learning_rate_factor=1.0), False),
    ):
        exp = SimpleNamespace(objective=objective, model=None, compiler_options=None, _jitted={})
        exp.cached = functools.partial(Experiment.cached, exp)  # the real cache
        queries, documents = Experiment.embed_fn(exp, True), Experiment.embed_fn(exp)
        assert (queries is documents) == shared, objective
