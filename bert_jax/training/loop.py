"""The training loop shared by pretraining and fine-tuning: a Trainer that steps and runs hooks at
their cadence, and one Timer that owns the run's time.

    hooks = [LogMetrics(writer, every=(log_every, checkpoint_every), ckpt=ckpt),
             Evaluate(evaluate, writer, every=eval_every),
             SaveCheckpoint(ckpt, exp.checkpoint_meta(), every=checkpoint_every)]
    trainer = Trainer(exp, hooks, num_train_steps=..., stop_sync_every=log_every,
                      timer=Timer.for_mesh(exp.mesh, step_flops))
    state, step, stopped = trainer.run(start.state, start.step, batches)

Each hook says when it runs (`Hook.every`, `at_end`, `at_stop`); the Trainer asks, and before
running any hook waits for the step, so that hooks see finished steps and their host work
(logging, evaluating, saving) is left out of the training time the Timer measures. The loop is
host-side orchestration only: the math is `training.steps`' and `training.objectives`', the
compiled steps are the Experiment's (`bert_jax.training.experiment`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from absl import logging

from bert_jax import hardware
from bert_jax.checkpoints import checkpointing
from bert_jax.parallel import sharding
from bert_jax.parallel.preemption import PreemptionWatcher
from bert_jax.training import objective
from bert_jax.training.experiment import Experiment
from bert_jax.training.summaries import MetricWriter


def reduce_metrics(window: list[Mapping[str, Any]]) -> dict[str, float]:
    """Metrics of several steps or batches: sums, counts and histograms are added, loss and
    grad_norm averaged, the last learning rate and loss scale kept; then `objective.summarize`
    turns them into means (and AUCs). With float16's `skipped_steps` (a count over the window),
    loss and grad_norm are averaged over the applied steps (none applied: no loss, grad_norm)."""
    fetched = jax.device_get(window)
    total: dict[str, Any] = {}
    for m in fetched:
        for k, v in m.items():
            total[k] = total.get(k, 0.0) + np.asarray(v, np.float64)  # scalars, or histograms
    out = objective.summarize(total)
    applied = len(fetched) - float(total.get("skipped_steps", 0.0))
    for k in ("loss", "grad_norm"):
        if k in total:
            out.pop(k, None)
            if applied > 0:
                out[k] = total[k] / applied
    for k in ("learning_rate", "loss_scale"):
        if k in fetched[-1]:
            out[k] = float(fetched[-1][k])
    return out


# ---- Time ----
class Timer:
    """A run's time: compiles (a step whose batch shape is new: the first one, then each new
    length bucket), training seconds with the compiles and the hooks' host work left out, and the
    tokens and model FLOPs of the timed steps, per window and in total.

    Args:
      host_fraction: this host's share of the global batch's rows (its tokens scale by 1/it).
      step_flops: host batch -> model FLOPs of the global step, for MFU (None: no MFU).
      peak_flops: the devices' peak FLOP/s (all of them together), or None: no MFU.
    """

    def __init__(self, host_fraction: float = 1.0, step_flops=None, peak_flops=None):
        self.host_fraction, self.step_flops, self.peak_flops = host_fraction, step_flops, peak_flops
        self.compiles = 0  # steps that compiled (a batch shape not seen before)
        self.compile_s = 0.0  # their seconds (the compile and that one step's run)
        self._window_compiles, self._window_compile_s = 0, 0.0
        self._compile_began: float | None = None
        self.train_seconds = 0.0  # totals over the closed windows
        self.train_tokens = 0.0
        self._since: float | None = None  # when the running interval began (None: paused)
        self._seconds = self._tokens = self._flops = 0.0
        self._steps = 0

    @classmethod
    def for_mesh(cls, mesh, step_flops=None) -> Timer:
        """A Timer for a run on `mesh`, with MFU where the device's peak is known."""
        peak = hardware.peak_flops_per_device(jax.devices()[0].device_kind)
        return cls(
            sharding.host_batch_fraction(mesh),
            step_flops,
            peak * jax.device_count() if peak else None,
        )

    def start(self) -> None:
        """The loop begins: the first step (and its compile) starts now."""
        self._since = time.perf_counter()

    def compile_begins(self) -> None:
        """A step that compiles is dispatched now (the steps before it finished): its time is
        left out of the training seconds until `compile_done`."""
        self._stop_clock()
        self._compile_began = time.perf_counter()

    def compile_done(self) -> None:
        """The compiling step finished (the caller waited for it): its seconds are the
        compile's."""
        now = time.perf_counter()
        seconds = now - self._compile_began
        self.compiles += 1
        self.compile_s += seconds
        self._window_compiles += 1
        self._window_compile_s += seconds
        self._since, self._compile_began = now, None

    def count(self, host_batch: Mapping[str, np.ndarray]) -> None:
        """A timed step of this host's batch: its real tokens (scaled to the global batch) and
        model FLOPs."""
        self._steps += 1
        self._tokens += float(np.sum(host_batch["attention_mask"])) / self.host_fraction
        if self.step_flops is not None:
            self._flops += self.step_flops(host_batch)

    def _stop_clock(self) -> None:
        """Adds the running interval (if any) to the window's seconds and stops the clock."""
        if self._since is not None:
            self._seconds += time.perf_counter() - self._since
        self._since = None

    @contextlib.contextmanager
    def paused(self):
        """Host work that is not training (the hooks'): left out of the seconds."""
        self._stop_clock()
        try:
            yield
        finally:
            self._since = time.perf_counter()

    def window(self) -> dict[str, float]:
        """tokens_per_s, step_time_s and mfu (where known) of the timed steps since the last
        window, and `compiles` and `compile_s` where steps of the window compiled; the window
        closes. {} when nothing ran."""
        running = self._since is not None
        self._stop_clock()
        seconds = self._seconds
        if running:
            self._since = time.perf_counter()
        out = {}
        if seconds > 0 and self._tokens:
            out = {"tokens_per_s": self._tokens / seconds, "step_time_s": seconds / self._steps}
            if self.peak_flops and self._flops:
                out["mfu"] = self._flops / seconds / self.peak_flops
            self.train_seconds += seconds
            self.train_tokens += self._tokens
        if self._window_compiles:
            out.update(compiles=float(self._window_compiles), compile_s=self._window_compile_s)
        self._seconds = self._tokens = self._flops = self._window_compile_s = 0.0
        self._steps = self._window_compiles = 0
        return out


# ---- Hooks ----
@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What the loop hands its hooks after each step.

    Attributes:
      step: optimizer steps done (the state's step).
      state: the new TrainState (global arrays).
      metrics: the step's metric sums, on the devices.
      batch: the host batch of the step (this process's rows).
      last: the run's final step.
      stop: every process agreed to stop after this step (SIGTERM/SIGINT).
      timer: the run's Timer.
      data: the loop's batches (`sharding.DevicePrefetcher`): `data.consumed()` is the source
        iterator at the next step's batch, what a checkpoint saves.
    """

    step: int
    state: Any
    metrics: Mapping[str, jax.Array]
    batch: Mapping[str, np.ndarray]
    last: bool
    stop: bool
    timer: Timer
    data: Any = None


class Hook:
    """An action after a step, at its cadence: every `every` steps (several: at the multiples of
    each; 0: never periodically), at the run's last step (`at_end`) and at a step the run stops
    after on a signal (`at_stop`).

    `observe` runs after every step and must not wait for it (cheap bookkeeping); `run` runs at
    the cadence, after the step finished, outside the training time.
    """

    def __init__(self, every: int | Sequence[int] = 0, *, at_end: bool = True, at_stop=False):
        self.every = tuple(e for e in ((every,) if isinstance(every, int) else every) if e)
        self.at_end, self.at_stop = at_end, at_stop

    def due(self, info: StepInfo) -> bool:
        """Whether `run` is called after this step."""
        periodic = any(info.step % e == 0 for e in self.every)
        return periodic or (self.at_end and info.last) or (self.at_stop and info.stop)

    def observe(self, info: StepInfo) -> None:
        """After every step (the step may still be running)."""

    def run(self, info: StepInfo) -> None:
        """At the cadence (the step has finished)."""

    def close(self) -> None:
        """Called once when the loop ends (normally or not)."""


# float16: skipped steps in a row after which a run stops (more than the 24 halvings from the
# largest loss scale, 2^24, down to 1: the loss or gradients overflow even unscaled).
MAX_SKIPPED_STEPS_IN_A_ROW = 32


class LogMetrics(Hook):
    """Writes the window's training metrics: means of the sums, the Timer's tokens/s, step time
    and MFU (compiling steps left out), and the window's compiles (train/compiles,
    train/compile_s). Moves the progress bar on by the steps known finished, never by the steps
    dispatched. Stops the run with FloatingPointError on a non-finite loss (so give it the
    checkpoint cadence too: no state is saved unchecked); for float16 (whose overflowing steps are
    skipped, `steps.train_step`) when `MAX_SKIPPED_STEPS_IN_A_ROW` steps in a row were skipped.

    Args:
      writer: the run's MetricWriter.
      every: the cadence (e.g. (log_every_steps, checkpoint_every_steps)); also at the end and
        at a stop.
      ckpt: named in the error on a non-finite loss (its last good step).
    """

    def __init__(self, writer: MetricWriter, every=(), ckpt=None):
        super().__init__(every, at_end=True, at_stop=True)
        self.writer, self.ckpt = writer, ckpt
        self.window: list = []
        self.skipped_in_a_row = 0  # float16: steps skipped since the last applied one
        self.unfinished: list = []  # metrics of dispatched steps not yet known finished

    def observe(self, info: StepInfo) -> None:
        self.window.append(info.metrics)
        self.unfinished.append(info.metrics)
        done = 0  # steps finish in order: count the finished ones at the front
        while done < len(self.unfinished) and _ready(self.unfinished[done]):
            done += 1
        if done:
            self.writer.advance(done)
            del self.unfinished[:done]

    def run(self, info: StepInfo) -> None:
        if self.unfinished:  # the step (and every one before it) finished
            self.writer.advance(len(self.unfinished))
            self.unfinished = []
        summary = reduce_metrics(self.window)
        self._check_finite(summary, info.step)
        summary.update(info.timer.window())
        self.writer.write(info.step, {f"train/{k}": v for k, v in summary.items()})
        self.window = []

    def _check_finite(self, summary: Mapping[str, float], step: int) -> None:
        finite = np.isfinite(summary.get("loss", np.nan))
        if "skipped_steps" in self.window[-1]:  # float16: a window of skipped steps has no loss
            for skipped in jax.device_get([m["skipped_steps"] for m in self.window]):
                self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
            finite = self.skipped_in_a_row < MAX_SKIPPED_STEPS_IN_A_ROW and np.isfinite(
                summary.get("loss", 0.0)
            )
        if finite:
            return
        where = ""
        if self.ckpt is not None:
            self.ckpt.wait()
            where = (
                f" The last good checkpoint is step {self.ckpt.latest_step()} in "
                f"{self.ckpt.directory}"
            )
        if self.skipped_in_a_row:
            raise FloatingPointError(
                f"{self.skipped_in_a_row} steps in a row skipped at step {step} (non-finite "
                f"float16 loss or gradients, loss scale {summary.get('loss_scale')}); "
                f"stopping.{where}"
            )
        raise FloatingPointError(
            f"non-finite loss {summary.get('loss')} at step {step}; stopping.{where}"
        )


def _ready(metrics: Mapping[str, Any]) -> bool:
    """Whether the step that computed `metrics` finished (without waiting for it)."""
    return all(
        not isinstance(x, jax.Array) or x.is_ready() for x in jax.tree_util.tree_leaves(metrics)
    )


class Evaluate(Hook):
    """Runs `evaluate(params, step) -> metrics` every `every` steps (0: never) and at the last
    step, and writes them as eval/*.

    With `at_end=False` it skips the last step, periodic or not: for a job that evaluates the
    final model itself (fine-tuning), so the last step is evaluated once.
    """

    def __init__(self, evaluate: Callable, writer: MetricWriter, every: int, at_end=True):
        super().__init__(every, at_end=at_end)
        self.evaluate, self.writer = evaluate, writer

    def due(self, info: StepInfo) -> bool:
        return super().due(info) and (self.at_end or not info.last)

    def run(self, info: StepInfo) -> None:
        results = self.evaluate(info.state.params, info.step)
        self.writer.write(info.step, {f"eval/{k}": v for k, v in results.items()})


class SaveCheckpoint(Hook):
    """Saves the state and the data position every `every` steps, at the end and at a stop;
    waits for the last save when the loop ends.

    Args:
      ckpt: the run's Checkpointer.
      meta: JSON saved with each checkpoint, plus the step (`Experiment.checkpoint_meta()`).
      every: the cadence in steps.
    """

    def __init__(self, ckpt: checkpointing.Checkpointer, meta: Mapping, every: int):
        super().__init__(every, at_end=True, at_stop=True)
        self.ckpt, self.meta = ckpt, dict(meta)

    def observe(self, info: StepInfo) -> None:
        self.ckpt.check()  # a failed background save stops the run at the next step

    def run(self, info: StepInfo) -> None:
        data = info.data.consumed() if info.data is not None and info.data.stateful else None
        meta = {**self.meta, "step": info.step}
        self.ckpt.save(info.step, info.state, data_iterator=data, meta=meta)

    def close(self) -> None:
        self.ckpt.wait()


# ---- The loop ----
def _compiled_shapes(exp: Experiment) -> set:
    """The host batch shapes the Experiment's train step was compiled for: kept on the
    Experiment, whose compiled steps serve every seed of a fine-tuning run."""
    return exp.cached(("train_batch_shapes",), set)


class Trainer:
    """Runs an Experiment's train step over batches and runs its hooks at their cadence.

        trainer = Trainer(exp, hooks, num_train_steps=..., stop_sync_every=...)
        state, step, stopped = trainer.run(state, start_step, batches)

    The loop itself steps, times (`timer`), and agrees with the other processes on a stop
    request (SIGTERM/SIGINT: the loop ends after that step, whose `at_stop` hooks run; a local
    request is agreed at every `stop_sync_every`-th step; `parallel.preemption.stopped_by()` then
    names the signal). Hooks run in the order given;
    `steps()` yields each `StepInfo` after its hooks ran, for callers that watch the run.
    """

    def __init__(
        self,
        exp: Experiment,
        hooks: Sequence[Hook],
        *,
        num_train_steps: int,
        stop_sync_every: int,
        timer: Timer | None = None,
    ):
        self.exp, self.hooks = exp, list(hooks)
        self.num_train_steps, self.stop_sync_every = num_train_steps, stop_sync_every
        self.timer = timer if timer is not None else Timer.for_mesh(exp.mesh)

    def steps(self, state, start_step: int, batches: Iterator) -> Iterator[StepInfo]:
        """Trains from `start_step` to `num_train_steps` (or a stop request, or the data's end),
        yielding each step's info after the hooks ran. `batches`: host batches (this process's
        rows; dicts of numpy arrays), from a checkpointable iterator where the run saves its data
        position."""
        exp, watcher, timer = self.exp, PreemptionWatcher(), self.timer
        data = sharding.DevicePrefetcher(batches, exp.mesh, size=2)
        shapes = _compiled_shapes(exp)
        step = start_step
        try:
            with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
                timer.start()
                while step < self.num_train_steps:
                    try:
                        batch, host = next(data)
                    except StopIteration:
                        logging.warning("the training data ran out at step %d", step)
                        return
                    shape = tuple(sorted((k, np.shape(v)) for k, v in host.items()))
                    compiles = shape not in shapes  # a new batch shape compiles: not timed
                    if compiles:
                        jax.block_until_ready(state)  # the steps before it are training time
                        timer.compile_begins()
                    state, metrics = exp.train_step_fn(host)(state, batch)
                    if compiles:
                        jax.block_until_ready(metrics)
                        timer.compile_done()
                        shapes.add(shape)
                    else:
                        timer.count(host)
                    step += 1
                    last = step == self.num_train_steps
                    sync = step % self.stop_sync_every == 0 or last
                    # At the last step the run is done anyway: finished, not stopped.
                    stop = watcher.should_stop(step, sync_point=sync) and not last
                    info = StepInfo(step, state, metrics, host, last, stop, timer, data)
                    self._run_hooks(info)
                    yield info
                    if stop:
                        logging.warning("stopping at step %d after a stop request", step)
                        watcher.stopped()  # preemption.stopped_by() names the signal
                        return
        finally:
            # The last save is on disk before the signal handlers go back to their defaults: a
            # second SIGTERM (schedulers repeat it before they kill) cannot then end the process
            # mid-save.
            for hook in self.hooks:
                hook.close()
            watcher.close()

    def _run_hooks(self, info: StepInfo) -> None:
        for hook in self.hooks:
            hook.observe(info)
        due = [hook for hook in self.hooks if hook.due(info)]
        if due:
            jax.block_until_ready(info.metrics)  # the step (and all before it) finished
            with self.timer.paused():  # host work is not training time
                for hook in due:
                    hook.run(info)

    def run(self, state, start_step: int, batches: Iterator):
        """Runs `steps()` to the end. Returns (state, step reached, stopped by a signal)."""
        step, stopped = start_step, False
        for info in self.steps(state, start_step, batches):
            state, step, stopped = info.state, info.step, info.stop
        return state, step, stopped
