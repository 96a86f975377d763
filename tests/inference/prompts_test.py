"""Prompts and Matryoshka truncation as sentence-transformers applies them: a directory's
`prompts` and `default_prompt_name` (config_sentence_transformers.json) put before each text by
`inference embed` (`--prompt_name`, `--prompt`, else the default) and by `search` (the query and
document prompts, as `encode_query` / `encode_document`), `--truncate_dim` keeping the first
dimensions after normalization; each equal to `SentenceTransformer.encode` within 1e-5, started
as a user starts it (a subprocess, a clean environment), in the one-file and the bulk form; and
the inputs that are refused, each naming the problem."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from bert_jax import cli
from bert_jax.checkpoints.sentence_transformers import (
    read_sentence_transformer,
    resolve_prompt,
    save_sentence_transformer,
)
from bert_jax.embed import mine
from bert_jax.inference import encoder
from bert_jax.inference.__main__ import main as inference_main
from bert_jax.retrieval import pairs
from tests.checkpoints.sentence_transformers_test import TEXTS, _tiny
from tests.commands_test import clean_env
from tests.embed.mining_test import st_mine  # noqa: F401 (a fixture)

PROMPTS = {"query": "search_query: ", "document": "search_document: ", "classification": "c: "}
ROOT = __file__.rsplit("/tests/", 1)[0]


@pytest.fixture(scope="module")
def prompted(bert_tokenizer, tmp_path_factory):
    """A tiny BERT saved as a sentence-transformers directory with mean pooling, normalized,
    with PROMPTS and "classification" as its default prompt."""
    config, params = _tiny(bert_tokenizer, "bert")
    out = tmp_path_factory.mktemp("prompted") / "st"
    save_sentence_transformer(
        out, config, params, tokenizer_dir=bert_tokenizer, pooling="mean", normalize=True,
        max_seq_length=24, prompts=PROMPTS, default_prompt_name="classification",
    )  # fmt: skip
    return out


def _embed(model_dir, tmp_path, *flags, output="emb.npy") -> subprocess.CompletedProcess:
    """`python -m bert_jax.inference embed --model model_dir` of TEXTS, as a user runs it."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    argv = ["embed", "--model", str(model_dir), "--input", str(texts), "--output"]
    argv.append(str(tmp_path / output))
    return subprocess.run(
        [sys.executable, "-m", "bert_jax.inference", *argv, *flags],
        env=clean_env(tmp_path / "home"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_prompts_are_saved_and_read_back(prompted):
    settings = read_sentence_transformer(prompted)
    assert dict(settings.prompts) == PROMPTS and settings.default_prompt_name == "classification"
    st_config = json.loads((prompted / "config_sentence_transformers.json").read_text())
    assert st_config["prompts"] == PROMPTS
    assert resolve_prompt(settings) == "c: "  # the default
    assert resolve_prompt(settings, "query") == "search_query: "
    assert resolve_prompt(settings, "query", prompt="x ") == "x "
    assert resolve_prompt(settings, task="query") == "search_query: "
    assert resolve_prompt(settings, task="document") == "search_document: "
    assert resolve_prompt(None, task="query") == ""


@pytest.mark.torch
def test_embed_with_prompts_and_truncation_as_sentence_transformers(prompted, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(prompted), device="cpu")
    cases = [  # (flags, encode's keyword arguments)
        ((), {}),  # the default prompt
        (("--prompt_name", "query"), {"prompt_name": "query"}),
        (("--prompt", "Represent this: "), {"prompt": "Represent this: "}),
        (("--prompt_name", "document", "--truncate_dim", "8"),
         {"prompt_name": "document", "truncate_dim": 8}),
    ]  # fmt: skip
    for i, (flags, kwargs) in enumerate(cases):
        if i == 0:  # the defaults, as a user runs them: a process of its own
            result = _embed(prompted, tmp_path, *flags, output=f"emb{i}.npy")
            assert result.returncode == 0, result.stderr[-3000:]
        else:  # one step off, in this process (each a subprocess would cost ~10 s)
            argv = ["embed", "--model", str(prompted), "--input", str(tmp_path / "texts.txt")]
            assert inference_main([*argv, "--output", str(tmp_path / f"emb{i}.npy"), *flags]) == 0
        ours = np.load(tmp_path / f"emb{i}.npy")
        theirs = model.encode(TEXTS, **kwargs)
        assert ours.shape == theirs.shape, flags
        np.testing.assert_allclose(ours, theirs, atol=1e-5, err_msg=str(flags))
    # The prompt changes the embeddings: not a test that passes by ignoring it.
    assert not np.allclose(np.load(tmp_path / "emb0.npy"), np.load(tmp_path / "emb1.npy"))
    # Truncated after normalization: not unit length, as encode(truncate_dim=8) gives them.
    assert np.linalg.norm(np.load(tmp_path / "emb3.npy"), axis=-1).max() < 0.999


def test_bulk_embed_keeps_the_prompt_and_refuses_a_rerun_with_another(prompted, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "part.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "emb"
    argv = ["embed", "--model", str(prompted), "--input", str(corpus), "--output", str(out),
            "--no_progress"]  # fmt: skip
    assert inference_main([*argv, "--prompt_name", "query", "--truncate_dim", "8"]) == 0
    table = pq.read_table(next(out.glob("*.parquet")))
    bulk = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    single = encoder.load_for_embedding(str(prompted), prompt_name="query", truncate_dim=8)
    np.testing.assert_allclose(bulk, single.embed(TEXTS), atol=1e-5)
    assert bulk.shape == (len(TEXTS), 8)
    assert inference_main([*argv, "--prompt_name", "query", "--truncate_dim", "8"]) == 0  # done
    assert inference_main([*argv, "--prompt_name", "document", "--truncate_dim", "8"]) == 1


def test_search_puts_the_query_and_document_prompts(prompted, tmp_path, capsys):
    queries, corpus = tmp_path / "queries.jsonl", tmp_path / "corpus.jsonl"
    queries.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:2]))
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "run.jsonl"
    argv = ["search", "--model", str(prompted), "--queries", str(queries), "--corpus", str(corpus),
            "--output", str(out), "--top_k", "4", "--truncate_dim", "16"]  # fmt: skip
    assert inference_main(argv) == 0
    model = encoder.load_for_embedding(str(prompted), prompt="", truncate_dim=16)  # no prompt
    q = model.embed([f"search_query: {t}" for t in TEXTS[:2]])  # encode_query's prompt
    d = model.embed([f"search_document: {t}" for t in TEXTS])  # encode_document's
    q, d = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, d))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row, scores in zip(rows, q @ d.T):
        np.testing.assert_allclose(row["scores"], np.sort(scores)[::-1], atol=1e-5)
        assert row["ids"] == [int(i) for i in np.argsort(-scores, kind="stable")]


def test_bad_prompts_and_dimensions_are_refused(prompted, bert_tokenizer, tmp_path, capsys):
    texts = tmp_path / "t.txt"
    texts.write_text("a\n")
    argv = ["embed", "--model", str(prompted), "--input", str(texts), "--output",
            str(tmp_path / "e.npy")]  # fmt: skip
    for flags, message in [
        (["--prompt_name", "passage"], "--prompt_name 'passage': the model's prompts are"),
        (["--truncate_dim", "0"], "--truncate_dim 0: the embeddings have 32 dimensions"),
        (["--truncate_dim", "33"], "--truncate_dim 33: the embeddings have 32 dimensions"),
    ]:
        assert inference_main([*argv, *flags]) == 1
        assert message in capsys.readouterr().err, flags
    config, params = _tiny(bert_tokenizer, "bert")
    with pytest.raises(ValueError, match="default_prompt_name 'passage' is not one of the"):
        save_sentence_transformer(
            tmp_path / "bad", config, params, tokenizer_dir=bert_tokenizer, pooling="mean",
            normalize=False, max_seq_length=24, prompts=PROMPTS, default_prompt_name="passage",
        )  # fmt: skip
    st_file = prompted / "config_sentence_transformers.json"
    saved = st_file.read_text()
    try:
        st_file.write_text(json.dumps({"prompts": PROMPTS, "default_prompt_name": "x"}))
        with pytest.raises(ValueError, match="default_prompt_name 'x' is not one of the prompts"):
            read_sentence_transformer(prompted)
        st_file.write_text(json.dumps({"prompts": ["query: "]}))
        with pytest.raises(ValueError, match="prompts is \\['query: '\\]; expected texts by name"):
            read_sentence_transformer(prompted)
    finally:
        st_file.write_text(saved)
    pooling_file = prompted / "1_Pooling" / "config.json"
    saved = pooling_file.read_text()
    try:
        pooling_file.write_text(json.dumps({**json.loads(saved), "include_prompt": False}))
        with pytest.raises(ValueError, match="include_prompt false leaves the prompt's tokens"):
            read_sentence_transformer(prompted)
    finally:
        pooling_file.write_text(saved)


@pytest.mark.e2e  # a training run (about 40 s alone)
@pytest.mark.torch
def test_embedding_job_trains_with_prompts_and_exports_them(prompted, tmp_path):
    """From a directory with prompts: "auto" takes its query prompt, a given document prompt
    replaces its own; both are put before the texts in training and saved in the export, where
    `encode_query` and `encode` equal `inference embed` with and without a prompt."""
    st = pytest.importorskip("sentence_transformers")
    from bert_jax.embed import run as embed_run
    from tests.embed.embed_test import embed_config, make_pair_files

    data = make_pair_files(tmp_path)
    config = embed_config(
        data, **{"init_from": str(prompted), "embed.tokenizer": "", "embed.num_epochs": 1,
                 "embed.document_prompt": "passage: "},
    )  # fmt: skip
    start = embed_run.starting_point(config, embed_run.check_config(config))
    assert (start.query_prompt, start.document_prompt) == ("search_query: ", "passage: ")
    shown = start.prompted(pairs.Pairs(["a"], ["p"], [("n",)], "x"))
    assert (shown.anchors, shown.positives, shown.negatives) == (
        ["search_query: a"], ["passage: p"], [("passage: n",)]
    )  # fmt: skip
    embed_run.train_and_evaluate(config, str(tmp_path / "run"))
    hf = tmp_path / "run" / "hf"
    settings = read_sentence_transformer(hf)
    assert dict(settings.prompts) == {**PROMPTS, "document": "passage: "}
    assert settings.default_prompt_name == "classification"
    assert "'search_query: ' before each query" in (hf / "README.md").read_text()
    model = st.SentenceTransformer(str(hf), device="cpu")
    for kwargs, theirs in (
        ({"prompt_name": "query"}, model.encode_query(TEXTS)),
        ({"prompt_name": "document"}, model.encode_document(TEXTS)),
        ({}, model.encode(TEXTS)),  # the default prompt
        ({"prompt": ""}, model.encode(TEXTS, prompt="")),  # none
    ):
        ours = encoder.load_for_embedding(str(hf), **kwargs).embed(TEXTS)
        np.testing.assert_allclose(ours, theirs, atol=1e-5, err_msg=str(kwargs))


def test_prompts_round_trip_through_a_bucket(fake_bucket, bert_tokenizer):
    """Saved to gs:// and read back from there, the prompts and the default are kept."""
    from tests.conftest import BUCKET

    config, params = _tiny(bert_tokenizer, "bert")
    url = f"{BUCKET}/prompted"
    save_sentence_transformer(
        url, config, params, tokenizer_dir=bert_tokenizer, pooling="mean", normalize=True,
        max_seq_length=24, prompts=PROMPTS, default_prompt_name="query",
    )  # fmt: skip
    settings = read_sentence_transformer(url)
    assert dict(settings.prompts) == PROMPTS and settings.default_prompt_name == "query"
    assert encoder.load_for_embedding(url).options.prompt == "search_query: "


@pytest.mark.torch
def test_mining_puts_the_query_and_document_prompts_as_sentence_transformers(
    prompted,
    tmp_path,
    capsys,
    st_mine,  # noqa: F811
):
    """`embed.mine` on a directory with prompts mines what `mine_hard_negatives` mines from
    `SentenceTransformer` of it (anchors after the query prompt, candidates after the document
    prompt), and the prompt flags as its arguments; the rows hold the texts without prompts."""
    st = pytest.importorskip("sentence_transformers")
    words = "fair foul fog air night day king crown sword blood ghost grave".split()
    anchors = [f"{a} and {b}" for a, b in zip(words, words[3:] + words[:3])]
    positives = [f"the {b} of {a}" for a, b in zip(words, words[5:] + words[:5])]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n"
                             for a, p in zip(anchors, positives)))  # fmt: skip
    model = st.SentenceTransformer(str(prompted), device="cpu")
    found = {}
    for name, flags, theirs in [
        ("prompts", [], {}),  # the defaults, as a user starts the command
        ("named", ["--query_prompt_name", "classification", "--corpus_prompt", "d: "],
         dict(query_prompt_name="classification", corpus_prompt="d: ")),
        ("none", ["--query_prompt", "", "--corpus_prompt", ""],
         dict(query_prompt="", corpus_prompt="")),
    ]:  # fmt: skip
        out = tmp_path / f"{name}.jsonl"
        argv = ["--model", str(prompted), "--pairs", str(train), "--output", str(out),
                "--num_negatives", "2", *flags]  # fmt: skip
        if flags:  # the flags in this process (a subprocess each costs seconds)
            assert cli.run(mine.main, argv) == 0
        else:
            done = subprocess.run([sys.executable, "-m", "bert_jax.embed.mine", *argv],
                                  env=clean_env(tmp_path), capture_output=True, text=True,
                                  timeout=300, cwd=ROOT)  # fmt: skip
            assert done.returncode == 0, done.stderr
        ours = pairs.read_pairs(out)
        found[name] = list(zip(ours.anchors, ours.positives, ours.negatives))
        assert found[name] == st_mine(anchors, positives, model, num_negatives=2, **theirs)
    assert found["prompts"] != found["none"]  # the prompts changed what was mined
    assert set(found["prompts"][0][2]) <= set(positives)
    bad = ["--model", str(prompted), "--pairs", str(train), "--output", str(tmp_path / "x.jsonl"),
           "--query_prompt_name", "qq"]  # fmt: skip
    assert cli.run(mine.main, bad) == 1
    assert "error: --query_prompt_name 'qq'" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
