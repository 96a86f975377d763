"""Metric writers: `metrics.jsonl`, TensorBoard, `curves.png` and a console progress bar.

Only process 0 writes; on other processes every method is a no-op. The files go through
`etils.epath`, so a `gs://` (any URL) work directory stays a URL (see `MetricWriter`).

`metrics.jsonl` holds one JSON object per logged step: {"step": 200, "train/loss": 7.1, ...}.
`curves.png` (train and held-out loss and accuracies against steps) is redrawn at every
evaluation. While the progress bar is up, log lines are printed above it, never into its line.
"""

from __future__ import annotations

import json
import logging as std_logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping

import jax
from absl import logging
from etils import epath

from bert_jax.paths import as_path, is_url


class MetricWriter:
    """Writes scalar metrics for a run in `workdir`.

    Args:
      workdir: the run directory (metrics.jsonl, tensorboard/ and curves.png go there).
      total_steps: for the progress bar's ETA.
      initial_step: where the run (re)starts.
      progress: show a tqdm progress bar on the console; log lines go above it.
      curves: redraw `workdir/curves.png` whenever held-out ("eval/...") metrics are written.

    For a URL work directory (`gs://...`) the files are rewritten whole at each write (object
    stores cannot append): metrics.jsonl, and the TensorBoard events, which tensorboardX writes to
    a local staging folder (it cannot write through etils.epath: gs:// would need
    google-cloud-storage, other schemes become a local folder named after the URL) and which are
    copied to `workdir/tensorboard/` after each write and at `close`.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        total_steps: int,
        initial_step: int = 0,
        progress: bool = True,
        curves: bool = True,
    ):
        self.active = jax.process_index() == 0
        self._jsonl = self._tb = self._bar = self._stream = self._tb_staging = None
        self.workdir = as_path(workdir)
        self.jsonl_path = self.workdir / "metrics.jsonl"
        self.curves_path = self.workdir / "curves.png" if curves else None
        self._url = is_url(self.workdir)
        self._jsonl_text = ""  # a URL's metrics.jsonl, rewritten whole at each write
        self.history: dict[str, list[tuple[int, float]]] = {}  # name -> [(step, value)]
        self.latest: dict[str, float] = {}  # name -> its last value
        self._start_time, self._train_s, self._train_tokens = time.perf_counter(), 0.0, 0.0
        self._initial_step = self._last_train_step = initial_step
        if not self.active:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._read_history()  # a resumed run's curves keep their beginning
        if not self._url:
            self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        try:
            from tensorboardX import SummaryWriter

            if self._url:
                self._tb_staging = tempfile.mkdtemp(prefix="bert_jax_tensorboard_")
                (self.workdir / "tensorboard").mkdir(parents=True, exist_ok=True)
            self._tb = SummaryWriter(self._tb_staging or os.fspath(self.workdir / "tensorboard"))
        except ImportError:  # optional: metrics.jsonl and the console still work
            logging.warning("tensorboardX is not installed; no TensorBoard events are written")
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=initial_step,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
            )
            self._stream = _LogAboveBar.install(self._bar)

    def _read_history(self) -> None:
        if not self.jsonl_path.exists():
            return
        text = self.jsonl_path.read_text(encoding="utf-8")
        if self._url:
            self._jsonl_text = text
        for line in text.splitlines():
            row = json.loads(line)
            if row["step"] > self._initial_step:  # steps redone after a resume
                continue
            for key, value in row.items():
                if key != "step" and isinstance(value, float):
                    self.history.setdefault(key, []).append((row["step"], value))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Records `metrics` (names like "train/loss", "eval/mlm_accuracy") at `step`."""
        if not self.active:
            return
        clean = {k: _jsonable(v) for k, v in metrics.items()}
        line = json.dumps({"step": int(step), **clean}) + "\n"
        if self._url:
            self._jsonl_text += line
            self.jsonl_path.write_text(self._jsonl_text, encoding="utf-8")
        else:
            self._jsonl.write(line)
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if isinstance(value, float) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
            self._mirror_tensorboard()
        for key, value in clean.items():
            if isinstance(value, float):
                self.history.setdefault(key, []).append((int(step), value))
        self.latest.update(clean)
        if "train/tokens_per_s" in clean and "train/step_time_s" in clean:
            # The run's throughput: tokens and seconds of the windows, compile and eval left out.
            seconds = clean["train/step_time_s"] * (step - self._last_train_step)
            self._train_s += seconds
            self._train_tokens += clean["train/tokens_per_s"] * seconds
        if any(k.startswith("train/") for k in clean):
            self._last_train_step = step
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
        shown = {k: v for k, v in clean.items() if k.startswith("eval/") or _short(k) in _CONSOLE}
        logging.info("step %d: %s", step, " ".join(f"{k}={_fmt(v)}" for k, v in shown.items()))
        if self.curves_path and any(k.startswith("eval/") for k in clean):
            plot_curves(self.history, self.curves_path)

    def _mirror_tensorboard(self) -> None:
        """Copies the staged event files of a URL work directory to `workdir/tensorboard/`."""
        if self._tb_staging is None:
            return
        for local in sorted(epath.Path(self._tb_staging).iterdir()):
            if local.is_file():
                local.copy(self.workdir / "tensorboard" / local.name, overwrite=True)

    def _postfix(self) -> str:
        parts = []
        for key in ("train/loss", "train/mlm_accuracy", "eval/mlm_accuracy", "eval/accuracy"):
            if key in self.latest:
                parts.append(f"{key.replace('accuracy', 'acc')}={_fmt(self.latest[key])}")
        if "train/tokens_per_s" in self.latest:
            parts.append(f"{self.latest['train/tokens_per_s']:,.0f} tok/s")
        return " ".join(parts)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def summary(self, step: int, places: Mapping[str, str] = ()) -> str:
        """The run's closing summary: time, throughput, final metrics and where things are.

        Args:
          step: the step the run reached.
          places: label -> path of what the run wrote (exports, ...), listed after the metrics.
        """
        minutes = (time.perf_counter() - self._start_time) / 60
        lines = [f"Done: step {step} in {minutes:.1f} min"]
        if self._train_s > 0:
            lines[0] += (
                f" ({self._train_s / 60:.1f} min of training steps at "
                f"{self._train_tokens / self._train_s:,.0f} tokens/s; the rest is compilation, "
                "evaluation, data and saving)"
            )
        for prefix, title in (("eval/", "held-out"), ("train/", "train (last window)")):
            keys = [
                k
                for k in self.latest
                if k.startswith(prefix) and (_short(k) in _SUMMARY or k in _BASELINES)
            ]
            if keys:
                shown = ", ".join(f"{_short(k)} {_fmt(self.latest[k])}" for k in keys)
                lines.append(f"  {title}: {shown}")
        listed = dict(places)
        listed["metrics"] = os.fspath(self.jsonl_path)
        if self.curves_path and self.curves_path.exists():
            listed["curves"] = os.fspath(self.curves_path)
        if self._tb is not None:
            board = os.fspath(self.workdir / "tensorboard")
            listed["TensorBoard"] = f"tensorboard --logdir {board}"
        lines.extend(f"  {label}: {where}" for label, where in listed.items())
        return "\n".join(lines)

    def close(self) -> None:
        if not self.active:
            return
        if self._bar is not None:
            self._bar.close()
            self._stream.uninstall()
        if self._tb is not None:
            self._tb.close()
            self._mirror_tensorboard()
        if self._tb_staging is not None:
            shutil.rmtree(self._tb_staging, ignore_errors=True)
        if self._jsonl is not None:
            self._jsonl.close()


class _LogAboveBar:
    """A stream for absl's handler that prints each log line above the progress bar."""

    def __init__(self, bar, handler: std_logging.StreamHandler):
        stream = handler.stream
        while isinstance(stream, _LogAboveBar):  # a bar left open (a run that raised): replaced
            stream = stream.stream
        self.bar, self.handler, self.stream = bar, handler, stream

    @classmethod
    def install(cls, bar) -> _LogAboveBar:
        handler = logging.get_absl_handler().python_handler
        self = cls(bar, handler)
        handler.setStream(self)
        return self

    def uninstall(self) -> None:
        if self.handler.stream is self:
            self.handler.setStream(self.stream)

    def write(self, text: str) -> None:
        if text.strip():  # on the bar's own stream, so the bar is cleared and redrawn below it
            self.bar.write(text.rstrip("\n"), file=self.bar.fp)

    def flush(self) -> None:
        self.stream.flush()

    def close(self) -> None:
        """Nothing to close: the console stream is not ours (logging calls this at exit when a
        run raised before its bar was closed)."""


class _QuietLibraries(std_logging.Filter):
    """Drops the INFO chatter of Orbax, grain, JAX and absl (every save logs dozens of lines)."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        noisy = any(f"/{lib}/" in record.pathname for lib in _NOISY)
        return record.levelno >= std_logging.WARNING or not noisy


_NOISY = ("orbax", "grain", "jax", "etils", "absl")
# Warnings libraries raise on every run that say nothing to a user of this project.
_IGNORED_WARNINGS = (
    r".*Sharding info not provided when restoring.*",
    r".*Couldn't find sharding info under RestoreArgs.*",
    r".*os\.fork\(\) was called.*",
)


def configure_console() -> None:
    """A readable console: short "HH:MM:SS message" log lines, library INFO chatter dropped,
    Python warnings logged once through the same handler (so they too print above the bar)."""
    import warnings

    logging.use_absl_handler()  # app.run does this too; a script without it gets it here
    handler = logging.get_absl_handler()
    if not any(isinstance(f, _QuietLibraries) for f in handler.filters):
        handler.addFilter(_QuietLibraries())
    handler.setFormatter(_ConsoleFormatter())
    for pattern in _IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    std_logging.captureWarnings(True)


class _ConsoleFormatter(std_logging.Formatter):
    """ "12:01:33 message" ("W 12:01:33 message" for warnings and errors)."""

    def __init__(self):
        super().__init__("%(asctime)s %(message)s", datefmt="%H:%M:%S")

    def format(self, record: std_logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < std_logging.WARNING else f"{record.levelname[0]} {text}"


def plot_curves(history: Mapping[str, list[tuple[int, float]]], path: str | os.PathLike) -> None:
    """Draws loss and accuracies against steps into a PNG (no display needed).

    Args:
      history: metric name ("train/loss", "eval/mlm_accuracy", ...) -> [(step, value)].
      path: the PNG to (over)write (a `gs://` URL stays a URL).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=90)
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.subplots(1, 2)
    for ax, wanted, title in (
        (loss_ax, lambda k: _short(k) == "loss", "loss"),
        (
            acc_ax,
            lambda k: _short(k).endswith("accuracy") or k == "eval/nsp_auc",
            "accuracy (and held-out NSP AUC: 0.5 is chance)",
        ),
    ):
        for key in sorted(k for k in history if k.split("/")[0] in ("train", "eval")):
            if not wanted(key) or not history[key]:
                continue
            steps, values = zip(*history[key])
            held_out = key.startswith("eval/")
            label = f"{'held-out' if held_out else 'train'} {_short(key)}"
            ax.plot(steps, values, "o-" if held_out else "-", label=label, markersize=4)
        for key, (label, style) in _BASELINES.items():
            if ax is acc_ax and history.get(key):
                ax.axhline(history[key][-1][1], color="gray", ls=style, lw=1, label=label)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = as_path(path)
    tmp = path.parent / (path.name + ".tmp.png")
    with tmp.open("wb") as f:
        fig.savefig(f, format="png")
    tmp.replace(path)  # a reader never sees half a picture


_CONSOLE = ("loss", "mlm_accuracy", "nsp_accuracy", "cls_accuracy", "accuracy", "learning_rate")
_SUMMARY = ("loss", "mlm_accuracy", "nsp_accuracy", "nsp_auc", "accuracy", "mlm_loss", "nsp_loss")
# Held-out scores of a model that ignores its input: dashed lines in the curves, and in the
# summary next to the accuracies they are the floor of.
_BASELINES = {
    "eval/commonest_token_share": ("commonest token's share", "--"),
    "eval/nsp_majority_share": ("NSP majority class's share", ":"),
}


def _short(key: str) -> str:
    return key.split("/", 1)[-1]


def _jsonable(value):
    value = float(value)
    return value if math.isfinite(value) else str(value)


def _fmt(value) -> str:
    if isinstance(value, str):
        return value
    return f"{value:.4g}"
