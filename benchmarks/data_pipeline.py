"""Throughput of the pretraining input pipeline: sequences per second, per CPU core.

    python benchmarks/data_pipeline.py                  # 128 and 512 tokens, 0/1/2 workers
    python benchmarks/data_pipeline.py --seq_lens=128 --workers=0 --seconds=5
    python benchmarks/data_pipeline.py --plays=4 --seq_lens=128 --workers=0 --seconds=0.5  # small

Builds shards from the Shakespeare corpus once (all 38 plays, or the first `--plays`; cached in
--data_dir; dynamic masking, so every
batch is masked at load time, the costlier path), then reads batches through
`make_pretraining_loader` and prints one JSON line per measurement:

    seq_len, batch, workers   the setting
    seqs_per_s                sequences delivered per wall-clock second
    cpu_s_per_s               CPU seconds used per wall second by this process and its workers
    seqs_per_s_per_core       sequences per CPU second: the cost that sizes a host's cores

The CPU time is measured with psutil over the process and its grain worker processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bert_jax.pretrain.data import build, default_corpus, pipeline  # noqa: E402
from bert_jax.pretrain.data.examples import PretrainingOptions  # noqa: E402


def _cpu_seconds(proc: psutil.Process) -> float:
    """User+system CPU seconds of `proc` and its live children."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _shards(data_dir: str, seq_len: int, plays: int = 0) -> str:
    """Builds (once) dynamic-masking shards of the default corpus (or its first `plays` plays, at
    least 4: one a shard) at `seq_len` tokens."""
    out = os.path.join(data_dir, f"shakespeare_len{seq_len}" + (f"_plays{plays}" if plays else ""))
    tokenizer = default_corpus.default_corpus_tokenizer(os.path.join(data_dir, "vocab"))
    options = PretrainingOptions(
        max_seq_length=seq_len,
        max_predictions_per_seq=round(seq_len * 0.15),
        dupe_factor=1 if seq_len <= 128 else 2,
        static_masking=False,
    )
    if not plays:
        build.build_default_corpus_shards(out, tokenizer, options, num_shards=4, progress=False)
    else:
        documents = default_corpus.default_corpus_documents()[:plays]
        build.build_pretraining_shards(
            documents, out, tokenizer, options, num_shards=4, progress=False
        )
    return out


def machine() -> dict:
    """The machine a measurement ran on: processor, cores, Python, 1-minute load average."""
    return {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def measure(path: str, seq_len: int, batch: int, workers: int, seconds: float) -> dict:
    """Reads batches for `seconds` after a warm-up; returns the measurement."""
    it = pipeline.make_pretraining_loader(
        path, batch_size=batch, seed=0, shard_index=0, shard_count=1, worker_count=workers
    )
    proc = psutil.Process()
    for _ in range(3 + 2 * workers):  # Warm up: start workers, fill their buffers.
        next(it)
    start_wall, start_cpu = time.perf_counter(), _cpu_seconds(proc)
    num = 0
    while time.perf_counter() - start_wall < seconds:
        b = next(it)
        num += b["input_ids"].shape[0]
    wall = time.perf_counter() - start_wall
    cpu = _cpu_seconds(proc) - start_cpu
    if hasattr(it, "close"):
        it.close()
    return {
        "seq_len": seq_len,
        "batch": batch,
        "workers": workers,
        "seqs_per_s": round(num / wall, 1),
        "cpu_s_per_s": round(cpu / wall, 2),
        "seqs_per_s_per_core": round(num / cpu, 1),
        "seconds": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default=os.path.join("/tmp", "bert_jax_bench"))
    parser.add_argument("--seq_lens", default="128,512")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--plays", type=int, default=0, help="the first N plays (0: all 38)")
    args = parser.parse_args()
    if args.plays and args.plays < 4:
        parser.error(f"--plays={args.plays}: at least 4 (one a shard), or 0 for all")
    print(json.dumps(machine()), flush=True)
    for seq_len in [int(s) for s in args.seq_lens.split(",")]:
        path = _shards(args.data_dir, seq_len, args.plays)
        batch = 256 if seq_len <= 128 else 64
        for workers in [int(w) for w in args.workers.split(",")]:
            print(json.dumps(measure(path, seq_len, batch, workers, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
