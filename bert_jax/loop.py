"""The training loop shared by pretraining and fine-tuning.

    exp = Experiment.build(config, cfg, model_name, objective, num_train_steps)
    state, start = exp.create_or_restore(ckpt, data_iterator, init_from=config.init_from)
    hooks = [LogMetrics(writer, exp.mesh), Evaluate(evaluate, writer, every_steps=1000),
             SaveCheckpoint(ckpt, exp.checkpoint_meta(), data_iterator)]
    state, step, stopped = Trainer(exp, hooks, num_train_steps=..., log_every_steps=...,
                                   checkpoint_every_steps=...).run(state, start, batches)

`Experiment` holds what a run needs besides data (model, mesh, optimizer, state shardings) and
creates, restores and exports the state. It jits each step (init, train, eval, predict) once and
keeps it, with the parameters as arguments, so every evaluation and every seed of a run reuses one
compiled program per batch shape; `compile_train_step` is the one place a train step is jitted,
and `enable_compilation_cache` keeps the programs on disk across runs. `Trainer` steps and calls
its hooks (periodic actions: logging, evaluation, checkpointing) after each step. Everything here
is host-side orchestration; the math lives in `bert_jax.steps` and `bert_jax.objectives`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax
from absl import logging
from etils import epath

from bert_jax import checkpointing, convert, flops, objectives, optimizer, sharding, steps
from bert_jax.attention import current_platform, resolve_attention
from bert_jax.config import BertConfig, RuntimeConfig
from bert_jax.model import count_params, get_model_class, stack_layers
from bert_jax.paths import as_path
from bert_jax.preemption import PreemptionWatcher
from bert_jax.summaries import MetricWriter

PyTree = Any


def default_compilation_cache_dir() -> str:
    """$XDG_CACHE_HOME/bert_jax/jax, by default ~/.cache/bert_jax/jax."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bert_jax", "jax")


def enable_compilation_cache(directory: str = "auto") -> str | None:
    """Turns JAX's persistent compilation cache on (or off) for this process.

    Compiled programs are written to disk, and a later run that compiles the same program (same
    shapes, JAX version, devices and flags) loads it instead: a restarted or repeated fine-tuning
    run skips its compiles. JAX writes only programs that took at least
    `jax_persistent_cache_min_compile_time_secs` (1 s by default) to compile. Call it before the
    first compile.

    Args:
      directory: "auto": $JAX_COMPILATION_CACHE_DIR if set, else `default_compilation_cache_dir()`;
        "off": no persistent cache; anything else: the cache directory.

    Returns:
      The cache directory, or None when off.
    """
    if not directory:
        raise ValueError("the compilation cache directory is empty; use 'auto', 'off' or a path")
    if directory == "off":
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if directory == "auto":
        directory = jax.config.jax_compilation_cache_dir or default_compilation_cache_dir()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", directory)
    return directory


@dataclasses.dataclass
class Experiment:
    """Everything a run needs besides data: model, mesh, optimizer and state shardings."""

    cfg: BertConfig
    runtime: RuntimeConfig
    model_name: str
    model: nn.Module
    mesh: Any
    rules: list
    tx: optax.GradientTransformation
    schedule: Any
    objective: objectives.Objective
    abstract_state: PyTree  # the boxed abstract TrainState (logical axes)
    state_shardings: PyTree
    seed: int
    num_microbatches: int = 1
    compiler_options: dict = dataclasses.field(default_factory=dict)  # XLA's, for every step
    loss_scale: steps.DynamicLossScale | None = None  # float16 runs: dynamic loss scaling
    # The jitted steps, built once: (kind, arguments) -> jitted function. JAX keeps one compiled
    # program per input shape inside each, so a step compiles once per shape for the whole run.
    _jitted: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        config,
        cfg: BertConfig,
        model_name: str,
        objective: str,
        num_train_steps: int,
        devices: list | None = None,
    ):
        """`devices`: the mesh's devices (all of this run's by default; a TPU topology's
        compile-only devices for ahead-of-time compilation, `bert_jax.aot`)."""
        mesh = sharding.make_mesh(config.mesh.to_dict(), devices)
        tensor = mesh.shape["tensor"]
        if tensor > 1 and cfg.padded_vocab_size % (128 * tensor):
            logging.warning(
                "the word-embedding table's %d rows are not a multiple of 128 x tensor=%d: "
                "its shards are unaligned or it is replicated; set "
                "--config.model.vocab_pad_multiple=%d",
                cfg.padded_vocab_size,
                tensor,
                128 * tensor,
            )
        # dtype "auto" becomes concrete once, for the mesh's platform (float32 on CPUs); the
        # attention kernel is checked here too, so a bad choice fails before any compile.
        platform, capability = current_platform(mesh), compute_capability(mesh)
        runtime = RuntimeConfig(**config.runtime.to_dict()).resolved(
            platform, compute_capability=capability
        )
        kernels = [
            resolve_attention(runtime, cfg, platform, training=t, compute_capability=capability)
            for t in (True, False)
        ]
        if runtime.attention == "auto" and platform == "cuda" and kernels == ["xla", "xla"]:
            # The model resolves "auto" again without knowing the card, and would pick cuDNN on
            # a GPU below cuDNN's compute capability: pin what was chosen here.
            runtime = dataclasses.replace(runtime, attention="xla")
        logging.info("%s: %s; attention %s (train), %s (eval)", platform, runtime, *kernels)
        model = get_model_class(model_name)(cfg, runtime)
        rules = [(n, tuple(a) if isinstance(a, list) else a) for n, a in config.sharding_rules]
        tx, schedule = optimizer.from_config(config.optimizer, num_train_steps)
        loss_scale = None
        if runtime.dtype == "float16":
            loss_scale = steps.DynamicLossScale(runtime.loss_scale_init, runtime.loss_scale_period)
        init_fn = functools.partial(
            steps.init_train_state, model=model, tx=tx, loss_scale=loss_scale
        )
        abstract_state = jax.eval_shape(init_fn, jax.random.PRNGKey(config.seed))
        state_shardings = sharding.logical_shardings(abstract_state, mesh, rules)
        logging.info(
            "%s: %s parameters; mesh %s",
            model_name,
            f"{count_params(abstract_state.params):,}",
            dict(mesh.shape),
        )
        return cls(
            cfg,
            runtime,
            model_name,
            model,
            mesh,
            rules,
            tx,
            schedule,
            objectives.get_objective(objective),
            abstract_state,
            state_shardings,
            config.seed,
            config.num_microbatches,
            runtime.compiler_options(platform),
            loss_scale,
        )

    # ---- state ----
    def _init_fn(self, rng, params=None):
        return steps.init_train_state(
            rng, model=self.model, tx=self.tx, params=params, loss_scale=self.loss_scale
        )

    def targets(self) -> PyTree:
        """Abstract unboxed state with shardings: what a checkpoint restores into."""
        return jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            nn.unbox(self.abstract_state),
            self.state_shardings,
        )

    def _cached(self, key: tuple, build: Callable[[], Callable]) -> Callable:
        """The jitted function stored under `key`, built by `build()` the first time."""
        if key not in self._jitted:
            self._jitted[key] = build()
        return self._jitted[key]

    def _init_from_params_fn(self) -> Callable:
        """The jitted (rng, sharded params) -> state around them (fresh optimizer state)."""
        return self._cached(
            ("init_from_params",),
            lambda: jax.jit(
                lambda r, p: self._init_fn(r, params=p), out_shardings=self.state_shardings
            ),
        )

    def init_state(self, params: PyTree | None = None, *, seed: int | None = None):
        """A fresh sharded state: from scratch, or around given (host) parameters.

        Args:
          params: host parameters of the model (unstacked layers; vocabulary rows padded or not),
            or None for scratch.
          seed: the PRNG seed of the initialization and of the run's dropout (default: the
            config's `seed`).
        """
        rng = jax.random.PRNGKey(self.seed if seed is None else seed)
        if params is None:
            init = self._cached(
                ("init",),
                lambda: jax.jit(
                    lambda r: nn.unbox(self._init_fn(r)), out_shardings=self.state_shardings
                ),
            )
            return init(rng)
        params = convert.fit_vocab_rows(params, self.cfg)  # e.g. unpadded Hugging Face weights
        params = stack_layers(params) if self.runtime.scan_layers else params
        params = jax.device_put(
            jax.tree_util.tree_map(lambda x: np.asarray(x, self.runtime.param_dtype), params),
            self.state_shardings.params,
        )
        return self._init_from_params_fn()(rng, params)

    def _init_from_training_run(self, path: str, seed: int | None):
        """A fresh state around the parameters of a `train.py` run of this model, read straight
        into their shardings (no optimizer state, no host copy); None if `path` is no such run
        (another format, head, architecture or layer layout)."""
        if convert.detect_format(path) != "train":
            return None
        targets = self.targets().params
        loaded = convert.load_training_params_sharded(path, targets)
        if loaded is None or loaded[2] != self.model_name:
            return None
        _, params, _, step = loaded
        logging.info(
            "init_from %s: the parameters of step %d, read into their shardings", path, step
        )
        rng = jax.random.PRNGKey(self.seed if seed is None else seed)
        return self._init_from_params_fn()(rng, params)

    def create_or_restore(
        self,
        ckpt: checkpointing.Checkpointer,
        data_iterator=None,
        *,
        init_from: str = "",
        init_params: PyTree | None = None,
        seed: int | None = None,
    ):
        """The state a run starts from, and its step. In this order:

        1. the newest good checkpoint in the run's directory (with the data position);
        2. `init_params`, or the converted weights of `init_from` (fresh optimizer state);
        3. scratch.

        `seed` (default: the config's) seeds a fresh state's initialization and dropout.
        """
        restored = ckpt.restore_latest(self.targets(), data_iterator=data_iterator)
        if restored is not None:
            state = restored[1]
        elif init_params is not None:
            state = self.init_state(init_params, seed=seed)
        elif init_from:
            state = self._init_from_training_run(init_from, seed)
            if state is None:
                _, params, _, report = convert.load_any(
                    init_from, self.model_name, allow_new_heads=True
                )
                logging.info("init_from %s:\n%s", init_from, report.summary())
                state = self.init_state(params, seed=seed)
        else:
            state = self.init_state(seed=seed)
        return state, int(jax.device_get(state.step))

    # ---- compiled steps ----
    def jit_train_step(self, batch_shardings: PyTree) -> Callable:
        """`compile_train_step` with this experiment's model, optimizer, objective and shardings.
        What `train_step_fn` caches and what `bert_jax.aot` compiles for a TPU."""
        return compile_train_step(
            self.model,
            self.tx,
            self.objective,
            state_shardings=self.state_shardings,
            batch_shardings=batch_shardings,
            metrics_sharding=sharding.replicated(self.mesh),
            num_microbatches=self.num_microbatches,
            schedule=self.schedule,
            compiler_options=self.compiler_options,
            loss_scale=self.loss_scale,
        )

    def train_step_fn(self, host_batch: Mapping[str, np.ndarray]) -> Callable:
        """The jitted train step for batches with these keys, built once per set of batch keys and
        ranks (their shardings); JAX compiles it once per batch shape (length buckets), for every
        seed of the run."""
        ranks = tuple(sorted((k, np.ndim(v)) for k, v in host_batch.items()))
        return self._cached(
            ("train", ranks),
            lambda: self.jit_train_step(sharding.batch_shardings(host_batch, self.mesh)),
        )

    def eval_fn(self) -> Callable:
        """The jitted (params, global batch) -> the objective's metric sums (dropout off), built
        once."""
        return self._cached(
            ("eval",),
            lambda: jax.jit(
                functools.partial(steps.eval_step, model=self.model, objective=self.objective),
                compiler_options=self.compiler_options,
            ),
        )

    def predict_fn(self, **extra) -> Callable:
        """The jitted (params, global batch) -> model outputs (dropout off), built once per
        `extra` (keyword arguments of the model's call, e.g. output_hidden_states=True)."""
        return self._cached(
            ("predict", tuple(sorted(extra.items()))),
            lambda: jax.jit(
                functools.partial(steps.predict_step, model=self.model, **extra),
                compiler_options=self.compiler_options,
            ),
        )

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint records beside the state: the model's config.json fields and head
        (what `init_from` and `convert` read back)."""
        return {"config": self.cfg.to_hf_dict(self.model_name), "model": self.model_name}

    # ---- export ----
    def export(self, params: PyTree, out_dir: str, *, hf: bool = True) -> None:
        """Writes `out_dir/export` (bert_jax format) and, with `hf`, `out_dir/hf` (transformers).

        Every process must call this: the parameters are gathered to every host, all processes
        take part in the (collective) Orbax save, and process 0 alone writes the safetensors.
        """
        from jax.experimental import multihost_utils

        host_params = multihost_utils.process_allgather(params, tiled=True)
        out = as_path(out_dir)
        convert.save_pretrained(
            out / "export", self.cfg, host_params, self.model_name, overwrite=True
        )
        if hf and jax.process_index() == 0:
            convert.save_pytorch(self.cfg, host_params, out / "hf", self.model_name, overwrite=True)
        logging.info("exported %s to %s", self.model_name, out_dir)


def write_config(config, workdir: str) -> epath.Path:
    """Writes the experiment config as `<workdir>/config.json` (process 0; `gs://` and other
    URLs stay URLs) and returns the run directory."""
    directory = as_path(workdir)
    if jax.process_index() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(config.to_json_best_effort(indent=2))
    return directory


def checkpointer(workdir: str, config) -> checkpointing.Checkpointer:
    """The run directory's Checkpointer (<workdir>/checkpoints; a URL stays a URL)."""
    return checkpointing.Checkpointer(
        checkpointing.run_checkpoints(workdir),
        max_to_keep=config.max_checkpoints_to_keep,
        async_save=config.async_checkpointing,
    )


def compute_capability(mesh=None) -> str | None:
    """The compute capability ("7.5", "9.0") of the mesh's first device (of JAX's first device
    without a mesh) where it has one (CUDA GPUs); None elsewhere."""
    device = jax.devices()[0] if mesh is None else mesh.devices.flat[0]
    return getattr(device, "compute_capability", None)


def compile_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    objective: objectives.Objective,
    *,
    state_shardings: PyTree = None,
    batch_shardings: PyTree = None,
    metrics_sharding: Any = None,
    num_microbatches: int = 1,
    schedule: Callable | None = None,
    donate: bool = True,
    compiler_options: dict[str, str] | None = None,
    loss_scale: steps.DynamicLossScale | None = None,
) -> Callable:
    """The jitted (state, global batch) -> (state, metrics) of `steps.train_step`, the state
    donated (its buffers are reused for the new state; `donate=False` keeps it, for callers that
    step the same state twice). The one place a train step is compiled: the loop, `bert_jax.aot`,
    the tests and the benchmarks use it. Shardings left None are JAX's choice (one device);
    `compiler_options` are XLA's (`RuntimeConfig.compiler_options`); `loss_scale` turns on
    dynamic loss scaling (float16 runs; the state is then a `steps.ScaledTrainState`)."""
    step = functools.partial(
        steps.train_step,
        model=model,
        tx=tx,
        objective=objective,
        num_microbatches=num_microbatches,
        schedule=schedule,
        loss_scale=loss_scale,
    )
    shardings = {}
    if state_shardings is not None:
        shardings = dict(
            in_shardings=(state_shardings, batch_shardings),
            out_shardings=(state_shardings, metrics_sharding),
        )
    return jax.jit(
        step,
        donate_argnums=0 if donate else (),
        compiler_options=compiler_options,
        **shardings,
    )


def reduce_metrics(window: list[Mapping[str, Any]]) -> dict[str, float]:
    """Metrics of several steps or batches: sums, counts and histograms are added, loss and
    grad_norm averaged, the last learning rate and loss scale kept; then `objectives.summarize`
    turns them into means (and AUCs). With float16's `skipped_steps` (a count over the window),
    loss and grad_norm are averaged over the applied steps (none applied: no loss, grad_norm)."""
    fetched = jax.device_get(window)
    total: dict[str, Any] = {}
    for m in fetched:
        for k, v in m.items():
            total[k] = total.get(k, 0.0) + np.asarray(v, np.float64)  # scalars, or histograms
    out = objectives.summarize(total)
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


# --------------------------------------------------------------------------------------------
# The loop and its hooks
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class StepResult:
    """What the loop hands its hooks after each step.

    Attributes:
      step: optimizer steps done (the state's step).
      state: the new TrainState (global arrays).
      metrics: the step's metric sums, on the devices (fetching them waits for the step).
      batch: the host batch of the step (this process's rows).
      last: the run's final step.
      log: a logging step (every `log_every_steps`, and the last).
      save: a checkpoint step (every `checkpoint_every_steps`, the last, and a stop).
      stop: every process agreed to stop after this step (SIGTERM/SIGINT).
      compile_s: seconds the first step of this run took (it compiles), else None.
      window_start: `time.perf_counter()` when the current throughput window began (after the
        first step, and after each hook that did host work such as logging or evaluating).
      rewind_data: puts the prefetched batches back into the data iterator, so that its saved
        position is the next step's batch.
    """

    step: int
    state: Any
    metrics: Mapping[str, jax.Array]
    batch: Mapping[str, np.ndarray]
    last: bool
    log: bool
    save: bool
    stop: bool
    compile_s: float | None
    window_start: float
    rewind_data: Callable[[], None]


class Hook:
    """A periodic action: called after every step with its `StepResult`, in the loop's order;
    returns True when it did host work (logging, evaluating, saving) that is not training time."""

    def __call__(self, result: StepResult) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Called once when the loop ends (normally or not)."""


# float16: skipped steps in a row after which a run stops (more than the 24 halvings from the
# largest loss scale, 2^24, down to 1: the loss or gradients overflow even unscaled).
MAX_SKIPPED_STEPS_IN_A_ROW = 32


class LogMetrics(Hook):
    """Writes the window's training metrics at logging and checkpoint steps: means of the sums,
    tokens/s, step time, MFU where the device's peak is known, and the first step's compile time.
    Stops the run with FloatingPointError on a non-finite loss; for float16 (whose overflowing
    steps are skipped, `steps.train_step`) when `MAX_SKIPPED_STEPS_IN_A_ROW` steps in a row were
    skipped.

    Args:
      writer: the run's MetricWriter.
      mesh: the run's mesh (tokens of this host's rows scale to the global batch).
      step_flops: host batch -> model FLOPs of the global step, for MFU (None: no MFU).
      ckpt: named in the error on a non-finite loss (its last good step).
    """

    def __init__(self, writer: MetricWriter, mesh, step_flops=None, ckpt=None):
        self.writer, self.step_flops, self.ckpt = writer, step_flops, ckpt
        self.peak = flops.peak_flops_per_device(jax.devices()[0].device_kind)
        self.host_fraction = sharding.host_batch_fraction(mesh)  # of the global batch's rows
        self.window, self.flops, self.tokens, self.compile_s = [], 0.0, 0, None
        self.skipped_in_a_row = 0  # float16: steps skipped since the last applied one

    def __call__(self, r: StepResult) -> bool:
        if r.compile_s is not None:
            self.compile_s, self.first_step = r.compile_s, r.step
        else:  # the first step compiles: its tokens and FLOPs stay out of the throughput
            self.flops += self.step_flops(r.batch) if self.step_flops else 0.0
            self.tokens += int(np.sum(r.batch["attention_mask"]) / self.host_fraction)
        self.window.append(r.metrics)
        self.writer.advance()
        if not (r.log or r.save):
            return False
        summary = reduce_metrics(self.window)
        finite = np.isfinite(summary.get("loss", np.nan))
        if "skipped_steps" in self.window[-1]:  # float16: a window of skipped steps has no loss
            for skipped in jax.device_get([m["skipped_steps"] for m in self.window]):
                self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
            finite = self.skipped_in_a_row < MAX_SKIPPED_STEPS_IN_A_ROW and np.isfinite(
                summary.get("loss", 0.0)
            )
        if not finite:
            where = ""
            if self.ckpt is not None:
                self.ckpt.wait()
                where = (
                    f" The last good checkpoint is step {self.ckpt.latest_step()} in "
                    f"{self.ckpt.directory}"
                )
            if self.skipped_in_a_row:
                raise FloatingPointError(
                    f"{self.skipped_in_a_row} steps in a row skipped at step {r.step} (non-finite "
                    f"float16 loss or gradients, loss scale {summary.get('loss_scale')}); "
                    f"stopping.{where}"
                )
            raise FloatingPointError(
                f"non-finite loss {summary.get('loss')} at step {r.step}; stopping.{where}"
            )
        elapsed = time.perf_counter() - r.window_start
        if elapsed > 0 and self.tokens:
            summary["tokens_per_s"] = self.tokens / elapsed
            summary["step_time_s"] = elapsed / len(self.window)
            if self.peak and self.flops:
                summary["mfu"] = self.flops / elapsed / (self.peak * jax.device_count())
        if self.compile_s is not None and r.step - self.first_step < len(self.window):
            summary["compile_s"] = self.compile_s
        self.writer.write(r.step, {f"train/{k}": v for k, v in summary.items()})
        self.window, self.flops, self.tokens = [], 0.0, 0
        return True


class Evaluate(Hook):
    """Runs `evaluate(params, step) -> metrics` every `every_steps` (0: never) and at the last
    step, and writes them as eval/*."""

    def __init__(self, evaluate: Callable, writer: MetricWriter, every_steps: int):
        self.evaluate, self.writer, self.every_steps = evaluate, writer, every_steps

    def __call__(self, r: StepResult) -> bool:
        if not (r.last or (self.every_steps and r.step % self.every_steps == 0)):
            return False
        results = self.evaluate(r.state.params, r.step)
        self.writer.write(r.step, {f"eval/{k}": v for k, v in results.items()})
        return True


class SaveCheckpoint(Hook):
    """Saves the state (and the data position) at checkpoint steps; waits for the last save when
    the loop ends.

    Args:
      ckpt: the run's Checkpointer.
      meta: JSON saved with each checkpoint, plus the step (`Experiment.checkpoint_meta()`).
      data_iterator: the checkpointable source of the batches (grain iterator or alike), or None.
    """

    def __init__(self, ckpt: checkpointing.Checkpointer, meta: Mapping, data_iterator=None):
        self.ckpt, self.meta, self.data_iterator = ckpt, dict(meta), data_iterator

    def __call__(self, r: StepResult) -> bool:
        if not r.save:
            return False
        if self.data_iterator is not None:
            r.rewind_data()
        meta = {**self.meta, "step": r.step}
        self.ckpt.save(r.step, r.state, data_iterator=self.data_iterator, meta=meta)
        return True

    def close(self) -> None:
        self.ckpt.wait()


class Trainer:
    """Runs an Experiment's train step over batches and calls its hooks after each step.

        trainer = Trainer(exp, hooks, num_train_steps=..., log_every_steps=...,
                          checkpoint_every_steps=...)
        state, step, stopped = trainer.run(state, start_step, batches)

    The loop itself only steps, times the first (compiling) step, and agrees with the other
    processes on a stop request (SIGTERM/SIGINT: the step becomes a checkpoint step and the
    loop ends after it). Logging, evaluation and checkpointing are hooks (`LogMetrics`,
    `Evaluate`, `SaveCheckpoint`), called in the order given; `steps()` yields each
    `StepResult` after its hooks ran, for callers that want to watch the run.
    """

    def __init__(
        self,
        exp: Experiment,
        hooks: list[Hook],
        *,
        num_train_steps: int,
        log_every_steps: int,
        checkpoint_every_steps: int,
    ):
        self.exp, self.hooks = exp, list(hooks)
        self.num_train_steps = num_train_steps
        self.log_every_steps = log_every_steps
        self.checkpoint_every_steps = checkpoint_every_steps

    def steps(self, state, start_step: int, batches: Iterator) -> Iterator[StepResult]:
        """Trains from `start_step` to `num_train_steps` (or a stop request, or the data's end),
        yielding each step's result after the hooks ran. `batches`: host batches (this process's
        rows; dicts of numpy arrays)."""
        exp, watcher = self.exp, PreemptionWatcher()
        prefetch = sharding.DevicePrefetcher(batches, exp.mesh, size=2)
        step, compile_s, window_start = start_step, None, time.perf_counter()
        try:
            with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
                while step < self.num_train_steps:
                    try:
                        batch, host = next(prefetch)
                    except StopIteration:
                        logging.warning("the training data ran out at step %d", step)
                        return
                    state, metrics = exp.train_step_fn(host)(state, batch)
                    first = compile_s is None
                    if first:  # the first step may compile: keep it out of the throughput
                        jax.block_until_ready(metrics)
                        compile_s = time.perf_counter() - window_start
                        window_start = time.perf_counter()
                    step += 1
                    last = step == self.num_train_steps
                    log = step % self.log_every_steps == 0 or last
                    stop = watcher.should_stop(step, sync_point=log)
                    save = stop or last or step % self.checkpoint_every_steps == 0
                    result = StepResult(
                        step, state, metrics, host, last, log, save, stop,
                        compile_s if first else None, window_start, prefetch.rewind,
                    )  # fmt: skip
                    if any([hook(result) for hook in self.hooks]):
                        window_start = time.perf_counter()  # host work is not training time
                    yield result
                    if stop:
                        logging.warning("stopping at step %d after a stop request", step)
                        return
        finally:
            # The last save is on disk before the signal handlers go back to their defaults: a
            # second SIGTERM (schedulers repeat it before they kill) cannot then end the process
            # mid-save.
            for hook in self.hooks:
                hook.close()
            watcher.close()

    def run(self, state, start_step: int, batches: Iterator):
        """Runs `steps()` to the end. Returns (state, step reached, stopped by a signal)."""
        step, stopped = start_step, False
        for result in self.steps(state, start_step, batches):
            state, step, stopped = result.state, result.step, result.stop
        return state, step, stopped
