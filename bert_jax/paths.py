"""The one path type of a run's files: local paths and URLs (gs://..., any scheme etils.epath
knows) through `etils.epath`, a URL never turned into a local path."""

from __future__ import annotations

import os
import re
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence

from etils import epath

_UMASK = os.umask(0o022)  # read at import: the permissions a file created here would get
os.umask(_UMASK)


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
    local file through a temporary file beside it (named by this process) renamed over it, its
    folder made where it is missing (a command's output in a new folder is written, not lost at
    its end); a URL in one object write (an object store replaces an object at once)."""
    write_bytes_whole(path, text.encode("utf-8"))


def write_bytes_whole(path: str | os.PathLike, data: bytes) -> None:
    """`write_text_whole` for bytes."""
    path = as_path(path)
    if is_url(path):
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    os.replace(os.fspath(tmp), os.fspath(path))


def write_file_whole(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """`write_text_whole` for a writer that takes a local file name (a library's `save_file`):
    `write(local temporary file)`, then the file becomes `path` whole: renamed over it, or for
    a URL copied there in one object write. A local file's missing folder is made."""
    path = as_path(path)
    local = not is_url(path)
    if local:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=os.fspath(path.parent) if local else None, prefix=f".{path.name}.", suffix=".tmp"
    )
    os.close(fd)
    try:
        write(tmp)
        if local:
            os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp's 0600 would make it private
            os.replace(tmp, os.fspath(path))
        else:
            epath.Path(tmp).copy(path, overwrite=True)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def prepare_out_dir(out_dir: str | os.PathLike, names: Sequence[str], overwrite: bool):
    """`out_dir` (made if absent) as an `epath.Path`, refusing to replace the files `names`
    there unless `overwrite`.

    Raises:
      FileExistsError: naming the files already there.
    """
    out_dir = as_path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clash = [n for n in names if (out_dir / n).exists()]
    if clash and not overwrite:
        raise FileExistsError(
            f"{out_dir} already holds {clash}; pass overwrite=True (--overwrite) to replace them"
        )
    return out_dir


def check_apart(writes: Mapping[str, Sequence[str]], reads: Mapping[str, Sequence[str]]) -> None:
    """Refuses a command that would write over what it reads, or where it reads from.

    Args:
      writes: {flag: the paths it makes written} ("--output": a file and its scores file, or
        the bulk job's folder).
      reads: {flag: the paths it reads}: files, and the folders named (`tables.check_apart`
        takes the flags' patterns).

    Raises:
      ValueError: naming both flags, where a path written is one read, a folder written holds a
        file read (the outputs would land among, or over, the inputs), or a path written lies in
        a folder read (the next run would read it as an input).
    """
    for what, written in writes.items():
        for out in written:
            w = _resolved(out)
            for flag, named in reads.items():
                for path in named:
                    r = _resolved(path)
                    if w == r:
                        why = f"which {flag} reads: the command would write over its input"
                    elif r.startswith(w + "/"):
                        why = (
                            f"a folder holding {path}, which {flag} reads: the outputs would land "
                            "among (or over) the inputs"
                        )
                    elif w.startswith(r + "/"):
                        why = f"inside {flag}'s folder {path}: a rerun would read it as input"
                    else:
                        continue
                    raise ValueError(f"{what} writes {out}, {why}; give {what} a path apart")


def _resolved(path: str) -> str:
    """`path` comparable with another: a URL without its trailing /, a local path real."""
    text = os.fspath(path)
    return text.rstrip("/") if is_url(text) else os.path.realpath(os.path.expanduser(text))


class StorageUnreachableError(OSError):
    """A URL's storage service (gs://...) could not be reached from here: no network, no
    credentials, or no permission. A user's mistake (`bert_jax.cli`), not a bug."""


# TensorFlow's errors (tf.io.gfile: epath's backend for gs:// where TensorFlow is installed) that
# say its storage service could not be reached, not that the program or the path is wrong: a
# request that found no server (FailedPrecondition, "libcurl code 6 meaning 'Could not resolve
# hostname'"), credentials missing or refused (HTTP 401, 403: PermissionDenied), a service away
# or too slow, and after tf.io.gfile's retries (GCS_RETRY_CONFIG_MAX_RETRIES, 10 by default,
# minutes) a refused connection (Aborted, "All 10 retry attempts failed ...").
_TF_ERRORS = "tensorflow.python.framework.errors_impl"
_UNREACHABLE = (
    "AbortedError",
    "FailedPreconditionError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "UnavailableError",
    "DeadlineExceededError",
)
_URL = re.compile(r"\b(?!https?://)[a-z][\w+.-]*://[^\s'\"]+")


def unreachable_storage(error: BaseException) -> StorageUnreachableError | None:
    """`error` as the user's error "cannot reach gs://bucket/run: <reason>" when it is the storage
    client's failure to reach a URL (`_UNREACHABLE`, its message naming the URL); None for any
    other error, which stays what it is (a bug keeps its traceback)."""
    while isinstance(error, OSError) and str(error) == str(error.__context__):
        error = error.__context__  # epath's `OSError(str(tf_error)) from None`: the same error
    kind, text = type(error), str(error)
    if kind.__module__ != _TF_ERRORS or kind.__name__ not in _UNREACHABLE:
        return None
    if kind.__name__ == "FailedPreconditionError" and "libcurl code" not in text:
        return None  # a request that reached the server, or no request: not the network
    retries = re.match(r"All (\d+) retry attempts failed", text)
    if kind.__name__ == "AbortedError" and not retries:
        return None  # an operation that gave way to another: not the network
    url = _URL.search(text)
    if url is None:
        return None
    first = text.strip().splitlines()[0]
    details = re.search(r"error details: (.+)", first)
    status = re.search(r"HTTP response code (\d+)", first)
    if details:
        reason = details.group(1)
    elif status:
        said = re.search(r'"message":\s*"([^"]+)"', text)
        reason = f"HTTP {status.group(1)}" + (f" ({said.group(1)})" if said else "")
    else:
        reason = first
    if retries and int(retries.group(1)):
        reason += f" (after {retries.group(1)} retries)"
    if kind.__name__ in ("UnauthenticatedError", "PermissionDeniedError"):
        reason += (
            "; check the credentials (gcloud auth application-default login, or "
            "GOOGLE_APPLICATION_CREDENTIALS) and the bucket's permissions"
        )
    return StorageUnreachableError(f"cannot reach {url.group(0).rstrip('.,;')}: {reason}")


class FileInPlaceOfFolderError(NotADirectoryError):
    """A folder was to be made where a file is (an --output, --workdir or --out_dir naming a
    file). A user's mistake (`bert_jax.cli`), not a bug."""


def file_in_place_of_folder(error: BaseException) -> FileInPlaceOfFolderError | None:
    """`error` as the user's error "X is a file, not a folder" when a folder could not be made
    because the path, or a folder above it, is a file (`os.makedirs` and `Path.mkdir` raise
    FileExistsError or NotADirectoryError naming the path); None for any other error."""
    if not isinstance(error, (FileExistsError, NotADirectoryError)) or not error.filename:
        return None
    frames = traceback.extract_tb(error.__traceback__)
    if not frames or frames[-1].name not in ("makedirs", "mkdir"):
        return None
    target = os.fsdecode(error.filename)
    blocker = target
    while blocker and not os.path.lexists(blocker) and os.path.dirname(blocker) != blocker:
        blocker = os.path.dirname(blocker)
    if not os.path.lexists(blocker) or os.path.isdir(blocker):
        return None
    if blocker == target:
        return FileInPlaceOfFolderError(
            f"{target} is a file, not a folder: name a folder there, or move the file"
        )
    return FileInPlaceOfFolderError(
        f"{blocker} is a file, so no folder can be made inside it: name another path, or move "
        "the file"
    )


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
