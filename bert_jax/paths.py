"""The one path type of a run's files: local paths and URLs (gs://..., any scheme etils.epath
knows) through `etils.epath`, a URL never turned into a local path."""

from __future__ import annotations

import os
import re

from etils import epath


def is_url(path: str | os.PathLike) -> bool:
    """Whether `path` names a URL (`gs://...`, any scheme) rather than a local file."""
    return "://" in os.fspath(path)


def as_path(path: str | os.PathLike) -> epath.Path:
    """The one path type of a run's files (work directory, checkpoints, exports): `gs://...`
    (any URL scheme) stays a URL, and a local path becomes absolute (so that a later change of
    directory does not move the run)."""
    text = os.fspath(path)
    return epath.Path(text) if is_url(text) else epath.Path(os.path.abspath(text))


def write_text_whole(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` whole, so that a crash or a reader never sees a part of it: a
    local file through a temporary file beside it (named by this process) renamed over it; a URL
    in one object write (an object store replaces an object at once)."""
    path = as_path(path)
    if is_url(path):
        path.write_text(text, encoding="utf-8")
        return
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(os.fspath(tmp), os.fspath(path))


def missing_path_error(path: str | os.PathLike) -> FileNotFoundError:
    """The error for a checkpoint path that does not exist; when it reads like a Hugging Face Hub
    id ("bert-base-uncased", "org/name"), it says which loaders read Hub ids."""
    text = os.fspath(path)
    if re.fullmatch(r"[\w.-]+(/[\w.-]+)?", text) and not text.startswith((".", "/")):
        return FileNotFoundError(
            f"{text!r} is not a file or directory. If it is a Hugging Face Hub id, "
            "bert_jax.from_pretrained, init_from and `python -m bert_jax.convert` read it (the "
            "cache, else a download); this reader takes a directory"
        )
    return FileNotFoundError(f"no checkpoint at {text}")
