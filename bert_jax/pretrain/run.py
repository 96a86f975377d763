"""The pretraining job: MLM (+ NSP) on the config's corpus, as google-research/bert's
run_pretraining.py, or replaced-token detection (`job="rtd"`, ELECTRA's: `models.rtd`).

    train_and_evaluate(config, workdir)           # train.py --config=configs/pretrain.py:...
    compile_for_topology(config, "v5e:4x4")       # train.py --mode=compile --topology=v5e:4x4

Flow: config (a rerun's compared with the run's config.json: `settings.check_resumed_run`) ->
Experiment (mesh, model, optimizer) -> inputs (shards built once) -> state (restored or fresh) ->
Trainer with hooks (metrics, held-out evaluation, checkpoints) -> export and a summary. A rerun
of a finished run trains nothing and rewrites nothing (it exports only where the export is
missing: `finished`). `compile_for_topology` compiles the step for a TPU slice or GPUs instead
(`parallel.aot`; `--mode=compile`); `mode="shardings"` prints every parameter's sharding.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal

import jax
import numpy as np
from absl import logging

from bert_jax import tokenization
from bert_jax.batch_layout import pretraining_shapes
from bert_jax.checkpoints import pretrained
from bert_jax.models import families, rtd
from bert_jax.models.config import EncoderConfig
from bert_jax.parallel import aot, multihost, preemption, sharding
from bert_jax.paths import as_path
from bert_jax.pretrain import inputs
from bert_jax.pretrain.data import packing
from bert_jax.pretrain.fill_mask_demo import fill_mask_demo
from bert_jax.training import compile_report, experiment, flops, loop, objectives, settings
from bert_jax.training.export import export
from bert_jax.training.job import Job, register
from bert_jax.training.objective import Objective
from bert_jax.training.start import starting_state
from bert_jax.training.summaries import MetricView, MetricWriter

JOBS = ("pretraining", "mlm", "rtd")  # each trains the objective of its name
# What the console, the progress bar, the curves and the summary show of the metrics. Baselines:
# held-out scores of a model that ignores its input (`_write_starting_point`).
VIEW = MetricView(
    console=("eval/", "loss", "mlm_accuracy", "nsp_accuracy", "learning_rate"),
    summary=("loss", "mlm_accuracy", "nsp_accuracy", "nsp_auc", "mlm_loss", "nsp_loss"),
    progress=("train/loss", "train/mlm_accuracy", "eval/mlm_accuracy", "train/tokens_per_s"),
    baselines={
        "eval/commonest_token_share": ("commonest token's share", "--"),
        "eval/nsp_majority_share": ("NSP majority class's share", ":"),
    },
    curves_accuracy=("eval/nsp_auc",),
    curves_accuracy_title="accuracy (and held-out NSP AUC: 0.5 is chance)",
)
# Replaced-token detection: the generator's MLM accuracy and the discriminator's.
RTD_VIEW = MetricView(
    console=("eval/", "loss", "mlm_accuracy", "rtd_accuracy", "rtd_auc", "learning_rate"),
    summary=(
        "loss", "mlm_accuracy", "rtd_accuracy", "rtd_auc", "rtd_replaced_share", "mlm_loss",
        "rtd_loss",
    ),
    progress=("train/loss", "train/mlm_accuracy", "eval/rtd_auc", "train/tokens_per_s"),
    baselines={"eval/commonest_token_share": ("commonest token's share", "--")},
    curves_accuracy=("eval/rtd_auc",),
    curves_accuracy_title="accuracy (and held-out discriminator AUC: 0.5 is chance)",
)  # fmt: skip


def objective_of(config) -> str | Objective:
    """The job's objective: its name, or replaced-token detection with the config's weight."""
    if config.job == "rtd":
        if "rtd" not in config:
            raise ValueError(
                "job='rtd' needs the config's rtd block (configs/pretrain.py:arch=electra)"
            )
        return objectives.rtd_objective(config.rtd.discriminator_weight, config.rtd)
    return config.job


def job_step_flops(exp: experiment.Experiment, job: str, lengths, predictions: float) -> float:
    """Model FLOPs of one global step of `job` over sequences of the given real lengths with
    `predictions` masked positions: BERT's step (NSP for "pretraining" only), or for "rtd" the
    generator's MLM step plus the discriminator's encoder and head (dense + output per token)
    over every token."""
    if job != "rtd":
        return flops.pretraining_step_flops(
            exp.model_config, lengths, predictions, nsp=job == "pretraining"
        )
    disc, gen = exp.model_config, exp.model.generator
    e = disc.hidden_size
    head = 3.0 * 2.0 * (e * e + e) * float(np.sum(lengths))
    return (
        flops.pretraining_step_flops(gen, lengths, predictions, nsp=False)
        + flops.pretraining_step_flops(disc, lengths, 0.0, nsp=False)
        + head
    )


def pretraining_batch(config) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one global pretraining batch of the config (`bert_jax.batch_layout`):
    B = global_batch_size, L = max_seq_length, P (packed: per row), S = max_segments."""
    d = inputs.PretrainData.parse(config)
    length, s, p = d.max_seq_length, d.max_segments, d.max_predictions_per_seq
    if d.pack_sequences:
        p = packing.max_predictions_per_row(length, s, p, d.masked_lm_prob)
    b = config.global_batch_size
    spec = pretraining_shapes(d.pack_sequences, B=b, L=length, P=p, S=s)
    return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in spec.items()}


def model_step_flops(exp: experiment.Experiment, config) -> float:
    """Model FLOPs of one global pretraining step of the config if every slot held a real token
    and every prediction slot were used (full rows; the most the batch can need)."""
    batch = pretraining_batch(config)
    rows, length = batch["input_ids"].shape
    predictions = math.prod(batch["masked_lm_weights"].shape)
    return job_step_flops(exp, config.job, np.full(rows, length), predictions)


def compile_for_topology(
    config, topology: str, *, num_slices: int = 1, hlo_out: str | None = None
) -> int:
    """Compiles the step for `num_slices` of a TPU slice or GPUs on this machine and prints the
    report; returns the exit status (1 if it does not fit in memory)."""
    exp = build_experiment(config, aot.topology_devices(topology, num_slices))
    return compile_report.report_compiled_step(
        exp,
        pretraining_batch(config),
        model_flops=model_step_flops(exp, config),
        topology=topology,
        num_slices=num_slices,
        hlo_out=hlo_out,
    )


def build_experiment(config, devices=None) -> experiment.Experiment:
    """The run's Experiment: the model of `config.model` with the family's head of the job's
    objective (its role), on `devices` (None: this machine's)."""
    model_config = families.config_from_fields(config.model.to_dict())
    # The objective names a role; the model family gives its class of it.
    objective = objective_of(config)
    role = objectives.get_objective(config.job).role
    head = families.family_of(model_config).head_for(role)
    return experiment.Experiment.build(
        config, model_config, head, objective, config.num_train_steps, devices
    )


class HeldOutEvaluation:
    """(params, step) -> held-out metrics over the same `num_batches` batches every time.

    The batches are read once: `host_batches` (this process's rows, also what the job shows and
    counts before training), and their global arrays kept on the devices after the first call.
    """

    def __init__(
        self, exp: experiment.Experiment, data: inputs.PretrainingInputs, num_batches: int
    ):
        self.exp = exp
        self.host_batches = data.eval_batches(num_batches)
        self.batches = None

    def __call__(self, params, step: int) -> dict[str, float]:
        del step
        if self.batches is None:
            mesh = self.exp.mesh
            self.batches = [sharding.global_batch_from_local(b, mesh) for b in self.host_batches]
        jit_eval = self.exp.eval_fn()
        # One batch in flight at a time: with dozens of collective programs queued at once, XLA's
        # CPU collectives (a mesh of host devices) deadlock at their rendezvous.
        return loop.reduce_metrics(
            [jax.block_until_ready(jit_eval(params, b)) for b in self.batches]
        )


def step_flops_fn(exp: experiment.Experiment, job: str):
    """Host batch -> model FLOPs of the global step (this host's batch stands for every host's).
    Every (packed) sequence's own length counts: its attention costs n_i^2, not a row's L^2."""

    def step_flops(host):
        lengths = packing.sequence_lengths(host)
        predictions = float(host["masked_lm_weights"].sum())
        step = job_step_flops(exp, job, lengths, predictions)
        return step / sharding.host_batch_fraction(exp.mesh)

    return step_flops


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """The pretraining jobs' settings, typed and checked once (`check_config`).

    Attributes:
      data: the data block (`config.data`: `inputs.PretrainData`).
      mlm_bias_init, position_embeddings_init: a scratch run's starting values
        (`_STARTING_VALUES`: "zeros" or "unigram"; "normal" or "sinusoid").
    """

    data: inputs.PretrainData
    mlm_bias_init: str
    position_embeddings_init: str


def check_config(config, reads_data: bool = True) -> PretrainSettings:
    """Refuses, before anything is built, a data setting of the wrong type or range
    (`inputs.PretrainData.parse`) or a starting value the job does not know
    (`_STARTING_VALUES`), naming the key; the same with or without `reads_data`. Returns the
    settings, parsed."""
    del reads_data
    starts = {key: _starting_value(config, key) for key in _STARTING_VALUES}
    return PretrainSettings(inputs.PretrainData.parse(config), **starts)


def train_and_evaluate(config, workdir: str | None, *, mode: str = "train") -> int | None:
    """Pretrains (mode "train") or prints the shardings ("shardings"; --mode=compile:
    `compile_for_topology`, through `JOB.run`)."""
    job = check_config(config)  # a bad choice stops the run before anything is built
    if mode == "train":  # a rerun of other settings stops before anything is built or written
        settings.check_resumed_run(config, workdir)
    exp = build_experiment(config)
    model_config = exp.model_config
    if mode == "shardings":
        print(f"mesh {dict(exp.mesh.shape)}; {exp.head} {model_config}")
        print("\n".join(sharding.describe(exp.abstract_state.params, exp.mesh, exp.rules)))
        return None
    logging.vlog(1, "config:\n%s", config)
    data = inputs.pretraining_inputs(config, workdir, exp.mesh, job.data)
    check_vocabulary(config, data.tokenizer_path)
    ckpt = experiment.checkpointer(workdir, config)
    start = starting_state(
        exp,
        ckpt,
        data.train,
        init_from=config.init_from,
        starting_values=lambda: starting_values(config, job, model_config, data),
    )
    if start.step >= config.num_train_steps:  # an earlier run finished: nothing to train
        ckpt.close()
        finished(config, workdir, exp, data, start.state.params, start.step)
        return None
    # Only now: a config its checkpoint refuses (RestoreError) leaves the run's record alone.
    experiment.write_config(config, workdir)
    logging.info("config: %s", os.path.join(workdir, "config.json"))
    _train(config, workdir, exp, data, ckpt, start)
    return None


def check_vocabulary(config, tokenizer_path: str | None) -> None:
    """Refuses, before any step, a vocabulary that does not fit: the data's tokenizer
    (`data.tokenizer`, else the build's) must have `model.vocab_size` tokens, and where
    `init_from` carries a vocabulary (beside it or in a run's hf/, data/:
    `pretrained.find_tokenizer`), the same tokens in the same order (its embedding rows are those
    tokens'). Names both sizes and files, or the first line that differs."""
    if not tokenizer_path or not os.path.isfile(tokenizer_path):
        return
    tokenizer = tokenization.load_tokenizer(tokenizer_path)
    key = "config.data.tokenizer" if config.data.tokenizer else "the data's tokenizer"
    if tokenizer.vocab_size != config.model.vocab_size:
        raise ValueError(
            f"{key} {tokenizer_path} has {tokenizer.vocab_size} tokens but "
            f"config.model.vocab_size={config.model.vocab_size}; use a tokenizer of the model's "
            "vocabulary (or set --config.model.vocab_size for a new model)"
        )
    found = pretrained.find_tokenizer(config.init_from) if config.init_from else None
    if found is None:
        return
    source, theirs, ours = found.source, found.vocab, tokenizer.vocab
    if theirs == ours:
        return
    if len(theirs) != len(ours):
        raise ValueError(
            f"init_from's vocabulary {source} has {len(theirs)} tokens but {key} "
            f"{tokenizer_path} has {len(ours)}: the model's embedding rows are another "
            "vocabulary's tokens"
        )
    i = next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b)
    raise ValueError(
        f"init_from's vocabulary {source} and {key} {tokenizer_path} differ at id {i} (line "
        f"{i + 1} of a vocab.txt): {theirs[i]!r} there, {ours[i]!r} here; the model's embedding "
        "rows are init_from's tokens: tokenize the data with its vocabulary"
    )


def _train(config, workdir, exp, data, ckpt, start) -> None:
    """The Trainer's run from `start`, the export and the closing summary."""
    writer = MetricWriter(
        workdir, config.num_train_steps, start.step, view=RTD_VIEW if config.job == "rtd" else VIEW
    )
    pair = isinstance(exp.model, rtd.ReplacedTokenDetection)
    # The fill-mask demonstration and the export read each model's own parameters.
    demo_model = exp.model.generator_model() if pair else exp.model

    def demo_params(params):
        return exp.model.split(params)[0] if pair else params

    evaluate = None
    if data.eval_batches:
        evaluate = HeldOutEvaluation(exp, data, config.num_eval_steps)
    # What the model predicts for held-out lines, before and after.
    demo = None
    if evaluate:
        demo = fill_mask_demo(evaluate.host_batches[0], data.tokenizer_path)
    if demo:
        demo.predict(demo_model, demo_params(start.state.params), f"step {start.step}")
    if evaluate and start.step == 0:
        _write_starting_point(writer, evaluate(start.state.params, 0), evaluate.host_batches)
    log_every, checkpoint_every = config.log_every_steps, config.checkpoint_every_steps
    hooks = [loop.LogMetrics(writer, every=(log_every, checkpoint_every), ckpt=ckpt)]
    if evaluate is not None:
        hooks.append(loop.Evaluate(evaluate, writer, config.eval_every_steps))
    hooks.append(loop.SaveCheckpoint(ckpt, exp.checkpoint_meta(), checkpoint_every))
    trainer = loop.Trainer(
        exp,
        hooks,
        num_train_steps=config.num_train_steps,
        stop_sync_every=log_every,
        timer=loop.Timer.for_mesh(exp.mesh, step_flops_fn(exp, config.job)),
    )
    state, step, stopped = trainer.run(start.state, start.step, data.train)
    ckpt.close()
    writer.close()
    places = {"checkpoints": ckpt.directory}
    if step >= config.num_train_steps and config.export_hf_at_end:
        places.update(export_run(config, workdir, exp, data, state.params))
    if jax.process_index() == 0:
        if demo:
            demo.predict(demo_model, demo_params(state.params), f"step {step}")
            print("\n" + demo.format())
        stopped_by = signal.Signals(preemption.stopped_by()).name if stopped else None
        print("\n" + writer.summary(step, places, timing=trainer.timer, stopped_by=stopped_by))


def export_run(config, workdir: str, exp: experiment.Experiment, data, params) -> dict:
    """The finished run's export (every process: a barrier, then the collective save):
    `<workdir>/export` and `hf/` (`training.export`), and replaced-token detection's generator
    (`export_rtd`). Returns label -> where it went, for the summary."""
    # Every process has trained and saved (a barrier with a timeout, before the collectives).
    multihost.barrier("export")
    tokenizer = None
    if data.tokenizer_path and os.path.isfile(data.tokenizer_path):
        tokenizer = tokenization.load_tokenizer(data.tokenizer_path)
    if isinstance(exp.model, rtd.ReplacedTokenDetection):
        return export_rtd(exp, params, workdir, tokenizer, config)
    return export(params, workdir, exp.model_config, exp.head, tokenizer=tokenizer, config=config)


def finished(config, workdir: str, exp: experiment.Experiment, data, params, step: int) -> None:
    """A rerun of a run that reached `step` >= num_train_steps: nothing is trained and nothing
    it wrote is rewritten (no metrics, no before-and-after guesses); the export alone is written
    where its weights are missing and export_hf_at_end asks for them (a run stopped in its export,
    or run without it). Prints one line saying which."""
    hf_dirs = [as_path(workdir) / "hf"]  # and the generator's: the export writes it last
    if isinstance(exp.model, rtd.ReplacedTokenDetection):
        hf_dirs.append(as_path(workdir) / rtd.GENERATOR_DIR / "hf")
    done = all((p / "model.safetensors").exists() for p in hf_dirs)
    # Process 0's view decides (it alone writes hf/): every process takes the same path.
    export_now = config.export_hf_at_end and multihost.broadcast("exported", str(done)) != "True"
    past = (
        f", past num_train_steps={config.num_train_steps}" if step > config.num_train_steps else ""
    )
    what = f"{workdir} finished at step {step}{past} in an earlier run (its checkpoint {step})"
    more = f"rerun with --config.num_train_steps above {step} to train on, or use another --workdir"
    if export_now:
        written = ", ".join(export_run(config, workdir, exp, data, params).values())
        if jax.process_index() == 0:
            print(f"{what}: nothing to train; exported it ({written}); {more}")
        return
    if jax.process_index() == 0:
        kept = [os.fspath(p) for p in hf_dirs if p.exists()]
        kept = f"; its export is kept as it was ({', '.join(kept)})" if kept else ""
        print(f"{what}: nothing to train{kept}; {more}")


def export_rtd(exp: experiment.Experiment, params, workdir: str, tokenizer, config) -> dict:
    """Replaced-token detection's export: the discriminator as the run's model (`<workdir>/hf`,
    the directory users fine-tune) and the generator, a masked LM for fill-mask, in
    `<workdir>/generator` (its `hf/` and `export/`)."""
    generator, discriminator = jax.jit(exp.model.split)(params)
    places = export(
        discriminator, workdir, exp.model_config, exp.head, tokenizer=tokenizer, config=config
    )
    head = families.family_of(exp.model_config).head_for(families.Role.MASKED_LM)
    out = os.path.join(workdir, rtd.GENERATOR_DIR)
    gen = export(generator, out, exp.model.generator, head, tokenizer=tokenizer)
    places["generator"] = gen["hf"].replace("(transformers)", "(transformers, fill-mask)")
    return places


# Scratch runs: how two parameters start (the first choice is BERT's). Set at step 0 in
# train_and_evaluate; a run from init_from or a checkpoint keeps its values.
_STARTING_VALUES = {
    "mlm_bias_init": ("zeros", "unigram"),
    "position_embeddings_init": ("normal", "sinusoid"),
}


def _starting_value(config, key: str) -> str:
    """`config.<key>` (BERT's choice when absent), checked against `_STARTING_VALUES[key]`."""
    known = _STARTING_VALUES[key]
    value = config.get(key, known[0])
    if value not in known:
        raise ValueError(f"config.{key}={value!r}: expected one of {known}")
    return value


def starting_values(
    config, job: PretrainSettings, model_config, data
) -> dict[tuple[str, ...], np.ndarray]:
    """A scratch run's special starting values (`training.start.starting_state` sets them inside
    the jitted init): parameter path -> value, for the settings' choices (`_STARTING_VALUES`);
    the paths are the family's (`models.families.Family.starting_paths`)."""
    values = {}
    family = families.family_of(model_config)
    paths = dict(family.starting_paths)
    if config.job == "rtd":  # the generator's MLM bias; a tied position table in the discriminator
        paths = rtd.starting_paths(paths, config.rtd.embedding_sharing)
    if job.mlm_bias_init == "unigram":
        log_frequencies = data.target_log_frequencies(model_config.vocab_size)
        values[paths["mlm_bias"]] = mlm_bias(log_frequencies, model_config.padded_vocab_size)
    if job.position_embeddings_init == "sinusoid":
        if "position_embeddings" not in paths:
            raise ValueError(
                f"config.position_embeddings_init='sinusoid': {family.model_type} has no position "
                "embeddings (no position table to start); use 'normal'"
            )
        values[paths["position_embeddings"]] = position_sinusoids(model_config)
    return values


def mlm_bias(log_frequencies: np.ndarray, rows: int) -> np.ndarray:
    """The MLM decoder's output bias [rows]: the log frequencies [V] of the training data's
    masked tokens, zeros for the table's padding rows (whose logits are cut off)."""
    logging.info("MLM decoder bias: the log frequencies of the training data's masked tokens")
    return np.pad(log_frequencies, (0, rows - len(log_frequencies)))


# The sinusoids' root-mean-square, in units of initializer_range: 3 starts the rows at about the
# norm the tiny model's learned ones reach by the end of its run (docs/pretraining.md).
SINUSOID_SCALE = 3.0


def sinusoid_positions(num_positions: int, width: int, rms: float) -> np.ndarray:
    """[num_positions, width] float32: the Transformer's position encoding (Vaswani et al.,
    2017): column 2i is sin(p / 10000^(2i / width)), column 2i + 1 its cosine, scaled to a
    root-mean-square of `rms` over the table."""
    if width % 2:
        raise ValueError(f"sinusoidal positions need an even width, not {width}")
    angles = np.arange(num_positions)[:, None] / 10000.0 ** (np.arange(0, width, 2) / width)
    table = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(num_positions, width)
    return (table * (rms * np.sqrt(2.0))).astype(np.float32)


def position_sinusoids(model_config: EncoderConfig) -> np.ndarray:
    """[max_position_embeddings, E] float32 (E the embeddings' width: hidden_size, or ELECTRA's
    embedding_size): the position embeddings' starting table,
    sinusoids of RMS SINUSOID_SCALE x initializer_range (learned from there, as BERT's are):
    nearby positions start out alike, so attention can find a token's neighbours from the first
    steps (docs/pretraining.md)."""
    rms = SINUSOID_SCALE * model_config.initializer_range
    logging.info("position embeddings: sinusoids (RMS %.3f)", rms)
    width = getattr(model_config, "embedding_size", None) or model_config.hidden_size  # ELECTRA's
    return sinusoid_positions(model_config.max_position_embeddings, width, rms)


def _write_starting_point(writer: MetricWriter, metrics, held_out: list) -> None:
    """Where the curves start, and what a model that ignores its input scores on the held-out
    batches: always the commonest masked token (the unigram plateau), and for NSP always the
    commonest label (random next is the more frequent in the original recipe's data)."""
    masked = [b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in held_out]
    counts = np.bincount(np.concatenate(masked))
    baselines = {"eval/commonest_token_share": counts.max() / counts.sum()}
    if "nsp_accuracy" in metrics:
        labels = [
            b["next_sentence_labels"][b["next_sentence_weights"] > 0]
            if "next_sentence_weights" in b
            else b["next_sentence_labels"]
            for b in held_out
        ]
        counts = np.bincount(np.concatenate(labels), minlength=2)
        baselines["eval/nsp_majority_share"] = counts.max() / counts.sum()
    writer.write(0, {**{f"eval/{k}": v for k, v in metrics.items()}, **baselines})


# `recipes`: configs/pretrain.py names the recipes that fit where a compiled step does not.
JOB = register(
    Job(JOBS, "data", check_config, train_and_evaluate, compile_for_topology, "configs.pretrain")
)
