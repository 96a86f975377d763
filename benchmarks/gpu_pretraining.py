"""Compile BERT-base and BERT-large pretraining (phases 1 and 2) for 1 and 8 H100s, no GPU needed.

    python benchmarks/gpu_pretraining.py [--only=large_p1_h100x8] [--out=...gpu_compile.jsonl]
    python benchmarks/gpu_pretraining.py --table   # the rows of the reports already in --out
    python benchmarks/gpu_pretraining.py --tiny --only=base_p1_h100 --out=/tmp/g.jsonl  # a check

Runs `train.py --config=configs/pretrain.py:size=S,phase=P,gpu=CARD --mode=compile` for each
recipe of configs/pretrain.py (`ROWS`, from `GPU_RECIPES`; one process each; the recipes'
attention dropout 0, so cuDNN attention; layers unrolled so that XLA's byte count, and the
roofline, cover the whole step), adds the
JSON report to `--out` under the row's name (replacing an older line of that name) and prints one
markdown row per report, as benchmarks/RESULTS_gpu.md records them. MFU figures are roofline
bounds from the compiled program, not measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import compile_records  # noqa: E402  (after the path)
from configs import pretrain  # noqa: E402

OUT = os.path.join(ROOT, "benchmarks", "results", "gpu_compile.jsonl")

# name -> (size, phase, topology, remat, extra overrides): the recipes of configs/pretrain.py
# (`GPU_RECIPES`, the `gpu=CARD` variants). Global batches are BERT's (256 for base, 512 for
# large); one card takes the whole batch, remat "dots" where activations would not fit, and
# phase 2 of large on one card in micro-batches.
ROWS = {
    f"{size}_p{phase}_{card}": (
        size,
        phase,
        f"gpu:{card}",
        remat,
        [f"--config.num_microbatches={micro}"] if micro > 1 else [],
    )
    for card, recipes in pretrain.GPU_RECIPES.items()
    for (size, phase), (remat, micro) in sorted(recipes.items())
}


def compile_row(name: str, extra: tuple[str, ...] = ()) -> dict:
    """The `--mode=compile` JSON report of one row (exit status 1, not fitting, included);
    `extra`: more train.py flags (`compile_records.TINY`)."""
    size, phase, topology, _, _ = ROWS[name]
    card = topology.removeprefix("gpu:")
    report = compile_records.compile_report(
        f"pretrain.py:size={size},phase={phase},gpu={card}", *extra
    )
    report["name"] = name
    return report


def table_row(r: dict) -> str:
    """The RESULTS_gpu.md row of a report (`compile_row`)."""
    m = r["hbm_gib"]
    cap = r["hbm_capacity_gib"]
    rows = r["batch"][0] // r["devices"]
    roof = r.get("roofline")
    bound = f"**{roof['mfu_bound']:.0%}** ({roof['bound']})" if roof else "n/a (micro-batches)"
    return (
        f"| {r['name']} | {r['topology']} | {r['batch'][0]} ({rows} x {r['batch'][1]}) | "
        f"{r['remat_policy']}, {r['num_microbatches']} | {m['arguments']:.2f} + "
        f"{m['temporaries']:.2f} = **{m['total']:.2f}** / {cap:.1f} GiB | "
        f"{'yes' if r['fits'] else 'NO'} | {r['cudnn_attention_calls']} | {bound} | "
        f"{r['compile_s']:.0f} |"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="", help="comma-separated row names (default: all)")
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--table", action="store_true", help="print the rows already in --out")
    parser.add_argument("--tiny", action="store_true", help="a 1-layer model: checks the script")
    args = parser.parse_args(argv)
    extra = compile_records.tiny_flags("pretrain.py", args.tiny, args.out, OUT, parser)
    names = [n for n in args.only.split(",") if n] or list(ROWS)
    reports = compile_records.read(args.out)
    if not args.table:
        for name in names:
            reports[name] = compile_row(name, extra)
            print(json.dumps(reports[name]), flush=True)
            compile_records.write(args.out, reports)
    print(
        "| row | topology | global batch (per card x length) | remat, micro-batches | "
        "memory per card: arguments + temporaries = total / JAX's pool | fits | "
        "cuDNN attention calls | MFU bound | compile s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ROWS:
        if name in reports:
            print(table_row(reports[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
