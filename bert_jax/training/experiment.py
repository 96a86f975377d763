"""What a run is: the Experiment (model, mesh, rules, optimizer, schedule, shardings) and its
compiled steps, plus the run directory's config and checkpointer.

    steps_count = ...                       # from the data, before anything is built
    exp = Experiment.build(config, model_config, head, objective, num_train_steps)
    start = bert_jax.training.start.starting_state(exp, ckpt, data, init_from=config.init_from)

`Experiment` only builds: the starting state is `training.start`'s, the loop `training.loop`'s,
the export `training.export`'s. It jits each step (init, train, eval, predict) once and keeps it,
with the parameters as arguments, so every evaluation and every seed of a run reuses one compiled
program per batch shape; `compile_train_step` is the one place a train step is jitted.
`check_experiment_config` refuses an experiment config's impossible counts before anything runs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax
from absl import logging
from etils import epath

from bert_jax import hardware
from bert_jax.checkpoints import checkpointing
from bert_jax.models.attention import resolve_attention
from bert_jax.models.config import EncoderConfig, RuntimeConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.params import count_params
from bert_jax.parallel import sharding
from bert_jax.paths import as_path
from bert_jax.training import job, objectives, optimizer, steps
from bert_jax.training.objective import Objective

PyTree = Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Experiment:
    """What a run is, besides its data: model, mesh, rules, optimizer, schedule and the state's
    shardings, built once from a step count (`build`), and the run's compiled steps.

    `model_config` is the model's architecture (config.json, any family's); `head` its class name
    ("BertForPreTraining", ...); the experiment config (`configs/*.py`) is only read by `build`.
    """

    model_config: EncoderConfig
    runtime: RuntimeConfig
    head: str
    model: nn.Module
    mesh: Any
    rules: list
    tx: optax.GradientTransformation
    schedule: Any
    objective: Objective
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
        model_config: EncoderConfig,
        head: str,
        objective: str | Objective,
        num_train_steps: int,
        devices: list | None = None,
    ) -> Experiment:
        """Builds the run described by the experiment `config` for the model `model_config` with
        the head `head`, trained with `objective` (a name of `objectives.OBJECTIVES`, or an
        objective made with its settings: `contrastive.contrastive_objective(...)`) for
        `num_train_steps` (the schedule's length).

        `devices`: the mesh's devices (all of this run's by default; a TPU topology's or GPUs'
        compile-only devices for ahead-of-time compilation, `bert_jax.parallel.aot`)."""
        mesh = sharding.make_mesh(config.mesh.to_dict(), devices)
        _warn_unaligned_vocabulary(model_config, mesh)
        runtime, platform = _resolved_runtime(config, model_config, mesh)
        if isinstance(objective, str):
            objective = objectives.get_objective(objective)
        if objective.build_model is None:
            model = get_model_class(head)(model_config, runtime)
        else:  # e.g. replaced-token detection's generator and discriminator
            model = objective.build_model(config, model_config, runtime, get_model_class(head))
        rules = [(n, tuple(a) if isinstance(a, list) else a) for n, a in config.sharding_rules]
        factors = getattr(objective, "learning_rate_factors", {})  # e.g. inference-free SPLADE
        tx, schedule = optimizer.from_config(config.optimizer, num_train_steps, factors)
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
            head,
            f"{count_params(abstract_state.params):,}",
            dict(mesh.shape),
        )
        return cls(
            model_config=model_config,
            runtime=runtime,
            head=head,
            model=model,
            mesh=mesh,
            rules=rules,
            tx=tx,
            schedule=schedule,
            objective=objective,
            abstract_state=abstract_state,
            state_shardings=state_shardings,
            seed=config.seed,
            num_microbatches=config.num_microbatches,
            compiler_options=runtime.compiler_options(platform),
            loss_scale=loss_scale,
        )

    # ---- state ----
    def init_fn(self, rng, params=None):
        """(rng, params or None) -> a fresh boxed TrainState (`steps.init_train_state`)."""
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

    def cached(self, key: tuple, build: Callable[[], Callable]) -> Callable:
        """The jitted function stored under `key`, built by `build()` the first time."""
        if key not in self._jitted:
            self._jitted[key] = build()
        return self._jitted[key]

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint records beside the state: the model's config.json fields and head
        (what `init_from` and `convert` read back)."""
        return {"config": self.model_config.to_hf_dict(self.head), "model": self.head}

    # ---- compiled steps ----
    def jit_train_step(self, batch_shardings: PyTree) -> Callable:
        """`compile_train_step` with this experiment's model, optimizer, objective and shardings.
        What `train_step_fn` caches and what `bert_jax.parallel.aot` compiles for a TPU or GPU."""
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
        return self.cached(
            ("train", ranks),
            lambda: self.jit_train_step(sharding.batch_shardings(host_batch, self.mesh)),
        )

    def eval_fn(self) -> Callable:
        """The jitted (params, global batch) -> the objective's metric sums (dropout off), in the
        train step's micro-batches, built once."""
        return self.cached(
            ("eval",),
            lambda: jax.jit(
                functools.partial(
                    steps.eval_step,
                    model=self.model,
                    objective=self.objective,
                    num_microbatches=self.num_microbatches,
                ),
                compiler_options=self.compiler_options,
            ),
        )

    def embed_fn(self, queries: bool = False) -> Callable:
        """The jitted (params, global batch [B, L]) -> sentence embeddings [B, E] of a
        contrastive objective (`steps.embed_step`; `queries`: as it embeds queries,
        `for_queries`), built once: one function for both where the objective embeds queries
        as it embeds documents."""
        objective = self.objective.for_queries() if queries else self.objective
        return self.cached(
            ("embed", objective is not self.objective),
            lambda: jax.jit(
                functools.partial(steps.embed_step, model=self.model, objective=objective),
                compiler_options=self.compiler_options,
            ),
        )

    def predict_fn(self, **extra) -> Callable:
        """The jitted (params, global batch) -> model outputs (dropout off), built once per
        `extra` (keyword arguments of the model's call, e.g. output_hidden_states=True)."""
        return self.cached(
            ("predict", tuple(sorted(extra.items()))),
            lambda: jax.jit(
                functools.partial(steps.predict_step, model=self.model, **extra),
                compiler_options=self.compiler_options,
            ),
        )


def _warn_unaligned_vocabulary(cfg: EncoderConfig, mesh) -> None:
    """Warns when the word-embedding table's rows do not split over the tensor axis in whole
    multiples of 128 (its shards are then unaligned, or it is replicated)."""
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


def _resolved_runtime(config, cfg: EncoderConfig, mesh) -> tuple[RuntimeConfig, str]:
    """(the config's RuntimeConfig made concrete for the mesh's platform, that platform).

    dtype "auto" becomes concrete once, for the mesh's platform (float32 on CPUs); the attention
    kernel is checked here too, so a bad choice fails before any compile."""
    platform, capability = hardware.current_platform(mesh), hardware.compute_capability(mesh)
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
    return runtime, platform


# The experiment config's (configs/*.py) counts: dotted key -> the least value that makes sense.
# A key a config lacks is not checked (fine-tuning counts its steps from its epochs).
_EXPERIMENT_MINIMA = {
    "num_train_steps": 1,
    "global_batch_size": 1,
    "num_microbatches": 1,
    "log_every_steps": 1,
    "eval_every_steps": 0,  # 0: never periodically (fine-tuning: each epoch's end)
    "num_eval_steps": 0,
    "checkpoint_every_steps": 0,  # 0: only at a stop and at the end
    "max_checkpoints_to_keep": 1,
}
_ABSENT = object()


def _lookup(config, dotted: str):
    """`config.<dotted>`, or _ABSENT where a part of the name is not in the config."""
    node = config
    for part in dotted.split("."):
        if part not in node:
            return _ABSENT
        node = node[part]
    return node


def check_experiment_config(config) -> None:
    """Refuses an experiment config (`configs/*.py`, after the command line's overrides) whose
    counts cannot run, naming the key: `global_batch_size=0`, `num_train_steps=-5`, or one of
    the counts the job `config.job` declares its own (`Job.minima`: the fine-tuning job's
    epochs, ...). train.py checks every config before its job starts; each job checks its own
    again (a job is also called directly).

    Raises:
      ValueError: "config.<key>=<value>: expected an integer >= <least>".
    """
    declared = job.declared(config)  # an unknown job: refused by name after the counts
    minima = {**_EXPERIMENT_MINIMA, **(declared.minima if declared else {})}
    for key, least in minima.items():
        value = _lookup(config, key)
        if value is _ABSENT:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"config.{key}={value!r}: expected an integer >= {least}")
    warmup = config.get("optimizer", {}).get("warmup_steps", -1)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < -1:
        raise ValueError(
            f"config.optimizer.warmup_steps={warmup!r}: expected an integer >= 0 (or -1: "
            "optimizer.warmup_fraction of the steps)"
        )


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


def compile_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    objective: Objective,
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
    step the same state twice). The one place a train step is compiled: the loop, `parallel.aot`,
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
