"""Pretrain, fine-tune, train sentence embeddings or rerankers with BERT on a device mesh.

    python train.py --config=configs/pretrain.py:size=tiny --workdir=runs/tiny
    python train.py --config=configs/pretrain.py:size=base --config.mesh.fsdp=8 --workdir=runs/base
    python train.py --config=configs/finetune.py:task=mrpc --config.init_from=DIR --workdir=runs/m
    python train.py --config=configs/embed.py:init=minilm --workdir=runs/e \
        --config.embed.train_file=pairs.jsonl --config.embed.dev_file=dev.jsonl
    python train.py --config=configs/rerank.py:init=minilm --workdir=runs/r \
        --config.rerank.train_file=pairs.jsonl --config.rerank.dev_file=dev.jsonl

Flow: flags -> config -> its job (`config.job`, looked up in `bert_jax.training.job`'s registry:
`pretrain`, `finetune`, `embed`, `rerank`, or a job its config file registers) -> mesh -> data ->
state (created sharded) -> loop. The
loop saves Orbax checkpoints (state + data position) every `checkpoint_every_steps`, on
SIGTERM/SIGINT and at the end, and resumes from the newest good one in --workdir. Metrics go to
the console, TensorBoard and <workdir>/metrics.jsonl.

Exit status (`bert_jax.cli`): 0 done; 1 an error (a user's mistake prints one line, `error: ...`;
a bug its traceback); 130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (preemption), after saving a
checkpoint when training: rerun the same command to resume.

Multi-host: on TPU pods, SLURM and Open MPI, jax.distributed finds its peers by itself; elsewhere
pass --coordinator_address=host:port --num_processes=N --process_id=i (CPU processes talk over
gloo). `--mode=shardings` prints every parameter's sharding for the config and mesh and exits.
Compiled steps are kept in a persistent cache (`--compilation_cache_dir`, on by default), so a
rerun or resumed run loads them instead of compiling.

Before renting a TPU slice or a GPU, compile the real step for it on this machine (libtpu, or
JAX's CUDA plugin in .venv/cuda-compile; `make setup` installs both):

    python train.py --config=configs/pretrain.py:size=large --mode=compile --topology=v5e:4x4
    python train.py --config=... --mode=compile --topology=v5p:4x4x4 --num_slices=2
    python train.py --config=configs/pretrain.py:size=base --mode=compile --topology=gpu:h100x8

prints memory per chip or card, whether it fits (exit status 1 if not), compile time, collectives
and a roofline bound on MFU, as a table and one JSON line (`bert_jax.parallel.aot`).
"""

from __future__ import annotations

import contextlib
import importlib

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.parallel import compile_cache, multihost, preemption
from bert_jax.training import experiment, job, run_lock, summaries

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, exports.")
flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "shardings", "compile"],
    "Train, print parameter shardings, or compile the step for --topology without running it.",
)
flags.DEFINE_string(
    "topology",
    None,
    "--mode=compile: a TPU slice (v5e:4x4, v5p:4x4x4) or NVIDIA GPUs of one host (gpu:t4, "
    "gpu:h100x8; cards in bert_jax.hardware.GPU_CARDS).",
)
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


def initialize_distributed() -> None:
    """jax.distributed for multi-process runs: explicit flags, or a cluster JAX detects itself;
    with `parallel.multihost`'s heartbeat and shutdown timeouts (a dead process is noticed)."""
    multihost.initialize_job(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)


def main(argv):
    del argv
    summaries.configure_console()
    config, workdir = FLAGS.config, FLAGS.workdir
    if FLAGS.mode == "compile":
        if not (FLAGS.topology or config.topology):
            raise app.UsageError(
                "--mode=compile needs --topology (e.g. v5e:4x4, gpu:l4) or a config with a "
                "topology (configs/pretrain.py:...,tpu=v5e-16)"
            )
    else:
        initialize_distributed()
        # Not in compile mode: its report times the compile, which a cache hit would hide.
        cache_dir = compile_cache.enable_compilation_cache(FLAGS.compilation_cache_dir)
        logging.info("persistent compilation cache: %s", cache_dir or "off")
    if FLAGS.mode == "train" and workdir is None:
        raise app.UsageError("--workdir is required to train")
    experiment.check_experiment_config(config)
    the_job = job.get(config.job)  # an unknown job: one line naming the known ones
    # With several processes, an error on any of them ends all of them (parallel.multihost).
    # One run at a time in a workdir: the lock is taken before anything is written there.
    training = FLAGS.mode == "train"
    topology = FLAGS.topology or config.topology
    with multihost.guard(), run_lock.hold(workdir) if training else contextlib.nullcontext():
        out = the_job.run(
            config,
            workdir,
            mode=FLAGS.mode,
            topology=FLAGS.topology,
            num_slices=FLAGS.num_slices,
            hlo_out=FLAGS.hlo_out,
        )
    if FLAGS.mode == "compile":
        if out == 1 and the_job.recipes:  # does not fit: name what does
            recipes = importlib.import_module(the_job.recipes)
            logging.error("does not fit: %s", recipes.fit_hint(config, topology))
        return out
    # Stopped by a signal before the end (a checkpoint saved): 128 + the signal, never 0.
    signum = preemption.stopped_by()
    return 128 + signum if signum else None


if __name__ == "__main__":
    app.run(
        cli.wrap(main), flags_parser=cli.parse_absl_flags
    )  # a user's mistake: `error: <message>`, exit status 1 (bert_jax.cli)
