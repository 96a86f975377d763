"""The training loop shared by pretraining and fine-tuning: state creation, resume, steps,
metrics, evaluation, checkpoints, preemption and export.

    exp = Experiment.build(config, cfg, model_name, num_train_steps)
    state, start = exp.create_or_restore(ckpt, data_iterator, init_from=config.init_from)
    state, step = exp.run(state, start, batches, ckpt, writer, evaluate=..., ...)

Everything here is host-side orchestration; the compiled math lives in `train_lib`. An
Experiment jits each step (init, train, eval, predict) once and keeps it, with the parameters as
arguments, so every evaluation and every seed of a run reuses one compiled program per batch shape;
`enable_compilation_cache` keeps the programs on disk across runs.
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

from bert_jax import checkpointing, convert, flops, optimizer, sharding, train_lib
from bert_jax.attention import current_platform, resolve_attention
from bert_jax.config import BertConfig, RuntimeConfig, as_path
from bert_jax.model import count_params, get_model_class, stack_layers
from bert_jax.preemption import PreemptionWatcher
from bert_jax.writers import MetricWriter

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


def make_optimizer(config, num_train_steps: int) -> tuple[optax.GradientTransformation, Any]:
    """(tx, schedule) from config.optimizer; warmup may be given as a fraction of the steps."""
    o = config.optimizer
    warmup = o.warmup_steps
    if warmup < 0:  # -1: take warmup_fraction of the steps
        warmup = int(round(o.get("warmup_fraction", 0.1) * num_train_steps))
    schedule = optimizer.make_schedule(
        o.schedule,
        o.peak_learning_rate,
        min(warmup, num_train_steps),
        num_train_steps,
        end_learning_rate=o.end_learning_rate,
        decay_fraction=o.decay_fraction,
    )
    tx = optimizer.make_optimizer(
        o.name,
        schedule,
        weight_decay=o.weight_decay,
        b1=o.b1,
        b2=o.b2,
        eps=o.eps,
        clip_norm=o.clip_norm,
        bias_correction=o.bias_correction,
    )
    return tx, schedule


def reduce_window(window: list[Mapping[str, Any]]) -> dict[str, float]:
    """Metrics of several steps or batches: sums and counts are added, loss/grad_norm averaged."""
    fetched = jax.device_get(window)
    total: dict[str, float] = {}
    for m in fetched:
        for k, v in m.items():
            total[k] = total.get(k, 0.0) + float(v)
    out = train_lib.summarize(total)
    for k in ("loss", "grad_norm"):
        if k in total:
            out[k] = total[k] / len(fetched)
    if "learning_rate" in fetched[-1]:
        out["learning_rate"] = float(fetched[-1]["learning_rate"])
    return out


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
    task: train_lib.Task
    abstract: PyTree  # the boxed abstract TrainState (logical axes)
    state_sh: PyTree
    seed: int
    num_microbatches: int = 1
    # The jitted steps, built once: (kind, arguments) -> jitted function. JAX keeps one compiled
    # program per input shape inside each, so a step compiles once per shape for the whole run.
    _jitted: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        config,
        cfg: BertConfig,
        model_name: str,
        task: str,
        num_train_steps: int,
        devices: list | None = None,
    ):
        """`devices`: the mesh's devices (all of this run's by default; a TPU topology's
        compile-only devices for ahead-of-time compilation, `bert_jax.aot`)."""
        mesh = sharding.make_mesh(config.mesh.to_dict(), devices)
        # dtype "auto" becomes concrete once, for the mesh's platform (float32 on CPUs); the
        # attention kernel is checked here too, so a bad choice fails before any compile.
        platform = current_platform(mesh)
        runtime = RuntimeConfig(**config.runtime.to_dict()).resolved(platform)
        kernels = [resolve_attention(runtime, cfg, platform, training=t) for t in (True, False)]
        logging.info("%s: %s; attention %s (train), %s (eval)", platform, runtime, *kernels)
        model = get_model_class(model_name)(cfg, runtime)
        rules = [(n, tuple(a) if isinstance(a, list) else a) for n, a in config.sharding_rules]
        tx, schedule = make_optimizer(config, num_train_steps)
        init_fn = functools.partial(train_lib.init_train_state, model=model, tx=tx)
        abstract = jax.eval_shape(init_fn, jax.random.PRNGKey(config.seed))
        state_sh = sharding.logical_shardings(abstract, mesh, rules)
        logging.info(
            "%s: %s parameters; mesh %s",
            model_name,
            f"{count_params(abstract.params):,}",
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
            train_lib.get_task(task),
            abstract,
            state_sh,
            config.seed,
            config.num_microbatches,
        )

    # ---- state ----
    def _init_fn(self, rng, params=None):
        return train_lib.init_train_state(rng, model=self.model, tx=self.tx, params=params)

    def targets(self) -> PyTree:
        """Abstract unboxed state with shardings: what a checkpoint restores into."""
        return jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            nn.unbox(self.abstract),
            self.state_sh,
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
            lambda: jax.jit(lambda r, p: self._init_fn(r, params=p), out_shardings=self.state_sh),
        )

    def init_state(self, params: PyTree | None = None, *, seed: int | None = None):
        """A fresh sharded state: from scratch, or around given (host) parameters.

        Args:
          params: host parameters of the model (unstacked layers), or None for scratch.
          seed: the PRNG seed of the initialization and of the run's dropout (default: the
            config's `seed`).
        """
        rng = jax.random.PRNGKey(self.seed if seed is None else seed)
        if params is None:
            init = self._cached(
                ("init",),
                lambda: jax.jit(lambda r: nn.unbox(self._init_fn(r)), out_shardings=self.state_sh),
            )
            return init(rng)
        params = stack_layers(params) if self.runtime.scan_layers else params
        params = jax.device_put(
            jax.tree_util.tree_map(lambda x: np.asarray(x, self.runtime.param_dtype), params),
            self.state_sh.params,
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

    # ---- the loop ----
    def run(
        self,
        state,
        start_step: int,
        batches: Iterator,
        ckpt: checkpointing.Checkpointer,
        writer: MetricWriter,
        *,
        num_train_steps: int,
        log_every_steps: int,
        checkpoint_every_steps: int,
        eval_every_steps: int = 0,
        evaluate: Callable[[PyTree, int], Mapping[str, float]] | None = None,
        step_flops: Callable[[Mapping[str, np.ndarray]], float] | None = None,
        data_iterator=None,
        meta: Mapping[str, Any] | None = None,
    ):
        """Trains from `start_step` to `num_train_steps` (or a stop request, or the data's end).

        Args:
          batches: host batches (this process's rows; dicts of numpy arrays).
          evaluate: (params, step) -> metrics, run every `eval_every_steps` and at the end.
          step_flops: host batch -> model FLOPs of the global step, for MFU.
          data_iterator: the checkpointable source of `batches` (grain iterator or alike).
          meta: JSON saved with each checkpoint (the model config and head).

        Returns:
          (state, step reached, stopped early by a signal).
        """
        mesh, watcher = self.mesh, PreemptionWatcher()
        prefetch = sharding.DevicePrefetcher(batches, mesh, size=2)
        peak = flops.peak_flops_per_device(jax.devices()[0].device_kind)
        meta = dict(
            meta or {"config": self.cfg.to_hf_dict(self.model_name), "model": self.model_name}
        )
        step, window, window_flops, tokens, stopped = start_step, [], 0.0, 0, False
        compile_s, t_window = None, time.perf_counter()
        with jax.set_mesh(mesh), nn.logical_axis_rules(self.rules):
            while step < num_train_steps:
                try:
                    batch, host = next(prefetch)
                except StopIteration:
                    logging.warning("the training data ran out at step %d", step)
                    break
                state, metrics = self.train_step_fn(host)(state, batch)
                if compile_s is None:  # the first step may compile: keep it out of the throughput
                    jax.block_until_ready(metrics)
                    compile_s = time.perf_counter() - t_window
                    t_window = time.perf_counter()
                else:
                    window_flops += step_flops(host) if step_flops else 0.0
                    tokens += int(
                        np.sum(host["attention_mask"]) / sharding.host_batch_fraction(mesh)
                    )
                step += 1
                window.append(metrics)
                writer.advance()
                last = step == num_train_steps
                log_now = step % log_every_steps == 0 or last
                stopped = watcher.should_stop(step, sync_point=log_now)
                save_now = stopped or last or step % checkpoint_every_steps == 0
                if log_now or save_now:
                    summary = reduce_window(window)
                    if not np.isfinite(summary.get("loss", np.nan)):
                        ckpt.wait()
                        raise FloatingPointError(
                            f"non-finite loss {summary.get('loss')} at step {step}; stopping. The "
                            f"last good checkpoint is step {ckpt.latest_step()} in "
                            f"{ckpt.directory}"
                        )
                    elapsed = time.perf_counter() - t_window
                    if elapsed > 0 and tokens:
                        summary["tokens_per_s"] = tokens / elapsed
                        summary["step_time_s"] = elapsed / len(window)
                        if peak and window_flops:
                            summary["mfu"] = window_flops / elapsed / (peak * jax.device_count())
                    if compile_s is not None and step - start_step <= len(window):
                        summary["compile_s"] = compile_s
                    writer.write(step, {f"train/{k}": v for k, v in summary.items()})
                    window, window_flops, tokens, t_window = [], 0.0, 0, time.perf_counter()
                if evaluate and ((eval_every_steps and step % eval_every_steps == 0) or last):
                    results = evaluate(state.params, step)
                    writer.write(step, {f"eval/{k}": v for k, v in results.items()})
                    t_window = time.perf_counter()  # evaluation is not training throughput
                if save_now:
                    if data_iterator is not None:
                        prefetch.rewind()
                    ckpt.save(step, state, data_iterator=data_iterator, meta={**meta, "step": step})
                if stopped:
                    logging.warning("stopping at step %d after a stop request", step)
                    break
        # The last save is on disk before the signal handlers go back to their defaults: a second
        # SIGTERM (schedulers repeat it before they kill) cannot then end the process mid-save.
        ckpt.wait()
        watcher.close()
        return state, step, stopped

    # ---- compiled steps ----
    def jit_train_step(self, batch_shardings: PyTree) -> Callable:
        """A new jitted (state, global batch) -> (state, metrics) with this experiment's shardings;
        the state is donated. What `train_step_fn` caches and what `bert_jax.aot` compiles for a
        TPU."""
        step = functools.partial(
            train_lib.train_step,
            model=self.model,
            tx=self.tx,
            task=self.task,
            num_microbatches=self.num_microbatches,
            schedule=self.schedule,
        )
        return jax.jit(
            step,
            in_shardings=(self.state_sh, batch_shardings),
            out_shardings=(self.state_sh, sharding.replicated(self.mesh)),
            donate_argnums=0,
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
        """The jitted (params, global batch) -> the task's metric sums (dropout off), built once."""
        return self._cached(
            ("eval",),
            lambda: jax.jit(
                functools.partial(train_lib.eval_step, model=self.model, task=self.task)
            ),
        )

    def predict_fn(self, **extra) -> Callable:
        """The jitted (params, global batch) -> model outputs (dropout off), built once per
        `extra` (keyword arguments of the model's call, e.g. output_hidden_states=True)."""
        return self._cached(
            ("predict", tuple(sorted(extra.items()))),
            lambda: jax.jit(functools.partial(train_lib.predict_step, model=self.model, **extra)),
        )

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
        as_path(workdir) / "checkpoints",
        max_to_keep=config.max_checkpoints_to_keep,
        async_save=config.async_checkpointing,
    )
