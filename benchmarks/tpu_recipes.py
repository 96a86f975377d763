"""Compile every BERT-large TPU recipe for its slice (no TPU needed) and print the results table.

    python benchmarks/tpu_recipes.py [--only=v5e-16] [--phases=2] [--out=...tpu_compile.jsonl]
    python benchmarks/tpu_recipes.py --table   # the rows of the reports already in --out

Runs `train.py --config=configs/pretrain.py:size=large,phase=P,tpu=SLICE --mode=compile` for each
recipe of `configs/pretrain.py:TPU_RECIPES` and phase (one process each), adds the JSON report to
`--out` under the name `recipe_<slice>_p<phase>` (replacing an older line of that name) and prints
one markdown row per recipe, as benchmarks/RESULTS_tpu.md records them. Needs the `tpu` extra.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import compile_records  # noqa: E402  (after the path)


def compile_recipe(tpu: str, phase: int) -> dict:
    """The `--mode=compile` JSON report of one recipe (exit status 1, not fitting, included)."""
    report = compile_records.compile_report(
        f"pretrain.py:size=large,phase={phase},tpu={tpu}", "--compilation_cache_dir=off"
    )
    report["name"] = f"recipe_{tpu}_p{phase}"
    return report


def table_row(r: dict) -> str:
    """The RESULTS_tpu.md row of a recipe's report (`compile_recipe`)."""
    tpu, phase = r["name"][len("recipe_") :].rsplit("_p", 1)
    m = r.get("hbm_gib", {})
    cap = r["hbm_capacity_gib"]
    hbm = (
        f"{m['arguments']:.2f} + {m['temporaries']:.2f} = **{m['total']:.2f}** / {cap:.0f} GiB "
        f"({m['total'] / cap:.0%})"
        if m
        else "does not fit"
    )
    mesh = ", ".join(f"{k}={v}" for k, v in r["mesh"].items() if v > 1)
    rows = r["batch"][0] // (r["mesh"]["data"] * r["mesh"]["fsdp"])
    coll = ", ".join(f"{k} {v}" for k, v in sorted(r.get("collectives", {}).items()) if v)
    compile_s = f"{r['compile_s']:.0f} + {r.get('eval_compile_s', 0):.0f}"
    return (
        f"| {tpu} ({r['topology']}) | {phase} | {mesh} | {r['remat_policy']}, "
        f"{r['num_microbatches']}, {'scanned' if r['scan_layers'] else 'unrolled'} | "
        f"{r['batch'][0]} ({rows} x {r['batch'][1]}) | {hbm} | "
        f"{'yes' if r['fits'] else 'no'} | {compile_s} | {coll} |"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="", help="comma-separated slices (default: all)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks/results/tpu_compile.jsonl"))
    parser.add_argument("--phases", default="1,2", help="comma-separated phases (default: both)")
    parser.add_argument("--table", action="store_true", help="print the recorded rows only")
    args = parser.parse_args(argv)
    from configs.pretrain import TPU_RECIPES

    slices = args.only.split(",") if args.only else list(TPU_RECIPES)
    unknown = sorted(set(slices) - set(TPU_RECIPES))
    if unknown:
        parser.error(f"unknown slices {unknown}; known: {sorted(TPU_RECIPES)}")
    by_name = compile_records.read(args.out)
    if args.table:
        for tpu in slices:
            for phase in (1, 2):
                print(table_row(by_name[f"recipe_{tpu}_p{phase}"]))
        return 0
    for tpu in slices:
        for phase in map(int, args.phases.split(",")):
            report = compile_recipe(tpu, phase)
            by_name.pop(report["name"], None)  # the newest last, as before
            by_name[report["name"]] = report
            compile_records.write(args.out, by_name)
            print(table_row(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
