"""What parts of a training step cost on this machine: variants of one step timed alternately in
one process, as ratios against the default.

    # the reranker job's step, on the rows of a rerank_peer.py run (its <out>/data/plan.json):
    python benchmarks/step_parts.py --what=rerank_step --plan runs/rr/data/plan.json \\
        --variants=default,no_dropout,rbg,hash --steps=24
    # an XLA:CPU option: the same command with XLA_FLAGS=--xla_cpu_use_xnnpack=false (and so on)
    # SPLADE pooling, the library's against its definition (log1p(relu) of every token, then max):
    python benchmarks/step_parts.py --what=splade_pool --shape=20,128,30522 --reps=10

rerank_step: for each variant, the reranker job's pieces as `rerank_peer.py` builds them for
bert_jax (seed 0; `_rerank_config`, the job's packed or padded batches as the plan says), --steps
steps, each batch shape timed after its first (compiled) step (`rerank_peer.Clock`). Variants:
  default      the job as configured
  no_dropout   the model's hidden and attention-probability dropout 0 (what dropout costs)
  rbg          runtime.dropout_rng="rbg" (XLA's RngBitGenerator for the masks)
  hash         runtime.dropout_rng="hash" (a counter hash of threefry's keys: models.hash_rng)
One JSON line a variant: steps timed, CPU-seconds and wall seconds a step, and the batch shapes.

splade_pool: `models.pooling.splade_pool` (padded [R, L, V], forward; forward and backward) and
`splade_pool_segments` (packed, 4 texts a row, forward and backward) against the definition,
float32 logits, alternating, the median of --reps CPU-times each. One JSON line a case.

Both print the CPU model (`lscpu`); compare only within one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.models.config import DROPOUT_RNGS  # noqa: E402

VARIANTS = ("default", "no_dropout", "rbg", "hash")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", choices=("rerank_step", "splade_pool"), required=True)
    parser.add_argument("--plan", default="", help="rerank_step: a rerank_peer.py data/plan.json")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=24, help="rerank_step: steps a variant")
    parser.add_argument("--shape", default="20,128,30522", help="splade_pool: R,L,V")
    parser.add_argument("--reps", type=int, default=10, help="splade_pool: runs a case")
    args = parser.parse_args(argv)
    if args.what == "rerank_step" and not args.plan:
        parser.error("--what=rerank_step needs --plan (a rerank_peer.py run's data/plan.json)")
    if unknown := set(args.variants.split(",")) - set(VARIANTS):
        parser.error(f"unknown variants {sorted(unknown)}; known: {list(VARIANTS)}")
    return args


def rerank_step(plan: dict, variant: str, steps: int) -> dict:
    """The reranker job's step for seed 0 under `variant`, timed as rerank_peer.py times it."""

    from benchmarks import rerank_peer
    from bert_jax.models import families
    from bert_jax.rerank import data, run
    from bert_jax.training import experiment
    from bert_jax.training.start import init_state

    config = rerank_peer._rerank_config(plan, 0)
    with config.unlocked():
        config.runtime.dropout_rng = variant if variant in DROPOUT_RNGS else "threefry"
    r = run.check_config(config)
    start = run.starting_point(config, r)
    if variant == "no_dropout":
        model = start.model_config.replace(
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
        start = dataclasses.replace(start, model_config=model)
    features = data.featurize(data.read_rows(r.train_file), start.tokenizer, start.max_seq_length)
    features.pop("teacher_scores", None)
    objective = run.rerank_objective(config, r, features["input_ids"].shape[1])
    head = families.head_in_family(start.model_config, objective.role)
    exp = experiment.Experiment.build(config, start.model_config, head, objective, plan["steps"])
    state = init_state(exp, run.initial_params(exp, start, 0), seed=0)
    batches = run._train_batches(config, r, features, 0, exp)
    _, clock = rerank_peer.timed_training(exp, state, batches, steps)
    row = clock.row()
    return {
        "what": "rerank_step",
        "variant": variant,
        "timed_steps": row["timed_steps"],
        "cpu_s_per_step": 1 / row["steps_per_cpu_s"] if row["timed_steps"] else float("nan"),
        "wall_s_per_step": row["s_per_step"],
        "shapes": sorted({str(dict(s)["input_ids"]) for s in clock.shapes}),
    }


def splade_pool_cases(shape: tuple[int, int, int], reps: int) -> list[dict]:
    """The library's poolings against the definition, alternating, median CPU-seconds."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.pooling import splade_activation, splade_pool, splade_pool_segments

    rows, length, _ = shape
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    mask = jnp.asarray(np.arange(length)[None] < rng.integers(1, length + 1, size=(rows, 1)))
    segments = jnp.asarray(np.broadcast_to(np.minimum(np.arange(length) * 4 // length, 3) + 1,
                                           (rows, length)))  # fmt: skip

    def definition(x, m):
        return (splade_activation(x) * m[..., None]).max(axis=-2)

    def definition_segments(x, s):
        return jnp.stack([definition(x, s == k + 1) for k in range(4)], axis=1)

    def fwd_bwd(f, *a):
        return jax.jit(jax.grad(lambda x: f(x, *a).sum()))

    cases = {
        "padded forward": (jax.jit(definition), jax.jit(splade_pool), (mask,)),
        "padded forward and backward": (fwd_bwd(definition, mask), fwd_bwd(splade_pool, mask), ()),
        "packed forward and backward": (
            fwd_bwd(definition_segments, segments),
            fwd_bwd(lambda x, s: splade_pool_segments(x, s, 4), segments),
            (),
        ),
    }
    out = []
    for name, (before, after, extra) in cases.items():
        times = {"definition": [], "library": []}
        for f in (before, after):
            jax.block_until_ready(f(x, *extra))  # compile
        for _ in range(reps):
            for key, f in (("definition", before), ("library", after)):
                started = time.process_time()
                jax.block_until_ready(f(x, *extra))
                times[key].append(time.process_time() - started)
        med = {k: statistics.median(v) for k, v in times.items()}
        out.append({"what": "splade_pool", "case": name, "shape": list(shape), "reps": reps,
                    **{f"{k}_cpu_s": v for k, v in med.items()},
                    "speedup": med["definition"] / med["library"]})  # fmt: skip
    return out


def main(argv=None) -> int:
    from benchmarks.rerank_peer import cpu_model

    args = parse_args(argv)
    print(json.dumps({"cpu": cpu_model(), "xla_flags": os.environ.get("XLA_FLAGS", "")}))
    if args.what == "splade_pool":
        shape = tuple(int(n) for n in args.shape.split(","))
        for row in splade_pool_cases(shape, args.reps):
            print(json.dumps(row), flush=True)
        return 0
    with open(args.plan, encoding="utf-8") as f:
        plan = json.load(f)
    for variant in args.variants.split(","):
        print(json.dumps(rerank_step(plan, variant, args.steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
