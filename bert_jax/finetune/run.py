"""The fine-tuning job: task data -> model from a checkpoint -> training per seed -> metrics,
prediction files and an exported model.

    train_and_evaluate(config, workdir)     # train.py --config=configs/finetune.py:task=...

Every task is a `FinetuneTask` of `tasks.TASKS` (reading, scoring); its objective decides the
head (the class of `objectives.get_objective(name).role` in the model family of `init_from`: a
ModernBERT checkpoint gets ModernBertForSequenceClassification, ...):

    classification / regression   GLUE, custom CSV/TSV/JSONL, the Shakespeare genre task
    question_answering            SQuAD v1.1 / v2.0 (windows; official EM/F1)
    token_classification          CoNLL-2003 NER (entity-level F1)
    multiple_choice               SWAG

For each seed in `finetune.seeds` the run trains `num_epochs` epochs in `<workdir>/seed_<s>`,
evaluates on the dev set after every epoch but the last, then evaluates the final model once on
every split, writes the dev (and test) predictions in the task's official format, and keeps what
`finetune.keep` says: the best model by the task's selection metric on dev ("best", the
default), the final one ("last"), or nothing ("none"), exported (bert_jax format, and a
transformers directory with `export_hf_at_end`). A finished seed's training checkpoints are
removed. `<workdir>/results.json` holds every finished seed's dev metrics (and `test_<metric>`
where the test set is labelled) of the model it kept, under "models" which one that is and its
step (an earlier model kept by "best" is scored again on every split, its predictions written
over the final model's), and their mean and std, rewritten as each seed finishes.
`<workdir>/settings.json`, written before training, holds what decides them: the config (but
for bookkeeping fields such as the seeds) and the size and SHA-256 of every data file
read. A rerun in the same workdir with the same settings and data skips the seeds results.json
lists; one with other settings or data is refused, naming each difference, while the workdir
holds finished seeds or training checkpoints (else it starts afresh). Both files are kept by
`training.settings`; the scoring is `finetune.evaluation`'s.

Batches (`finetune.batching`): "bucketed" draws each batch from one length bucket (fewer padded
tokens, faster); "shuffled" draws rows at random as google-research/bert does; docs/finetuning.md
measures the difference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax import tokenization
from bert_jax.checkpoints import pretrained
from bert_jax.data import batching, text_io
from bert_jax.finetune import evaluation, tasks
from bert_jax.finetune.task import FinetuneTask, TaskData
from bert_jax.models import families
from bert_jax.models.families import Role
from bert_jax.parallel import aot, sharding
from bert_jax.paths import as_path
from bert_jax.training import compile_report, experiment, flops, objectives, seed_run, settings
from bert_jax.training.export import export
from bert_jax.training.job import Job, register
from bert_jax.training.start import architecture, graft, job_tokenizer
from bert_jax.training.summaries import MetricView
from bert_jax.training.text_job import TextJob

# What the console, the progress bar and the curves show of the metrics (the accuracy panel's
# title is the pretraining job's, as before).
VIEW = MetricView(
    console=("eval/", "loss", "cls_accuracy", "accuracy", "learning_rate"),
    summary=("loss", "accuracy"),
    progress=("train/loss", "eval/accuracy", "train/tokens_per_s"),
    curves_accuracy_title="accuracy (and held-out NSP AUC: 0.5 is chance)",
    final_title="final dev",  # the final model's dev scores (results.json's)
)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
def find_tokenizer(config) -> tokenization.SubwordTokenizer:
    """config.finetune.tokenizer, else the vocabulary beside init_from (or in its hf/, data/;
    `pretrained.find_tokenizer`: a path, a URL or a Hub id)."""
    files = f"tokenizer ({', '.join(tokenization.TOKENIZER_FILES)})"
    return job_tokenizer(config, "finetune", files)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
def head_fields(objective: str, num_labels: int, label_names=None) -> dict[str, Any]:
    """The config fields of a task's head (num_labels, label_names)."""
    if objective == "multiple_choice":
        return dict(num_labels=2, label_names=None)  # the choice head has one output
    return dict(num_labels=num_labels, label_names=label_names)


def starting_point(config, data: TaskData, tokenizer):
    """(config of the fine-tuned model, its starting params or None for random init). A ModernBERT
    init_from gives ModernBERT's config and its ModernBertModel params.

    The params are init_from's encoder (the task's head starts anew: `graft`), or, where init_from
    holds this task's head with exactly its labels (a fine-tuned model trained on: the same head
    class, `num_labels` and label names), that whole model, its trained head kept.
    """
    overrides = head_fields(data.objective, data.num_labels, data.label_names)
    if not config.init_from or config.finetune.random_init:  # an architecture, not its weights
        cfg, params = architecture(config, tokenizer.vocab_size).replace(**overrides), None
    elif (head := _head_to_continue(config.init_from, data.objective, overrides)) is not None:
        loaded = pretrained.load(config.init_from, head, with_tokenizer=False)
        cfg, params = loaded.config.replace(**overrides), loaded.params
    else:
        # A masked-LM checkpoint (RoBERTa's and ModernBERT's exports, BERT's mlm_only ones) has
        # no pooler: it starts afresh, as transformers starts it, where the task's head reads it
        # (`graft` drops it elsewhere). Missing encoder weights are still refused.
        loaded = pretrained.load(
            config.init_from, Role.ENCODER, with_tokenizer=False, allow_new_heads=True
        )
        if loaded.report is not None and loaded.report.newly_initialized:
            logging.info("init_from lacks %s: initialized", loaded.report.newly_initialized)
        cfg, params = loaded.config.replace(**overrides), loaded.params
    tokenizer.check_model_vocab_size(cfg.vocab_size)
    return cfg, params


def _head_to_continue(init_from: str, objective: str, overrides: Mapping[str, Any]) -> str | None:
    """The head class of init_from when it is this task's head with exactly its labels (its
    trained head is kept), else None; says which, and why a head of other labels is not kept."""
    source = pretrained.read_config(init_from)
    head = task_head(source, objective)
    if pretrained.read_head(init_from) != head:
        return None
    theirs = (source.num_labels, tuple(source.label_names or ()))
    ours = (overrides["num_labels"], tuple(overrides["label_names"] or ()))
    if theirs == ours:
        logging.info(
            "init_from holds a %s of this task's labels %s: its trained head is kept",
            head,
            list(ours[1]) or ours[0],
        )
        return head
    logging.warning(
        "init_from's %s has other labels (%s) than this task (%s): its head is not used, a new "
        "one is trained",
        head,
        list(theirs[1]) or f"{theirs[0]} unnamed",
        list(ours[1]) or f"{ours[0]} unnamed",
    )
    return None


def compile_for_topology(
    config, topology: str, *, num_slices: int = 1, hlo_out: str | None = None
) -> int:
    """Compiles the task's train and eval steps for `topology` (a TPU slice or GPUs, `parallel.aot`;
    one slice: `num_slices` is not read) without reading its data, and prints the report; returns
    the exit status (1: does not fit).

    The architecture is init_from's, else `config.model` (`configs/finetune.py:...,model=base`);
    the batch is `global_batch_size` rows of `max_seq_length` tokens, padded (`pack=0`).
    """
    ft = config.finetune
    task = tasks.get_task(ft.name)
    if not task.objective:
        raise ValueError(
            f"task {ft.name!r} takes its labels from its data: --mode=compile compiles tasks "
            "whose head is known beforehand (GLUE, SQuAD, CoNLL-2003, SWAG, Shakespeare)"
        )
    cfg = architecture(config, preset="configs/finetune.py:task=...,model=base")
    cfg = cfg.replace(**head_fields(task.objective, task.num_labels))
    rows, length = config.global_batch_size, ft.max_seq_length
    batch = objectives.example_batch(task.objective, rows, length, task.num_labels)
    sequences = rows * (task.num_labels if task.objective == "multiple_choice" else 1)
    pooled = task.objective in ("classification", "regression", "multiple_choice")
    outputs = {"question_answering": 2, "multiple_choice": 1}.get(task.objective, task.num_labels)
    model_flops = flops.classification_step_flops(
        cfg, np.full(sequences, length), outputs, pooled=pooled
    )
    head = task_head(cfg, task.objective)
    exp = experiment.Experiment.build(
        config, cfg, head, task.objective, 1, aot.topology_devices(topology)
    )
    return compile_report.report_compiled_step(
        exp, batch, model_flops=model_flops, topology=topology, task=ft.name, hlo_out=hlo_out
    )


def task_head(cfg, objective: str) -> str:
    """The head class of `objective`'s role in `cfg`'s model family
    ("BertForSequenceClassification", "ModernBertForSequenceClassification", ...)."""
    return families.family_of(cfg).head_for(objectives.get_objective(objective).role)


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------
def train_features(task: FinetuneTask, data: TaskData, ft) -> dict[str, np.ndarray]:
    """The training rows: the task's features, packed several to a row with `ft.pack`."""
    if not ft.pack:
        return data.train
    if not task.packable:
        raise ValueError(
            f"packing is for sequence and token tasks, not {task.name} ({data.objective})"
        )
    packed, info = batching.pack(
        data.train, max_segments=ft.max_segments, max_seq_length=ft.max_seq_length
    )
    logging.info(
        "packed %d examples into %d rows (%.1f%% real tokens)",
        batching.num_rows(data.train),
        batching.num_rows(packed),
        100 * info.efficiency,
    )
    return packed


def train_and_evaluate(config, workdir: str | None, mode: str = "train") -> dict[str, Any]:
    """Fine-tunes the task `config.finetune.name` for every seed of `config.finetune.seeds`
    (mode "train") or prints the shardings ("shardings"; --mode=compile:
    `compile_for_topology`, through `JOB.run`).

    Flow: task data -> step count -> one Experiment for every seed (its compiled steps serve them
    all) -> per seed: starting state (the encoder with a new head) -> Trainer with hooks -> final
    evaluation and export.

    Settings that could only fail later are refused first (`check_config`, `check_init_from`,
    the eval batch against the mesh). Seeds listed in `<workdir>/results.json` (an earlier run's,
    written as each seed finished) are not trained again; an earlier run with other settings or
    data is refused (`settings.start_results`).

    Returns:
      {"task", "seeds": {seed: final dev (and labelled test) metrics}, "mean", "std"}, the
      earlier run's seeds included.
    """
    seeds = list(check_config(config).seeds)
    ft = config.finetune
    task = tasks.get_task(ft.name)
    check_init_from(config.init_from)
    tokenizer = find_tokenizer(config)
    with text_io.record_reads() as data_files:
        data = task.load(ft, tokenizer)
    model_config, encoder = starting_point(config, data, tokenizer)
    features = train_features(task, data, ft)
    exp = build_experiment(config, model_config, data, features, seeds[0])

    def train_seed(seed, seed_dir):
        return SeedRun(
            config=config, exp=exp, task=task, data=data, features=features, encoder=encoder,
            tokenizer=tokenizer, seed=seed, seed_dir=seed_dir,
        ).train_and_evaluate()  # fmt: skip

    return seed_run.run_seeds(
        config, workdir, exp, mode=mode, task=ft.name, data_files=data_files, seeds=seeds,
        one_seed=train_seed,
    )  # fmt: skip


def build_experiment(config, model_config, data: TaskData, features, first_seed: int):
    """The Experiment every seed of the run trains in (its compiled steps serve them all): the
    task's head on `model_config`, a schedule of `num_epochs` epochs of `features`' batches.
    Refuses a batch larger than the training rows and an eval batch that does not split over
    the data-parallel devices. Sets `config.seed` to `first_seed`, the Experiment's default (each
    seed's run passes its own)."""
    ft = config.finetune
    seed_run.check_batch(config, batching.num_rows(features), "training rows")
    steps_per_epoch = _train_batches(config, features, first_seed).steps_per_epoch  # every seed's
    with config.unlocked():
        config.seed = first_seed
    exp = experiment.Experiment.build(
        config,
        model_config,
        task_head(model_config, data.objective),
        data.objective,
        steps_per_epoch * ft.num_epochs,
    )
    if ft.eval_batch_size % sharding.data_parallel_size(exp.mesh):
        raise ValueError(
            f"finetune.eval_batch_size={ft.eval_batch_size} does not split over the "
            f"{sharding.data_parallel_size(exp.mesh)} data-parallel devices"
        )
    return exp


BATCHING = {
    "bucketed": "each batch from one length bucket (less padding than the original's batches)",
    "shuffled": "rows shuffled into batches, as google-research/bert",
}
KEEP = ("best", "last", "none")


def batching_summary(ft) -> str:
    """How the training batches were made, for the closing summary."""
    if ft.pack:  # packed rows are shuffled into batches whatever `batching` says
        return (
            f"packed: up to {ft.max_segments} examples a row of {ft.max_seq_length} tokens, "
            "rows shuffled into batches"
        )
    return f"{ft.batching}: {BATCHING[ft.batching]}"


def check_config(config, reads_data: bool = True) -> TextJob:
    """Refuses, before any data is read, the settings that could only fail later (or train
    nothing): a count that is not a positive whole number (`experiment.check_experiment_config`:
    batch sizes, epochs, ...), a seed list that is not distinct whole numbers, an unknown
    `finetune.batching` or `finetune.keep` (the same with or without `reads_data`: the task's
    files are checked as they are read), the shared settings (`TextJob.parse`: epochs, packing,
    seeds). Returns those, parsed."""
    del reads_data
    experiment.check_experiment_config(config)
    ft = config.finetune
    if ft.batching not in BATCHING:
        raise ValueError(f"finetune.batching={ft.batching!r}; expected one of {list(BATCHING)}")
    if ft.keep not in KEEP:
        raise ValueError(f"finetune.keep={ft.keep!r}; expected one of {KEEP}")
    return TextJob.parse(config, "finetune", least_length=1)


def check_init_from(path: str) -> None:
    """Reads the model config of `init_from` before any data (`pretrained.read_config`): a
    config.json that is no model config, or a path or Hub id that is not there, is refused at
    once, naming the file and what it lacks."""
    if path:
        pretrained.read_config(path)


def _length_buckets(ft) -> tuple[int, ...] | None:
    """The length buckets batches are cut to with `finetune.bucket_lengths` (None: no cut)."""
    return batching.length_buckets(ft.max_seq_length) if ft.bucket_lengths else None


def _train_batches(config, features, seed: int, host_rows=None) -> batching.EpochIterator:
    """The training batches of one seed: `num_epochs` epochs of shuffled global batches, drawn
    from one length bucket each with `finetune.batching="bucketed"` (not packed rows); each is cut
    to the bucket of its longest row with `bucket_lengths`. `host_rows`: this process's rows of
    each (None: all)."""
    ft = config.finetune
    buckets = _length_buckets(ft)
    return batching.EpochIterator(
        features,
        config.global_batch_size,
        num_epochs=ft.num_epochs,
        seed=seed,
        bucket_boundaries=None if ft.pack else buckets,
        group_by_length=bool(buckets) and not ft.pack and ft.batching == "bucketed",
        host_rows=host_rows,
    )


def selection_metric(scores: Mapping[str, float]) -> str:
    """The dev metric that picks the best model: "f1" where the task reports it (SQuAD, MRPC,
    QQP), else its first metric (GLUE's and custom files' official one, entity F1, accuracy)."""
    return "f1" if "f1" in scores else next(iter(scores))


# The metrics group of the kept model's scores in metrics.jsonl, at its step, where
# `finetune.keep="best"` keeps an earlier model than the final one (the model card shows them).
KEPT = "kept/"


class Kept(NamedTuple):
    """The model a seed keeps (`finetune.keep`).

    Attributes:
      params: its parameters.
      step: the step it is from.
      metrics: its final metrics over every split (results.json's; {} until scored).
      model: which model it is: "best by dev <metric>" or "final".
    """

    params: Any
    step: int
    metrics: dict[str, float]
    model: str


@dataclasses.dataclass(kw_only=True)
class SeedRun:
    """One seed's fine-tuning in `seed_dir`: train (resuming from its checkpoint), evaluate the
    final model on every split, write predictions, keep the model `finetune.keep` says and remove
    the training checkpoints."""

    config: Any
    exp: experiment.Experiment
    task: FinetuneTask
    data: TaskData
    features: dict
    encoder: Any  # BertModel params (or the whole model's: `starting_point`), None: random
    tokenizer: Any
    seed: int
    seed_dir: Any
    # keep="best": (dev selection metric, step, a copy of the params) of the best periodic
    # evaluation of this process's run (one resumed from a checkpoint knows its own only).
    best: tuple | None = None
    best_metric: str = ""  # the dev metric that picks it (`selection_metric`)

    def train_and_evaluate(self) -> settings.SeedResult | None:
        """The kept model's metrics on every split and which model it is (the final one's
        unless `finetune.keep="best"` keeps an earlier one), or None when a signal stopped the
        run before its last step (`seed_run.train_seed`, with this seed's plan)."""
        config, exp, ft, seed = self.config, self.exp, self.config.finetune, self.seed
        buckets = _length_buckets(ft)
        host_rows = sharding.host_batch_rows(exp.mesh, config.global_batch_size)
        train_iter = _train_batches(config, self.features, seed, host_rows)
        params = None
        if self.encoder is not None:
            params, new = graft(exp.model_config, exp.head, self.encoder, seed)
            if new:
                logging.info("newly initialized head weights: %s", new)
        steps_per_epoch = train_iter.steps_per_epoch
        plan = seed_run.SeedPlan(
            VIEW,
            lambda params, step, writer, checkpoints: self._finish(
                params, step, writer, checkpoints, buckets
            ),
            evaluate=self._dev_evaluation(buckets),
            eval_every=config.eval_every_steps or steps_per_epoch,
            eval_at_end=False,  # the final evaluation scores the last step
            checkpoint_every=min(config.checkpoint_every_steps, steps_per_epoch),  # each epoch
        )
        return seed_run.train_seed(
            config, exp, train_iter, ft.num_epochs, seed, self.seed_dir, plan, init_params=params
        )

    def _finish(self, params, step: int, writer, checkpoints, buckets):
        """The final model scored on every split (its predictions written), the model
        `finetune.keep` names kept and exported, the training checkpoints removed: the seed's
        `SeedResult` and the summary's lines."""
        exp, ft = self.exp, self.config.finetune
        predictions_dir = self.seed_dir / "predictions"
        final = evaluation.evaluate_splits(
            exp, params, self.task, self.data, ft, buckets, predictions_dir
        )
        writer.write(step, {f"final/{k}": v for k, v in final.items()})
        kept = self._choose(params, step, final)
        if kept.step != step:  # the kept model scored as the final one was, its predictions kept
            kept = kept._replace(
                metrics=evaluation.evaluate_splits(
                    exp, kept.params, self.task, self.data, ft, buckets, predictions_dir
                )
            )
            writer.write(kept.step, {f"{KEPT}{k}": v for k, v in kept.metrics.items()})
        places = {"batching": batching_summary(ft)}
        places.update(self._keep(kept, step, final, as_path(checkpoints)))
        model = {"model": kept.model, "step": kept.step, "last_step": step}
        return settings.SeedResult(kept.metrics, model), places

    def _choose(self, params, step: int, final: Mapping[str, float]) -> Kept:
        """The model `finetune.keep` keeps: the best of the dev evaluations by the selection
        metric with keep="best" (the final one unless an earlier one scored higher), else the
        final one (its metrics `final`; an earlier model's are scored by the caller)."""
        metric = self.best_metric
        if self.config.finetune.keep == "best" and self.best is not None:
            value, best_step, best_params = self.best
            if value > final[metric]:
                return Kept(best_params, best_step, {}, f"best by dev {metric}")
            return Kept(params, step, final, f"best by dev {metric}")
        return Kept(params, step, final, "final")

    def _keep(self, kept: Kept, step: int, final: Mapping[str, float], checkpoints):
        """Exports the model `finetune.keep` names (`kept`) and removes the training
        checkpoints (the seed is done: results.json holds its metrics). Returns the summary's
        lines about them."""
        config, exp = self.config, self.exp
        keep, places, metric = config.finetune.keep, {}, self.best_metric
        what = f"the final model (step {step})"
        if keep == "best" and kept.step != step:
            what = (
                f"the best model by dev {metric}: step {kept.step} "
                f"({kept.metrics[metric]:.4f}; the final model's {final[metric]:.4f}), scored in "
                "results.json"
            )
        elif keep == "best" and self.best is not None:
            what = f"the best model by dev {metric}: the final one (step {step})"
        if keep != "none":
            out = export(
                kept.params,
                self.seed_dir,
                exp.model_config,
                exp.head,
                hf=config.export_hf_at_end,
                tokenizer=self.tokenizer,
                config=config,
            )
            sizes = ", ".join(f"{d}/ {_megabytes(self.seed_dir / d):,.1f} MB" for d in out)
            places["kept"] = f"{what}: {sizes}"
            places.update(out)
        else:
            places["kept"] = "no model (finetune.keep=none)"
        if jax.process_index() == 0 and checkpoints.exists():
            places["kept"] += f"; training checkpoints ({_megabytes(checkpoints):,.1f} MB) removed"
            checkpoints.rmtree()
        return places

    def _dev_evaluation(self, buckets):
        """(params, step) -> the dev scores, remembering the best model for keep="best"; None
        where the task has no labelled dev split."""
        dev = next((e for e in self.data.evals if e.name == "dev" and e.labelled), None)
        if dev is None:
            return None
        exp, task, data, ft = self.exp, self.task, self.data, self.config.finetune

        def evaluate(params, step):
            scores = evaluation.score(exp, params, task, data, dev, ft, buckets)
            self._remember(params, step, scores)
            return scores

        return evaluate

    def _remember(self, params, step: int, scores: Mapping[str, float]) -> None:
        """keep="best": a copy of `params` when their dev selection metric is the best so far
        (the train step donates the state's buffers)."""
        if self.config.finetune.keep != "best" or not scores:
            return
        self.best_metric = selection_metric(scores)
        value = scores[self.best_metric]
        if self.best is None or value > self.best[0]:
            self.best = (value, step, jax.tree_util.tree_map(jnp.copy, params))


def _megabytes(path) -> float:
    """The size of a file or directory tree in MB (10^6 bytes)."""
    path = as_path(path)
    if not path.exists():
        return 0.0
    if path.is_file():
        return path.stat().length / 1e6
    return sum(_megabytes(p) for p in path.iterdir())


JOB = register(
    Job(
        ("finetune",),
        "finetune",
        check_config,
        train_and_evaluate,
        compile_for_topology,
        minima={"finetune.num_epochs": 1, "finetune.eval_batch_size": 1},
    )
)
