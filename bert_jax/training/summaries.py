"""Metric writers: `metrics.jsonl`, TensorBoard, `curves.png` and a console progress bar.

A `MetricWriter` hands each step's metrics to its sinks, one per place they go (`Sink`):
`JsonlSink`, `TensorBoardSink`, `ConsoleSink` (a log line and the progress bar) and
`CurvesSink`. None of them knows a job's metric names: the job passes a `MetricView` saying what
to show. Only process 0 writes; on other processes every method is a no-op. The files go through
`etils.epath`, so a `gs://` (any URL) work directory stays a URL (see `MetricWriter`).

`metrics.jsonl` holds one JSON object per logged step: {"step": 200, "train/loss": 7.1, ...}.
`curves.png` (train and held-out loss and accuracies against steps) is redrawn at every
evaluation. While the progress bar is up, log lines are printed above it, never into its line.
"""

from __future__ import annotations

import dataclasses
import json
import logging as std_logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Protocol

import jax
from absl import flags, logging
from etils import epath

from bert_jax.paths import as_path, is_url, write_text_whole

# A cleaned metric value: a float, or its text where it is not finite ("nan", "inf").
Value = float | str
# The group of the final model's held-out scores (`MetricView`).
FINAL = "final/"


@dataclasses.dataclass(frozen=True)
class MetricView:
    """What a job shows of its metrics (every metric goes to metrics.jsonl and TensorBoard).

    In `console` and `summary` a name ending in "/" matches a group ("eval/": every held-out
    metric) and any other name a metric's name after its group ("loss": "train/loss",
    "eval/loss", "final/loss").

    A job that scores its final model once more at the end writes those scores as "final/..."
    (fine-tuning's final dev metrics, results.json's): once written, they stand in the summary
    and after the bar in place of the held-out ("eval/...") ones, the last evaluation during
    training, which would otherwise read as the run's result.

    Attributes:
      console: the metrics of the log line printed at each write.
      summary: the final metrics listed in `MetricWriter.summary`, held-out then train.
      progress: full names shown, in this order, after the progress bar ("accuracy" shortened to
        "acc"; a "tokens_per_s" as "12,345 tok/s").
      baselines: full name -> (label, line style) of held-out scores of a model that ignores its
        input: horizontal lines on the curves' accuracy panel, and in the summary beside the
        accuracies they are the floor of.
      curves_accuracy: full names drawn on the accuracy panel besides every "...accuracy".
      curves_accuracy_title: that panel's title.
      final_title: the summary's title of the "final/..." metrics.
    """

    console: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()
    progress: tuple[str, ...] = ()
    baselines: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    curves_accuracy: tuple[str, ...] = ()
    curves_accuracy_title: str = "accuracy"
    final_title: str = "final"


class Timing(Protocol):
    """The run's training throughput, owned by its timer (compilation and evaluation left out)."""

    train_seconds: float  # seconds of training steps
    train_tokens: float  # tokens those steps processed (global batch)


class Sink(Protocol):
    """One place metrics go; `MetricWriter` hands every sink each write, then closes them."""

    def write(self, step: int, metrics: Mapping[str, Value]) -> None: ...

    def close(self) -> None: ...


class MetricWriter:
    """Writes scalar metrics for a run in `workdir`, and keeps them (`history`, `latest`).

    Args:
      workdir: the run directory (metrics.jsonl, tensorboard/ and curves.png go there).
      total_steps: for the progress bar's ETA.
      initial_step: where the run (re)starts.
      progress: show a tqdm progress bar on the console; log lines go above it.
      curves: redraw `workdir/curves.png` whenever held-out ("eval/...") metrics are written.
      view: what the console, the progress bar, the curves and the summary show (None: no
        metric on the console, nothing after the bar, no baselines).

    For a URL work directory (`gs://...`) the files are rewritten whole at each write (object
    stores cannot append): metrics.jsonl, and the TensorBoard events (see `TensorBoardSink`).
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        total_steps: int,
        initial_step: int = 0,
        progress: bool = True,
        curves: bool = True,
        view: MetricView | None = None,
    ):
        self.active = jax.process_index() == 0
        self.view = view or MetricView()
        self.workdir = as_path(workdir)
        self.total_steps = total_steps
        self.jsonl_path = self.workdir / "metrics.jsonl"
        self.curves_path = self.workdir / "curves.png" if curves else None
        self.history: dict[str, list[tuple[int, float]]] = {}  # name -> [(step, value)]
        self.latest: dict[str, Value] = {}  # name -> its last value
        self._start_time = time.perf_counter()
        self._sinks: list[Sink] = []
        self._tb = self._console = None
        if not self.active:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = self.jsonl_path.read_text(encoding="utf-8") if self.jsonl_path.exists() else ""
        # A resumed run redoes the steps after its checkpoint: the rows an earlier run wrote past
        # it go (a fresh start keeps none), so every step has one row.
        kept = _rows_up_to(text, initial_step) if initial_step else ""
        if kept != text:
            write_text_whole(self.jsonl_path, kept)
        text = kept
        self.history = _read_history(text, initial_step)  # a resumed run's curves keep their start
        jsonl = JsonlSink(self.jsonl_path, text)
        # TensorBoard drops the earlier runs' events from the first step this run writes on.
        first = initial_step + 1 if initial_step else 0
        self._tb = TensorBoardSink.create(self.workdir / "tensorboard", first)
        self._console = ConsoleSink(self.view, total_steps, initial_step, progress)
        plot = CurvesSink(self.curves_path, self.history, self.view) if curves else None
        self._sinks = [s for s in (jsonl, self._tb, self._console, plot) if s is not None]

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Records `metrics` (names like "train/loss", "eval/mlm_accuracy") at `step`."""
        if not self.active:
            return
        step = int(step)
        clean = {k: _jsonable(v) for k, v in metrics.items()}
        for key, value in clean.items():
            if isinstance(value, float):
                self.history.setdefault(key, []).append((step, value))
        self.latest.update(clean)
        for sink in self._sinks:
            sink.write(step, clean)

    def advance(self, steps: int = 1) -> None:
        """Moves the progress bar on by `steps`."""
        if self._console is not None:
            self._console.advance(steps)

    def summary(
        self,
        step: int,
        places: Mapping[str, str] = (),
        timing: Timing | None = None,
        stopped_by: str | None = None,
    ) -> str:
        """The run's closing summary: time, throughput, final metrics and where things are.

        Args:
          step: the step the run reached.
          places: label -> path of what the run wrote (exports, ...), listed after the metrics.
          timing: the run's training throughput (None, or no seconds: not shown).
          stopped_by: the signal's name ("SIGINT") when one stopped the run before its end.
        """
        minutes = (time.perf_counter() - self._start_time) / 60
        lines = [f"Done: step {step} in {minutes:.1f} min"]
        if stopped_by:
            lines[0] = (
                f"Stopped by {stopped_by} at step {step} of {self.total_steps}, its checkpoint "
                f"saved (rerun the same command to resume); {minutes:.1f} min"
            )
        if timing is not None and timing.train_seconds > 0:
            lines[0] += (
                f" ({timing.train_seconds / 60:.1f} min of training steps at "
                f"{timing.train_tokens / timing.train_seconds:,.0f} tokens/s; the rest is "
                "compilation, evaluation, data and saving)"
            )
        if getattr(timing, "compiles", 0):
            n = timing.compiles
            lines[0] += f"; {n} compile{'s' if n > 1 else ''} (new batch shapes): "
            lines[0] += f"{timing.compile_s:.0f} s"
        groups = [("eval/", "held-out"), ("train/", "train (last window)")]
        if any(k.startswith(FINAL) for k in self.latest):  # the result: not the last eval's
            groups[0] = (FINAL, self.view.final_title)
        for prefix, title in groups:
            keys = [
                k
                for k in self.latest
                if k.startswith(prefix)
                and (_matches(k, self.view.summary) or k in self.view.baselines)
            ]
            if keys:
                shown = ", ".join(f"{_short(k)} {_fmt(self.latest[k])}" for k in keys)
                lines.append(f"  {title}: {shown}")
        listed = dict(places)
        listed["metrics"] = os.fspath(self.jsonl_path)
        if self.curves_path and self.curves_path.exists():
            listed["curves"] = os.fspath(self.curves_path)
        if self._tb is not None:
            listed["TensorBoard"] = f"tensorboard --logdir {os.fspath(self._tb.directory)}"
        lines.extend(f"  {label}: {where}" for label, where in listed.items())
        return "\n".join(lines)

    def close(self) -> None:
        for sink in reversed(self._sinks):  # the console first: the bar goes before the files
            sink.close()


def _rows_up_to(text: str, step: int) -> str:
    """The lines of a metrics.jsonl's text whose step is at most `step` (a line that a killed run
    left unfinished goes too)."""
    kept = []
    for line in text.splitlines():
        try:
            row_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue
        if row_step <= step:
            kept.append(line + "\n")
    return "".join(kept)


def _read_history(text: str, initial_step: int) -> dict[str, list[tuple[int, float]]]:
    """name -> [(step, value)] of a metrics.jsonl's text, up to `initial_step` (a resumed run
    redoes the steps after it)."""
    history: dict[str, list[tuple[int, float]]] = {}
    for line in text.splitlines():
        row = json.loads(line)
        if row["step"] > initial_step:
            continue
        for key, value in row.items():
            if key != "step" and isinstance(value, float):
                history.setdefault(key, []).append((row["step"], value))
    return history


class JsonlSink:
    """Appends one JSON line per write to `path` ({"step": 200, "train/loss": 7.1, ...}).

    Args:
      path: the metrics.jsonl (a URL is rewritten whole at each write: object stores cannot
        append).
      text: its content so far (a URL's new lines are added to it).
    """

    def __init__(self, path: epath.Path, text: str = ""):
        self.path = path
        self._url_text = text if is_url(path) else None
        self._file = None if self._url_text is not None else path.open("a", encoding="utf-8")

    def write(self, step: int, metrics: Mapping[str, Value]) -> None:
        line = json.dumps({"step": step, **metrics}) + "\n"
        if self._file is None:
            self._url_text += line
            self.path.write_text(self._url_text, encoding="utf-8")
        else:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


# The characters a TensorBoard tag may hold; tensorboardX replaces others by "_" with a warning
# at every write ("eval/ndcg@10" -> "eval/ndcg_10"): done here, once, without the warnings.
_TAG_CHARACTERS = re.compile(r"[^-/\w.]")


class TensorBoardSink:
    """Writes the finite float metrics as TensorBoard scalars (tensorboardX) in `directory`.

    tensorboardX cannot write through etils.epath (gs:// would need google-cloud-storage, other
    schemes become a local folder named after the URL), so for a URL `directory` it writes to a
    local staging folder whose event files are copied to `directory` after each write and at
    `close`.
    """

    def __init__(self, directory: epath.Path, summary_writer_cls, purge_step: int | None = None):
        self.directory = directory
        self._staging = None
        if is_url(directory):
            self._staging = tempfile.mkdtemp(prefix="bert_jax_tensorboard_")
            directory.mkdir(parents=True, exist_ok=True)
        self._tb = summary_writer_cls(self._staging or os.fspath(directory), purge_step=purge_step)

    @classmethod
    def create(cls, directory: epath.Path, first_step: int = 1) -> TensorBoardSink | None:
        """The sink, or None (with a warning) where tensorboardX is not installed. Where earlier
        runs wrote events in `directory`, TensorBoard discards theirs from `first_step` on (a
        resumed run's are the ones kept: tensorboardX's `purge_step`)."""
        try:
            from tensorboardX import SummaryWriter
        except ImportError:  # optional: metrics.jsonl and the console still work
            logging.warning("tensorboardX is not installed; no TensorBoard events are written")
            return None
        earlier = directory.exists() and any(directory.iterdir())
        return cls(directory, SummaryWriter, purge_step=first_step if earlier else None)

    def write(self, step: int, metrics: Mapping[str, Value]) -> None:
        for key, value in metrics.items():
            if isinstance(value, float) and math.isfinite(value):
                self._tb.add_scalar(_TAG_CHARACTERS.sub("_", key), value, step)
        self._tb.flush()
        self._mirror()

    def _mirror(self) -> None:
        """Copies the staged event files of a URL directory to it."""
        if self._staging is None:
            return
        for local in sorted(epath.Path(self._staging).iterdir()):
            if local.is_file():
                local.copy(self.directory / local.name, overwrite=True)

    def close(self) -> None:
        self._tb.close()
        self._mirror()
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)


class ConsoleSink:
    """Logs the view's console metrics at each write ("step 200: train/loss=7.1 ..."), and keeps
    a tqdm progress bar (`advance`) with the view's progress metrics after it.

    Args:
      view: what to show.
      total_steps, initial_step: the bar's end and start.
      progress: show the bar; while it is up, log lines print above it (`_LogAboveBar`).
    """

    def __init__(self, view: MetricView, total_steps: int, initial_step: int, progress: bool):
        self.view = view
        self._shown: dict[str, Value] = {}  # the progress metrics' last values
        self._bar = self._stream = None
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

    def write(self, step: int, metrics: Mapping[str, Value]) -> None:
        self._shown.update(
            {k: v for k, v in metrics.items() if _held_out_name(k) in self.view.progress}
        )
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
        shown = {k: v for k, v in metrics.items() if _matches(k, self.view.console)}
        logging.info("step %d: %s", step, " ".join(f"{k}={_fmt(v)}" for k, v in shown.items()))

    def _postfix(self) -> str:
        parts = []
        for key in self.view.progress:
            final = FINAL + _short(key) if key.startswith("eval/") else None
            key = final if final in self._shown else key  # the final evaluation's, once there
            if key not in self._shown:
                continue
            if _short(key).endswith("tokens_per_s"):
                parts.append(f"{self._shown[key]:,.0f} tok/s")
            else:
                parts.append(f"{key.replace('accuracy', 'acc')}={_fmt(self._shown[key])}")
        return " ".join(parts)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._stream.uninstall()


class CurvesSink:
    """Redraws `path` (`plot_curves`) from `history` whenever held-out ("eval/...") metrics
    arrive.

    Args:
      path: the PNG.
      history: the writer's name -> [(step, value)], read (never changed) at each redraw.
      view: its baselines and accuracy panel.
    """

    def __init__(self, path: epath.Path, history: Mapping, view: MetricView):
        self.path, self.history, self.view = path, history, view

    def write(self, step: int, metrics: Mapping[str, Value]) -> None:
        del step
        if any(k.startswith("eval/") for k in metrics):
            plot_curves(self.history, self.path, self.view)

    def close(self) -> None:
        """Nothing held open."""


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
    if not flags.FLAGS.is_parsed():
        # Outside an absl app (python -m bert_jax.inference, a notebook, a test) nothing parsed
        # absl's flags, and its handler then writes every line straight to stderr, across the
        # progress bar: take their defaults (log to the handler's stream).
        flags.FLAGS.mark_as_parsed()
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


def plot_curves(
    history: Mapping[str, list[tuple[int, float]]],
    path: str | os.PathLike,
    view: MetricView | None = None,
) -> None:
    """Draws loss and accuracies against steps into a PNG (no display needed).

    Args:
      history: metric name ("train/loss", "eval/mlm_accuracy", ...) -> [(step, value)].
      path: the PNG to (over)write (a `gs://` URL stays a URL).
      view: the baselines and the accuracy panel's extra metrics and title (None: neither).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    view = view or MetricView()
    fig = Figure(figsize=(10, 4), dpi=90)
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.subplots(1, 2)
    for ax, wanted, title in (
        (loss_ax, lambda k: _short(k) == "loss", "loss"),
        (
            acc_ax,
            lambda k: _short(k).endswith("accuracy") or k in view.curves_accuracy,
            view.curves_accuracy_title,
        ),
    ):
        for key in sorted(k for k in history if k.split("/")[0] in ("train", "eval")):
            if not wanted(key) or not history[key]:
                continue
            steps, values = zip(*history[key])
            held_out = key.startswith("eval/")
            label = f"{'held-out' if held_out else 'train'} {_short(key)}"
            ax.plot(steps, values, "o-" if held_out else "-", label=label, markersize=4)
        for key, (label, style) in view.baselines.items():
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


def _matches(key: str, names: tuple[str, ...]) -> bool:
    """Whether `key` is one of `names` ("eval/": a group; "loss": a name after its group)."""
    return any(key.startswith(n) if n.endswith("/") else _short(key) == n for n in names)


def _held_out_name(key: str) -> str:
    """The "eval/..." name of a "final/..." metric (the same score of the final model); other
    names as they are."""
    return "eval/" + _short(key) if key.startswith(FINAL) else key


def _short(key: str) -> str:
    return key.split("/", 1)[-1]


def _jsonable(value):
    value = float(value)
    return value if math.isfinite(value) else str(value)


def _fmt(value) -> str:
    if isinstance(value, str):
        return value
    return f"{value:.4g}"
