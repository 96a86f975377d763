"""`python -m bert_jax.inference rerank`: a cross-encoder's scores of (query, passage) pairs equal
`sentence_transformers.CrossEncoder(DIR).predict` (Sigmoid and Identity directories saved by
sentence-transformers itself); the bulk job in a clean subprocess over Parquet shards, a rerun
with other settings refused; a model of 3 labels and a null passage refused."""

import json
import os
import subprocess

import flax.linen as nn
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_jax import convert, inference, tokenization
from bert_jax.inference.__main__ import main
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.params import init_params
from tests.inference.bulk_inference_test import FLAGS, ROOT, WORDS, cli
from tests.train_test import env

HEAD = "BertForSequenceClassification"


def save_classifier(path, tokenizer, num_labels: int) -> str:
    """A tiny random BERT classifier saved as transformers saves it, with its tokenizer; weights
    drawn wide (initializer_range 0.2, ten times BERT's) so that pairs' logits differ well beyond
    rounding (at 0.5, logits near 1 differed from torch's by up to 1.7e-5 in float32)."""
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
        initializer_range=0.2, num_labels=num_labels,
    )  # fmt: skip
    params = init_params(get_model_class(HEAD)(config), jax.random.PRNGKey(1))
    convert.save_pytorch(config, jax.device_get(nn.meta.unbox(params)), path, HEAD)
    tokenizer.save(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{"one": a num_labels=1 transformers directory, "three": a 3-label one}."""
    root = tmp_path_factory.mktemp("rerank_models")
    tokenizer = tokenization.train_wordpiece([" ".join(WORDS)] * 3, 60, min_frequency=1)
    return {
        "one": save_classifier(root / "one", tokenizer, 1),
        "three": save_classifier(root / "three", tokenizer, 3),
    }


def make_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """n queries of 1 to 3 words and n passages of 2 to 8 (rows of two length buckets: few
    compiles)."""
    rng = np.random.default_rng(seed)
    queries = [" ".join(rng.choice(WORDS, rng.integers(1, 4))) for _ in range(n)]
    return queries, [" ".join(rng.choice(WORDS, rng.integers(2, 9))) for _ in range(n)]


def write_pairs(path, ids, queries, passages):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = pa.table({"id": pa.array(ids, pa.int64()), "q": queries, "p": passages})
    pq.write_table(table, path)


def rerank_argv(model, inputs, out, *extra):
    return ["rerank", "--model", model, "--input", str(inputs), "--output", str(out), *FLAGS,
            "--query_column=q", "--text_column=p", *extra]  # fmt: skip


@pytest.mark.torch
@pytest.mark.parametrize("activation", ["Sigmoid", "Identity"])
def test_scores_equal_cross_encoder_predict(models, tmp_path, activation, capsys):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers")
    ce_dir = str(tmp_path / "ce")
    fn = getattr(torch.nn, activation)()
    st.CrossEncoder(models["one"], activation_fn=fn, device="cpu").save_pretrained(ce_dir)
    queries, passages = make_pairs(17, seed=3)
    expected = st.CrossEncoder(ce_dir, device="cpu").predict(list(zip(queries, passages)))
    # The folder form, over one Parquet shard.
    write_pairs(str(tmp_path / "in" / "pairs.parquet"), list(range(17)), queries, passages)
    argv = rerank_argv(ce_dir, tmp_path / "in", tmp_path / "out", "--id_column=id")
    assert main(argv) == 0, capsys.readouterr().err
    table = pq.read_table(tmp_path / "out" / "pairs.parquet")
    assert table.column_names == ["id", "score"]
    assert table.schema.field("score").type == pa.float32()
    meta = json.loads(table.schema.metadata[b"bert_jax"])
    assert meta["activation"] == activation.lower()
    got = table.column("score").to_numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # The one-file form: a query, a tab and its passage a line.
    (tmp_path / "pairs.txt").write_text("".join(f"{q}\t{p}\n" for q, p in zip(queries, passages)))
    argv = ["rerank", "--model", ce_dir, "--input", str(tmp_path / "pairs.txt"), *FLAGS]
    assert main([*argv, "--output", str(tmp_path / "scores.npy")]) == 0, capsys.readouterr().err
    np.testing.assert_allclose(np.load(tmp_path / "scores.npy"), expected, atol=1e-5, rtol=0)
    worst = float(np.abs(got - expected).max())
    print(f"{activation}: worst difference to CrossEncoder.predict {worst:.2e}")


def test_bulk_in_a_clean_subprocess_then_other_settings_refused(models, tmp_path, capsys):
    shards = {"a/part-0.parquet": (0, 9), "b/part-1.parquet": (9, 23)}
    queries, passages = make_pairs(23, seed=7)
    for name, (lo, hi) in shards.items():
        ids = list(range(lo, hi))
        write_pairs(str(tmp_path / "in" / name), ids, queries[lo:hi], passages[lo:hi])
    out = tmp_path / "out"
    argv = rerank_argv(models["one"], tmp_path / "in", out, "--id_column=id")
    e = {k: v for k, v in env().items() if not k.startswith("HF_")}
    e["HOME"] = str(tmp_path / "home")  # nothing cached or configured
    os.makedirs(e["HOME"])
    proc = subprocess.run(cli(*argv), env=e, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rerank: 23 rows" in proc.stdout and "2 shard(s) written" in proc.stdout
    got = {}
    for name in shards:
        table = pq.read_table(out / name)
        assert table.column_names == ["id", "score"]
        got.update(zip(table.column("id").to_pylist(), table.column("score").to_pylist()))
    assert sorted(got) == list(range(23))
    # A plain transformers directory names no activation: CrossEncoder's default, the sigmoid.
    config, params, head, tokenizer = inference.load(models["one"])
    logits = np.array(
        [
            r["score"]
            for r in inference.predict(
                config, params, head, tokenizer, queries, passages, max_seq_length=64
            )
        ]
    )
    np.testing.assert_allclose([got[i] for i in range(23)], 1 / (1 + np.exp(-logits)), atol=1e-6)
    assert np.ptp(logits) > 0.1  # pairs differ: a swapped row would show
    # The same folder with another query column: refused, naming the setting; nothing rewritten.
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    changed = rerank_argv(models["one"], tmp_path / "in", out, "--id_column=id")
    changed[changed.index("--query_column=q")] = "--query_column=p"
    assert main(changed) == 1
    assert "query_column: 'q' before, 'p' now" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")} == mtimes


def test_a_model_of_three_labels_is_refused(models, tmp_path, capsys):
    write_pairs(str(tmp_path / "in" / "x.parquet"), [0], ["a b"], ["c d"])
    assert main(rerank_argv(models["three"], tmp_path / "in", tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert "num_labels=3" in err and "use `predict`" in err
    assert not (tmp_path / "out").exists()  # refused before anything is written
    (tmp_path / "pairs.txt").write_text("a b\tc d\n")
    argv = ["rerank", "--model", models["three"], "--input", str(tmp_path / "pairs.txt")]
    assert main([*argv, "--output", str(tmp_path / "s.jsonl")]) == 1
    assert "num_labels=3" in capsys.readouterr().err


def test_a_null_passage_is_refused_naming_the_row(models, tmp_path, capsys):
    write_pairs(str(tmp_path / "in" / "x.parquet"), [5, 6, 7], ["a", "b", "c"], ["d", None, "f"])
    out = tmp_path / "out"
    assert main(rerank_argv(models["one"], tmp_path / "in", out, "--id_column=id")) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'in' / 'x.parquet'}: row 1 (id 6) has a null in column 'p'" in err
    assert not list(out.glob("*.parquet"))
    # The one-file form needs a tab on every line.
    (tmp_path / "pairs.txt").write_text("a\tb\nno tab here\n")
    argv = ["rerank", "--model", models["one"], "--input", str(tmp_path / "pairs.txt")]
    assert main([*argv, "--output", str(tmp_path / "s.jsonl")]) == 1
    assert "line 2 has no tab" in capsys.readouterr().err
