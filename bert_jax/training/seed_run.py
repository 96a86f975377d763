"""One seed of a job that trains, scores a dev set along the way and exports the final model
(the embedding and reranker jobs): `train_seed`.

    final = train_seed(config, exp, batches, num_epochs, seed, seed_dir, view=VIEW,
                       score_fn=..., card_fn=..., export_fn=..., init_from=...)

The seed resumes from its checkpoint in `seed_dir` (else starts from `init_params`, `init_from`
or scratch: `training.start`), scores dev at step 0, every `eval_every_steps` and at the end,
trains with the loop's hooks (metrics, evaluation, checkpoints), then writes the model card and
the export to `seed_dir/hf`, removes its training checkpoints and prints the run's summary. What
differs between the jobs (the scores, the card, the export format) comes in as functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from absl import logging

from bert_jax.paths import as_path
from bert_jax.training import experiment, loop
from bert_jax.training.start import starting_state
from bert_jax.training.summaries import MetricView, MetricWriter

PyTree = Any
Scores = dict[str, float]


def train_seed(
    config,
    exp: experiment.Experiment,
    batches,
    num_epochs: int,
    seed: int,
    seed_dir,
    *,
    view: MetricView,
    score_fn: Callable[[PyTree], Scores] | None,
    card_fn: Callable[[int, Scores, Scores], str],
    export_fn: Callable[[PyTree, Any, str], str],
    init_from: str = "",
    init_params: PyTree | None = None,
) -> Scores | None:
    """Trains one seed in `seed_dir` and exports it to `seed_dir/hf`.

    Args:
      config: the experiment config (log, eval and checkpoint cadences).
      exp: the Experiment every seed trains in.
      batches: this process's batches of the seed (checkpointable, with `steps_per_epoch`).
      num_epochs: epochs of `batches` the run trains.
      seed: the seed (initialization, dropout); seed_dir: checkpoints, metrics and `hf/`.
      view: which metrics the console, summary and curves show.
      score_fn: params -> the dev scores {name: float}, or None: no dev set.
      card_fn: (num_steps, begin, end) -> the export's model card (markdown), given the dev
        scores at step 0 and at the end ({} without a dev set).
      export_fn: (params, directory, card) -> where the export went (every process calls it).
      init_from, init_params: the starting model (`starting_state`) when no checkpoint is there.

    Returns:
      The final dev scores and the starting model's as `start_<name>` (a `base_` score, which
      no model changes, has none), or None when a signal stopped the run before its last step.
    """
    num_steps = batches.steps_per_epoch * num_epochs
    ckpt = experiment.checkpointer(seed_dir, config)
    state0 = starting_state(
        exp, ckpt, batches, init_from=init_from, init_params=init_params, seed=seed
    )
    writer = MetricWriter(seed_dir, num_steps, state0.step, view=view)
    scores: dict[int, Scores] = {}

    def evaluate(params, step):
        scores[step] = {} if score_fn is None else score_fn(params)
        return scores[step]

    if state0.step == 0 and score_fn is not None:
        writer.write(0, {f"eval/{k}": v for k, v in evaluate(state0.state.params, 0).items()})
    trainer = loop.Trainer(
        exp,
        _hooks(config, exp, writer, ckpt, evaluate),
        num_train_steps=num_steps,
        stop_sync_every=config.log_every_steps,
    )
    state, step, stopped = trainer.run(state0.state, state0.step, batches)
    ckpt.close()
    if stopped or step < num_steps:
        writer.close()
        logging.warning("seed %d stopped at step %d of %d; rerun to resume", seed, step, num_steps)
        return None
    end = scores.get(step, {})
    begin = {k[len("eval/") :]: v for k, v in _scores_at(writer, 0).items()}
    places = {"hf": export_fn(state.params, seed_dir / "hf", card_fn(num_steps, begin, end))}
    places.update(_remove_checkpoints(ckpt.directory))
    writer.close()
    if jax.process_index() == 0:
        print(f"\nseed {seed}: " + writer.summary(step, places, timing=trainer.timer))
    return {**end, **{f"start_{k}": v for k, v in begin.items() if not k.startswith("base_")}}


def _remove_checkpoints(directory) -> dict[str, str]:
    """Removes a finished seed's training checkpoints (process 0); the summary's line on it."""
    if jax.process_index() == 0 and as_path(directory).exists():
        as_path(directory).rmtree()
        return {"checkpoints": "removed (results.json holds the scores)"}
    return {}


def _hooks(config, exp, writer, ckpt, evaluate) -> list[loop.Hook]:
    """Metrics every log_every_steps and at every checkpoint, dev scores every eval_every_steps
    and at the end, checkpoints every checkpoint_every_steps."""
    return [
        loop.LogMetrics(
            writer, every=(config.log_every_steps, config.checkpoint_every_steps), ckpt=ckpt
        ),
        loop.Evaluate(evaluate, writer, config.eval_every_steps, at_end=True),
        loop.SaveCheckpoint(ckpt, exp.checkpoint_meta(), config.checkpoint_every_steps),
    ]


def _scores_at(writer: MetricWriter, step: int) -> Mapping[str, float]:
    """The eval/ metrics the writer holds at `step` (a resumed run's step 0 is in its history)."""
    return {
        k: v
        for k, points in writer.history.items()
        if k.startswith("eval/")
        for s, v in points
        if s == step
    }
