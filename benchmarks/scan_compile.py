"""Scan over layers vs the unrolled stack: compile time and step time of the pretraining step.

    python benchmarks/scan_compile.py --size=large --batch=2 --seq=128 --steps=3

Prints one JSON line per variant (peer "bert_jax_scan" / "bert_jax_unrolled") with the fields of
pretrain_step.py (peer, size, batch, seq, what, median_s, tokens_per_s, compile_s). compile_s is
the time of `jit(...).lower(...).compile()` alone; the step time is measured after it, the two
variants alternating, on the same machine in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="large")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--remat", default="none")
    args = parser.parse_args(argv)

    import jax

    from benchmarks.pretrain_step import bert_jax_peer, make_batch
    from bert_jax.models.bert.config import BertConfig

    cfg = BertConfig.preset(args.size)
    batch = make_batch(cfg, args.batch, args.seq, max(1, round(0.15 * args.seq)))
    variants = {}
    for name, scan in (("bert_jax_scan", True), ("bert_jax_unrolled", False)):
        peer = argparse.Namespace(
            what="train_step", dtype="float32", scan=scan, remat=args.remat, attention="auto"
        )
        run, compile_s, _ = bert_jax_peer(cfg, batch, peer)  # compile_s: the compile alone
        variants[name] = (run, compile_s, [])
    for _ in range(args.rounds):
        for run, _, times in variants.values():
            for _ in range(args.steps):
                t = time.perf_counter()
                run()
                times.append(time.perf_counter() - t)
    device = jax.devices()[0]
    for name, (_, compile_s, times) in variants.items():
        median = statistics.median(times)
        print(
            json.dumps(
                {
                    "peer": name,
                    "size": args.size,
                    "batch": args.batch,
                    "seq": args.seq,
                    "what": "train_step",
                    "median_s": median,
                    "tokens_per_s": args.batch * args.seq / median,
                    "compile_s": compile_s,
                    "remat": args.remat,
                    "device": f"{device.platform}:{device.device_kind}",
                    "jax": jax.__version__,
                }
            ),
            flush=True,
        )
    scan, unrolled = variants["bert_jax_scan"], variants["bert_jax_unrolled"]
    print(
        json.dumps(
            {
                "compile_speedup": unrolled[1] / scan[1],
                "step_time_ratio_scan_over_unrolled": statistics.median(scan[2])
                / statistics.median(unrolled[2]),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
