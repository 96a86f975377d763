"""Compile every TPU recipe for its slice (no TPU needed) and print the results table.

    python benchmarks/tpu_recipes.py [--only=v5e-16] [--phases=2] [--out=...tpu_compile.jsonl]
    python benchmarks/tpu_recipes.py --table   # the rows of the reports already in --out
    python benchmarks/tpu_recipes.py --arch=modernbert [--sizes=large] [--table]
    python benchmarks/tpu_recipes.py --tiny --only=v5p-8 --phases=1 --out=/tmp/t.jsonl  # a check
    python benchmarks/tpu_recipes.py --bound [--only=v5e-64] [--proxy_layers=2,3] [--table]

Runs `train.py --config=configs/pretrain.py:size=large,phase=P,tpu=SLICE --mode=compile` for each
recipe of `configs/pretrain.py:TPU_RECIPES` and phase (one process each), adds the JSON report to
`--out` under the name `recipe_<slice>_p<phase>` (replacing an older line of that name) and prints
one markdown row per recipe, as benchmarks/RESULTS_tpu.md records them. Needs the `tpu` extra.
With `--arch=modernbert` it does the same for `MODERNBERT_TPU_RECIPES` (each slice's sizes and
phases, `...:size=SIZE,phase=P,tpu=SLICE,arch=modernbert`), named
`recipe_modernbert-<size>_<slice>_p<phase>`; their rows start with the size.

With `--bound` it gives each BERT recipe's phase-1 roofline MFU bound (`bert_jax.parallel.aot`),
which needs every layer in the program (XLA counts a loop body once): a recipe compiled unrolled
has it in its own report; the others are compiled again with `--config.runtime.scan_layers=False`
(report `bound_<slice>_p1`), or, with `--proxy_layers=2,3`, at 2 and 3 unrolled layers
(`bound_<slice>_p1_L2`, `..._L3`), from which FLOPs and bytes are extrapolated to 24 layers: every
layer between the first and the last adds the same program, so they are linear in the layers (a
check: the v5e-16 recipe's 24-layer figures against its proxies' line, RESULTS_tpu.md).
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


LAYERS = 24  # BERT-large


def bound_name(tpu: str, layers: int | None = None) -> str:
    """`bound_<slice>_p1` (24 layers unrolled), `bound_<slice>_p1_L<layers>` (a proxy)."""
    return f"bound_{tpu}_p1" + (f"_L{layers}" if layers else "")


def compile_bound(tpu: str, layers: int | None, extra: tuple[str, ...] = ()) -> dict:
    """The `--mode=compile` report of a recipe's phase 1 with every layer unrolled (and
    `layers` layers instead of 24 where given)."""
    flags = ["--config.runtime.scan_layers=False", "--config.num_microbatches=1"]
    if layers:
        flags.append(f"--config.model.num_hidden_layers={layers}")
    report = compile_records.compile_report(
        f"pretrain.py:size=large,phase=1,tpu={tpu}", "--compilation_cache_dir=off", *flags, *extra
    )
    report["name"] = bound_name(tpu, layers)
    return report


def roofline(report: dict, counts: tuple[float, float, float] | None = None) -> dict:
    """The roofline of a report (`training.compile_report._roofline`): its own counts, or
    `counts` = (XLA FLOPs, XLA bytes, model FLOPs) per device (extrapolated ones)."""
    from bert_jax import hardware

    chip = hardware.tpu_chip(report["device_kind"])
    per_chip = report["devices"] // report["chips"]
    peak, bandwidth = chip.peak_bf16_flops / per_chip, chip.hbm_bytes_per_s / per_chip
    flops, nbytes, model = counts or (
        report["xla_flops_per_device"],
        report["xla_bytes_per_device"],
        report["model_flops_per_device"],
    )
    compute_s, memory_s = flops / peak, nbytes / bandwidth
    step_s = max(compute_s, memory_s)
    return dict(
        xla_flops=flops,
        xla_bytes=nbytes,
        model_flops=model,
        compute_s=compute_s,
        memory_s=memory_s,
        mfu_bound=model / peak / step_s,
    )


def bound(by_name: dict, tpu: str) -> tuple[dict, str, dict] | None:
    """(roofline, how, report) of a recipe's phase 1: from its own unrolled compile, the
    24-layer unrolled one, or extrapolated from the two largest proxies (`--proxy_layers`);
    None if none is recorded at the recipe's current global batch (a record of an earlier batch
    does not count: `--bound` compiles it again)."""
    from configs.pretrain import TPU_RECIPES

    batch = [TPU_RECIPES[tpu][1], 128]
    by_name = {name: r for name, r in by_name.items() if r.get("batch") == batch}
    recipe = by_name.get(recipe_name(tpu, 1))
    if recipe and not recipe["scan_layers"] and recipe.get("roofline"):
        return roofline(recipe), "the recipe (unrolled)", recipe
    full = by_name.get(bound_name(tpu))
    if full and full.get("fits", True) and full.get("xla_bytes_per_device"):
        return roofline(full), "unrolled, 24 layers", full
    proxies = sorted(
        (r["name"], r)
        for r in by_name.values()
        if r.get("name", "").startswith(f"{bound_name(tpu)}_L")
    )
    proxies = sorted((int(name.rsplit("_L", 1)[1]), r) for name, r in proxies)
    if len(proxies) < 2 or proxies[-2][0] < 2:
        return None
    (n_small, small), (n_large, large) = proxies[-2:]
    if small["batch"] != large["batch"]:  # compiled for different recipes
        return None
    keys = ("xla_flops_per_device", "xla_bytes_per_device", "model_flops_per_device")
    per_layer = [(large[k] - small[k]) / (n_large - n_small) for k in keys]
    counts = tuple(large[k] + (LAYERS - n_large) * d for k, d in zip(keys, per_layer, strict=True))
    how = f"extrapolated from {n_small} and {n_large} unrolled layers"
    return roofline(large, counts), how, large


def bound_row(tpu: str, result: tuple[dict, str, dict]) -> str:
    """The RESULTS_tpu.md row of a recipe's phase-1 bound (`bound`)."""
    r, how, report = result
    rows = report["batch"][0] // report["devices"]
    return (
        f"| {tpu} ({report['topology']}) | {report['batch'][0]} ({rows} x {report['batch'][1]}) "
        f"| {how} | {r['xla_flops'] / 1e12:.3f} | {r['model_flops'] / 1e12:.3f} | "
        f"{r['xla_bytes'] / 1e9:.2f} | {r['compute_s'] * 1e3:.1f} / {r['memory_s'] * 1e3:.1f} ms "
        f"| **{100 * r['mfu_bound']:.1f}%** |"
    )


def recipes(arch: str, sizes: list[str]) -> dict[str, list[tuple[str, int]]]:
    """slice -> its (size, phase) recipes, in the table's order."""
    from configs.pretrain import MODERNBERT_TPU_RECIPES, TPU_RECIPES

    if arch == "bert":
        return {tpu: [("large", p) for p in phases] for tpu, (_, _, phases) in TPU_RECIPES.items()}
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
    parser.add_argument("--bound", action="store_true", help="phase 1's roofline MFU bounds")
    parser.add_argument(
        "--proxy_layers", default="", help="--bound: 2,3: extrapolate from 2 and 3 layers"
    )
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
    if args.bound:
        return bounds(by_name, slices, args, extra)
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


def bounds(by_name: dict, slices: list[str], args, extra: tuple[str, ...]) -> int:
    """--bound: compiles what each slice's phase-1 bound lacks (unless --table), prints its row."""
    for tpu in slices:
        if not args.table and bound(by_name, tpu) is None:
            layers = [int(x) for x in args.proxy_layers.split(",")] if args.proxy_layers else [0]
            for n in layers:
                report = compile_bound(tpu, n or None, extra)
                by_name[report["name"]] = report
                compile_records.write(args.out, by_name)
        result = bound(by_name, tpu)
        print(bound_row(tpu, result) if result else f"| {tpu} | not compiled |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
