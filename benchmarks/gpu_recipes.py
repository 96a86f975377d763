"""One-GPU fine-tuning recipes: for each card, BERT-base / BERT-large and task, the fewest
micro-batches (and remat) with which the published global batch fits, chosen by compiling.

    python benchmarks/gpu_recipes.py [--cards=t4,l4] [--out=...gpu_recipes.jsonl]
    python benchmarks/gpu_recipes.py --table   # the rows of the reports already in --out
    python benchmarks/gpu_recipes.py --tiny --cards=t4 --models=base --tasks=mrpc --out=/tmp/r.jsonl

For each (card, model, task) it compiles `train.py --config=configs/finetune.py:task=T,model=M
--mode=compile --topology=gpu:CARD` (no data, no GPU) with 1, 2, 4, 8 ... micro-batches and
remat "none", then the same with remat "dots", and keeps the first that fits: the largest
per-step batch (global batch / micro-batches) without recomputation where one exists. Layers are
scanned (a faster compile; scanning plans a little more memory than unrolled layers, so a recipe
that fits scanned fits unrolled). The global batch is the published one: 32 (24 for SQuAD with
BERT-large, as google-research/bert's README runs it). The MFU bound needs unrolled layers and
one micro-batch (XLA counts a loop body once) and is left to `--mode=compile` of the chosen
recipe with `--config.runtime.scan_layers=False`.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "benchmarks", "results", "gpu_recipes.jsonl")
sys.path.insert(0, ROOT)

from benchmarks import compile_records  # noqa: E402  (after the path)

TASKS = {"mrpc": 128, "squad1": 384, "conll2003": 128, "swag": 128}  # task -> tokens a row
MODELS = ("base", "large")
MICROBATCHES = (1, 2, 4, 8, 16, 32)


def global_batch(model: str, task: str) -> int:
    return 24 if (model, task) == ("large", "squad1") else 32


def compile_recipe(
    card: str, model: str, task: str, microbatches: int, remat: str, extra: tuple[str, ...] = ()
) -> dict:
    """The `--mode=compile` JSON report of one candidate (exit status 1, not fitting, included);
    `extra`: more train.py flags (`compile_records.TINY`)."""
    return compile_records.compile_report(
        f"finetune.py:task={task},model={model}",
        f"--topology=gpu:{card}",
        f"--config.global_batch_size={global_batch(model, task)}",
        f"--config.num_microbatches={microbatches}",
        f"--config.runtime.remat_policy={remat}",
        "--config.runtime.scan_layers=True",
        *extra,
    )


def choose(card: str, model: str, task: str, extra: tuple[str, ...] = ()) -> dict:
    """The first candidate that fits (remat none before dots, fewer micro-batches first), or the
    last one tried, which does not."""
    report = {}
    for remat in ("none", "dots"):
        for k in MICROBATCHES:
            if global_batch(model, task) % k:
                continue
            report = compile_recipe(card, model, task, k, remat, extra)
            if report["fits"]:
                break
        if report["fits"]:
            break
    report.update(name=f"{card}_{model}_{task}", card=card, model=model)
    return report


def table_row(r: dict) -> str:
    """The RESULTS_gpu.md row of a recipe's report (`choose`)."""
    m, cap = r["hbm_gib"], r["hbm_capacity_gib"]
    per_step = r["batch"][0] // r["num_microbatches"]
    shape = " x ".join(map(str, r["batch"][1:]))
    recipe = f"{r['num_microbatches']} x {per_step}, remat {r['remat_policy']}"
    return (
        f"| {r['card']} | {r['model']} | {r['task']} ({shape}) | {r['dtype']} | "
        f"{recipe if r['fits'] else 'does not fit'} | {m['total']:.2f} / {cap:.1f} GiB "
        f"({m['total'] / cap:.0%}) |"
    )


def main(argv=None) -> int:
    from bert_jax import hardware

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cards", default=",".join(hardware.GPU_CARDS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--table", action="store_true", help="print the rows already in --out")
    parser.add_argument("--tiny", action="store_true", help="a 1-layer model: checks the script")
    args = parser.parse_args(argv)
    extra = compile_records.tiny_flags("finetune.py", args.tiny, args.out, OUT, parser)
    reports = compile_records.read(args.out)
    if not args.table:
        for card in args.cards.split(","):
            for model in args.models.split(","):
                for task in args.tasks.split(","):
                    r = choose(card, model, task, extra)
                    reports[r["name"]] = r
                    print(table_row(r), flush=True)
                    compile_records.write(args.out, reports)
    print(
        "| card | model | task (tokens a row) | dtype | micro-batches x rows, remat | "
        "memory: total / JAX's pool |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in reports.values():
        print(table_row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
