"""The one path type of a run's files: local paths and URLs (gs://..., any scheme etils.epath
knows) through `etils.epath`, a URL never turned into a local path."""

from __future__ import annotations

import os

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
