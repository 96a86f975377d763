"""Everything a lent GPU should measure, in one command; on a machine without one, a dry run.

    python benchmarks/gpu_suite.py              # on a machine with an NVIDIA GPU
    python benchmarks/gpu_suite.py --dry_run    # anywhere: the plan, each script's flags checked
    python benchmarks/gpu_suite.py --part=measure                 # on the GPU: steps 1 and 2
    python benchmarks/gpu_suite.py --part=predict --card=h200     # anywhere: step 3, then the table

On a GPU it runs, in order, each step in its own process (JAX's allocator keeps what it took, so
a torch peer after bert_jax in one process would run short of memory at BERT-large sizes):
  1. the tests that exercise the GPU paths (float16 loss scaling, the attention kernels),
  2. the pretraining step of BERT-large at 128 x 128 and 32 x 512 (bfloat16, cuDNN attention)
     and the fine-tuning-shaped step of BERT-base at 32 x 128 (BERT's dropout, xla attention):
     bert_jax against Hugging Face PyTorch eager and torch.compile (SDPA, bf16 autocast),
     `benchmarks/pretrain_step.py`, with the allocator's real peak memory,
  3. for the same shapes, the memory XLA plans when compiling for the card deviceless
     (`benchmarks/gpu_compile.py`), the prediction `--mode=compile --topology=gpu:CARD` rests on.
It writes every JSON line to `benchmarks/results/gpu_<card>_suite.jsonl` and a markdown table of
measured against predicted into `benchmarks/RESULTS_gpu.md`, between the markers
`<!-- gpu_suite:<card> -->` and `<!-- /gpu_suite:<card> -->` (appended the first time).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "benchmarks", "RESULTS_gpu.md")

# (name, pretrain_step.py / gpu_compile.py shape flags)
SHAPES = [
    ("large_128", ["--size=large", "--batch=128", "--seq=128", "--scan", "--attention_dropout=0"]),
    ("large_512", ["--size=large", "--batch=32", "--seq=512", "--scan", "--attention_dropout=0"]),
    ("base_finetune_128", ["--size=base", "--batch=32", "--seq=128"]),
]
PEERS = ("bert_jax", "torch_eager", "torch_compile")
TESTS = ["tests/training/loss_scale_test.py", "tests/models/attention_test.py"]


def steps(
    card: str | None, out: str, part: str = "all"
) -> list[tuple[str, list[str], dict[str, str]]]:
    """The suite's commands: (name, argv, extra environment); `part` "measure" keeps those that need
    the GPU (steps 1 and 2), "predict" the deviceless compiles (step 3), "all" both."""
    py = sys.executable
    gpu_env = {"JAX_PLATFORMS": "cuda,cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    plan = [("tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], gpu_env)]
    for name, shape in SHAPES:
        for peer in PEERS:
            argv = [py, "benchmarks/pretrain_step.py", *shape, "--dtype=bfloat16"]
            argv += [f"--peers={peer}", "--steps=10", "--rounds=3", "--peak_reps=0"]
            plan.append((f"{name}:{peer}", [*argv, f"--output={out}"], gpu_env))
    for name, shape in SHAPES:
        argv = [py, "benchmarks/gpu_compile.py", f"--card={card or 'h100'}", *shape]
        plan.append((f"{name}:predicted", [*argv, f"--output={out}"], {"JAX_PLATFORMS": "cpu"}))
    if part == "measure":
        return [step for step in plan if not step[0].endswith(":predicted")]
    if part == "predict":
        return [step for step in plan if step[0].endswith(":predicted")]
    return plan


def detect_card() -> str | None:
    """The `hardware.GPU_CARDS` name of this machine's first GPU (nvidia-smi), or None."""
    from bert_jax import hardware

    try:
        name = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return None
    for key, card in hardware.GPU_CARDS.items():
        if card.name == name.strip():
            return key
    return None


def _shape_key(row: dict) -> tuple:
    return (row["size"], row["batch"], row["seq"])


def table(rows: list[dict]) -> str:
    """Markdown: each shape's peers (s/step, tokens/s, MFU, allocator peak) and the prediction."""
    predicted = {_shape_key(r): r for r in rows if r.get("what") == "deviceless_compile"}
    measured = [r for r in rows if r.get("what") == "train_step" and "median_s" in r]
    lines = [
        "| size | batch x seq | peer | s/step | tokens/s | MFU | peak GB (allocator) | "
        "XLA plan GB (on the card) | predicted GB (deviceless) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in measured:
        p = predicted.get(_shape_key(r))
        gb = lambda x: f"{x / 1e9:.2f}" if x else ""  # noqa: E731
        lines.append(
            f"| {r['size']} | {r['batch']} x {r['seq']} | {r['peer']} | {r['median_s']:.4f} | "
            f"{r['tokens_per_s']:,.0f} | {r.get('mfu', 0):.3f} | {gb(r.get('peak_bytes'))} | "
            f"{gb(r.get('xla_plan_bytes'))} | "
            f"{gb(p['xla_plan_bytes']) if p and r['peer'] == 'bert_jax' else ''} |"
        )
    return "\n".join(lines)


def write_section(text: str, card: str, path: str = RESULTS) -> None:
    """Puts `text` between the card's markers in `path` (appending them the first time)."""
    begin, end = f"<!-- gpu_suite:{card} -->", f"<!-- /gpu_suite:{card} -->"
    doc = open(path).read() if os.path.exists(path) else ""
    block = f"{begin}\n{text}\n{end}"
    if begin in doc:
        doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + f"\n\n{block}\n"
    with open(path, "w") as f:
        f.write(doc)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry_run", action="store_true", help="print the plan, run nothing")
    parser.add_argument(
        "--part",
        choices=("all", "measure", "predict"),
        default="all",
        help="measure: the steps that need the GPU; predict: the deviceless compiles (no GPU "
        "needed, give --card), so that a short loan of a GPU runs only what needs it",
    )
    parser.add_argument("--card", help="the card's GPU_CARDS name, for --part=predict")
    args = parser.parse_args(argv)
    from bert_jax import hardware

    if args.card is not None and args.card not in hardware.GPU_CARDS:
        parser.error(f"--card: unknown card {args.card!r}; known: {', '.join(hardware.GPU_CARDS)}")
    card = args.card or detect_card()
    if card is None and not args.dry_run:
        print(
            "no NVIDIA GPU of bert_jax.hardware.GPU_CARDS here: use --dry_run",
            file=sys.stderr,
        )
        return 2
    out = os.path.join(ROOT, "benchmarks", "results", f"gpu_{card or 'none'}_suite.jsonl")
    plan = steps(card, out, args.part)
    failed = []
    for name, cmd, env in plan:
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        if args.dry_run:
            if cmd[1].startswith("benchmarks/"):  # the script's own parser reads the flags
                module = importlib.import_module(cmd[1][: -len(".py")].replace("/", "."))
                module.parse_args(cmd[2:])
            continue
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env})
        if proc.returncode:
            failed.append(name)
    if args.dry_run:
        print(f"dry run: {len(plan)} steps planned, every benchmark's flags parsed")
        return 0
    rows = [json.loads(line) for line in open(out)] if os.path.exists(out) else []
    write_section(table(rows), card)
    print(table(rows))
    print(f"failed steps: {failed}" if failed else "every step passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
