"""Pretrain (or fine-tune) BERT on a device mesh.

    python train.py --config=configs/pretrain.py:size=tiny --workdir=runs/tiny
    python train.py --config=configs/pretrain.py:size=base --config.mesh.fsdp=8 --workdir=runs/base

Flow: flags -> config -> mesh -> data -> state (created sharded) -> loop. The loop saves Orbax
checkpoints (state + data position) every `checkpoint_every_steps`, on SIGTERM/SIGINT and at the
end, and resumes from the newest good one in --workdir. Metrics go to the console, TensorBoard and
<workdir>/metrics.jsonl.

Multi-host: on TPU pods, SLURM and Open MPI, jax.distributed finds its peers by itself; elsewhere
pass --coordinator_address=host:port --num_processes=N --process_id=i (CPU processes talk over
gloo). `--mode=shardings` prints every parameter's sharding for the config and mesh and exits.
"""

from __future__ import annotations

import functools
import logging as std_logging
import os
import time

import flax.linen as nn
import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import checkpointing, convert, flops, optimizer, sharding, train_lib
from bert_jax.config import BertConfig, RuntimeConfig
from bert_jax.model import count_params, get_model_class, stack_layers
from bert_jax.preemption import PreemptionWatcher
from bert_jax.writers import MetricWriter

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, exports.")
flags.DEFINE_enum("mode", "train", ["train", "shardings"], "Train, or print parameter shardings.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes in a multi-process run.")
flags.DEFINE_integer("process_id", None, "This process's index in a multi-process run.")
flags.mark_flags_as_required(["config"])

TASK_MODELS = {"pretraining": "BertForPreTraining", "mlm": "BertForMaskedLM"}


def bert_config(config) -> BertConfig:
    """config.model (Hugging Face config.json fields) -> the frozen BertConfig, once."""
    return BertConfig(**config.model.to_dict())


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


def make_inputs(config, workdir: str):
    from bert_jax import inputs

    if config.task in ("pretraining", "mlm"):
        return inputs.pretraining_inputs(config, workdir)
    raise ValueError(f"unknown config.task {config.task!r}")


def step_flops(config, cfg: BertConfig, host_batch) -> float:
    """Model FLOPs of one global step, from this host's batch (hosts see alike batches)."""
    lengths = host_batch["attention_mask"].sum(axis=-1)
    predictions = float(host_batch["masked_lm_weights"].sum())
    local = flops.pretraining_step_flops(cfg, lengths, predictions, nsp=config.task != "mlm")
    return local * jax.process_count()


def reduce_window(window: list[dict]) -> dict[str, float]:
    """Metrics of several steps: sums and counts are summed, loss/grad_norm averaged."""
    fetched = jax.device_get(window)
    total = {}
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


class _QuietLibraries(std_logging.Filter):
    """Drops the INFO chatter of Orbax and grain (every save logs dozens of lines)."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        noisy = any(f"/{lib}/" in record.pathname for lib in ("orbax", "grain", "jax"))
        return record.levelno >= std_logging.WARNING or not noisy


def main(argv):
    del argv
    logging.get_absl_handler().addFilter(_QuietLibraries())
    config, workdir = FLAGS.config, FLAGS.workdir
    initialize_distributed()
    cfg = bert_config(config)
    runtime = RuntimeConfig(**config.runtime.to_dict())
    model_name = TASK_MODELS[config.task]
    model = get_model_class(model_name)(cfg, runtime)
    mesh = sharding.make_mesh(config.mesh.to_dict())
    rules = [(name, tuple(a) if isinstance(a, list) else a) for name, a in config.sharding_rules]
    schedule = optimizer.make_schedule(
        config.optimizer.schedule,
        config.optimizer.peak_learning_rate,
        config.optimizer.warmup_steps,
        config.num_train_steps,
        end_learning_rate=config.optimizer.end_learning_rate,
        decay_fraction=config.optimizer.decay_fraction,
    )
    o = config.optimizer
    tx = optimizer.make_optimizer(
        o.name, schedule, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
        clip_norm=o.clip_norm, bias_correction=o.bias_correction,
    )  # fmt: skip
    rng = jax.random.PRNGKey(config.seed)
    init_fn = functools.partial(train_lib.init_train_state, model=model, tx=tx)
    abstract = jax.eval_shape(init_fn, rng)  # boxed: carries the logical axes
    state_sh = sharding.logical_shardings(abstract, mesh, rules)
    if FLAGS.mode == "shardings":
        print(f"mesh {dict(mesh.shape)}; {model_name} {cfg}")
        print("\n".join(sharding.describe(abstract.params, mesh, rules)))
        return
    if workdir is None:
        raise app.UsageError("--workdir is required to train")
    logging.info("config:\n%s", config)
    logging.info("%s: %s parameters; mesh %s", model_name, f"{count_params(abstract.params):,}",
                 dict(mesh.shape))  # fmt: skip
    if jax.process_index() == 0:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2))

    data = make_inputs(config, workdir)
    ckpt = checkpointing.Checkpointer(
        os.path.join(workdir, "checkpoints"),
        max_to_keep=config.max_checkpoints_to_keep,
        async_save=config.async_checkpointing,
    )
    targets = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), nn.unbox(abstract),
        state_sh,
    )  # fmt: skip
    # Where the state comes from: 1. the newest good checkpoint in workdir (data position too);
    # 2. config.init_from (converted weights, fresh optimizer); 3. scratch.
    restored = ckpt.restore_latest(targets, data_iterator=data.train)
    if restored is not None:
        state = restored[1]
    elif config.init_from:
        _, params, _, report = convert.load_any(config.init_from, model_name, allow_new_heads=True)
        logging.info("init_from %s:\n%s", config.init_from, report.summary())
        params = stack_layers(params) if runtime.scan_layers else params
        params = jax.device_put(
            jax.tree_util.tree_map(lambda x: np.asarray(x, runtime.param_dtype), params),
            state_sh.params,
        )
        state = jax.jit(lambda r, p: init_fn(r, params=p), out_shardings=state_sh)(rng, params)
    else:
        state = jax.jit(lambda r: nn.unbox(init_fn(r)), out_shardings=state_sh)(rng)
    start_step = int(jax.device_get(state.step))

    task = train_lib.get_task(config.task)
    prefetch = sharding.DevicePrefetcher(data.train, mesh, size=2)
    writer = MetricWriter(workdir, config.num_train_steps, start_step)
    watcher = PreemptionWatcher()
    peak = flops.peak_flops_per_device(jax.devices()[0].device_kind)
    meta = {"config": cfg.to_hf_dict(model_name), "model": model_name}
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        jit_step = None
        jit_eval = jax.jit(functools.partial(train_lib.eval_step, model=model, task=task))
        eval_batches = None
        step, window, window_flops, tokens = start_step, [], 0.0, 0
        t_window = time.perf_counter()
        compile_s = None
        while step < config.num_train_steps:
            try:
                batch, host = next(prefetch)
            except StopIteration:
                logging.warning("the training data ran out at step %d", step)
                break
            if jit_step is None:  # compiled once, with the batch's shardings made explicit
                jit_step = jax.jit(
                    functools.partial(
                        train_lib.train_step, model=model, tx=tx, task=task,
                        num_microbatches=config.num_microbatches, schedule=schedule,
                    ),
                    in_shardings=(state_sh, sharding.batch_shardings(host, mesh)),
                    out_shardings=(state_sh, sharding.replicated(mesh)),
                    donate_argnums=0,
                )  # fmt: skip
            state, metrics = jit_step(state, batch)
            if compile_s is None:  # the first step compiles; keep it out of the throughput
                jax.block_until_ready(metrics)
                compile_s = time.perf_counter() - t_window
                t_window = time.perf_counter()
                window_flops, tokens = 0.0, 0
            else:
                window_flops += step_flops(config, cfg, host)
                tokens += int(host["attention_mask"].sum()) * jax.process_count()
            step += 1
            window.append(metrics)
            writer.advance()
            log_now = step % config.log_every_steps == 0 or step == config.num_train_steps
            stop = watcher.should_stop(step, sync_point=log_now)
            save_now = stop or step % config.checkpoint_every_steps == 0
            save_now = save_now or step == config.num_train_steps
            if log_now or save_now:
                summary = reduce_window(window)
                if not np.isfinite(summary.get("loss", np.nan)):
                    ckpt.wait()
                    raise FloatingPointError(
                        f"non-finite loss {summary.get('loss')} at step {step}; stopping. The "
                        f"last good checkpoint is step {ckpt.latest_step()} in {ckpt.directory}"
                    )
                elapsed = time.perf_counter() - t_window
                if len(window) and elapsed > 0 and tokens:
                    summary["tokens_per_s"] = tokens / elapsed
                    summary["step_time_s"] = elapsed / len(window)
                    if peak:
                        summary["mfu"] = window_flops / elapsed / (peak * jax.device_count())
                if compile_s is not None and step - start_step <= len(window):
                    summary["compile_s"] = compile_s
                writer.write(step, {f"train/{k}": v for k, v in summary.items()})
                window, window_flops, tokens, t_window = [], 0.0, 0, time.perf_counter()
            if data.eval_batches and (
                step % config.eval_every_steps == 0 or step == config.num_train_steps
            ):
                if eval_batches is None:  # the same held-out batches every time, kept on device
                    eval_batches = [
                        sharding.global_batch_from_local(b, mesh)
                        for b in data.eval_batches(config.num_eval_steps)
                    ]
                writer.write(step, {
                    f"eval/{k}": v for k, v in
                    reduce_window([jit_eval(state.params, b) for b in eval_batches]).items()
                })  # fmt: skip
                t_window = time.perf_counter()  # evaluation time is not training throughput
            if save_now:
                prefetch.rewind()
                ckpt.save(step, state, data_iterator=data.train, meta={**meta, "step": step})
            if stop:
                logging.warning("stopping at step %d after a stop request", step)
                break
    ckpt.close()
    watcher.close()
    writer.close()
    if step >= config.num_train_steps and config.export_hf_at_end:
        export(cfg, model_name, state.params, workdir)


def export(cfg: BertConfig, model_name: str, params, workdir: str) -> None:
    """Writes <workdir>/export (bert_jax format) and <workdir>/hf (transformers directory)."""
    from jax.experimental import multihost_utils

    host_params = multihost_utils.process_allgather(params, tiled=True)
    if jax.process_index() != 0:
        return
    convert.save_pretrained(os.path.join(workdir, "export"), cfg, host_params, model_name,
                            overwrite=True)  # fmt: skip
    convert.save_pytorch(cfg, host_params, os.path.join(workdir, "hf"), model_name, overwrite=True)
    logging.info("exported %s to %s/export and %s/hf", model_name, workdir, workdir)


if __name__ == "__main__":
    app.run(main)
