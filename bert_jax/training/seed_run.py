"""One seed of a job that trains several (fine-tuning, embeddings, rerankers, a job of one's
own): `train_seed`, the one seed runner, and `export_plan`, the plan of a seed that scores a
dev set along the way and exports its final model.

    result = train_seed(config, exp, batches, num_epochs, seed, seed_dir, plan,
                        init_from=..., init_params=...)
    plan = export_plan(config, seed_dir, view=VIEW, score_fn=..., card_fn=..., export_fn=...)

The seed resumes from its checkpoint in `seed_dir` (else starts from `init_params`, `init_from`
or scratch: `training.start`), trains with the loop's hooks (metrics, dev evaluation,
checkpoints), then hands its final parameters to the plan's `finish` (score, export, remove
the training checkpoints) and prints the run's summary. What differs between the jobs (the dev
scores and their cadence, what a finished seed keeps and writes) is the job's `SeedPlan`.
`training.settings.run_seeds` runs it for every seed and keeps results.json.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
from absl import logging

from bert_jax.data import text_io
from bert_jax.parallel import sharding
from bert_jax.paths import as_path
from bert_jax.retrieval import packing
from bert_jax.training import experiment, loop, settings
from bert_jax.training.start import starting_state
from bert_jax.training.summaries import MetricView, MetricWriter

PyTree = Any
Scores = dict[str, float]


@dataclasses.dataclass(frozen=True)
class SeedPlan:
    """What a job's seed does beside training.

    Attributes:
      view: which metrics the console, summary and curves show.
      finish: (params, step, writer, checkpoint directory) -> (the seed's result, the summary's
        lines {label: text}), after the last step: final scores, exports, the checkpoints
        removed (every process calls it).
      evaluate: (params, step) -> the dev scores {name: float}, written as `eval/<name>`
        (None: no dev set).
      eval_every: steps between dev evaluations (0: none but at the start and end).
      eval_at_start: score dev at step 0 of a fresh run (where the curves start).
      eval_at_end: score dev at the last step too.
      checkpoint_every: steps between checkpoints (None: `config.checkpoint_every_steps`).
    """

    view: MetricView
    finish: Callable[[PyTree, int, MetricWriter, Any], tuple[Any, dict[str, str]]]
    evaluate: Callable[[PyTree, int], Scores] | None = None
    eval_every: int = 0
    eval_at_start: bool = False
    eval_at_end: bool = True
    checkpoint_every: int | None = None


def read_train_dev(block, read: Callable[[str, int], Any]) -> tuple[Any, Any, dict]:
    """A job block's training and dev files read by `read(path, max_examples)`: its
    `train_file` (at most `max_train_examples`; 0: all) and `dev_file` (None where it names
    none), and the data files read ({path: size and SHA-256}: settings.json's, through
    `text_io.record_reads`)."""
    with text_io.record_reads() as data_files:
        train = read(block.train_file, block.max_train_examples)
        dev = read(block.dev_file, block.max_eval_examples) if block.dev_file else None
    return train, dev, data_files


def check_batch(config, num_rows: int, rows: str) -> None:
    """Refuses a global batch larger than the `num_rows` training rows (no training step);
    `rows` names them ("training rows", "training pairs of FILE")."""
    if num_rows < config.global_batch_size:
        raise ValueError(
            f"global_batch_size={config.global_batch_size} is more than the {num_rows} {rows}: "
            "no training step"
        )


def run_seeds(
    config,
    workdir,
    exp: experiment.Experiment,
    *,
    mode: str,
    task: str,
    data_files: Mapping[str, dict],
    seeds: list[int],
    one_seed: Callable[[int, Any], Any],
) -> dict[str, Any]:
    """The end of a seeded job's run: mode "shardings" prints every parameter's sharding on
    the Experiment's mesh and returns {"task", "seeds": {}}; mode "train" trains every seed
    `one_seed(seed, seed_dir)` an earlier run in `workdir` did not finish
    (`settings.run_seeds`, the run's settings and `data_files` kept as settings.json) and
    returns results.json's record."""
    if mode == "shardings":
        print("\n".join(sharding.describe(exp.abstract_state.params, exp.mesh, exp.rules)))
        return {"task": task, "seeds": {}}
    record = settings.run_record(config, data_files, task)
    return settings.run_seeds(config, workdir, record, seeds, one_seed)


def train_seed(
    config,
    exp: experiment.Experiment,
    batches,
    num_epochs: int,
    seed: int,
    seed_dir,
    plan: SeedPlan,
    *,
    init_from: str = "",
    init_params: PyTree | None = None,
    init_values=None,
) -> Any:
    """Trains one seed in `seed_dir` and finishes it as `plan` says.

    Args:
      config: the experiment config (log and checkpoint cadences).
      exp: the Experiment every seed trains in.
      batches: this process's batches of the seed (checkpointable, with `steps_per_epoch`).
      num_epochs: epochs of `batches` the run trains.
      seed: the seed (initialization, dropout); seed_dir: checkpoints, metrics and exports.
      plan: the job's dev scores, cadences and finish (`SeedPlan`).
      init_from, init_params, init_values: the starting model (`starting_state`) when no
        checkpoint is there.

    Returns:
      What `plan.finish` returns first, or None when a signal stopped the run before its last
      step (rerun to resume).
    """
    num_steps = batches.steps_per_epoch * num_epochs
    ckpt = experiment.checkpointer(seed_dir, config)
    state0 = starting_state(
        exp, ckpt, batches, init_from=init_from, init_params=init_params, seed=seed,
        init_values=init_values,
    )  # fmt: skip
    writer = MetricWriter(seed_dir, num_steps, state0.step, view=plan.view)
    if plan.eval_at_start and state0.step == 0 and plan.evaluate is not None:
        scores = plan.evaluate(state0.state.params, 0)
        writer.write(0, {f"eval/{k}": v for k, v in scores.items()})
    trainer = loop.Trainer(
        exp,
        _hooks(config, exp, writer, ckpt, plan),
        num_train_steps=num_steps,
        stop_sync_every=config.log_every_steps,
    )
    state, step, stopped = trainer.run(state0.state, state0.step, batches)
    ckpt.close()
    if stopped or step < num_steps:
        writer.close()
        logging.warning("seed %d stopped at step %d of %d; rerun to resume", seed, step, num_steps)
        return None
    result, places = plan.finish(state.params, step, writer, ckpt.directory)
    writer.close()
    if jax.process_index() == 0:
        print(f"\nseed {seed}: " + writer.summary(step, places, timing=trainer.timer))
    return result


def _hooks(config, exp, writer, ckpt, plan: SeedPlan) -> list[loop.Hook]:
    """Metrics every log_every_steps and at every checkpoint, dev scores at the plan's cadence,
    checkpoints at the plan's (else every checkpoint_every_steps)."""
    checkpoint_every = plan.checkpoint_every or config.checkpoint_every_steps
    hooks: list[loop.Hook] = [
        loop.LogMetrics(writer, every=(config.log_every_steps, checkpoint_every), ckpt=ckpt)
    ]
    if plan.evaluate is not None:
        hooks.append(loop.Evaluate(plan.evaluate, writer, plan.eval_every, at_end=plan.eval_at_end))
    hooks.append(loop.SaveCheckpoint(ckpt, exp.checkpoint_meta(), checkpoint_every))
    return hooks


def export_plan(
    config,
    seed_dir,
    *,
    view: MetricView,
    score_fn: Callable[[PyTree], Scores] | None,
    card_fn: Callable[[int, Scores, Scores], str],
    export_fn: Callable[[PyTree, Any, str], str],
) -> SeedPlan:
    """The plan of a seed that scores dev at step 0, every `eval_every_steps` and at the end,
    writes the final model with its model card to `seed_dir/hf` and removes its training
    checkpoints (the embedding and reranker jobs). `train_seed` then returns the final dev
    scores and the starting model's as `start_<name>` (a `base_` score, which no model changes,
    has none).

    Args:
      config: the experiment config (`eval_every_steps`).
      seed_dir: the seed's directory (the export goes to its `hf/`).
      view: which metrics the console, summary and curves show.
      score_fn: params -> the dev scores {name: float}, or None: no dev set.
      card_fn: (num_steps, begin, end) -> the export's model card (markdown), given the dev
        scores at step 0 and at the end ({} without a dev set).
      export_fn: (params, directory, card) -> where the export went (every process calls it).
    """
    scores: dict[int, Scores] = {}

    def evaluate(params, step):
        scores[step] = {} if score_fn is None else score_fn(params)
        return scores[step]

    def finish(params, step, writer, checkpoints):
        end = scores.get(step, {})
        begin = {k[len("eval/") :]: v for k, v in _scores_at(writer, 0).items()}
        places = {"hf": export_fn(params, as_path(seed_dir) / "hf", card_fn(step, begin, end))}
        places.update(remove_checkpoints(checkpoints))
        start = {f"start_{k}": v for k, v in begin.items() if not k.startswith("base_")}
        return {**end, **start}, places

    return SeedPlan(
        view,
        finish,
        evaluate=evaluate,
        eval_every=config.eval_every_steps,
        eval_at_start=score_fn is not None,
    )


def remove_checkpoints(directory) -> dict[str, str]:
    """Removes a finished seed's training checkpoints (process 0); the summary's line on it."""
    if jax.process_index() == 0 and as_path(directory).exists():
        as_path(directory).rmtree()
        return {"checkpoints": "removed (results.json holds the scores)"}
    return {}


def _scores_at(writer: MetricWriter, step: int) -> Mapping[str, float]:
    """The eval/ metrics the writer holds at `step` (a resumed run's step 0 is in its history)."""
    return {
        k: v
        for k, points in writer.history.items()
        if k.startswith("eval/")
        for s, v in points
        if s == step
    }


def group_batches(config, block, features, seed: int, exp=None, keep: tuple[str, ...] = ()):
    """One seed's batches of groups of texts (the embedding job's pairs, the reranker's rows;
    `retrieval.packing.epoch_batches`): `block.num_epochs` epochs of shuffled global batches
    (`block`: the job's `training.text_job.TextJob`), packed with `block.pack`; the `keep` keys
    stay [B].

    exp: the `Experiment` the batches feed: this process's rows of each batch on its mesh (the
      row count a multiple of the mesh's data-parallel devices x `num_microbatches`), and the
      anchors beside the rows ([B, L], not packed) where its objective declares `anchors_apart`.
      None: one process's plan of every row, for counting steps before there is an Experiment
      (`steps_per_epoch` is the same either way)."""
    mesh = None if exp is None else exp.mesh
    dp = 1 if mesh is None else sharding.data_parallel_size(mesh)
    host_rows = None if mesh is None else functools.partial(sharding.host_batch_rows, mesh)
    return packing.epoch_batches(
        features, config.global_batch_size, block, seed,
        row_multiple=config.num_microbatches * dp, host_rows=host_rows, keep=keep,
        anchors_apart=exp is not None and exp.objective.anchors_apart,
    )  # fmt: skip
