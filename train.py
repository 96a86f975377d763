"""Pretrain or fine-tune BERT on a device mesh.

    python train.py --config=configs/pretrain.py:size=tiny --workdir=runs/tiny
    python train.py --config=configs/pretrain.py:size=base --config.mesh.fsdp=8 --workdir=runs/base
    python train.py --config=configs/finetune.py:task=mrpc --config.init_from=DIR --workdir=runs/m

Flow: flags -> config -> mesh -> data -> state (created sharded) -> loop. The loop saves Orbax
checkpoints (state + data position) every `checkpoint_every_steps`, on SIGTERM/SIGINT and at the
end, and resumes from the newest good one in --workdir. Metrics go to the console, TensorBoard and
<workdir>/metrics.jsonl.

Multi-host: on TPU pods, SLURM and Open MPI, jax.distributed finds its peers by itself; elsewhere
pass --coordinator_address=host:port --num_processes=N --process_id=i (CPU processes talk over
gloo). `--mode=shardings` prints every parameter's sharding for the config and mesh and exits.
Compiled steps are kept in a persistent cache (`--compilation_cache_dir`, on by default), so a
rerun or resumed run loads them instead of compiling.

Before renting a TPU slice, compile the real step for it on this machine (needs the `tpu` extra):

    python train.py --config=configs/pretrain.py:size=large --mode=compile --topology=v5e:4x4
    python train.py --config=... --mode=compile --topology=v5p:4x4x4 --num_slices=2

prints HBM per chip, whether it fits (exit status 1 if not), compile time, collectives and a
roofline bound on MFU, as a table and one JSON line (`bert_jax.aot`).
"""

from __future__ import annotations

import os

import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import aot, flops, inference, sharding, trainer, writers
from bert_jax.config import BertConfig
from bert_jax.data import packing, tokenization
from bert_jax.writers import MetricWriter

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, exports.")
flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "shardings", "compile"],
    "Train, print parameter shardings, or compile the step for --topology without running it.",
)
flags.DEFINE_string("topology", None, "--mode=compile: a TPU slice, e.g. v5e:4x4, v5p:4x4x4.")
flags.DEFINE_integer("num_slices", 1, "--mode=compile: slices of --topology (multi-slice).")
flags.DEFINE_string("hlo_out", None, "--mode=compile: write the compiled step's HLO text here.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes in a multi-process run.")
flags.DEFINE_integer("process_id", None, "This process's index in a multi-process run.")
flags.DEFINE_string(
    "compilation_cache_dir",
    "auto",
    "Persistent XLA compilation cache: 'auto' ($JAX_COMPILATION_CACHE_DIR, else "
    "$XDG_CACHE_HOME/bert_jax/jax, ~/.cache/bert_jax/jax by default), a directory, or 'off'.",
)
flags.mark_flags_as_required(["config"])

PRETRAINING_MODELS = {"pretraining": "BertForPreTraining", "mlm": "BertForMaskedLM"}


def initialize_distributed() -> None:
    """jax.distributed for multi-process runs: explicit flags, or a cluster JAX detects itself."""
    env = os.environ
    if FLAGS.coordinator_address:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes only
        jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    elif (
        int(env.get("SLURM_NTASKS", "1")) > 1
        or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
        or "," in env.get("TPU_WORKER_HOSTNAMES", "")
    ):
        jax.distributed.initialize()


def pretrain(config, workdir: str) -> int | None:
    """MLM (+ NSP) pretraining: config.model is the architecture (HF config.json fields)."""
    from bert_jax import inputs

    cfg = BertConfig(**config.model.to_dict())
    compiling = FLAGS.mode == "compile"
    topology = FLAGS.topology or config.topology
    devices = aot.topology_devices(topology, FLAGS.num_slices) if compiling else None
    exp = trainer.Experiment.build(
        config, cfg, PRETRAINING_MODELS[config.task], config.task, config.num_train_steps, devices
    )
    if compiling:
        flops_per_step = aot.model_step_flops(cfg, config)
        report = aot.compile_step(
            exp, aot.pretraining_batch(config), model_flops=flops_per_step, hlo_path=FLAGS.hlo_out
        )
        report.update(topology=topology, num_slices=FLAGS.num_slices)
        print(aot.format_report(report))
        print(aot.report_json(report))
        return 0 if report["fits"] else 1
    if FLAGS.mode == "shardings":
        print(f"mesh {dict(exp.mesh.shape)}; {exp.model_name} {cfg}")
        print("\n".join(sharding.describe(exp.abstract.params, exp.mesh, exp.rules)))
        return
    logging.vlog(1, "config:\n%s", config)
    trainer.write_config(config, workdir)
    logging.info("config: %s", os.path.join(workdir, "config.json"))
    data = inputs.pretraining_inputs(config, workdir, exp.mesh)
    ckpt = trainer.checkpointer(workdir, config)
    state, start = exp.create_or_restore(ckpt, data.train, init_from=config.init_from)
    if start == 0 and not config.init_from and config.get("mlm_bias_init", "zeros") == "unigram":
        state = _with_mlm_bias(state, data.target_log_frequencies(cfg.vocab_size))
    writer = MetricWriter(workdir, config.num_train_steps, start)
    shown = _masked_examples(data)  # what the model predicts for held-out lines, before and after
    if shown:
        before = (f"step {start}", *inference.top_predictions(exp.model, state.params, *shown[:2]))

    eval_cache = []

    def evaluate(params, step):
        del step
        if not eval_cache:  # the same held-out batches every time, kept on the devices
            eval_cache.extend(
                sharding.global_batch_from_local(b, exp.mesh)
                for b in data.eval_batches(config.num_eval_steps)
            )
        jit_eval = exp.eval_fn()
        return trainer.reduce_window([jit_eval(params, b) for b in eval_cache])

    if data.eval_batches and start == 0:
        # Where the curves start, and the unigram plateau: the accuracy of always guessing the
        # held-out masked tokens' commonest token, which a model must rise clearly above.
        held_out = data.eval_batches(config.num_eval_steps)
        masked = [b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in held_out]
        counts = np.bincount(np.concatenate(masked))
        writer.write(
            0,
            {
                **{f"eval/{k}": v for k, v in evaluate(state.params, 0).items()},
                "eval/commonest_token_share": counts.max() / counts.sum(),
            },
        )

    def step_flops(host):  # this host's batch stands for every host's
        # Every (packed) sequence's own length: its attention costs n_i^2, not a row's L^2.
        lengths = packing.sequence_lengths(host)
        predictions = float(host["masked_lm_weights"].sum())
        nsp = config.task != "mlm"
        step = flops.pretraining_step_flops(cfg, lengths, predictions, nsp=nsp)
        return step / sharding.host_batch_fraction(exp.mesh)

    state, step, _ = exp.run(
        state,
        start,
        data.train,
        ckpt,
        writer,
        num_train_steps=config.num_train_steps,
        log_every_steps=config.log_every_steps,
        checkpoint_every_steps=config.checkpoint_every_steps,
        eval_every_steps=config.eval_every_steps,
        evaluate=evaluate if data.eval_batches else None,
        step_flops=step_flops,
        data_iterator=data.train,
    )
    ckpt.close()
    writer.close()
    places = {"checkpoints": ckpt.directory}
    if step >= config.num_train_steps and config.export_hf_at_end:
        exp.export(state.params, workdir)
        places["export"] = os.path.join(workdir, "export") + " (bert_jax)"
        places["hf"] = os.path.join(workdir, "hf") + " (transformers)"
        if data.tokenizer_path and os.path.isfile(data.tokenizer_path) and jax.process_index() == 0:
            # The vocabulary goes with the model: <workdir>/hf is a complete transformers directory.
            tokenization.load_tokenizer(data.tokenizer_path).save(os.path.join(workdir, "hf"))
    if jax.process_index() == 0:
        if shown:
            after = (
                f"step {step}",
                *inference.top_predictions(exp.model, state.params, *shown[:2]),
            )
            print("\nHeld-out lines with a word masked, and the model's top guesses:")
            print(inference.format_predictions(*shown[2:4], [before, after], shown[4].id_to_token))
        print("\n" + writer.summary(step, places))


def _with_mlm_bias(state, bias: np.ndarray):
    """`state` with the MLM decoder's output bias `cls/predictions/bias` [V] set to `bias`."""
    params = dict(state.params)
    cls = dict(params["cls"])
    old = cls["predictions"]["bias"]
    cls["predictions"] = {**cls["predictions"], "bias": jax.device_put(bias, old.sharding)}
    params["cls"] = cls
    logging.info("MLM decoder bias: the log frequencies of the training data's masked tokens")
    return state.replace(params=params)


def _masked_examples(data):
    """(features, positions, texts, answers, tokenizer) of a few held-out lines, or None."""
    if not (data.eval_batches and data.tokenizer_path and os.path.isfile(data.tokenizer_path)):
        return None
    if jax.process_count() > 1:  # the host-side demonstration needs every parameter on one host
        return None
    tokenizer = tokenization.load_tokenizer(data.tokenizer_path)
    return (*inference.masked_examples(data.eval_batches(1)[0], tokenizer, 4), tokenizer)


def main(argv):
    del argv
    writers.configure_console()
    config, workdir = FLAGS.config, FLAGS.workdir
    aot.skip_absent_tpu_backend()
    if FLAGS.mode == "compile":
        if config.task not in PRETRAINING_MODELS:
            raise app.UsageError(
                "--mode=compile compiles pretraining configs (configs/pretrain.py)"
            )
        if not (FLAGS.topology or config.topology):
            raise app.UsageError(
                "--mode=compile needs --topology (e.g. v5e:4x4) or a config with a topology "
                "(configs/pretrain.py:...,tpu=v5e-16)"
            )
    else:
        initialize_distributed()
        # Not in compile mode: its report times the compile, which a cache hit would hide.
        cache_dir = trainer.enable_compilation_cache(FLAGS.compilation_cache_dir)
        logging.info("persistent compilation cache: %s", cache_dir or "off")
    if FLAGS.mode == "train" and workdir is None:
        raise app.UsageError("--workdir is required to train")
    if config.task in PRETRAINING_MODELS:
        return pretrain(config, workdir)
    else:
        from bert_jax import finetune

        finetune.run(config, workdir, mode=FLAGS.mode)


if __name__ == "__main__":
    app.run(main)
