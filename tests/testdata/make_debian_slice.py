"""Writes tests/testdata/debian_slice/: a small slice of the Debian package search set
(../shared/data/debian_packages; `python -m bert_jax.retrieval.debian_packages` rebuilds it from
Debian's Translation-en) in the set's four files, for the tests and the tiny retrieval loop
(benchmarks/debian_loop.py --tiny), since a clone of the project has no ../shared.

    python tests/testdata/make_debian_slice.py [--source ../shared/data/debian_packages]

The slice: the first 96 training pairs, the first 24 dev queries with their qrels, and a corpus
of their 120 documents and the 80 held-out documents that come first in the corpus (name
order), 200 in all, in the corpus's order. Descriptions are Debian's (DFSG-free text).
"""

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN, DEV, HELD_OUT = 96, 24, 80


def _read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _write(rows, path):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = os.path.join(HERE, "..", "..", "..", "shared", "data", "debian_packages")
    parser.add_argument("--source", default=os.path.normpath(default))
    args = parser.parse_args()
    src = lambda name: _read(os.path.join(args.source, name))  # noqa: E731
    train, dev, qrels, corpus = (
        src(n) for n in ("train.jsonl", "dev.jsonl", "dev_qrels.jsonl", "corpus.jsonl")
    )
    train, dev, qrels = train[:TRAIN], dev[:DEV], qrels[:DEV]
    wanted = {r["positive"] for r in train + dev}
    answered = {r["positive"] for r in src("train.jsonl") + src("dev.jsonl")}
    held = [r["text"] for r in corpus if r["text"] not in answered][:HELD_OUT]
    wanted |= set(held)
    out = os.path.join(HERE, "debian_slice")
    os.makedirs(out, exist_ok=True)
    _write(train, os.path.join(out, "train.jsonl"))
    _write(dev, os.path.join(out, "dev.jsonl"))
    _write(qrels, os.path.join(out, "dev_qrels.jsonl"))
    _write([r for r in corpus if r["text"] in wanted], os.path.join(out, "corpus.jsonl"))


if __name__ == "__main__":
    main()
