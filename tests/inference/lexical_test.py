"""`search --index bm25` and `fuse`: BM25's top k equal to bm25s's own ranking of the same
corpus (ids and scores, equal scores in ascending id); BM25 as the first stage of --rerank;
reciprocal rank fusion of two hand-made runs equal to a hand computation (ids matched as text);
the fused run's scores with qrels equal to `retrieval.metrics.ranked_scores` of the fused lists;
each bad input one `error:` line."""

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_jax import tokenization
from bert_jax.inference.__main__ import main
from bert_jax.retrieval import metrics
from tests.inference.search_test import DOCS, QRELS, QUERIES, read_run, write_jsonl

bm25s = pytest.importorskip("bm25s")

WORDY = [  # queries sharing words with DOCS (one of stopwords only, one of unknown words)
    {"id": "q-tyre", "text": "fix the bicycle tyre"},
    {"id": "q-kernel", "text": "linux kernel source modules"},
    {"id": "q-tea", "text": "green tea water temperature"},
    {"id": "q-history", "text": "history of jazz and chess"},
    {"id": "q-stop", "text": "the and of with"},
    {"id": "q-none", "text": "zebra quantum"},
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lexical")
    return {
        "root": root,
        "wordy": write_jsonl(root / "wordy.jsonl", WORDY),
        "queries": write_jsonl(root / "queries.jsonl", QUERIES),
        "corpus": write_jsonl(
            root / "corpus.jsonl", [{"id": i, "text": t} for i, t in DOCS.items()]
        ),
        "qrels": write_jsonl(root / "qrels.jsonl", QRELS),
        "wordy_qrels": write_jsonl(
            root / "wordy_qrels.jsonl", [{"query_id": "q-tea", "corpus_id": "tea-brewing"}]
        ),
    }


def test_bm25_equals_bm25s_on_the_same_corpus(files, tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "bm25.jsonl"  # made: a long search's output is not lost
    argv = ["search", "--index", "bm25", "--queries", files["wordy"], "--corpus", files["corpus"]]
    assert main([*argv, "--top_k", "5", "--output", str(out)]) == 0
    rows = read_run(out)
    index = bm25s.BM25()
    index.index(bm25s.tokenize(list(DOCS.values()), stopwords="en", show_progress=False))
    assert [r["query_id"] for r in rows] == [q["id"] for q in WORDY]
    for query, row in zip(WORDY, rows):
        tokens = bm25s.tokenize([query["text"]], stopwords="en", show_progress=False)
        docs, scores = index.retrieve(tokens, k=len(DOCS), show_progress=False)
        theirs = {list(DOCS)[d]: s for d, s in zip(docs[0], scores[0])}
        want = sorted(theirs, key=lambda d: (-theirs[d], d))[:5]  # equal scores: ascending id
        assert row["ids"] == want, query
        assert row["scores"] == [float(theirs[d]) for d in want], query
    assert rows[0]["ids"][0] == "bike-repair" and rows[0]["scores"][0] > 0
    assert rows[4]["scores"] == [0.0] * 5 == rows[5]["scores"]  # no indexed word: all equal
    err = capsys.readouterr().err.splitlines()  # and bm25s's progress bars of the check above
    assert [line for line in err if line.startswith("warning:")] == [
        "warning: 2 of 6 queries share no indexed word with the corpus (e.g. 'the and of with': "
        "stopwords only, or words no document holds); BM25 scores every document 0 for them, so "
        "they list it in id order"
    ]


@pytest.mark.torch
def test_bm25_as_the_first_stage_of_rerank(files, tmp_path):
    """A tiny random cross-encoder reorders BM25's first 6 documents of each query, descending
    by its scores (that these are `CrossEncoder.predict`'s is search_test's: the same code)."""
    from tests.inference.rerank_inference_test import save_classifier

    texts = [*DOCS.values(), *(q["text"] for q in WORDY)]
    words = [w.strip(".,'").lower() for t in texts for w in t.split()]
    tokenizer = tokenization.train_wordpiece([" ".join(words)] * 3, 200, min_frequency=1)
    ce_dir = save_classifier(tmp_path / "ce", tokenizer, 1)
    argv = ["search", "--index", "bm25", "--queries", files["wordy"], "--corpus", files["corpus"]]
    argv += ["--top_k", "6", "--qrels", files["wordy_qrels"]]
    assert main([*argv, "--output", str(tmp_path / "first.jsonl")]) == 0
    reranked = [*argv, "--rerank", ce_dir, "--rerank_top", "6"]
    assert main([*reranked, "--output", str(tmp_path / "second.jsonl")]) == 0
    first, second = read_run(tmp_path / "first.jsonl"), read_run(tmp_path / "second.jsonl")
    for a, b in zip(first, second):
        assert sorted(b["ids"]) == sorted(a["ids"])
        assert b["scores"] == sorted(b["scores"], reverse=True) != a["scores"]
    assert any(a["ids"] != b["ids"] for a, b in zip(first, second))
    record = json.loads((tmp_path / "second.metrics.json").read_text())
    assert record["index"] == "bm25" and record["model"] is None and record["rerank"] == ce_dir


def test_fuse_equals_a_hand_computation(tmp_path):
    """k = 1: a document at rank r of a run adds 1 / (1 + r); one run as Parquet, one as JSONL,
    the second in another query order; q3's two documents tie: the first run's order wins."""
    first = [
        {"query_id": "q1", "ids": ["a", "b", "c"], "scores": [3, 2, 1]},
        {"query_id": "q2", "ids": ["x", "y"], "scores": [2, 1]},
        {"query_id": "q3", "ids": ["p", "r"], "scores": [2, 1]},
    ]
    second = [
        {"query_id": "q3", "ids": ["r", "p"], "scores": [2, 1]},
        {"query_id": "q1", "ids": ["c", "a", "d"], "scores": [3, 2, 1]},
        {"query_id": "q2", "ids": ["y", "z"], "scores": [2, 1]},
    ]
    pq.write_table(pa.Table.from_pylist(first), tmp_path / "a.parquet")
    write_jsonl(tmp_path / "b.jsonl", second)
    for out in ("fused.jsonl", "fused.parquet"):
        argv = ["fuse", "--runs", str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")]
        assert main([*argv, "--k", "1", "--top_k", "3", "--output", str(tmp_path / out)]) == 0
        rows = read_run(tmp_path / out)
        assert [r["query_id"] for r in rows] == ["q1", "q2", "q3"]
        assert [r["ids"] for r in rows] == [["a", "c", "b"], ["y", "x", "z"], ["p", "r"]]
        want = [[1 / 2 + 1 / 3, 1 / 4 + 1 / 2, 1 / 3], [1 / 3 + 1 / 2, 1 / 2, 1 / 3]]
        want.append([1 / 2 + 1 / 3] * 2)
        for got, hand in zip(rows, want):
            np.testing.assert_allclose(got["scores"], hand, rtol=1e-6)


def test_fuse_matches_ids_as_text(tmp_path):
    """`2` in one run and `"2"` in the other are one document, written as the first run has it."""
    write_jsonl(tmp_path / "a.jsonl", [{"query_id": 0, "ids": [1, 2]}])
    write_jsonl(tmp_path / "b.jsonl", [{"query_id": "0", "ids": ["2", "3"]}])
    argv = ["fuse", "--runs", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    assert main([*argv, "--output", str(tmp_path / "fused.jsonl")]) == 0
    (row,) = read_run(tmp_path / "fused.jsonl")
    assert row["query_id"] == 0 and row["ids"] == [2, 1, "3"]
    np.testing.assert_allclose(row["scores"], [1 / 62 + 1 / 61, 1 / 61, 1 / 62], rtol=1e-12)


def test_fuse_with_qrels_scores_as_ranked_scores(files, tmp_path):
    """BM25's run and a hand-made one (every document, in reverse id order) of the search
    tests' queries, fused; qrels by query text, one naming a document of no run."""
    bm25 = tmp_path / "bm25.jsonl"
    argv = ["search", "--index", "bm25", "--queries", files["queries"], "--corpus", files["corpus"]]
    assert main([*argv, "--top_k", "4", "--output", str(bm25)]) == 0
    other = [{"query_id": q, "ids": sorted(DOCS)[::-1][q:], "scores": []} for q in range(5)]
    write_jsonl(tmp_path / "other.jsonl", other)
    out = tmp_path / "fused.jsonl"
    argv = ["fuse", "--runs", str(bm25), str(tmp_path / "other.jsonl"), "--top_k", "100"]
    argv += ["--queries", files["queries"], "--qrels", files["qrels"], "--output", str(out)]
    assert main(argv) == 0
    rows = read_run(out)
    relevant = [{"apple-pie", "bread"}, {"bike-repair"}, {"python-lists"}]
    relevant.append({"moon-landing", "not-in-the-corpus"})
    hits = np.array([[d in relevant[q] for d in rows[q]["ids"][:11]] for q in range(4)])
    want = metrics.ranked_scores(hits, [len(r) for r in relevant], recall_at=(100,))
    got = json.loads((tmp_path / "fused.metrics.json").read_text())
    assert got["num_queries"] == 4 and got["num_queries_without_relevant"] == 1
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    assert len(rows[1]["ids"]) == 14  # the 14 documents of the second run (it lacks one)


def test_a_beir_dataset_searches_as_its_plain_layout(tmp_path):
    """BEIR's files: queries and corpus with `_id`, a corpus `title` (put before the text with a
    space, as BEIR embeds its corpora), qrels as TSV with `query-id`, `corpus-id` and `score`
    (0: not relevant): the same run and scores as the plain layout of the same texts."""
    titles = {"tax-guide": "zakat", "bike-repair": ""}  # a word found in one title only
    beir, plain = tmp_path / "beir", tmp_path / "plain"
    beir.mkdir(), plain.mkdir()
    write_jsonl(beir / "corpus.jsonl", [{"_id": i, "title": titles.get(i, "Doc"), "text": t}
                                        for i, t in DOCS.items()])  # fmt: skip
    write_jsonl(plain / "corpus.jsonl", [{"id": i, "text": f"{titles.get(i, 'Doc')} {t}".strip()}
                                         for i, t in DOCS.items()])  # fmt: skip
    queries = [q["query"] for q in QUERIES] + ["zakat"]
    write_jsonl(
        beir / "queries.jsonl", [{"_id": f"q{n}", "text": q} for n, q in enumerate(queries)]
    )
    write_jsonl(
        plain / "queries.jsonl", [{"id": f"q{n}", "text": q} for n, q in enumerate(queries)]
    )
    lines = ["query-id\tcorpus-id\tscore", "q1\tbike-repair\t1", "q1\tbread\t0", "q5\ttax-guide\t1"]
    (beir / "qrels.tsv").write_text("\n".join(lines) + "\n")
    write_jsonl(plain / "qrels.jsonl", [{"query_id": "q1", "corpus_id": "bike-repair"},
                                        {"query_id": "q5", "corpus_id": "tax-guide"}])  # fmt: skip
    for d, qrels in ((beir, "qrels.tsv"), (plain, "qrels.jsonl")):
        argv = ["search", "--index", "bm25", "--queries", str(d / "queries.jsonl"), "--corpus",
                str(d / "corpus.jsonl"), "--qrels", str(d / qrels), "--output", str(d / "run.jsonl")]  # fmt: skip
        assert main(argv) == 0
    assert read_run(beir / "run.jsonl") == read_run(plain / "run.jsonl")
    rows = read_run(beir / "run.jsonl")
    assert rows[5]["query_id"] == "q5" and rows[5]["ids"][0] == "tax-guide"  # by its title
    files = ("queries", "corpus", "qrels")  # the two layouts' own paths
    scores = [json.loads((d / "run.metrics.json").read_text()) for d in (beir, plain)]
    scores = [{k: v for k, v in got.items() if k not in files} for got in scores]
    assert scores[0] == scores[1] and scores[0]["num_queries"] == 2


@pytest.mark.parametrize(
    "case,flags,message",
    [
        ("one_run", ["--runs", "{d}/a.jsonl"], "--runs: give two or more runs to fuse, got 1"),
        ("queries", ["--runs", "{d}/a.jsonl", "{d}/c.jsonl"], "c.jsonl lacks 1 query id(s) of"),
        ("k", ["--k", "0"], "--k must be at least 1, got 0"),
        ("qrels_alone", ["--qrels", "{d}/a.jsonl"], "--qrels and --queries go together"),
        (
            "other_queries",
            ["--queries", "{d}/three.txt", "--qrels", "{d}/fuse_qrels.jsonl"],
            "a.jsonl lacks 1 query id(s) of --queries",
        ),
        ("columns", ["--runs", "{d}/a.jsonl", "{d}/bad.jsonl"], "no columns 'query_id' and 'ids'"),
        ("bm25_embeddings", ["--index", "bm25", "--corpus", "{d}/emb.parquet"], "embeddings only"),
        ("bm25s", ["--index", "bm25"], "--index bm25: a BM25 index needs bm25s: pip install bm25s"),
        ("model", ["--index", "exact"], "--model is required: --index exact ranks by"),
    ],
)
def test_each_bad_input_is_one_error_line(files, capsys, monkeypatch, case, flags, message):
    d = files["root"]
    write_jsonl(d / "a.jsonl", [{"query_id": 0, "ids": ["x"]}, {"query_id": 1, "ids": ["y"]}])
    write_jsonl(d / "c.jsonl", [{"query_id": 0, "ids": ["x"]}])
    write_jsonl(d / "bad.jsonl", [{"query": 0, "ids": ["x"]}])
    (d / "three.txt").write_text("first\nsecond\nthird\n")  # query ids 0, 1, 2
    write_jsonl(d / "fuse_qrels.jsonl", [{"query_id": 0, "corpus_id": "x"}])
    embedding = pa.FixedSizeListArray.from_arrays(pa.array([0.5, 1.0], pa.float32()), 2)
    pq.write_table(pa.table({"id": ["a"], "embedding": embedding}), d / "emb.parquet")
    if case == "bm25s":
        monkeypatch.setitem(sys.modules, "bm25s", None)  # `import bm25s` raises ImportError
    command = "search" if "--index" in flags else "fuse"
    if command == "search":
        argv = {"--queries": [files["queries"]], "--corpus": [files["corpus"]]}
    else:
        argv = {"--runs": [str(d / "a.jsonl"), str(d / "a.jsonl")]}
    argv["--output"] = [str(d / "run.jsonl")]
    for word in (f.format(d=d) for f in flags):  # each flag with the values after it
        if word.startswith("--"):
            flag = argv[word] = []
        else:
            flag.append(word)
    words = [x for key, values in argv.items() for x in [key, *values]]
    assert main([command, *words]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
