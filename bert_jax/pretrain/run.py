"""The pretraining job: MLM (+ NSP) on the config's corpus, as google-research/bert's
run_pretraining.py.

    train_and_evaluate(config, workdir)           # train.py --config=configs/pretrain.py:...
    train_and_evaluate(config, workdir, mode="compile", topology="v5e:4x4")

Flow: config -> Experiment (mesh, model, optimizer) -> inputs (shards built once) -> state
(restored or fresh) -> Trainer with hooks (metrics, held-out evaluation, checkpoints) -> export
and a summary. `mode="compile"` compiles the step for a TPU topology instead (`bert_jax.aot`);
`mode="shardings"` prints every parameter's sharding.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax import aot, flops, inference, loop, multihost, sharding, tokenization
from bert_jax.config import BertConfig
from bert_jax.paths import as_path
from bert_jax.pretrain import inputs
from bert_jax.pretrain.data import packing
from bert_jax.summaries import MetricWriter

MODELS = {"pretraining": "BertForPreTraining", "mlm": "BertForMaskedLM"}  # job -> head


def pretraining_batch(config) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one global pretraining batch of the config (keys as
    `bert_jax.pretrain.data.pipeline` / `packing` document them): B = global_batch_size, L, P."""
    d = config.data
    b, length, p = config.global_batch_size, d.max_seq_length, d.max_predictions_per_seq
    i32, f32 = jnp.int32, jnp.float32
    spec = {k: ((b, length), i32) for k in ("input_ids", "token_type_ids", "attention_mask")}
    if d.pack_sequences:
        s = d.max_segments
        p = packing.max_predictions_per_row(length, s, p, d.masked_lm_prob)
        spec.update(segment_ids=((b, length), i32), position_ids=((b, length), i32))
        spec.update(cls_positions=((b, s), i32), next_sentence_labels=((b, s), i32))
        spec.update(next_sentence_weights=((b, s), f32))
    else:
        spec.update(next_sentence_labels=((b,), i32))
    spec.update(masked_lm_positions=((b, p), i32), masked_lm_ids=((b, p), i32))
    spec.update(masked_lm_weights=((b, p), f32))
    return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in spec.items()}


def model_step_flops(cfg, config) -> float:
    """Model FLOPs of one global pretraining step of the config if every slot held a real token
    and every prediction slot were used (full rows; the most the batch can need)."""
    batch = pretraining_batch(config)
    rows, length = batch["input_ids"].shape
    predictions = math.prod(batch["masked_lm_weights"].shape)
    return flops.pretraining_step_flops(
        cfg, np.full(rows, length), predictions, nsp=config.job != "mlm"
    )


def compile_for_topology(exp: loop.Experiment, config, topology: str, num_slices: int, hlo_out):
    """Compiles the step for a TPU slice or GPUs on this machine and prints the report; returns
    the exit status (1 if it does not fit in memory)."""
    cfg = exp.cfg
    report = aot.compile_step(
        exp,
        pretraining_batch(config),
        model_flops=model_step_flops(cfg, config),
        hlo_path=hlo_out,
    )
    report.update(topology=topology, num_slices=num_slices)
    return aot.print_report(report)


class HeldOutEvaluation:
    """(params, step) -> held-out metrics over the same `num_batches` batches every time.

    The batches are read once: `host_batches` (this process's rows, also what the job shows and
    counts before training), and their global arrays kept on the devices after the first call.
    """

    def __init__(self, exp: loop.Experiment, data: inputs.PretrainingInputs, num_batches: int):
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


class InjectFault(loop.Hook):
    """`multihost.inject_fault("step:<k>")` after each step k's other hooks (a test hook)."""

    def __call__(self, r: loop.StepResult) -> bool:
        multihost.inject_fault(f"step:{r.step}")
        return False


def step_flops_fn(exp: loop.Experiment, job: str):
    """Host batch -> model FLOPs of the global step (this host's batch stands for every host's).
    Every (packed) sequence's own length counts: its attention costs n_i^2, not a row's L^2."""

    def step_flops(host):
        lengths = packing.sequence_lengths(host)
        predictions = float(host["masked_lm_weights"].sum())
        step = flops.pretraining_step_flops(exp.cfg, lengths, predictions, nsp=job != "mlm")
        return step / sharding.host_batch_fraction(exp.mesh)

    return step_flops


def train_and_evaluate(
    config,
    workdir: str | None,
    *,
    mode: str = "train",
    topology: str | None = None,
    num_slices: int = 1,
    hlo_out: str | None = None,
) -> int | None:
    """Pretrains (mode "train"), prints the shardings, or compiles for `topology` ("compile")."""
    starts = {key: _starting_value(config, key) for key in _STARTING_VALUES}
    cfg = BertConfig(**config.model.to_dict())
    compiling = mode == "compile"
    topology = topology or config.topology
    devices = aot.topology_devices(topology, num_slices) if compiling else None
    exp = loop.Experiment.build(
        config, cfg, MODELS[config.job], config.job, config.num_train_steps, devices
    )
    if compiling:
        return compile_for_topology(exp, config, topology, num_slices, hlo_out)
    if mode == "shardings":
        print(f"mesh {dict(exp.mesh.shape)}; {exp.model_name} {cfg}")
        print("\n".join(sharding.describe(exp.abstract_state.params, exp.mesh, exp.rules)))
        return None
    logging.vlog(1, "config:\n%s", config)
    loop.write_config(config, workdir)
    logging.info("config: %s", os.path.join(workdir, "config.json"))
    data = inputs.pretraining_inputs(config, workdir, exp.mesh)
    ckpt = loop.checkpointer(workdir, config)
    state, start = exp.create_or_restore(ckpt, data.train, init_from=config.init_from)
    if start == 0 and not config.init_from:
        if starts["mlm_bias_init"] == "unigram":
            state = with_mlm_bias(state, data.target_log_frequencies(cfg.vocab_size))
        if starts["position_embeddings_init"] == "sinusoid":
            state = with_sinusoid_positions(state, cfg)
    writer = MetricWriter(workdir, config.num_train_steps, start)
    evaluate = None
    if data.eval_batches:
        evaluate = HeldOutEvaluation(exp, data, config.num_eval_steps)
    # What the model predicts for held-out lines, before and after.
    demo = None
    if evaluate:
        demo = inference.fill_mask_demo(evaluate.host_batches[0], data.tokenizer_path)
    if demo:
        demo.predict(exp.model, state.params, f"step {start}")
    if evaluate and start == 0:
        _write_starting_point(writer, evaluate(state.params, 0), evaluate.host_batches)
    hooks = [
        loop.LogMetrics(writer, exp.mesh, step_flops_fn(exp, config.job), ckpt),
        loop.SaveCheckpoint(ckpt, exp.checkpoint_meta(), data.train),
        InjectFault(),
    ]
    if evaluate is not None:
        hooks.insert(1, loop.Evaluate(evaluate, writer, config.eval_every_steps))
    trainer = loop.Trainer(
        exp,
        hooks,
        num_train_steps=config.num_train_steps,
        log_every_steps=config.log_every_steps,
        checkpoint_every_steps=config.checkpoint_every_steps,
    )
    state, step, _ = trainer.run(state, start, data.train)
    ckpt.close()
    writer.close()
    places = {"checkpoints": ckpt.directory}
    if step >= config.num_train_steps and config.export_hf_at_end:
        multihost.inject_fault("export")  # a test hook (bert_jax.multihost)
        # Every process has trained and saved (a barrier with a timeout, before the collectives).
        multihost.barrier("export")
        exp.export(state.params, workdir)
        run_dir = as_path(workdir)  # a gs:// URL stays one
        places["export"] = f"{run_dir / 'export'} (bert_jax)"
        places["hf"] = f"{run_dir / 'hf'} (transformers)"
        if data.tokenizer_path and os.path.isfile(data.tokenizer_path) and jax.process_index() == 0:
            # The vocabulary goes with the model: <workdir>/hf is a complete transformers directory.
            tokenization.load_tokenizer(data.tokenizer_path).save(run_dir / "hf")
    if jax.process_index() == 0:
        if demo:
            demo.predict(exp.model, state.params, f"step {step}")
            print("\n" + demo.format())
        print("\n" + writer.summary(step, places))
    return None


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


def _with_param(state, path: tuple[str, ...], value: np.ndarray):
    """`state` with the parameter at `path` set to `value` (the same on every host), placed and
    typed as the parameter it replaces."""

    def put(tree, keys):
        old = tree[keys[0]]
        if len(keys) > 1:
            new = put(old, keys[1:])
        else:
            new = jax.device_put(np.asarray(value, old.dtype), old.sharding)
        return {**tree, keys[0]: new}

    return state.replace(params=put(state.params, path))


def with_mlm_bias(state, bias: np.ndarray):
    """`state` with the MLM decoder's output bias `cls/predictions/bias` set to `bias` [V] (the
    same on every host; zeros for the table's padding rows)."""
    rows = state.params["cls"]["predictions"]["bias"].shape[0]
    bias = np.pad(bias, (0, rows - len(bias)))  # the padding rows' logits are cut off
    logging.info("MLM decoder bias: the log frequencies of the training data's masked tokens")
    return _with_param(state, ("cls", "predictions", "bias"), bias)


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


def with_sinusoid_positions(state, cfg: BertConfig):
    """`state` with its position embeddings started at sinusoids of RMS SINUSOID_SCALE x
    initializer_range (learned from there, as BERT's are): nearby positions start out alike, so
    attention can find a token's neighbours from the first steps (docs/pretraining.md)."""
    table = sinusoid_positions(
        cfg.max_position_embeddings, cfg.hidden_size, SINUSOID_SCALE * cfg.initializer_range
    )
    logging.info(
        "position embeddings: sinusoids (RMS %.3f)", SINUSOID_SCALE * cfg.initializer_range
    )
    return _with_param(state, ("bert", "embeddings", "position_embeddings", "embedding"), table)


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
