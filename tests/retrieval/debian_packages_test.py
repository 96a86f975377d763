"""The Debian package search set rebuilt from a Translation-en file
(`python -m bert_jax.retrieval.debian_packages`): its rules on a small file written here, the
command in a clean subprocess, and, where the released set is on disk
(../shared/data/debian_packages), its four files reproduced exactly from a Translation-en
written back from them."""

import bz2
import json
import lzma
import os
import pathlib
import re
import subprocess
import sys

import pytest

from bert_jax.retrieval import debian_packages

ROOT = pathlib.Path(__file__).resolve().parents[2]
RELEASED = ROOT.parent / "shared" / "data" / "debian_packages"
LONG = "a description long enough to be kept, which says what the package holds and does"


def stanza(package: str, synopsis: str, *paragraphs: str, width: int = 70) -> str:
    """A Translation-en stanza: each paragraph on lines of about `width` characters, broken at
    single spaces between words (Debian's text has runs of spaces, which a break would lose),
    never before a lone "." (a line of one "." parts paragraphs)."""
    body = []
    for i, paragraph in enumerate(paragraphs):
        if i:
            body.append(" .")
        line = []
        for word in re.split(r"(?<=\S) (?=\S)", paragraph):
            if line and len(" ".join([*line, word])) > width and word != ".":
                body.append(" " + " ".join(line))
                line = []
            line.append(word)
        body.append(" " + " ".join(line))
    head = [
        f"Package: {package}",
        "Description-md5: 0123456789abcdef",
        f"Description-en: {synopsis}",
    ]
    return "\n".join(head + body) + "\n\n"


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def small_file(tmp_path, opener=open, name="Translation-en") -> str:
    kept = [
        stanza(f"pkg{i}", f"tool number {i}", f"{LONG} {i}.", f"Second part {i}.") for i in range(9)
    ]
    dropped = [
        stanza("pkg0", "a second stanza of pkg0", f"{LONG} again."),  # not its first
        stanza("short", "too short", "Eighty characters are needed."),  # < 80 characters
        stanza("same-a", "Shared Synopsis", f"{LONG} a."),  # synopsis twice, case-folded
        stanza("same-b", "shared synopsis", f"{LONG} b."),
        stanza("open-a", "first of two", f"{LONG} twice.", "Then its own."),  # first paragraph
        stanza("open-b", "second of two", f"{LONG.upper()} TWICE.", "Then another."),
    ]
    path = str(tmp_path / name)
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("".join(kept[:4] + dropped + kept[4:]))
    return path


@pytest.mark.parametrize(
    "opener,name", [(open, "Translation-en"), (lzma.open, "T.xz"), (bz2.open, "T.bz2")]
)
def test_rules_on_a_small_file(tmp_path, opener, name):
    rows = debian_packages.build(small_file(tmp_path, opener, name), held_out=2, dev=3)
    corpus = rows["corpus.jsonl"]
    assert [r["id"] for r in corpus] == [f"pkg{i}" for i in range(9)]  # name order, 9 kept
    assert corpus[0]["text"] == f"{LONG} 0.\nSecond part 0."  # lines joined, paragraphs by \n
    assert len(rows["dev.jsonl"]) == len(rows["dev_qrels.jsonl"]) == 3
    assert len(rows["train.jsonl"]) == 9 - 2 - 3
    order = sorted((r["id"] for r in corpus), key=debian_packages._name_hash)
    assert [r["id"] for r in rows["dev_qrels.jsonl"]] == order[2:5]
    text = {r["id"]: r["text"] for r in corpus}
    for pair, qrel in zip(rows["dev.jsonl"], rows["dev_qrels.jsonl"]):
        assert pair == {"query": qrel["query"], "positive": text[qrel["id"]]}
    assert [r["positive"] for r in rows["train.jsonl"]] == [text[n] for n in order[5:]]


def test_too_few_packages_and_bad_sizes_name_the_problem(tmp_path):
    path = small_file(tmp_path)
    with pytest.raises(ValueError, match="9 packages kept; the split needs more than 4000"):
        debian_packages.build(path)
    with pytest.raises(ValueError, match="dev must be >= 0, got -1"):
        debian_packages.build(path, held_out=2, dev=-1)
    bad = tmp_path / "bad"
    bad.write_text("Description-en: no package\n a long line\n\n")
    with pytest.raises(ValueError, match=r"bad:1: a stanza with Description-en but no Package"):
        debian_packages.build(str(bad), held_out=0, dev=0)


def _command(*argv) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run(
        [sys.executable, "-m", "bert_jax.retrieval.debian_packages", *argv],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip


def test_command_writes_the_files_and_keeps_what_is_there(tmp_path):
    path, out = small_file(tmp_path), tmp_path / "set"
    flags = ["--translation", path, "--out_dir", str(out), "--held_out", "1", "--dev", "2"]
    proc = _command(*flags)
    assert proc.returncode == 0, proc.stderr
    assert "train.jsonl 6, dev.jsonl 2, dev_qrels.jsonl 2, corpus.jsonl 9" in proc.stdout
    before = {name: (out / name).read_text() for name in debian_packages.FILES}
    again = _command(*flags[:-1], "3")
    assert again.returncode == 1 and "already holds" in again.stderr
    assert "--overwrite" in again.stderr
    assert {name: (out / name).read_text() for name in debian_packages.FILES} == before
    assert _command(*flags[:-1], "3", "--overwrite").returncode == 0
    assert len(jsonl(out / "dev.jsonl")) == 3
    missing = _command("--translation", str(tmp_path / "nowhere.xz"), "--out_dir", str(out))
    assert missing.returncode == 1 and "nowhere.xz" in missing.stderr


@pytest.mark.skipif(not RELEASED.is_dir(), reason="the released set is not on this machine")
def test_the_released_set_is_reproduced(tmp_path):
    """A Translation-en written back from the released files (held-out packages get synopses
    of their own, since no file holds theirs), in a shuffled order, rebuilds them exactly."""
    corpus = jsonl(RELEASED / "corpus.jsonl")
    synopsis = {r["id"]: r["query"] for r in jsonl(RELEASED / "dev_qrels.jsonl")}
    by_text = {r["text"]: r["id"] for r in corpus}
    synopsis.update({by_text[r["positive"]]: r["query"] for r in jsonl(RELEASED / "train.jsonl")})
    stanzas = [
        stanza(r["id"], synopsis.get(r["id"], f"held out {r['id']}"), *r["text"].split("\n"))
        for r in corpus
    ]
    path = tmp_path / "Translation-en"
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(sorted(stanzas, key=debian_packages._name_hash)))
    out = tmp_path / "set"
    proc = _command("--translation", str(path), "--out_dir", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in debian_packages.FILES:
        assert (out / name).read_bytes() == (RELEASED / name).read_bytes(), name
