"""What the card would run, read off the optimized HLO of the H100 step, compiled without a GPU.

    python benchmarks/gpu_step_hlo.py        # the four shapes of RESULTS_gpu.md, section 1
    python benchmarks/gpu_step_hlo.py --only=large_128x128 --output=benchmarks/results/x.jsonl

For each shape (`SHAPES`: BERT-large 128 x 128, 256 x 128 and 64 x 512 with attention dropout 0,
and the fine-tuning-shaped BERT-base 32 x 128 with dropout 0.1 everywhere) the pretraining step of
benchmarks/pretrain_step.py (AdamW, bfloat16, no remat) is compiled twice for the card
(`benchmarks/gpu_compile.py`), each in a process of its own:

  * as benchmarks/pretrain_step.py runs it (layers scanned for large, unrolled for base): XLA's
    plan of its buffers, in GB (`plan_gb`: what section 2 of RESULTS_gpu.md compares with the
    allocator's real peak);
  * unrolled, so that every count covers the whole step (XLA counts a loop body once): XLA's bytes
    accessed (`xla_bytes_gb`), kernel launches (`kernels`: fusions, custom calls and the few other
    instructions left outside fusions in the computations a step runs: ENTRY and loop bodies),
    of which cuBLAS / cuDNN calls (`library_calls`), copies (`copies`) and dynamic-update-slice
    kernels (`stacking`: a scanned loop's per-layer writes into its stacked buffers), and the
    random-number work: kernels that draw random bits (`rng_kernels`) and the integer operations
    they do for it (`rng_ops`: elements times unsigned-integer instructions, threefry's adds,
    rotations and xors or Philox's multiplies and xors; reported in billions).

One JSON line per shape, then the markdown table of RESULTS_gpu.md (counts of the unrolled step;
"as run": the step as section 1 measured it, a scanned loop's body counted once, and of its
kernels the dynamic-update-slices that stack a layer's saved activations and gradients).
Deviceless figures: the plan's sizes are those a real H100 had (0.6-2% under the allocator's
peak); kernels are counted, not timed.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> gpu_compile.py flags (besides --card and the layout): the four shapes of section 1.
SHAPES = {
    "large_256x128": ["--size=large", "--batch=256", "--seq=128", "--attention_dropout=0"],
    "large_64x512": ["--size=large", "--batch=64", "--seq=512", "--attention_dropout=0"],
    "large_128x128": ["--size=large", "--batch=128", "--seq=128", "--attention_dropout=0"],
    "base_32x128_dropout": ["--size=base", "--batch=32", "--seq=128"],
}
# The layout pretrain_step.py measured each shape with (section 1): scanned for large.
SCANNED = {"large_256x128", "large_64x512", "large_128x128"}

# Instructions that launch nothing: bookkeeping, or the loops and calls whose bodies are counted.
_NO_KERNEL = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "while",
    "call",
    "conditional",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*? ([\w\-]+)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+) [(]")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
# The integer arithmetic of random-number generators (threefry's adds, rotations and xors;
# Philox's 64-bit multiplies, as XLA expands RngBitGenerator), inlined by XLA into the kernels
# that use the bits: nothing else in the step computes on unsigned integers.
_RNG = re.compile(
    r"= u(?:32|64)\[([\d,]*)\][^=]*? (xor|shift-left|shift-right-logical|or|add|multiply|"
    r"rng-bit-generator)\("
)


def _computations(hlo: str) -> dict[str, list[str]]:
    """The HLO text's computations: name -> instruction lines ("ENTRY" for the entry)."""
    out, name = {}, None
    for line in hlo.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            m = _COMPUTATION.match(line)
            name = "ENTRY" if line.startswith("ENTRY") else (m.group(1) if m else None)
            out[name] = []
        elif name is not None and line.strip() != "}":
            out[name].append(line)
    return out


def _called(lines: list[str], comps: dict[str, list[str]]) -> set[str]:
    """Every computation the `lines` call, transitively (a fusion's nested computations)."""
    seen, todo = set(), [c for line in lines for c in _CALLS.findall(line)]
    while todo:
        c = todo.pop()
        if c not in seen and c in comps:
            seen.add(c)
            todo += [d for line in comps[c] for d in _CALLS.findall(line)]
    return seen


def hlo_counts(hlo: str) -> dict[str, int]:
    """Kernel launches, library calls, copies and random-number work of an optimized GPU HLO
    module's text (one pass of every loop body: compile unrolled for a whole step)."""
    comps = _computations(hlo)
    fused = {
        c
        for lines in comps.values()
        for line in lines
        if " fusion(" in line
        for c in _CALLS.findall(line)
    }
    counts = collections.Counter()
    for name, lines in comps.items():
        if name in fused or name not in _launching(comps, fused):
            continue
        for line in lines:
            m = _INSTRUCTION.match(line)
            if not m or m.group(2) in _NO_KERNEL:
                continue
            counts["kernels"] += 1
            op = m.group(2)
            counts["library_calls"] += op == "custom-call"
            counts["copies"] += op == "copy" or "calls=%fused_copy" in line
            counts["stacking"] += "dynamic_update_slice" in line or "dynamic-update-slice" in line
            inner = [line] + [x for c in _called([line], comps) for x in comps[c]]
            rng = [m for m in map(_RNG.search, inner) if m]
            counts["rng_kernels"] += bool(rng)
            counts["rng_ops"] += sum(
                math.prod(int(d) for d in m.group(1).split(",") if d) for m in rng
            )
    return dict(counts)


def _launching(comps: dict[str, list[str]], fused: set[str]) -> set[str]:
    """The computations whose instructions launch kernels: ENTRY and the loop bodies and
    conditions it reaches (not fusions, nor the reducers and comparators ops call)."""
    out, todo = set(), ["ENTRY"]
    while todo:
        c = todo.pop()
        if c in out or c not in comps:
            continue
        out.add(c)
        for line in comps[c]:
            if re.search(r" (while|call|conditional)\(", line):
                todo += re.findall(
                    r"(?:body|condition|to_apply|calls|branch_computations)="
                    r"\{?%?([\w.\-]+)",
                    line,
                )
    return out - fused


def _compile(name: str, scanned: bool, card: str, hlo_path: str, extra=()) -> dict:
    """gpu_compile.py's JSON line for one shape, in a process of its own."""
    cmd = [
        sys.executable,
        os.path.join(ROOT, "benchmarks", "gpu_compile.py"),
        f"--card={card}",
        *SHAPES[name],
        *extra,
        f"--hlo={hlo_path}",
        *(["--scan"] if scanned else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(name: str, card: str, workdir: str, extra=()) -> dict:
    """One shape's row: the plan as measured on the card, the counts of the unrolled step;
    `extra`: more gpu_compile.py flags (--dropout_rng=rbg)."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, f"{name}_unrolled.hlo")
    unrolled = _compile(name, False, card, path, extra)
    plan = unrolled  # measured unrolled: one compile
    if name in SCANNED:
        plan = _compile(name, True, card, os.path.join(workdir, f"{name}_plan.hlo"), extra)
    else:
        shutil.copyfile(path, os.path.join(workdir, f"{name}_plan.hlo"))
    return {
        "name": name,
        "card": card,
        "scanned_plan": name in SCANNED,
        "plan_gb": plan["xla_plan_bytes"] / 1e9,
        "unrolled_plan_gb": unrolled["xla_plan_bytes"] / 1e9,
        "xla_bytes_gb": unrolled["xla_bytes_accessed"] / 1e9,
        **counted(name, workdir),
        "compile_s": plan["compile_s"],
        "unrolled_compile_s": unrolled["compile_s"],
        "jax": plan["jax"],
    }


def counted(name: str, workdir: str) -> dict:
    """`hlo_counts` of a shape's unrolled step, and (`as_run`) of the step as measured on the card
    (scanned for large: its loop body counted once), from the HLO files in `workdir`."""
    with open(os.path.join(workdir, f"{name}_unrolled.hlo")) as f:
        counts = hlo_counts(f.read())
    with open(os.path.join(workdir, f"{name}_plan.hlo")) as f:
        return {**counts, "as_run": hlo_counts(f.read())}


def table(rows: list[dict]) -> str:
    """The markdown table of `measure`'s rows."""
    out = [
        "| shape | plan GB | XLA bytes GB | kernels | cuDNN/cuBLAS calls | copies | RNG kernels "
        "| RNG integer ops (G) | as run: kernels, of them stacking "
        "| compile s (as run / unrolled) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        run = r["as_run"]
        out.append(
            f"| {r['name']} | {r['plan_gb']:.2f} | {r['xla_bytes_gb']:.1f} | {r['kernels']} | "
            f"{r['library_calls']} | {r['copies']} | {r.get('rng_kernels', 0)} | "
            f"{r.get('rng_ops', 0) / 1e9:.2f} | {run['kernels']}, {run.get('stacking', 0)} | "
            f"{r['compile_s']:.0f} / {r['unrolled_compile_s']:.0f} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--card", default="h100")
    parser.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--workdir", default="/tmp/gpu_step_hlo", help="where the HLO goes")
    parser.add_argument("--output", default="", help="also append the JSON lines to this file")
    parser.add_argument("--dropout_rng", default="threefry", help="threefry | rbg")
    parser.add_argument(
        "--recount", default="", help="a JSON-lines file of earlier rows: count their HLO again"
    )
    args = parser.parse_args(argv)
    if args.recount:
        with open(args.recount) as f:
            old = [json.loads(line) for line in f if line.strip()]
        rows = [{**r, **counted(r["name"], args.workdir)} for r in old]
        print("\n".join(json.dumps(r) for r in rows))
        print(table(rows))
        return 0
    names = [n for n in args.only.split(",") if n] or list(SHAPES)
    unknown = sorted(set(names) - set(SHAPES))
    if unknown:
        parser.error(f"unknown shapes {unknown}: expected some of {list(SHAPES)}")
    rows = []
    for name in names:
        extra = [] if args.dropout_rng == "threefry" else [f"--dropout_rng={args.dropout_rng}"]
        rows.append(measure(name, args.card, args.workdir, extra))
        rows[-1]["dropout_rng"] = args.dropout_rng
        print(json.dumps(rows[-1]), flush=True)
        if args.output:
            with open(args.output, "a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
