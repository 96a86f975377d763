"""Metric writers: `metrics.jsonl`, TensorBoard and a console progress bar with an ETA.

Only process 0 writes; on other processes every method is a no-op.

`metrics.jsonl` holds one JSON object per logged step: {"step": 200, "train/loss": 7.1, ...}.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping

import jax
from absl import logging


class MetricWriter:
    """Writes scalar metrics for a run in `workdir`.

    Args:
      workdir: the run directory (metrics.jsonl and tensorboard/ go there).
      total_steps: for the progress bar's ETA.
      initial_step: where the run (re)starts.
      progress: show a tqdm progress bar on the console.
    """

    def __init__(self, workdir: str, total_steps: int, initial_step: int = 0, progress=True):
        self.active = jax.process_index() == 0
        self._jsonl = self._tb = self._bar = None
        if not self.active:
            return
        os.makedirs(workdir, exist_ok=True)
        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")
        try:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
        except ImportError:  # optional: metrics.jsonl and the console still work
            logging.warning("tensorboardX is not installed; no TensorBoard events are written")
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True
            )

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Records `metrics` (names like "train/loss") at `step`."""
        if not self.active:
            return
        clean = {k: _jsonable(v) for k, v in metrics.items()}
        self._jsonl.write(json.dumps({"step": int(step), **clean}) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if isinstance(value, float) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        shown = {k.split("/", 1)[-1]: v for k, v in clean.items() if k.startswith("train/")}
        text = " ".join(f"{k}={_fmt(v)}" for k, v in shown.items() if k in _CONSOLE)
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
        logging.info("step %d: %s", step, " ".join(f"{k}={_fmt(v)}" for k, v in clean.items()))

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def close(self) -> None:
        if not self.active:
            return
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        self._jsonl.close()


_CONSOLE = ("loss", "mlm_accuracy", "nsp_accuracy", "cls_accuracy", "tokens_per_s", "mfu")


def _jsonable(value):
    value = float(value)
    return value if math.isfinite(value) else str(value)


def _fmt(value) -> str:
    if isinstance(value, str):
        return value
    return f"{value:.4g}"
