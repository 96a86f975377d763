"""XLA:CPU's options on the float32 pretraining step and the embedding forward, A/B in one process.

    python benchmarks/cpu_options.py --what=train_step --size=small --rounds=3
    python benchmarks/cpu_options.py --what=train_step --size=base --rounds=2 \\
        --options=default,onednn,onednn_custom_call,vector_512
    python benchmarks/cpu_options.py --what=embed --rounds=5
    python benchmarks/cpu_options.py --list   # the option sets and what each sets

Every option set of `OPTIONS` compiles the same program (`jit(...).lower(...).compile(options)`:
per program, so that all of them alternate with the default in one process, A B C A B C ...):

  train_step  one AdamW step of `BertForPreTraining` (benchmarks/pretrain_step.py's batch: MLM +
              NSP, dropout on, 15% of the positions masked), float32, `--batch` x `--seq`
  embed       the all-MiniLM-L6-v2 encoder's forward (the architecture `benchmarks/embed.py` and
              `python -m bert_jax.inference embed` run), float32, `--batch` x `--seq`

Before timing, each set's results are compared with the default's from the same inputs (the
step's loss and every updated parameter, or the last hidden state): `max_abs_diff` and `exact`
(within `--rtol` of the default's scale, i.e. float rounding: a different summation order).
Prints one JSON line per set: option, xla_options, median_s, vs_default (the default's median
over this set's: above 1 is faster), exact, max_abs_diff, compile_s, the library calls in the
optimized HLO (`library_calls`: which of XNNPACK / YNNPACK / oneDNN ran the dots and fusions),
the CPU's model and flags of interest, and the load average. Ratios only: the machine may be
shared. `bert_jax/xla_flags.py` takes the defaults from what this finds (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Option sets, by name: what `compile(compiler_options=...)` gets. Every option exists in the
# installed jaxlib (0.10.2); `xla_cpu_use_thunk_runtime` does not any more (the thunk runtime is
# XLA:CPU's only one), so it is not a set here.
OPTIONS: dict[str, dict] = {
    "default": {},
    "onednn": {"xla_cpu_use_onednn": True},  # oneDNN thunks for matmul fusions
    "onednn_custom_call": {"xla_cpu_experimental_onednn_custom_call": True},  # oneDNN rewrite
    "onednn_fusion_dot": {"xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "no_xnnpack": {"xla_cpu_use_xnnpack": False},  # XLA's own (Eigen) dots
    "no_ynn": {"xla_cpu_experimental_ynn_fusion_type": ""},  # no YNNPACK fusions
    "xnn_graph_greedy": {
        "xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_GREEDY"
    },
    "fast_min_max": {"xla_cpu_enable_fast_min_max": True},  # NaN handling of min/max only
    "vector_512": {"xla_cpu_prefer_vector_width": 512},  # 512-bit vectors in XLA's own loops
    "max_isa_avx2": {"xla_cpu_max_isa": "AVX2"},  # no AVX-512 in XLA's own loops
    "no_fusion_emitters": {"xla_cpu_use_fusion_emitters": False},
    "fast_math": {"xla_cpu_enable_fast_math": True},  # changes numerics: for reference only
}
_LIBRARY_CALL = re.compile(r'"kind":"(__[a-z]+_fusion)"|custom_call_target="(__onednn\$[a-zA-Z]+)"')
CPU_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_description() -> dict:
    """The CPU's model name and the /proc/cpuinfo flags that choose kernels (`CPU_FLAGS`)."""
    from bert_jax import hardware

    info = hardware.read_cpuinfo() or ""
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    flags = hardware.cpu_flags(info) if info else frozenset()
    return {
        "cpu_model": model.group(1) if model else "?",
        "cpu_family": hardware.cpu_family(info) if info else "unknown",
        "cpu_flags": sorted(f for f in CPU_FLAGS if f in flags),
        "threads": os.cpu_count(),
    }


def train_step_program(size: str, batch: int, seq: int):
    """(lowered AdamW step, () -> its arguments, results -> flat arrays): the step of
    benchmarks/pretrain_step.py at `size`, float32."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from benchmarks.pretrain_step import make_batch
    from bert_jax.models.bert import model as M
    from bert_jax.models.bert.config import BertConfig
    from bert_jax.models.config import RuntimeConfig
    from bert_jax.training import experiment, objectives, optimizer, steps

    cfg = BertConfig.preset(size)
    model = M.BertForPreTraining(cfg, RuntimeConfig())
    tx = optimizer.make_optimizer("adamw", 1e-4, weight_decay=0.01)
    state = jax.jit(lambda r: nn.unbox(steps.init_train_state(r, model=model, tx=tx)))(
        jax.random.PRNGKey(0)
    )
    host = make_batch(cfg, batch, seq, max(1, round(0.15 * seq)))
    device_batch = jax.device_put(host)
    fn = experiment.compile_train_step(model, tx, objectives.get_objective("pretraining"))

    def args():  # the step donates its state: a fresh copy for every call
        return jax.tree.map(jnp.copy, state), device_batch

    def flat(out):
        new_state, metrics = out
        leaves = jax.tree.leaves(new_state.params) + jax.tree.leaves(metrics)
        return [np.asarray(x, np.float64).ravel() for x in leaves]

    return fn.lower(*args()), args, flat


def embed_program(batch: int, seq: int):
    """(lowered encoder forward, () -> its arguments, results -> flat arrays): all-MiniLM-L6-v2's
    architecture and vocabulary size (random weights: timing and exactness do not need its
    trained ones), float32."""
    import jax

    from bert_jax.models.bert import model as M
    from bert_jax.models.bert.config import BertConfig
    from bert_jax.models.config import RuntimeConfig

    cfg = BertConfig.preset(
        "L6-H512", hidden_size=384, num_attention_heads=12, intermediate_size=1536
    )
    model = M.BertModel(cfg, RuntimeConfig(), add_pooling_layer=False)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, cfg.vocab_size, size=(batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    mask[batch // 2 :, seq // 2 :] = 0  # half the rows padded, as a length bucket holds them
    params = jax.jit(model.init)(jax.random.PRNGKey(0), ids, attention_mask=mask)
    fn = jax.jit(lambda p, i, m: model.apply(p, i, attention_mask=m).last_hidden_state)

    def flat(out):
        return [np.asarray(out, np.float64).ravel()]

    return fn.lower(params, ids, mask), lambda: (params, ids, mask), flat


def compare(reference: list[np.ndarray], result: list[np.ndarray], rtol: float) -> tuple:
    """(max |difference|, exact): every array within `rtol` x its largest reference value."""
    diff, exact = 0.0, True
    for a, b in zip(reference, result, strict=True):
        d = float(np.max(np.abs(a - b))) if a.size else 0.0
        diff = max(diff, d)
        exact &= d <= rtol * max(float(np.max(np.abs(a))), 1e-30)
    return diff, bool(exact)


def sweep(lowered, args, flat, names: list[str], rounds: int, reps: int, rtol: float):
    """One JSON-able row per option set: compile, compare with the default, time alternately."""
    import jax

    compiled, rows = {}, {}
    for name in names:
        t = time.perf_counter()
        try:
            compiled[name] = lowered.compile(OPTIONS[name] or None)
        except Exception as e:  # noqa: BLE001 - report the set that does not compile, go on
            rows[name] = {"option": name, "skipped": f"{type(e).__name__}: {e}"[:300]}
            continue
        hlo = compiled[name].as_text()
        calls = {}
        for match in _LIBRARY_CALL.finditer(hlo):
            call = match.group(1) or match.group(2)
            calls[call] = calls.get(call, 0) + 1
        rows[name] = {
            "option": name,
            "xla_options": OPTIONS[name],
            "compile_s": time.perf_counter() - t,
            "library_calls": calls,
        }
    reference = flat(jax.block_until_ready(compiled["default"](*args())))
    for name, c in compiled.items():
        rows[name]["max_abs_diff"], rows[name]["exact"] = compare(
            reference, flat(jax.block_until_ready(c(*args()))), rtol
        )
    times = {name: [] for name in compiled}
    load = [round(os.getloadavg()[0], 2)]
    for _ in range(rounds):
        for name, c in compiled.items():
            for _ in range(reps):
                inputs = jax.block_until_ready(args())
                t = time.perf_counter()
                jax.block_until_ready(c(*inputs))
                times[name].append(time.perf_counter() - t)
    load.append(round(os.getloadavg()[0], 2))
    default = statistics.median(times["default"])
    for name, ts in times.items():
        median = statistics.median(ts)
        rows[name].update(median_s=median, vs_default=default / median, runs=len(ts), load=load)
    return [rows[n] for n in names]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--what", choices=("train_step", "embed"), default="train_step")
    parser.add_argument("--size", default="small", help="train_step: a BertConfig preset")
    parser.add_argument("--batch", type=int, default=None, help="16 (train_step) / 64 (embed)")
    parser.add_argument("--seq", type=int, default=None, help="128 (train_step) / 64 (embed)")
    parser.add_argument("--options", default=",".join(OPTIONS), help="comma-separated sets")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds over the sets")
    parser.add_argument("--reps", type=int, default=1, help="timed runs of a set per round")
    parser.add_argument("--rtol", type=float, default=1e-5, help="exact: within this x scale")
    parser.add_argument("--output", default="", help="also append the JSON lines to this file")
    parser.add_argument("--list", action="store_true", help="print the option sets and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, options in OPTIONS.items():
            print(f"{name:20s} {options}")
        return 0
    names = ["default"] + [n for n in args.options.split(",") if n and n != "default"]
    unknown = sorted(set(names) - set(OPTIONS))
    if unknown:
        parser.error(f"unknown option sets {unknown}; known: {sorted(OPTIONS)}")
    if args.what == "train_step":
        batch, seq = args.batch or 16, args.seq or 128
        program = train_step_program(args.size, batch, seq)
    else:
        batch, seq = args.batch or 64, args.seq or 64
        program = embed_program(batch, seq)
    import jax

    common = {"what": args.what, "batch": batch, "seq": seq, "jax": jax.__version__}
    if args.what == "train_step":
        common["size"] = args.size
    common.update(cpu_description())
    lines = []
    for row in sweep(*program, names, args.rounds, args.reps, args.rtol):
        lines.append(json.dumps({**common, **row}))
        print(lines[-1], flush=True)
    if args.output:
        with open(args.output, "a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
