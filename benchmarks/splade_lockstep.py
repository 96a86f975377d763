"""The SPLADE job and sentence-transformers' `SparseEncoderTrainer` in lockstep: the same start
(embed_training_peer.py's, written with dropout 0), the same pairs in the same order, batch,
schedule and optimizer; each step's loss of both, side by side.

    python benchmarks/splade_lockstep.py --data ../shared/data/debian_packages   # 6 steps of 8
    python benchmarks/splade_lockstep.py --data ../shared/data/debian_packages \
        --model inference_free
    python benchmarks/splade_lockstep.py --data ../shared/data/debian_packages --pairs 1024 \
        --batch 32 --max_seq_length 128 --warmup 3 --seed 3 --dev 500 [--order trainer] \
        [--dropout 0.1 [--dropout_rng hash]]
    python benchmarks/splade_lockstep.py --data ../shared/data/debian_packages --pairs 1024 \
        --batch 32 --max_seq_length 128 --seed 3 --dropout 0.1 --draws 64
    python benchmarks/splade_lockstep.py --data ../shared/data/debian_packages --pairs 1024 \
        --batch 32 --max_seq_length 128 --warmup 3 --seed 9 --dev 500 --dropout 0.1 --alone \
        [--order trainer]

With dropout off nothing random is left, so two equal trainers give equal losses step after
step (to float32 rounding); a difference in the model, the loss, the regularizers' warmup, the
schedule, clipping or AdamW shows as losses that part. The job's batches come from
`seed_run.group_batches` (its shuffle for `--seed`, packed or not with `--pack`); the trainer is
given them in that order. With `--order trainer` the trainer draws its own order for `--seed`
(as embed_training_peer.py's run of that seed does) and the job's batches take the pairs in it;
that order is `torch.randperm` under a `torch.Generator` seeded `--seed` (checked each run).
With `--alone` only the job trains, in either order (the trainer's drawn as it draws it, not
run): the job in numpy's shuffles and in torch's, seed by seed, tells whether the generator that
draws the order moves the score.
With `--dropout P` the start's hidden and attention dropout is P (the job's masks from
`--dropout_rng`'s generator): the peers draw their masks differently, so the losses part by
dropout's noise, and the dev scores, over seeds and generators, show how far the masks alone
move a run (the same batches, the masks the only difference).
With `--model inference_free` both train an inference-free model (a Router: query weights of
ones for queries, that start for documents; `configs/embed.py:model=inference_free`'s recipe).
With `--draws N` nothing trains: on the first batch of the job's order, at the first step (the
FLOPS weights still 0), each peer's ranking loss without dropout and under N dropout draws of
`--dropout` (the job's keys of steps 0..N-1; torch seeded 0..N-1): if the two apply dropout
alike, the means agree within their standard errors. An inference-free model's anchors go
through its query route (static weights, no dropout), the positives through the document route.
With `--dev N` both final models are scored on dev.jsonl's first N pairs, each by its own peer's
evaluation (embed_training_peer.py's), and paired query by query. Needs sentence-transformers
and, to run the trainer, `datasets` and `accelerate` (as embed_training_peer.py's
sentence-transformers side); `--alone` and `--draws` run without those two.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import embed_training_peer as peer  # noqa: E402
from benchmarks.rerank_peer import add_dropout_rng_flag  # noqa: E402


def job_pieces(config, seed: int, order: list[int] | None = None):
    """The embedding job's pieces for one seed, as its run builds them: (its `check_config`
    block, `Starting`, Experiment, host batches keeping each pair's row as "pair_id", state).
    The batches follow the job's shuffle for `seed`, or `order` (the pairs' rows in the order
    to take them)."""
    from bert_jax.embed import run
    from bert_jax.retrieval import pairs
    from bert_jax.training import seed_run
    from bert_jax.training.start import init_state

    e = run.check_config(config)
    start = run.starting_point(config, e)
    features = dict(pairs.featurize_pairs(pairs.read_pairs(e.train_file), start.tokenizer,
                                          start.max_seq_length))  # fmt: skip
    n = features["input_ids"].shape[0]
    features["pair_id"] = np.arange(n, dtype=np.int32)
    batches = seed_run.group_batches(config, e, features, seed, keep=("pair_id",))
    if order is not None:  # the rows the shuffle visits i-th take the i-th pair of `order`
        shuffled = [int(i) for host in batches for i in host["pair_id"]]
        rows = np.arange(n)
        rows[shuffled] = order[: len(shuffled)]
        features = {k: v[rows] for k, v in features.items()}
        batches = seed_run.group_batches(config, e, features, seed, keep=("pair_id",))
    exp = run.build_experiment(config, e, start, batches.steps_per_epoch,
                               texts_per_pair=features["input_ids"].shape[1])  # fmt: skip
    batches = seed_run.group_batches(config, e, features, seed, exp, keep=("pair_id",))
    state = init_state(exp, peer.start_params(config, exp, start), seed=seed)
    return e, start, exp, batches, state


def torch_order(n: int, seed: int) -> list[int]:
    """`SparseEncoderTrainer`'s order of n pairs for `seed`: its default batch sampler's
    `RandomSampler` under the `torch.Generator` its dataloader seeds with the seed."""
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def bert_jax_losses(
    config, seed: int, dev_file: str = "", order: list[int] | None = None
) -> tuple[list[float], list[int], dict]:
    """The job's loss at each step of one epoch, the order of the pairs it trained on (its
    shuffle for `seed`, or `order`: the pairs' rows in the order to take them), and its final
    model's dev scores (`embed_training_peer.score` of the pairs in `dev_file`; {} without
    one)."""
    import flax.linen as nn
    import jax

    from bert_jax.embed import evaluation
    from bert_jax.parallel import sharding
    from bert_jax.retrieval import pairs

    e, start, exp, batches, state = job_pieces(config, seed, order)
    losses, order = [], []
    with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
        for host in batches:
            host = dict(host)
            order += [int(i) for i in host.pop("pair_id")]
            step = exp.train_step_fn(host)
            state, metrics = step(state, sharding.global_batch_from_local(host, exp.mesh))
            losses.append(float(jax.device_get(metrics["loss"])))
    if not dev_file:
        return losses, order, {}
    dev = evaluation.retrieval_set(
        pairs.read_pairs(dev_file), start.tokenizer, start.max_seq_length
    )
    texts = (evaluation.embed_texts(exp, state.params, t, e.eval_batch_size, queries=q)
             for t, q in ((dev.queries, True), (dev.corpus, False)))  # fmt: skip
    return losses, order, peer.score(*texts, dev.relevant, similarity=exp.objective.similarity)


def dropout_draws(args, config, rows: list[dict], start: str) -> dict:
    """The ranking loss of the job's first batch (seed `args.seed`) at the first step, by each
    peer: without dropout, and the mean and standard error under `args.draws` draws."""
    import flax.linen as nn
    import jax
    import torch
    from sentence_transformers.sparse_encoder import losses

    from bert_jax.parallel import sharding
    from bert_jax.training import steps

    _, _, exp, batches, state = job_pieces(config, args.seed)
    host = dict(next(iter(batches)))
    taken = [int(i) for i in host.pop("pair_id")]
    objective = exp.objective.at_step(jax.numpy.int32(0))

    def loss(params, batch, rng):
        out = steps.chunked_embeddings(params, batch, rng, model=exp.model,
                                       objective=objective, num_chunks=1)  # fmt: skip
        return objective.loss(objective.batch_sums(out, batch), objective.counts(batch))

    ours = []
    with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
        batch = sharding.global_batch_from_local(host, exp.mesh)
        loss = jax.jit(loss)
        runtime = exp.model.runtime
        plain = float(loss(state.params, batch, None))
        for i in range(args.draws):
            ours.append(float(loss(state.params, batch, steps.step_rng(state.rng, i, runtime))))
    model = peer.st_model(args, start)
    ranking = losses.SparseMultipleNegativesRankingLoss(model, scale=config.embed.scale)
    # An inference-free model's Router takes each column on the route training maps it to
    # (`st_routing`: anchors on the query route, static weights without dropout).
    routes = peer.st_routing(config, model).get("router_mapping", {})
    tasks = {column: {"task": route} for column, route in routes.items()}
    texts = [model.preprocess([rows[i][k] for i in taken], **tasks.get(k, {}))
             for k in ("anchor", "positive")]  # fmt: skip

    def their_loss():  # SpladeLoss's ranking term: each column embedded on its own
        vectors = [model(dict(t))["sentence_embedding"] for t in texts]
        return float(ranking.compute_loss_from_embeddings(vectors, None))

    theirs = []
    with torch.no_grad():
        model.eval()
        their_plain = their_loss()
        model.train()
        for i in range(args.draws):
            torch.manual_seed(i)
            theirs.append(their_loss())
    found = {"pairs": len(taken), "draws": args.draws, "dropout": args.dropout,
             "loss_without_dropout_bert_jax": plain,
             "loss_without_dropout_sentence_transformers": their_plain}  # fmt: skip
    for name, values in (("bert_jax", ours), ("sentence_transformers", theirs)):
        found[f"mean_{name}"] = float(np.mean(values))
        found[f"se_{name}"] = float(np.std(values, ddof=1) / np.sqrt(len(values)))
    gap = found["mean_bert_jax"] - found["mean_sentence_transformers"]
    found["difference_in_se"] = gap / np.hypot(found["se_bert_jax"],
                                               found["se_sentence_transformers"])  # fmt: skip
    return found


def trainer_losses(
    args, config, pairs: list[dict], warmup: int, start: str, dev_file: str = "", own=False
) -> tuple[list[float], dict, list[int]]:
    """SparseEncoderTrainer's loss at each step over `pairs`, batches taken in order (`own`:
    in its own sampler's order for the seed), its final model's dev scores
    (`embed_training_peer.st_score`; {} without `dev_file`) and the order it took the pairs in."""
    from datasets import Dataset
    from torch.utils.data import BatchSampler, SequentialSampler

    model = peer.st_model(args, start)
    trainer_class, arguments_class, loss = peer.st_trainer(config, model)

    taken: list[int] = []

    class InOrder(trainer_class):
        def get_batch_sampler(self, dataset, batch_size, drop_last, *rest, **kwargs):
            if not own:
                sampler = BatchSampler(SequentialSampler(range(len(dataset))), batch_size, True)
            else:
                sampler = super().get_batch_sampler(dataset, batch_size, drop_last, *rest, **kwargs)
            draw = type(sampler).__iter__

            class Recorded(type(sampler)):  # the same sampler, noting each batch it gives
                def __iter__(self):
                    for batch in draw(self):
                        taken.extend(int(i) for i in batch)
                        yield batch

            sampler.__class__ = Recorded
            return sampler

    columns = {k: [p[k] for p in pairs] for k in ("anchor", "positive")}
    with tempfile.TemporaryDirectory() as out:
        arguments = peer.st_arguments(
            arguments_class, config, out, 1, args.batch, warmup, args.seed,
            logging_strategy="steps", logging_steps=1, **peer.st_routing(config, model),
        )  # fmt: skip
        trainer = InOrder(
            model=model, loss=loss, train_dataset=Dataset.from_dict(columns), args=arguments
        )
        with contextlib.redirect_stdout(sys.stderr):  # its log lines: stdout is ours
            trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    taken = taken[: len(losses) * args.batch]
    return losses, peer.st_score(model, dev_file, args.eval_batch) if dev_file else {}, taken


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
    parser.add_argument("--order", choices=("job", "trainer"), default="job",
                        help="whose order for --seed both take the pairs in")  # fmt: skip
    parser.add_argument("--alone", action="store_true",
                        help="only the job trains (in --order's order) and is scored")  # fmt: skip
    parser.add_argument("--model", choices=peer.SPARSE, default="splade",
                        help="inference_free: query weights and its recipe")  # fmt: skip
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="the start's hidden and attention dropout (0: none)")  # fmt: skip
    parser.add_argument("--draws", type=int, default=0, help="no training: the first batch's "
                        "loss under this many dropout draws by each peer")  # fmt: skip
    add_dropout_rng_flag(parser)
    parser.add_argument("--dev", type=int, default=0, help="dev.jsonl's first pairs to score "
                        "both final models on (0: none)")  # fmt: skip
    args = parser.parse_args(argv)
    if not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout={args.dropout}: expected a probability in [0, 1)")
    if args.draws and (args.draws < 2 or args.dropout == 0.0):
        parser.error("--draws takes 2 or more draws of a --dropout above 0")
    if args.draws and args.alone:
        parser.error("--draws trains neither peer; --alone trains the job")
    args.epochs, args.eval_batch, args.threads = 1, 16, 1
    args.max_train, args.max_eval = args.pairs, args.dev or 1
    with tempfile.TemporaryDirectory() as tmp:
        train_file, dev_file, _ = peer.write_task(args, tmp)
        rows = [json.loads(line) for line in open(train_file, encoding="utf-8")]
        dev_file = dev_file if args.dev else ""
        free = args.model == "inference_free"
        start = peer.write_start(tmp, args.max_seq_length, args.dropout, free)
        config = peer.embed_config(args, train_file, train_file, args.warmup, start)
        if args.draws:
            print(json.dumps(dropout_draws(args, config, rows, start)))
            return 0
        drawn = torch_order(len(rows), args.seed) if args.order == "trainer" else None
        if drawn is not None and not args.alone:  # the trainer draws its order first
            theirs, their_dev, taken = trainer_losses(
                args, config, rows, args.warmup, start, dev_file, own=True
            )
            assert taken == drawn[: len(taken)], "the trainer's order is not torch.randperm's"
        ours, order, our_dev = bert_jax_losses(config, args.seed, dev_file, drawn)
        assert drawn is None or order == drawn[: len(order)], "the job took another order"
        if args.alone:
            found = {"steps": len(ours), "losses": ours, "order": order}
            print(json.dumps(found | {f"{k}_bert_jax": v for k, v in our_dev.items()}))
            return 0
        if drawn is None:
            in_order = [rows[i] for i in order]
            theirs, their_dev, _ = trainer_losses(
                args, config, in_order, args.warmup, start, dev_file
            )
    gaps = [abs(a - b) / abs(b) for a, b in zip(ours, theirs)]
    for i, (a, b, g) in enumerate(zip(ours, theirs, gaps)):
        print(f"step {i}: bert_jax {a:.4f}  sentence-transformers {b:.4f}  relative {g:.1e}")
    found = {"steps": len(ours), "max_relative_difference": max(gaps), "order": order}
    found |= {"losses_bert_jax": ours, "losses_sentence_transformers": theirs}
    for peer_name, scores in (("bert_jax", our_dev), ("sentence_transformers", their_dev)):
        found.update({f"{k}_{peer_name}": v for k, v in scores.items() if k != "per_query"})
    if args.dev:
        d = np.subtract(our_dev["per_query"], their_dev["per_query"])
        found["paired_ndcg@10_bert_jax_minus_st"] = float(d.mean())
        found["paired_se"] = float(d.std(ddof=1) / np.sqrt(len(d)))
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
