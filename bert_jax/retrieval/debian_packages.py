"""Debian package search, rebuilt from Debian's published package descriptions.

    python -m bert_jax.retrieval.debian_packages \\
        --translation Translation-en.xz --out_dir data/debian_packages
    # -> train.jsonl (query, positive), dev.jsonl (query, positive),
    #    dev_qrels.jsonl (query, id), corpus.jsonl (id, text)

The input is a release's `main/i18n/Translation-en` (plain, `.xz`, `.bz2` or `.gz`; bookworm's
for the set the docs record), stanzas of `Package:`, `Description-md5:` and `Description-en:`
whose first line is the package's synopsis and whose indented lines are its long description,
paragraphs parted by a line " .". The set (its rules are `build`'s):

  query     a package's synopsis (the first line of Description-en)
  document  its long description: each paragraph's lines joined by a space, paragraphs by a
            newline, the " ." separators gone; its id the package's name

  kept      the first stanza of each package; of those, the packages whose synopsis and whose
            first paragraph are unique (case-folded) among them all, and whose description is at
            least `MIN_CHARS` characters: each query has one relevant document, and no copy of
            it stands under another name
  split     by the SHA-256 of the package's name (hex order): the first `HELD_OUT` packages are
            held out (their documents stay in the corpus, their queries are in no file, as an
            index holds documents no training query points to), the next `DEV` are dev, the
            rest train; dev and train rows in that order, the corpus in name order

Applied to bookworm's Translation-en this gives 26,759 training pairs, 2,000 dev queries and a
corpus of 30,759 descriptions: docs/inference.md's table. Host-side, standard library only.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import json
import lzma
import os
import sys
from collections import Counter
from collections.abc import Iterator

from bert_jax.paths import file_in_place_of_folder

MIN_CHARS = 80  # the shortest description kept (characters, after joining)
HELD_OUT = 2000  # packages whose queries no file holds
DEV = 2000  # dev queries
FILES = ("train.jsonl", "dev.jsonl", "dev_qrels.jsonl", "corpus.jsonl")
_OPENERS = {".xz": lzma.open, ".bz2": bz2.open, ".gz": gzip.open}


def stanzas(path: str) -> Iterator[tuple[str, str, list[str]]]:
    """(package, synopsis, paragraphs) of each stanza of a Translation-en file with a
    `Description-en` field, in file order; ValueError naming the line of a stanza that has a
    description but no `Package`."""
    opener = _OPENERS.get(os.path.splitext(path)[1], open)
    with opener(path, "rt", encoding="utf-8") as f:
        fields: dict[str, object] = {}
        start = 1
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                yield from _stanza(path, start, fields)
                fields, start = {}, number + 1
            elif line.startswith(" ") and "long" in fields:
                fields["long"].append(line[1:])
            elif ":" in line and not line.startswith(" "):
                key, _, value = line.partition(":")
                if key == "Description-en":
                    fields["synopsis"], fields["long"] = value.strip(), []
                else:
                    fields[key] = value.strip()
        yield from _stanza(path, start, fields)


def _stanza(path: str, line: int, fields: dict) -> Iterator[tuple[str, str, list[str]]]:
    if "synopsis" not in fields:
        return
    if not fields.get("Package"):
        raise ValueError(f"{path}:{line}: a stanza with Description-en but no Package")
    paragraphs, lines = [], []
    for text in [*fields["long"], "."]:
        if text.strip() == ".":
            if lines:
                paragraphs.append(" ".join(lines))
            lines = []
        elif text.strip():
            lines.append(text.strip())
    yield fields["Package"], fields["synopsis"], paragraphs


def _name_hash(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def build(path: str, held_out: int = HELD_OUT, dev: int = DEV) -> dict[str, list[dict]]:
    """The set's four files' rows from a Translation-en file (the module's rules), by file
    name; `held_out` and `dev` packages split off first (the released set's sizes by default).
    ValueError where too few packages are kept for those splits and a training one."""
    for name, value in (("held_out", held_out), ("dev", dev)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    first: dict[str, tuple[str, list[str]]] = {}
    for package, synopsis, paragraphs in stanzas(path):
        first.setdefault(package, (synopsis, paragraphs))
    synopses = Counter(s.casefold() for s, _ in first.values())
    openings = Counter(p[0].casefold() for _, p in first.values() if p)
    kept = {
        package: (synopsis, "\n".join(paragraphs))
        for package, (synopsis, paragraphs) in first.items()
        if paragraphs
        and synopses[synopsis.casefold()] == 1
        and openings[paragraphs[0].casefold()] == 1
        and len("\n".join(paragraphs)) >= MIN_CHARS
    }
    if len(kept) <= held_out + dev:
        raise ValueError(
            f"{path}: {len(kept)} packages kept; the split needs more than {held_out + dev}"
            f" ({held_out} held out, {dev} dev): is it a release's whole Translation-en?"
        )
    order = sorted(kept, key=_name_hash)
    dev_names, train = order[held_out : held_out + dev], order[held_out + dev :]
    pairs = lambda names: [{"query": kept[n][0], "positive": kept[n][1]} for n in names]  # noqa: E731
    return {
        "train.jsonl": pairs(train),
        "dev.jsonl": pairs(dev_names),
        "dev_qrels.jsonl": [{"query": kept[n][0], "id": n} for n in dev_names],
        "corpus.jsonl": [{"id": n, "text": kept[n][1]} for n in sorted(kept)],
    }


def write(rows: dict[str, list[dict]], out_dir: str, overwrite: bool = False) -> None:
    """Writes the files into `out_dir`; an existing one is replaced only with `overwrite`
    (FileExistsError naming it otherwise, before anything is written)."""
    os.makedirs(out_dir, exist_ok=True)
    existing = [name for name in rows if os.path.exists(os.path.join(out_dir, name))]
    if existing and not overwrite:
        raise FileExistsError(f"{out_dir} already holds {existing}; pass --overwrite to replace")
    for name, records in rows.items():
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(tmp, os.path.join(out_dir, name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--translation", required=True, help="Translation-en[.xz|.bz2|.gz]")
    parser.add_argument("--out_dir", required=True, help="the folder for the four files")
    parser.add_argument("--overwrite", action="store_true", help="replace files already there")
    parser.add_argument("--held_out", type=int, default=HELD_OUT, help="packages held out")
    parser.add_argument("--dev", type=int, default=DEV, help="dev queries")
    args = parser.parse_args(argv)
    try:
        rows = build(args.translation, args.held_out, args.dev)
        write(rows, args.out_dir, args.overwrite)
    except (OSError, ValueError, EOFError, lzma.LZMAError) as e:
        print(f"error: {file_in_place_of_folder(e) or e}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{name} {len(records):,}" for name, records in rows.items())
    print(f"{args.out_dir}: {counts}")
    return 0


if __name__ == "__main__":
    from bert_jax import cli  # Ctrl-C: status 130

    sys.exit(cli.run(main))
