"""Inference-free SPLADE: a sentence-transformers SparseEncoder whose Router sends queries to a
`SparseStaticEmbedding` (a weight per token, no model) and documents to a masked LM with
SpladePooling. `inference embed --task` and `inference search --index sparse` compute what
`encode_query` / `encode_document` do; routings bert_jax does not compute, and the tools that
would drop the query weights, fail naming the problem."""

import json

import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints.sentence_transformers import read_sentence_transformer
from bert_jax.inference import encoder
from bert_jax.inference.__main__ import main
from bert_jax.retrieval import metrics as retrieval
from tests.embed.embed_test import WORDS, embed_config, pair_files  # noqa: F401 (a fixture)
from tests.embed.splade_test import tiny_export

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
    with pytest.raises(ValueError, match="inference-free SparseEncoder .* does not train"):
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
