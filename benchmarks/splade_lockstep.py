"""The SPLADE job and sentence-transformers' `SparseEncoderTrainer` in lockstep: the same start
(embed_training_peer.py's, written with dropout 0), the same pairs in the same order, batch,
schedule and optimizer; each step's loss of both, side by side.

    python benchmarks/splade_lockstep.py --data ../shared/data/debian_packages   # 6 steps of 8

With dropout off nothing random is left, so two equal trainers give equal losses step after
step (to float32 rounding); a difference in the model, the loss, the regularizers' warmup, the
schedule, clipping or AdamW shows as losses that part. The job's batches come from
`seed_run.group_batches` (its shuffle for `--seed`, packed or not with `--pack`); the trainer is
given them in that order. Needs sentence-transformers and `datasets` (as embed_training_peer.py's
sentence-transformers side).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import embed_training_peer as peer  # noqa: E402


def bert_jax_losses(config, seed: int) -> tuple[list[float], list[int]]:
    """The job's loss at each step of one epoch, and the order of the pairs it trained on."""
    import flax.linen as nn
    import jax

    from bert_jax.checkpoints import pretrained
    from bert_jax.embed import run
    from bert_jax.parallel import sharding
    from bert_jax.retrieval import pairs
    from bert_jax.training import seed_run
    from bert_jax.training.start import init_state

    e = run.check_config(config)
    start = run.starting_point(config, e)
    features = dict(pairs.featurize_pairs(pairs.read_pairs(e.train_file), start.tokenizer,
                                          start.max_seq_length))  # fmt: skip
    features["pair_id"] = np.arange(features["input_ids"].shape[0], dtype=np.int32)
    batches = seed_run.group_batches(config, e, features, seed, keep=("pair_id",))
    exp = run.build_experiment(config, e, start, batches.steps_per_epoch,
                               texts_per_pair=features["input_ids"].shape[1])  # fmt: skip
    params = pretrained.load(config.init_from, exp.head, with_tokenizer=False).params
    state = init_state(exp, params, seed=seed)
    losses, order = [], []
    with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
        for host in batches:
            host = dict(host)
            order += [int(i) for i in host.pop("pair_id")]
            step = exp.train_step_fn(host)
            state, metrics = step(state, sharding.global_batch_from_local(host, exp.mesh))
            losses.append(float(jax.device_get(metrics["loss"])))
    return losses, order


def trainer_losses(
    args, config, pairs_in_order: list[dict], warmup: int, start: str
) -> list[float]:
    """SparseEncoderTrainer's loss at each step over `pairs_in_order`, batches taken in order."""
    from datasets import Dataset
    from torch.utils.data import BatchSampler, SequentialSampler

    model = peer.st_model(args, start)
    trainer_class, arguments_class, loss = peer.st_trainer(config, model)

    class InOrder(trainer_class):
        def get_batch_sampler(self, dataset, batch_size, drop_last, *rest, **kwargs):
            return BatchSampler(SequentialSampler(range(len(dataset))), batch_size, drop_last=True)

    columns = {k: [p[k] for p in pairs_in_order] for k in ("anchor", "positive")}
    with tempfile.TemporaryDirectory() as out:
        arguments = peer.st_arguments(
            arguments_class, config, out, 1, args.batch, warmup, args.seed,
            logging_strategy="steps", logging_steps=1,
        )  # fmt: skip
        trainer = InOrder(
            model=model, loss=loss, train_dataset=Dataset.from_dict(columns), args=arguments
        )
        trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a folder with train.jsonl")
    parser.add_argument("--pairs", type=int, default=48, help="train.jsonl's first pairs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max_seq_length", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--warmup", type=int, default=1, help="warmup steps")
    parser.add_argument("--pack", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.model, args.epochs, args.eval_batch, args.threads = "splade", 1, 16, 1
    rows = []
    for line in open(os.path.join(args.data, "train.jsonl"), encoding="utf-8"):
        r = json.loads(line)
        rows.append({"anchor": r.get("anchor", r.get("query")), "positive": r["positive"]})
        if len(rows) == args.pairs:
            break
    with tempfile.TemporaryDirectory() as tmp:
        train_file = os.path.join(tmp, "train.jsonl")
        with open(train_file, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        start = peer.write_start(tmp, args.max_seq_length, dropout=0.0)
        config = peer.embed_config(args, train_file, train_file, args.warmup, start)
        ours, order = bert_jax_losses(config, args.seed)
        theirs = trainer_losses(args, config, [rows[i] for i in order], args.warmup, start)
    gaps = [abs(a - b) / abs(b) for a, b in zip(ours, theirs)]
    for i, (a, b, g) in enumerate(zip(ours, theirs, gaps)):
        print(f"step {i}: bert_jax {a:.4f}  sentence-transformers {b:.4f}  relative {g:.1e}")
    print(json.dumps({"steps": len(ours), "max_relative_difference": max(gaps)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
