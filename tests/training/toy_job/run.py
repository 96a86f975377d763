"""The toy job: does a row of random tokens hold token 7? A job built only from what every job
shares (`bert_jax.training`), to show that a new job is its folder plus its config file.

    python train.py --config=tests/training/toy_job/config.py --workdir=/tmp/toy

Each seed of `toy.seeds` trains `config.model`'s sequence classifier from scratch on
`toy.num_examples` synthetic rows of `toy.max_seq_length` tokens for `toy.num_epochs` epochs
(`seed_run.train_seed`), scores dev accuracy at the start and the end, exports the final model
(`training.export`: export/ and hf/ with its model card) and removes its training checkpoints;
`settings.run_seeds` keeps settings.json and results.json.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bert_jax.data import batching
from bert_jax.models import families
from bert_jax.parallel import aot, sharding
from bert_jax.training import (
    compile_report,
    experiment,
    flops,
    loop,
    objectives,
    seed_run,
    settings,
)
from bert_jax.training.export import export
from bert_jax.training.job import Job, register
from bert_jax.training.summaries import MetricView

OBJECTIVE = "classification"
VIEW = MetricView(
    console=("eval/", "loss", "cls_accuracy"),
    summary=("loss", "cls_accuracy", "accuracy"),
    progress=("train/loss", "eval/accuracy"),
)


def check_config(config, reads_data: bool = True) -> list[int]:
    """Refuses counts that cannot run and a bad seed list before anything is built; the seeds."""
    del reads_data  # the rows are drawn, not read
    experiment.check_experiment_config(config)
    for key in ("num_examples", "max_seq_length", "num_epochs"):
        if not isinstance(config.toy[key], int) or config.toy[key] < 1:
            raise ValueError(f"config.toy.{key}={config.toy[key]!r}: expected an integer >= 1")
    return settings.parse_seeds(config.toy.seeds, "toy.seeds")


def rows(config, seed: int) -> dict[str, np.ndarray]:
    """`toy.num_examples` rows of random tokens (ids 1-9 then [PAD] 0); label 1 where one is 7."""
    t, rng = config.toy, np.random.default_rng(seed)
    lengths = rng.integers(2, t.max_seq_length + 1, t.num_examples)
    mask = np.arange(t.max_seq_length)[None, :] < lengths[:, None]
    ids = np.where(mask, rng.integers(1, 10, (t.num_examples, t.max_seq_length)), 0)
    return {
        "input_ids": ids.astype(np.int32),
        "token_type_ids": np.zeros_like(ids, np.int32),
        "attention_mask": mask.astype(np.int32),
        "labels": (ids == 7).any(axis=1).astype(np.int32),
        "example_weights": np.ones(t.num_examples, np.float32),
    }


def build_experiment(config, num_train_steps: int, devices=None) -> experiment.Experiment:
    """`config.model`'s two-label sequence classifier, trained with the classification loss."""
    model_config = families.config_from_fields(config.model.to_dict()).replace(num_labels=2)
    head = families.head_in_family(model_config, objectives.get_objective(OBJECTIVE).role)
    return experiment.Experiment.build(
        config, model_config, head, OBJECTIVE, num_train_steps, devices
    )


def compile_for_topology(config, topology: str, *, num_slices: int = 1, hlo_out=None) -> int:
    """The train step compiled for `topology` (`--mode=compile`): the job's compile entry."""
    exp = build_experiment(config, 1, aot.topology_devices(topology, num_slices))
    rows_, length = config.global_batch_size, config.toy.max_seq_length
    model_flops = flops.classification_step_flops(exp.model_config, [length] * rows_, 2)
    return compile_report.report_compiled_step(
        exp,
        objectives.example_batch(OBJECTIVE, rows_, length),
        model_flops=model_flops,
        topology=topology,
        num_slices=num_slices,
        task="toy",
        hlo_out=hlo_out,
    )


def train_and_evaluate(config, workdir: str | None, mode: str = "train") -> dict[str, Any]:
    """Every seed of `toy.seeds`: train, dev accuracy, export (mode "train"); or the shardings."""
    seeds = check_config(config)
    train, dev = rows(config, 1000), rows(config, 2000)
    first = batching.EpochIterator(train, config.global_batch_size, num_epochs=1)
    exp = build_experiment(config, first.steps_per_epoch * config.toy.num_epochs)

    def dev_accuracy(params, step):
        del step
        batch = sharding.global_batch_from_local(dev, exp.mesh)
        metrics = loop.reduce_metrics([exp.eval_fn()(params, batch)])
        return {"accuracy": float(metrics["cls_accuracy"])}

    def one_seed(seed, seed_dir):
        def finish(params, step, writer, checkpoints):  # the last step's dev score is written
            del step
            places = export(params, seed_dir, exp.model_config, exp.head, config=config)
            places.update(seed_run.remove_checkpoints(checkpoints))
            return {"accuracy": writer.latest["eval/accuracy"]}, places

        batches = batching.EpochIterator(
            train,
            config.global_batch_size,
            num_epochs=config.toy.num_epochs,
            seed=seed,
            host_rows=sharding.host_batch_rows(exp.mesh, config.global_batch_size),
        )
        plan = seed_run.SeedPlan(VIEW, finish, evaluate=dev_accuracy, eval_at_start=True)
        return seed_run.train_seed(
            config, exp, batches, config.toy.num_epochs, seed, seed_dir, plan
        )

    return seed_run.run_seeds(
        config, workdir, exp, mode=mode, task="toy", data_files={}, seeds=seeds, one_seed=one_seed
    )


JOB = register(Job(("toy",), "toy", check_config, train_and_evaluate, compile_for_topology))
