"""What the compile benchmarks share: run `train.py --mode=compile`, keep its reports by name.

`tpu_recipes.py`, `gpu_pretraining.py` and `gpu_recipes.py` compile configurations, each in a
process of its own (a TPU or GPU compiler, once loaded, stays in its process), and record the
JSON reports one a line in a file under `benchmarks/results/`, by the name of their row.
With `--tiny` each compiles its rows with a 1-layer 32-wide model on small batches (`TINY`; the
rows' meshes and settings otherwise), a check of the script whose figures are no recipe's: it
must then write to an `--out` of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# train.py flags of `--tiny` by config file: a 1-layer 32-wide model on 400 word pieces, rows of
# 32 tokens, pretraining batches of 16 rows (the compile of a TPU recipe's 1,024 rows takes 30 s
# even so; 16 rows split over at most 16 devices); the rows' meshes and settings otherwise.
_TINY_MODEL = (
    "--config.model.hidden_size=32",
    "--config.model.num_hidden_layers=1",
    "--config.model.num_attention_heads=2",
    "--config.model.intermediate_size=64",
    "--config.model.vocab_size=400",
)
TINY = {
    "pretrain.py": (
        *_TINY_MODEL,
        "--config.data.max_seq_length=32",
        "--config.data.max_predictions_per_seq=5",
        "--config.global_batch_size=16",
    ),
    "finetune.py": (*_TINY_MODEL, "--config.finetune.max_seq_length=32"),
}


def tiny_flags(config: str, tiny: bool, out: str, default_out: str, parser) -> tuple[str, ...]:
    """`TINY[config]` with `--tiny` (refused while `--out` is the recorded file, which it would
    overwrite with figures of no recipe), else nothing."""
    if not tiny:
        return ()
    if os.path.abspath(out) == os.path.abspath(default_out):
        parser.error(f"--tiny writes no recipe's figures: give an --out other than {default_out}")
    return TINY[config]


def compile_report(config: str, *flags: str) -> dict:
    """The JSON report of `train.py --config=configs/<config> --mode=compile <flags>`, whether or
    not the step fits (exit status 1); RuntimeError with the end of stderr on any other failure."""
    cmd = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        f"--config={os.path.join(ROOT, 'configs', config)}",
        "--mode=compile",
        *flags,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def read(path: str) -> dict[str, dict]:
    """The reports recorded in `path` by name ({} if there is no file)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r.get("name"): r for r in map(json.loads, filter(str.strip, f))}


def write(path: str, reports: Mapping[str, dict]) -> None:
    """Records `reports` in `path`, one JSON line each, in their order."""
    with open(path, "w") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in reports.values())
