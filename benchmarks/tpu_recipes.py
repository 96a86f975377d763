"""Compile every TPU recipe for its slice (no TPU needed) and print the results table.

    python benchmarks/tpu_recipes.py [--only=v5e-16] [--phases=2] [--out=...tpu_compile.jsonl]
    python benchmarks/tpu_recipes.py --table   # the rows of the reports already in --out
    python benchmarks/tpu_recipes.py --arch=modernbert [--sizes=large] [--table]
    python benchmarks/tpu_recipes.py --tiny --only=v5p-8 --phases=1 --out=/tmp/t.jsonl  # a check

Runs `train.py --config=configs/pretrain.py:size=large,phase=P,tpu=SLICE --mode=compile` for each
recipe of `configs/pretrain.py:TPU_RECIPES` and phase (one process each), adds the JSON report to
`--out` under the name `recipe_<slice>_p<phase>` (replacing an older line of that name) and prints
one markdown row per recipe, as benchmarks/RESULTS_tpu.md records them. Needs the `tpu` extra.
With `--arch=modernbert` it does the same for `MODERNBERT_TPU_RECIPES` (each slice's sizes and
phases, `...:size=SIZE,phase=P,tpu=SLICE,arch=modernbert`), named
`recipe_modernbert-<size>_<slice>_p<phase>`; their rows start with the size.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import compile_records  # noqa: E402  (after the path)

OUT = os.path.join(ROOT, "benchmarks", "results", "tpu_compile.jsonl")


def recipe_name(tpu: str, phase: int, size: str = "large", arch: str = "bert") -> str:
    """The name of a recipe's report: `recipe_<slice>_p<phase>` (BERT-large), or
    `recipe_modernbert-<size>_<slice>_p<phase>`."""
    return f"recipe_{tpu}_p{phase}" if arch == "bert" else f"recipe_{arch}-{size}_{tpu}_p{phase}"


def compile_recipe(
    tpu: str, phase: int, size: str = "large", arch: str = "bert", extra: tuple[str, ...] = ()
) -> dict:
    """The `--mode=compile` JSON report of one recipe (exit status 1, not fitting, included);
    `extra`: more train.py flags (`compile_records.TINY`)."""
    variant = f"size={size},phase={phase},tpu={tpu}" + ("" if arch == "bert" else f",arch={arch}")
    report = compile_records.compile_report(
        f"pretrain.py:{variant}", "--compilation_cache_dir=off", *extra
    )
    report["name"] = recipe_name(tpu, phase, size, arch)
    return report


def table_row(r: dict) -> str:
    """The RESULTS_tpu.md row of a recipe's report (`compile_recipe`). ModernBERT's rows start
    with the size and give the rows a chip takes per micro-batch."""
    recipe = r["name"][len("recipe_") :]
    size = ""
    if recipe.startswith("modernbert-"):
        size, recipe = recipe[len("modernbert-") :].split("_", 1)
    tpu, phase = recipe.rsplit("_p", 1)
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
    per_chip = f"{rows} x {r['batch'][1]}"
    if size and r["num_microbatches"] > 1:
        per_chip += f", {rows // r['num_microbatches']} a micro-batch"
    coll = ", ".join(f"{k} {v}" for k, v in sorted(r.get("collectives", {}).items()) if v)
    compile_s = f"{r['compile_s']:.0f} + {r.get('eval_compile_s', 0):.0f}"
    return (
        f"| {size + ' | ' if size else ''}{tpu} ({r['topology']}) | {phase} | {mesh} | "
        f"{r['remat_policy']}, {r['num_microbatches']}, "
        f"{'scanned' if r['scan_layers'] else 'unrolled'} | "
        f"{r['batch'][0]} ({per_chip}) | {hbm} | "
        f"{'yes' if r['fits'] else 'no'} | {compile_s} | {coll} |"
    )


def recipes(arch: str, sizes: list[str]) -> dict[str, list[tuple[str, int]]]:
    """slice -> its (size, phase) recipes, in the table's order."""
    from configs.pretrain import MODERNBERT_TPU_RECIPES, TPU_RECIPES

    if arch == "bert":
        return {tpu: [("large", p) for p in phases] for tpu, (_, phases) in TPU_RECIPES.items()}
    return {
        tpu: [(size, p) for size in sizes for (s, p) in sorted(entries) if s == size]
        for tpu, (_, entries) in MODERNBERT_TPU_RECIPES.items()
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="", help="comma-separated slices (default: all)")
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--phases", default="1,2", help="comma-separated phases (default: both)")
    parser.add_argument("--table", action="store_true", help="print the recorded rows only")
    parser.add_argument("--arch", default="bert", choices=["bert", "modernbert"])
    parser.add_argument(
        "--sizes", default="base,large", help="--arch=modernbert: comma-separated sizes"
    )
    parser.add_argument("--tiny", action="store_true", help="a 1-layer model: checks the script")
    args = parser.parse_args(argv)
    extra = compile_records.tiny_flags("pretrain.py", args.tiny, args.out, OUT, parser)
    if extra and args.arch == "modernbert":  # its special ids lie past 400 word pieces, and 16
        # rows make no 14-28 micro-batches of its recipes
        extra = (*(f for f in extra if "vocab_size" not in f), "--config.num_microbatches=1")
    by_slice = recipes(args.arch, args.sizes.split(","))
    slices = args.only.split(",") if args.only else list(by_slice)
    unknown = sorted(set(slices) - set(by_slice))
    if unknown:
        parser.error(f"unknown slices {unknown}; known: {sorted(by_slice)}")
    by_name = compile_records.read(args.out)
    if args.table:
        for tpu in slices:
            for size, phase in by_slice[tpu]:
                print(table_row(by_name[recipe_name(tpu, phase, size, args.arch)]))
        return 0
    phases = set(map(int, args.phases.split(",")))
    for tpu in slices:
        for size, phase in by_slice[tpu]:
            if phase not in phases:
                continue
            report = compile_recipe(tpu, phase, size, args.arch, extra)
            by_name.pop(report["name"], None)  # the newest last, as before
            by_name[report["name"]] = report
            compile_records.write(args.out, by_name)
            print(table_row(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
