"""Record files: TFRecord (framing written and read without TensorFlow) and ArrayRecord.

Both containers hold the same payload, one serialized `tf.train.Example` per record (see
`example_proto`), so shards convert between them record for record.

TFRecord framing, per record (all little-endian):

    uint64 length
    uint32 masked_crc32c(length bytes)
    bytes  data[length]
    uint32 masked_crc32c(data)

with masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2**32) over CRC-32C (Castagnoli).

ArrayRecord shards are written with `group_size:1`, so that any record can be read on its own:
what grain's global shuffle needs.
"""

from __future__ import annotations

import glob
import os
import struct
import threading
from collections.abc import Iterator, Sequence

import google_crc32c
import numpy as np
from etils import epath

from bert_jax.paths import is_url

RECORD_FORMATS = ("array_record", "tfrecord")
ARRAY_RECORD_WRITER_OPTIONS = "group_size:1"
_EXTENSIONS = {
    ".array_record": "array_record",
    ".arrayrecord": "array_record",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tf_record": "tfrecord",
}
_SCAN_CHUNK_BYTES = 8 << 20  # read size of a TFRecord header scan
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


class RecordFileError(ValueError):
    """A record file is missing, truncated, corrupt or of an unknown format."""


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# Reading goes through etils.epath, so a record file may be local or a URL (gs://..., any scheme
# epath knows); only ArrayRecord files must be local (their reader opens local files only).


def _open(path: str):
    return epath.Path(path).open("rb")


def _size(path: str) -> int:
    return epath.Path(path).stat().length


# ---- Writers ----


class TFRecordWriter:
    """Writes records with TFRecord framing (uncompressed, as google-research/bert does)."""

    def __init__(self, path: str | os.PathLike):
        self._file = open(path, "wb")

    def write(self, data: bytes) -> None:
        """Appends one record."""
        length = struct.pack("<Q", len(data))
        self._file.write(length)
        self._file.write(_FOOTER.pack(masked_crc32c(length)))
        self._file.write(data)
        self._file.write(_FOOTER.pack(masked_crc32c(data)))

    def close(self) -> None:
        """Flushes and closes the file."""
        self._file.close()


class ArrayRecordWriter:
    """Writes an ArrayRecord file with one record per chunk (random access)."""

    def __init__(self, path: str | os.PathLike, options: str = ARRAY_RECORD_WRITER_OPTIONS):
        from array_record.python import array_record_module

        self._writer = array_record_module.ArrayRecordWriter(os.fspath(path), options)

    def write(self, data: bytes) -> None:
        """Appends one record."""
        self._writer.write(data)

    def close(self) -> None:
        """Writes the index and closes the file."""
        self._writer.close()


def open_writer(path: str | os.PathLike, record_format: str) -> TFRecordWriter | ArrayRecordWriter:
    """A writer for `record_format` ("array_record" or "tfrecord") at `path`."""
    if record_format == "tfrecord":
        return TFRecordWriter(path)
    if record_format == "array_record":
        return ArrayRecordWriter(path)
    raise ValueError(f"unknown record format {record_format!r}; expected one of {RECORD_FORMATS}")


# ---- TFRecord reading ----


def _tfrecord_index(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Scans a TFRecord file's headers; returns (data offsets, data lengths) as int64 arrays.

    The file is read front to back in large chunks (one pass, also over a URL's object)."""
    offsets, lengths = [], []
    size = _size(path)
    with _open(path) as f:
        window, start = b"", 0  # the bytes read last and their offset in the file

        def read_at(pos: int, n: int) -> bytes:
            nonlocal window, start
            if not (start <= pos and pos + n <= start + len(window)):
                f.seek(pos)
                window, start = f.read(max(n, _SCAN_CHUNK_BYTES)), pos
            return window[pos - start : pos - start + n]

        if read_at(0, 2) == b"\x1f\x8b":
            raise RecordFileError(
                f"{path} is gzip-compressed; compressed TFRecords cannot be read at random. "
                "Decompress it first (e.g. with TensorFlow's TFRecordDataset and an uncompressed "
                "writer)."
            )
        pos = 0
        while pos < size:
            header = read_at(pos, _HEADER.size)
            if len(header) < _HEADER.size:
                raise RecordFileError(
                    f"{path} is truncated: record {len(offsets)} has a partial header at byte {pos}"
                )
            length, length_crc = _HEADER.unpack(header)
            if masked_crc32c(header[:8]) != length_crc:
                raise RecordFileError(
                    f"{path} is not a TFRecord file or is corrupt: bad length checksum of record "
                    f"{len(offsets)} at byte {pos}"
                )
            end = pos + _HEADER.size + length + _FOOTER.size
            if end > size:
                raise RecordFileError(
                    f"{path} is truncated: record {len(offsets)} needs {end} bytes, file has {size}"
                )
            offsets.append(pos + _HEADER.size)
            lengths.append(length)
            pos = end
    return np.asarray(offsets, np.int64), np.asarray(lengths, np.int64)


def iter_tfrecord(path: str | os.PathLike, verify: bool = True) -> Iterator[bytes]:
    """Yields the records of a TFRecord file in order.

    Args:
      path: an uncompressed TFRecord file.
      verify: check each record's data checksum.

    Raises:
      RecordFileError: the file is truncated, corrupt, compressed or not a TFRecord file.
    """
    path = os.fspath(path)
    offsets, lengths = _tfrecord_index(path)
    with _open(path) as f:
        for i, (offset, length) in enumerate(zip(offsets.tolist(), lengths.tolist())):
            f.seek(offset)
            data = f.read(length)
            (crc,) = _FOOTER.unpack(f.read(_FOOTER.size))
            if verify and masked_crc32c(data) != crc:
                raise RecordFileError(f"{path}: record {i} fails its data checksum")
            yield data


class TFRecordDataSource:
    """Random access to the records of one or more uncompressed TFRecord files.

    Implements grain's `RandomAccessDataSource` protocol (`__len__`, `__getitem__`) and a batched
    `__getitems__`. Opening scans the record headers once to build an offset index; the files are
    opened lazily in each process, so the source pickles cheaply into grain's worker processes.
    Local files are read with `os.pread`; files at URLs (gs://...) through etils.epath, one open
    object per file and thread, one ranged read per record.
    """

    def __init__(self, paths: Sequence[str | os.PathLike], verify: bool = True):
        self._paths = [os.fspath(p) for p in paths]
        index = [_tfrecord_index(p) for p in self._paths]
        self._file_of = np.concatenate(
            [np.full(len(o), i, np.int32) for i, (o, _) in enumerate(index)] or [np.zeros(0)]
        ).astype(np.int32)
        self._offsets = np.concatenate([o for o, _ in index] or [np.zeros(0, np.int64)])
        self._lengths = np.concatenate([n for _, n in index] or [np.zeros(0, np.int64)])
        self._verify = verify
        self._init_handles()

    def _init_handles(self) -> None:
        self._fds: dict[int, int] = {}  # local files, shared by all threads (pread)
        self._lock = threading.Lock()
        self._remote = threading.local()  # URL files: {file index: open object} per thread

    def __len__(self) -> int:
        return int(self._offsets.size)

    def _read(self, file_index: int, offset: int, size: int) -> bytes:
        path = self._paths[file_index]
        if is_url(path):
            files = getattr(self._remote, "files", None)
            if files is None:
                files = self._remote.files = {}
            if file_index not in files:
                files[file_index] = _open(path)
            f = files[file_index]
            f.seek(offset)
            return f.read(size)
        fd = self._fds.get(file_index)
        if fd is None:
            with self._lock:
                fd = self._fds.get(file_index)
                if fd is None:
                    fd = os.open(path, os.O_RDONLY)
                    self._fds[file_index] = fd
        return os.pread(fd, size, offset)

    def __getitem__(self, key: int) -> bytes:
        key = int(key)
        if not 0 <= key < len(self):
            raise IndexError(f"record {key} out of range [0, {len(self)})")
        file_index = int(self._file_of[key])
        offset, length = int(self._offsets[key]), int(self._lengths[key])
        buf = self._read(file_index, offset, length + _FOOTER.size)
        data = buf[:length]
        if len(buf) != length + _FOOTER.size:
            raise RecordFileError(f"{self._paths[file_index]} shrank while being read")
        if self._verify and masked_crc32c(data) != _FOOTER.unpack(buf[length:])[0]:
            raise RecordFileError(
                f"{self._paths[file_index]}: record at byte {offset - _HEADER.size} fails its "
                "data checksum"
            )
        return data

    def __getitems__(self, keys: Sequence[int]) -> list[bytes]:
        return [self[k] for k in keys]

    def __getstate__(self):
        state = self.__dict__.copy()
        for handles in ("_fds", "_lock", "_remote"):
            del state[handles]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_handles()

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __repr__(self) -> str:
        return f"TFRecordDataSource({len(self._paths)} files, {len(self)} records)"


# ---- Format detection and opening ----


def detect_format(path: str | os.PathLike) -> str:
    """ "array_record" or "tfrecord", from the file name or, failing that, from its content.

    Raises:
      RecordFileError: the file does not exist, is empty, or is neither format.
    """
    path = os.fspath(path)
    if not epath.Path(path).is_file():
        raise RecordFileError(f"record file not found: {path}")
    ext = os.path.splitext(path)[1].lower()
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    if _size(path) == 0:
        raise RecordFileError(f"{path} is empty")
    with _open(path) as f:
        header = f.read(_HEADER.size)
    if len(header) == _HEADER.size and masked_crc32c(header[:8]) == _HEADER.unpack(header)[1]:
        return "tfrecord"
    if is_url(path):
        raise RecordFileError(f"{path} is not a TFRecord file (an ArrayRecord file must be local)")
    try:
        count_records(path, "array_record")
    except Exception as e:  # array_record raises bare RuntimeErrors on foreign files.
        raise RecordFileError(f"{path} is neither a TFRecord nor an ArrayRecord file") from e
    return "array_record"


def count_records(path: str | os.PathLike, record_format: str | None = None) -> int:
    """The number of records in one file.

    Raises:
      RecordFileError: the file is unreadable as `record_format`, or an ArrayRecord URL.
    """
    path = os.fspath(path)
    record_format = record_format or detect_format(path)
    if record_format == "tfrecord":
        return int(_tfrecord_index(path)[0].size)
    if is_url(path):
        raise RecordFileError(
            f"{path} is an ArrayRecord file at a URL; ArrayRecord's reader opens local files "
            "only. Mount the bucket on every host (e.g. gcsfuse --implicit-dirs BUCKET "
            "/mnt/BUCKET) and pass /mnt/BUCKET/..., or build the records as TFRecord "
            "(--format=tfrecord; docs/pod.md)"
        )
    from array_record.python import array_record_module

    try:
        reader = array_record_module.ArrayRecordReader(path)
    except Exception as e:
        raise RecordFileError(f"{path} is not a readable ArrayRecord file: {e}") from e
    try:
        return int(reader.num_records())
    finally:
        reader.close()


def expand_paths(patterns: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Expands paths and globs (a list, or one comma-separated string) to files.

    Files keep the order of their patterns; each glob's matches are sorted; repeats are dropped.
    A URL pattern (gs://bucket/shards/*.tfrecord) is matched through etils.epath and its files
    stay URLs.

    Raises:
      FileNotFoundError: a pattern matches no file.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [p for p in os.fspath(patterns).split(",") if p.strip()]
    out: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        pattern = os.fspath(pattern).strip()
        if not is_url(pattern):
            pattern = os.path.expanduser(pattern)
        if glob.has_magic(pattern):
            matches = sorted(m for m in _glob(pattern) if epath.Path(m).is_file())
        else:
            matches = [pattern] if epath.Path(pattern).is_file() else []
        if not matches:
            what = "a directory, not a file" if epath.Path(pattern).is_dir() else "nothing"
            raise FileNotFoundError(f"input pattern {pattern!r} matches {what}")
        out.extend(m for m in matches if m not in seen)
        seen.update(matches)
    return out


def _glob(pattern: str) -> list[str]:
    if not is_url(pattern):
        return glob.glob(pattern, recursive=True)
    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    base = epath.Path("/".join(parts[:fixed]))
    return [os.fspath(m) for m in base.glob("/".join(parts[fixed:]))]


def open_data_source(paths: Sequence[str]):
    """A random-access grain data source over record files of one format.

    Args:
      paths: record files, all ArrayRecord or all TFRecord.

    Returns:
      `grain.sources.ArrayRecordDataSource` or `TFRecordDataSource`; both have `__len__`,
      `__getitem__` and a batched `__getitems__`.

    Raises:
      RecordFileError: the files mix formats, or one is unreadable.
    """
    if not paths:
        raise RecordFileError("no record files given")
    formats = {p: detect_format(p) for p in paths}
    kinds = set(formats.values())
    if len(kinds) > 1:
        raise RecordFileError(
            "record files mix formats: "
            + ", ".join(f"{os.path.basename(p)}={f}" for p, f in list(formats.items())[:6])
            + "; convert them to one format first"
        )
    if kinds == {"tfrecord"}:
        return TFRecordDataSource(paths)
    import grain

    for p in paths:
        count_records(p, "array_record")  # Fail here, with the file's name, on a bad file.
    return grain.sources.ArrayRecordDataSource(list(paths))


def read_all(path: str | os.PathLike) -> list[bytes]:
    """Every record of one file, in order (for tests and small files)."""
    path = os.fspath(path)
    if detect_format(path) == "tfrecord":
        return list(iter_tfrecord(path))
    source = open_data_source([path])
    return list(source.__getitems__(list(range(len(source)))))
