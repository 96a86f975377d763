"""Memory and speed of reading a Parquet file's text column: `bert_jax.data.tables` against
pyarrow's own `ParquetFile(path).iter_batches` (its defaults) and against the same reader with
pyarrow's default pre-buffering.

    python benchmarks/table_read.py                      # a 200 MB file, 40 row groups
    python benchmarks/table_read.py --mb=8 --row_groups=4   # small

Writes a Parquet file of incompressible text (`--mb` megabytes in `--row_groups` row groups,
uncompressed, rows of 5,000 characters) into --data_dir once, then reads its "text" column to
Python strings in batches of `--batch_rows`, each peer in a fresh process, and prints one JSON
line per peer:

    peer             tables: iter_column_batches (pre_buffer=False, through an etils.epath
                     file object, as every input is read); tables_prebuffer: the same with
                     pyarrow's default pre_buffer=True; pyarrow: ParquetFile(path).iter_batches
                     on the local path with its defaults
    rows, wall_s     rows read and the seconds the read took (imports and start-up excluded)
    rows_per_s       rows per wall-clock second
    rss_growth_mb    the growth of the process's peak resident memory during the read
    peak_arrow_mb    the most memory Arrow's pool held at a batch boundary
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

PEERS = ("tables", "tables_prebuffer", "pyarrow")
ROW_CHARS = 5000


def _write(path: str, mb: int, row_groups: int) -> None:
    """The benchmark file (written once): `mb` MB of random hex text in `row_groups` groups."""
    if os.path.isfile(path):
        return
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    rows_per_group = max(1, mb * 1_000_000 // ROW_CHARS // row_groups)
    tmp = path + ".tmp"
    with pq.ParquetWriter(tmp, pa.schema([("text", pa.string())]), compression="none") as w:
        for _ in range(row_groups):
            texts = [rng.bytes(ROW_CHARS // 2).hex() for _ in range(rows_per_group)]
            w.write_table(pa.table({"text": texts}))
    os.replace(tmp, path)


def _batches(peer: str, path: str, batch_rows: int):
    """Lists of Python strings, `batch_rows` at a time, as `peer` reads them."""
    import pyarrow.parquet as pq

    from bert_jax.data import tables

    if peer == "pyarrow":
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=["text"]):
            yield batch.column(0).to_pylist()
        return
    if peer == "tables_prebuffer":
        real = pq.ParquetFile
        pq.ParquetFile = lambda f, pre_buffer=True, **kw: real(f, pre_buffer=True, **kw)
    for _, batch in tables.iter_column_batches(path, ["text"], batch_rows=batch_rows):
        yield batch["text"]


def _measure(peer: str, path: str, batch_rows: int) -> dict:
    """One peer's read, in this process (start it fresh: peak memory only grows)."""
    import pyarrow as pa

    from bert_jax.data import tables  # noqa: F401  (imported before the measurement)

    peak_rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # noqa: E731
    before, rows, peak_arrow = peak_rss(), 0, 0
    start = time.perf_counter()
    for texts in _batches(peer, path, batch_rows):
        rows += len(texts)
        peak_arrow = max(peak_arrow, pa.total_allocated_bytes())
    wall = time.perf_counter() - start
    return {
        "peer": peer,
        "what": "parquet_read",
        "file_mb": round(os.path.getsize(path) / 1e6, 1),
        "rows": rows,
        "wall_s": round(wall, 3),
        "rows_per_s": round(rows / wall),
        "rss_growth_mb": round(peak_rss() - before),
        "peak_arrow_mb": round(peak_arrow / 1e6, 1),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--row_groups", type=int, default=40)
    p.add_argument("--batch_rows", type=int, default=512)
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--data_dir", default="/tmp/bert_jax_bench_tables")
    p.add_argument("--peer", help=argparse.SUPPRESS)  # one measurement, in a fresh process
    args = p.parse_args(argv)
    path = os.path.join(args.data_dir, f"text_{args.mb}mb_{args.row_groups}rg.parquet")
    if args.peer:
        print(json.dumps(_measure(args.peer, path, args.batch_rows)), flush=True)
        return 0
    os.makedirs(args.data_dir, exist_ok=True)
    _write(path, args.mb, args.row_groups)
    print(json.dumps({"what": "machine", "cpus": os.cpu_count(), "python": sys.version.split()[0]}))
    for peer in args.peers.split(","):
        if peer not in PEERS:
            p.error(f"unknown peer {peer!r}; known: {PEERS}")
        cmd = [sys.executable, os.path.abspath(__file__), f"--peer={peer}", *(argv or sys.argv[1:])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        print(proc.stdout.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
