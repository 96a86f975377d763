"""What the compile benchmarks share: run `train.py --mode=compile`, keep its reports by name.

`tpu_recipes.py`, `gpu_pretraining.py` and `gpu_recipes.py` compile configurations, each in a
process of its own (a TPU or GPU compiler, once loaded, stays in its process), and record the
JSON reports one a line in a file under `benchmarks/results/`, by the name of their row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
