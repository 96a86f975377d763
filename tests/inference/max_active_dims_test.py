"""`--max_active_dims`: a SPLADE vector's largest weights kept, as sentence-transformers'
`SparseEncoder.encode(max_active_dims=K)` keeps them (the flag, or the SparseEncoder directory's
config_sentence_transformers.json), in `embed --sparse` (one file and the bulk job) and in
`search --index sparse`; and the refusals of a count that is none."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from bert_jax.checkpoints.sentence_transformers import (
    read_sentence_transformer,
    save_sentence_transformer,
)
from bert_jax.inference import encoder
from bert_jax.inference.__main__ import main
from bert_jax.retrieval import metrics as retrieval
from tests.commands_test import ROOT, clean_env
from tests.embed.embed_test import WORDS
from tests.embed.splade_test import tiny_export

TEXTS = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + i % 5)) for i in range(12)]


def test_keeping_the_largest_weights_equals_sentence_transformers():
    """`keep_max_active_dims` against `select_max_active_dims`: weights with zeros among them,
    counts below, at and beyond the vector's width and its non-zero weights."""
    util = pytest.importorskip("sentence_transformers.util")
    rng = np.random.default_rng(0)
    vectors = rng.random((6, 40)).astype(np.float32) * (rng.random((6, 40)) > 0.5)
    vectors[0] = 0.0  # no active dimension
    for k in (1, 3, 17, 40, 64):
        ours = encoder.keep_max_active_dims(vectors, "splade", k)
        theirs = util.select_max_active_dims(vectors, k).numpy()
        np.testing.assert_array_equal(ours, theirs)
        assert ((ours != 0).sum(-1) <= k).all()
    assert encoder.keep_max_active_dims(vectors, "splade", None) is vectors
    for pooling, k, message in (
        ("splade", 0, "--max_active_dims must be at least 1, got 0"),
        ("splade", 2.5, "--max_active_dims must be an integer, got 2.5"),
        ("mean", 4, "--max_active_dims keeps a SPLADE vector's largest weights"),
    ):
        with pytest.raises(ValueError, match=message):
            encoder.keep_max_active_dims(vectors, pooling, k)


def _set_max_active_dims(directory, value) -> None:
    path = directory / "config_sentence_transformers.json"
    config = json.loads(path.read_text())
    config["max_active_dims"] = value
    path.write_text(json.dumps(config))


@pytest.mark.torch
def test_the_directorys_count_and_the_flags_encode_as_sparse_encoder(tmp_path, capsys):
    """A SparseEncoder directory saying max_active_dims 3: `load_for_embedding(DIR).embed`
    equals `SparseEncoder(DIR).encode`; `embed --sparse --max_active_dims 5` (one file and the
    bulk job's Parquet) equals `encode(max_active_dims=5)`, and `search` over that Parquet ranks
    as over the texts (a search with another count is warned of); an inference-free model's
    queries keep theirs too."""
    st = pytest.importorskip("sentence_transformers")
    hf, tokenizer = tiny_export(tmp_path)
    full = encoder.load_for_embedding(str(hf)).embed(TEXTS)
    assert ((full != 0).sum(-1) > 5).all()  # a random head: every vector has more than 5
    _set_max_active_dims(hf, 3)
    assert read_sentence_transformer(hf).max_active_dims == 3
    ours = encoder.load_for_embedding(str(hf)).embed(TEXTS)
    model = st.SparseEncoder(str(hf), device="cpu")
    assert model.max_active_dims == 3
    theirs = model.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert ((ours != 0).sum(-1) == 3).all()
    probe = encoder.load_for_embedding(str(hf), pooling="mean")  # the count is SPLADE's only
    assert probe.options.max_active_dims is None and probe.embed(TEXTS).shape[1] == 32

    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "five.npy"
    main(["embed", "--sparse", "--max_active_dims", "5", "--model", str(hf),
          "--input", str(tmp_path / "texts.txt"), "--output", str(out)])  # fmt: skip
    want = model.encode(TEXTS, max_active_dims=5, convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(np.load(out), want, atol=1e-5)
    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    main(["embed", "--sparse", "--max_active_dims", "5", "--model", str(hf),
          "--input", str(tmp_path / "corpus.jsonl"), "--text_column=text", "--id_column=id",
          "--output", str(tmp_path / "emb")])  # fmt: skip
    table = pq.read_table(next((tmp_path / "emb").glob("*.parquet")))
    np.testing.assert_allclose(np.array(table.column("embedding").to_pylist()), want, atol=1e-5)
    # search over that corpus: the queries cut as the documents were, else a warning names it
    (tmp_path / "q.txt").write_text("\n".join(TEXTS[:4]) + "\n")
    runs = []
    for corpus, flags in (
        ("emb", ["--max_active_dims", "5"]),
        ("corpus.jsonl", ["--max_active_dims", "5"]),
        ("emb", []),
    ):
        out = tmp_path / f"{corpus}{len(flags)}.jsonl"
        argv = ["--model", str(hf), "--queries", str(tmp_path / "q.txt"), "--output", str(out)]
        main(["search", "--index", "sparse", *flags, *argv, "--corpus", str(tmp_path / corpus)])
        runs.append(
            ([json.loads(line) for line in out.read_text().splitlines()], capsys.readouterr().err)
        )
    assert [r["ids"] for r in runs[0][0]] == [r["ids"] for r in runs[1][0]]
    assert "max_active_dims" not in runs[0][1]
    assert (
        "the corpus was embedded with max_active_dims=5; this search embeds documents with max_active_dims=3"
        in runs[2][1]
    )

    routed = tmp_path / "inference_free"
    weights = np.random.default_rng(0).random(tokenizer.vocab_size).astype(np.float32)
    config = encoder.loading.load_embedder(str(hf))
    save_sentence_transformer(
        routed, config[0], config[1], tokenizer_dir=tokenizer, pooling="splade",
        normalize=False, max_seq_length=16, query_weights=weights,
    )  # fmt: skip
    _set_max_active_dims(routed, 2)
    theirs = st.SparseEncoder(str(routed), device="cpu")
    for task, encode in (("query", theirs.encode_query), ("document", theirs.encode_document)):
        got = encoder.load_for_embedding(str(routed)).for_task(task).embed(TEXTS)
        want = encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert ((got != 0).sum(-1) <= 2).all()


def test_search_keeps_the_count_and_finds_numpys_top_10(tmp_path):
    """`search --index sparse --max_active_dims 4`, run as a user runs it (a subprocess, a clean
    environment): the top 10 and scores of numpy's dot products of the 4-weight vectors."""
    hf, _ = tiny_export(tmp_path)
    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "q.txt").write_text("\n".join(TEXTS[:5]) + "\n")
    out = tmp_path / "run.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.inference", "search", "--index", "sparse",
         "--max_active_dims", "4", "--model", str(hf), "--queries", str(tmp_path / "q.txt"),
         "--corpus", str(tmp_path / "corpus.jsonl"), "--output", str(out)],
        env=clean_env(tmp_path, PYTHONPATH=ROOT), cwd=tmp_path, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    vectors = encoder.load_for_embedding(str(hf), max_active_dims=4).embed(TEXTS)
    assert ((vectors != 0).sum(-1) == 4).all()
    dots = vectors[:5].astype(np.float64) @ vectors.T.astype(np.float64)
    want = retrieval.top_k(dots, 10)
    found = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["ids"] for r in found] == [[f"d{i}" for i in row] for row in want]
    scores = np.array([r["scores"] for r in found])
    np.testing.assert_allclose(scores, np.take_along_axis(dots, want, 1), rtol=1e-5)


def test_a_count_that_is_none_is_one_error_line(tmp_path, capsys):
    """0, a dense model's embeddings, and a directory's count that is not a positive integer."""
    hf, _ = tiny_export(tmp_path)
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    common = ["--model", str(hf), "--input", str(tmp_path / "texts.txt")]
    for argv, message in (
        (["--sparse", "--max_active_dims", "0"], "--max_active_dims must be at least 1, got 0"),
        (["--pooling", "mean", "--max_active_dims", "4"], "pooling gives dense embeddings"),
    ):
        assert main(["embed", *argv, *common, "--output", str(tmp_path / "x.npy")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[-1], err
    assert not (tmp_path / "x.npy").exists()
    _set_max_active_dims(hf, "many")
    assert main(["embed", "--sparse", *common, "--output", str(tmp_path / "x.npy")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "config_sentence_transformers.json: max_active_dims is 'many'" in err[-1], err


def test_splade_pooling_of_a_dense_directory_is_not_normalized_by_its_normalize():
    """A dense sentence-transformers directory's Normalize belongs to its dense pooling: probed
    with SPLADE pooling (`search --index sparse`, `embed --sparse`) its vectors are not
    normalized, so the run meets the real mistake (no masked-LM head), not a refusal of a
    --normalize the user never gave; a --normalize given with SPLADE is still refused."""
    from bert_jax.checkpoints.sentence_transformers import SentenceTransformerSettings

    dense = SentenceTransformerSettings("mean", True, 256)
    options, warnings = encoder.embedding_options(dense, pooling="splade")
    assert (options.pooling, options.normalize) == ("splade", False)
    assert len(warnings) == 1 and "pooling='splade' overrides it" in warnings[0]
    assert encoder.embedding_options(dense)[0].normalize is True
    given, _ = encoder.embedding_options(dense, pooling="splade", normalize=True)
    with pytest.raises(ValueError, match="take neither --layers nor --normalize"):
        encoder.check_splade_options(None, given.normalize)
