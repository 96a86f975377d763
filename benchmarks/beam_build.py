"""Throughput of the shard build: the Beam pipeline on the DirectRunner against the local build.

    python benchmarks/beam_build.py                        # dupe_factor 1 and 3, 1 and 2 workers
    python benchmarks/beam_build.py --dupe_factors=1 --workers=1
    python benchmarks/beam_build.py --plays=2 --dupe_factors=1 --workers=1   # small

Writes the Shakespeare plays (all 38, or the first `--plays`) as text files (one document per 40
sentences, 8 files, in --data_dir), then builds the same hash-partitioned shards (NSP, static
masking, 128 tokens, 20 predictions, 16 shards) with
`build.build_pretraining_shards(partition="hash")` and with
`beam_build.build_pretraining_shards_beam` on the DirectRunner, each in a fresh process, and
prints one JSON line per build:

    builder, workers, dupe_factor   the setting (Beam: --direct_num_workers, multi_processing
                                    above 1)
    wall_s, cpu_s                   wall-clock and CPU seconds of the build (the process and
                                    its workers; imports and start-up excluded)
    corpus_tokens, records          the input's WordPiece tokens and the examples written
    tokens_per_s                    input tokens built per wall-clock second
    tokens_per_cpu_s                input tokens built per CPU second: the cost per core that
                                    sizes a cluster
    max_rss_mb                      the largest resident memory of the process or one of its
                                    workers (with 1 worker: what one shard costs, plus the
                                    corpus for the local build)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import data_pipeline  # noqa: E402  (benchmarks/, beside this file)

from bert_jax.pretrain.data import build, default_corpus, sources  # noqa: E402
from bert_jax.pretrain.data.examples import PretrainingOptions  # noqa: E402

NUM_SHARDS = 16
SENTENCES_PER_DOCUMENT = 40
NUM_FILES = 8


def _corpus(data_dir: str, plays: int = 0) -> list[str]:
    """The plays (or the first `plays`) as text files of 40-sentence documents (written once)."""
    directory = os.path.join(data_dir, "plays_text" + (f"_{plays}" if plays else ""))
    paths = [os.path.join(directory, f"plays{k}.txt") for k in range(NUM_FILES)]
    if all(os.path.isfile(p) for p in paths):
        return paths
    os.makedirs(directory, exist_ok=True)
    documents = [
        play[i : i + SENTENCES_PER_DOCUMENT]
        for play in default_corpus.default_corpus_documents()[: plays or None]
        for i in range(0, len(play), SENTENCES_PER_DOCUMENT)
    ]
    for k, path in enumerate(paths):
        with open(path, "w", encoding="utf-8") as f:
            for document in documents[k::NUM_FILES]:
                f.write("\n".join(document) + "\n\n")
    return paths


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished (waited-for) child processes."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def run_one(builder: str, workers: int, dupe_factor: int, data_dir: str, plays: int = 0) -> dict:
    """One build into a fresh directory; returns the measurement."""
    paths = _corpus(data_dir, plays)
    out = os.path.join(data_dir, f"out_{builder}_{workers}_{dupe_factor}")
    shutil.rmtree(out, ignore_errors=True)
    tokenizer = default_corpus.default_corpus_tokenizer()
    options = PretrainingOptions(dupe_factor=dupe_factor)
    if builder == "beam":
        from bert_jax.pretrain.data import beam_build

        pipeline_args = ["--runner=DirectRunner", f"--direct_num_workers={workers}"]
        if workers > 1:
            pipeline_args.append("--direct_running_mode=multi_processing")
        source = beam_build.TextFiles(tuple(paths), split_sentences=False)
        build_fn = lambda: beam_build.build_pretraining_shards_beam(
            source, out, tokenizer, options, num_shards=NUM_SHARDS, pipeline_args=pipeline_args
        )
    else:
        build_fn = lambda: build.build_pretraining_shards(
            lambda: sources.text_file_documents(paths, split_sentences=False),
            out,
            tokenizer,
            options,
            num_shards=NUM_SHARDS,
            num_workers=workers,
            progress=False,
            partition="hash",
        )
    start_wall, start_cpu = time.perf_counter(), _cpu_seconds()
    metadata = build_fn()
    wall, cpu = time.perf_counter() - start_wall, _cpu_seconds() - start_cpu
    tokens = metadata["corpus"]["tokens"]
    max_rss_kb = max(
        resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return {
        "builder": builder,
        "workers": workers,
        "dupe_factor": dupe_factor,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "corpus_tokens": tokens,
        "records": metadata["num_records"],
        "tokens_per_s": round(tokens / wall),
        "tokens_per_cpu_s": round(tokens / cpu),
        "max_rss_mb": round(max_rss_kb / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default=os.path.join("/tmp", "bert_jax_bench_build"))
    parser.add_argument("--dupe_factors", default="1,3")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--builders", default="local,beam")
    parser.add_argument("--plays", type=int, default=0, help="the first N plays (0: all 38)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # builder,workers,dupe: run it here
    args = parser.parse_args()
    if args.one:
        builder, workers, dupe = args.one.split(",")
        print(
            json.dumps(run_one(builder, int(workers), int(dupe), args.data_dir, args.plays)),
            flush=True,
        )
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(json.dumps(data_pipeline.machine()), flush=True)
    _corpus(args.data_dir, args.plays)
    for dupe in args.dupe_factors.split(","):
        for builder in args.builders.split(","):
            for workers in args.workers.split(","):
                one = f"{builder},{workers},{dupe}"
                result = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        f"--data_dir={args.data_dir}",
                        f"--plays={args.plays}",
                        f"--one={one}",
                    ],
                    capture_output=True,
                    text=True,
                )
                if result.returncode:
                    sys.exit(f"{one} failed:\n{result.stderr[-3000:]}")
                print(result.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
