"""Pretraining-step benchmark: bert_jax against its peers, measured alternately in one run.

    python benchmarks/pretrain_step.py --size=small --batch=16 --seq=128 --steps=10 \\
        --peers=bert_jax,torch_eager,torch_compile --rounds=3

Peers (same BertConfig, same batch, AdamW with weight decay, dropout on, float32 or bf16):
  bert_jax       this library: jitted train_step, MLM head only at the masked positions
  bert_jax+NAME  the same step compiled with the XLA options `XLA_OPTIONS[NAME]` (e.g.
                 bert_jax+onednn), so that an option is measured against the default in one run
  torch_eager    transformers BertForPreTraining (SDPA attention), torch.optim.AdamW
  torch_compile  the same under torch.compile
  flax_hf        transformers 4.x FlaxBertForPreTraining (only where a 4.x transformers with
                 Flax is installed beside; skipped with a note otherwise)

Every measurement prints one JSON line with at least: peer, size, batch, seq, what ("train_step" or
"forward"), median_s, tokens_per_s, compile_s; plus mfu where the device's peak is known, the
device, dtype, versions, the 1-minute load average before and after the timed rounds, and memory:
peak_bytes where the device reports it (GPU: JAX's and torch's allocator peaks) and, for bert_jax,
xla_plan_bytes (the compiled step's buffers).

Rounds alternate the peers (A B C A B C ...) so that a slow patch of a
shared machine hits all of them; compare peers as ratios, never absolute times across runs.

The matmul peak is measured first, in the same run: `jnp.dot` of [2048, 768] x [768, 3072] (a
BERT-base feed-forward matmul at 16 x 128 tokens) in float32 and in bfloat16, median of
--peak_reps, one line each (peer "matmul_peak", gflops_per_s). Every peer's line then carries
step_gflops_per_s (the model FLOPs of bert_jax's step, MLM head at the masked positions, over the
peer's median time) and fraction_of_matmul_peak (that over the peak of the run's dtype): the same
work for every peer, so the fractions compare as the times do.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_batch(cfg, batch: int, seq: int, predictions: int, seed: int = 0):
    """A pretraining batch as the data pipeline makes it (full-length rows, as BERT's are)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, cfg.vocab_size, size=(batch, seq)).astype(np.int32)
    types = np.zeros((batch, seq), np.int32)
    types[:, seq // 2 :] = 1
    positions = np.sort(
        np.stack(
            [rng.choice(np.arange(1, seq - 1), predictions, replace=False) for _ in range(batch)]
        ),
        axis=1,
    ).astype(np.int32)
    return dict(
        input_ids=ids,
        token_type_ids=types,
        attention_mask=np.ones((batch, seq), np.int32),
        masked_lm_positions=positions,
        masked_lm_ids=rng.integers(1000, cfg.vocab_size, size=(batch, predictions)).astype(
            np.int32
        ),
        masked_lm_weights=np.ones((batch, predictions), np.float32),
        next_sentence_labels=rng.integers(0, 2, size=batch).astype(np.int32),
    )


# --------------------------------------------------------------------------------------------
# Peers: each returns (step_fn, compile_s, peak_fn): step_fn() runs one synchronous step,
# compile_s is the first step's time (bert_jax: the compile alone), peak_fn() memory figures.
# --------------------------------------------------------------------------------------------
# XLA options a `bert_jax+NAME` peer compiles with (`Compiled.compile(compiler_options=...)`:
# per program, so that they alternate with the default in one process). All exist in jaxlib 0.10.2.
XLA_OPTIONS = {
    "onednn": {"xla_cpu_use_onednn": True},  # oneDNN thunks for matmul fusions
    "onednn_custom_call": {"xla_cpu_experimental_onednn_custom_call": True},
    "no_xnnpack": {"xla_cpu_use_xnnpack": False},  # XLA's own (Eigen) matmuls
    "no_ynn": {"xla_cpu_experimental_ynn_fusion_type": ""},  # no YNNPACK fusions
    "fast_math": {"xla_cpu_enable_fast_math": True},  # changes numerics: for reference only
}


def bert_jax_peer(cfg, batch, args, options: str = ""):
    import flax.linen as nn
    import jax

    from bert_jax.hardware import current_platform
    from bert_jax.models.bert import model as M
    from bert_jax.models.config import RuntimeConfig
    from bert_jax.training import experiment, objectives, optimizer, steps

    runtime = RuntimeConfig(
        dtype=args.dtype, scan_layers=args.scan, remat_policy=args.remat, attention=args.attention
    ).resolved(current_platform())  # as a run resolves it (warns of emulated bfloat16)
    compiler_options = XLA_OPTIONS[options] if options else None
    model = M.BertForPreTraining(cfg, runtime)
    tx = optimizer.make_optimizer("adamw", 1e-4, weight_decay=0.01)
    state = jax.jit(lambda r: nn.unbox(steps.init_train_state(r, model=model, tx=tx)))(
        jax.random.PRNGKey(0)
    )
    device_batch = jax.device_put(batch)
    objective = objectives.get_objective("pretraining")
    t = time.perf_counter()
    if args.what == "train_step":
        fn = experiment.compile_train_step(model, tx, objective)
        compiled = fn.lower(state, device_batch).compile(compiler_options)
        holder = {"state": state}

        def step():
            holder["state"], metrics = compiled(holder["state"], device_batch)
            jax.block_until_ready(metrics)

    else:
        fn = jax.jit(functools.partial(steps.eval_step, model=model, objective=objective))
        compiled = fn.lower(state.params, device_batch).compile(compiler_options)

        def step():
            jax.block_until_ready(compiled(state.params, device_batch))

    compile_s = time.perf_counter() - t
    step()
    return step, compile_s, lambda: _jax_peak_bytes(compiled)


def _jax_peak_bytes(compiled) -> dict:
    """The device's peak bytes in use where it reports them (GPU, TPU); XLA's own plan of the
    step's buffers (arguments + outputs + temporaries, less donated aliases) everywhere."""
    import jax

    out = {}
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        out["peak_bytes"] = int(stats["peak_bytes_in_use"])
    m = compiled.memory_analysis()
    if m is not None:
        out["xla_plan_bytes"] = int(
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            + m.temp_size_in_bytes
            - m.alias_size_in_bytes
        )
    return out


def _torch_model(cfg, args):
    import torch
    import transformers

    torch.manual_seed(0)
    hf_cfg = transformers.BertConfig(**cfg.to_hf_dict())
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.BertForPreTraining(hf_cfg)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device), device


def torch_peer(cfg, batch, args, compiled: bool):
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    model, device = _torch_model(cfg, args)
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    for b in range(labels.shape[0]):
        labels[b, batch["masked_lm_positions"][b]] = batch["masked_lm_ids"][b]
    inputs = {
        "input_ids": torch.as_tensor(batch["input_ids"], dtype=torch.long, device=device),
        "token_type_ids": torch.as_tensor(batch["token_type_ids"], dtype=torch.long, device=device),
        "attention_mask": torch.as_tensor(batch["attention_mask"], dtype=torch.long, device=device),
        "labels": torch.as_tensor(labels, device=device),
        "next_sentence_label": torch.as_tensor(
            batch["next_sentence_labels"], dtype=torch.long, device=device
        ),
    }
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01)
    amp = args.dtype == "bfloat16"
    forward = torch.compile(model) if compiled else model
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        if args.what == "train_step":
            model.train()
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
                loss = forward(**inputs).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            model.eval()
            with (
                torch.no_grad(),
                torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp),
            ):
                forward(**inputs)
        sync()

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t

    def peak():
        if device == "cuda":
            return {"peak_bytes": int(torch.cuda.max_memory_allocated())}
        return {}  # no allocator statistics on the CPU

    return step, compile_s, peak


def flax_hf_peer(cfg, batch, args):
    import jax
    import optax
    import transformers

    if not hasattr(transformers, "FlaxBertForPreTraining"):
        raise ImportError(
            f"transformers {transformers.__version__} has no Flax BERT (removed in v5)"
        )
    model = transformers.FlaxBertForPreTraining(transformers.BertConfig(**cfg.to_hf_dict()), seed=0)
    tx = optax.adamw(1e-4, eps=1e-6, weight_decay=0.01)
    params = model.params
    opt_state = tx.init(params)

    def loss_fn(p, rng):
        out = model(
            batch["input_ids"],
            batch["attention_mask"],
            batch["token_type_ids"],
            params=p,
            dropout_rng=rng,
            train=True,
        )
        logits = jax.numpy.take_along_axis(
            out.prediction_logits, batch["masked_lm_positions"][..., None], 1
        )
        mlm = optax.softmax_cross_entropy_with_integer_labels(logits, batch["masked_lm_ids"]).mean()
        nsp = optax.softmax_cross_entropy_with_integer_labels(
            out.seq_relationship_logits, batch["next_sentence_labels"]
        ).mean()
        return mlm + nsp

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train(p, s, rng):
        grads = jax.grad(loss_fn)(p, rng)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    holder = {"p": params, "s": opt_state}

    def step():
        holder["p"], holder["s"] = train(holder["p"], holder["s"], jax.random.PRNGKey(0))
        jax.block_until_ready(holder["p"])

    t = time.perf_counter()
    step()
    return step, time.perf_counter() - t, lambda: {}


PEERS = {
    "bert_jax": bert_jax_peer,
    "torch_eager": functools.partial(torch_peer, compiled=False),
    "torch_compile": functools.partial(torch_peer, compiled=True),
    "flax_hf": flax_hf_peer,
}


def peer_fn(name: str):
    """The peer function of a --peers entry: a name in PEERS, or bert_jax+<XLA_OPTIONS key>."""
    base, _, options = name.partition("+")
    if base == "bert_jax" and options:
        if options not in XLA_OPTIONS:
            raise ValueError(f"unknown XLA option set {options!r}; known: {sorted(XLA_OPTIONS)}")
        return functools.partial(bert_jax_peer, options=options)
    return PEERS[name]


def matmul_peak(dtype: str, shape: tuple[int, int, int], reps: int) -> float:
    """FLOP/s of `jnp.dot` of [m, k] x [k, n] in `dtype` (accumulating in it), median of `reps`."""
    import jax
    import jax.numpy as jnp

    m, k, n = shape
    a = jax.random.normal(jax.random.PRNGKey(0), (m, k), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (k, n), dtype)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        dot(a, b).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2.0 * m * k * n / statistics.median(times)


def device_info():
    import jax

    d = jax.devices()[0]
    return d.platform, d.device_kind


def versions(names=("jax", "flax", "torch", "transformers")) -> dict[str, str]:
    """Python's version and those of the installed packages among `names`."""
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's flags (argparse exits naming a bad one)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size",
        default="small",
        help="a BertConfig preset: tiny, small, base, large, L4-H512, ...",
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds over the peers")
    parser.add_argument(
        "--predictions", type=int, default=0, help="masked positions (0: 15%% of seq)"
    )
    parser.add_argument("--peers", default="bert_jax,torch_eager,torch_compile")
    parser.add_argument("--what", choices=("train_step", "forward"), default="train_step")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--scan", action="store_true", help="bert_jax: scan over layers")
    parser.add_argument("--remat", default="none", help="bert_jax: none, dots, dots_no_batch, full")
    parser.add_argument(
        "--attention", default="auto", help="bert_jax: auto, xla, fused_xla, cudnn, splash"
    )
    parser.add_argument(
        "--attention_dropout",
        type=float,
        default=None,
        help="attention-probability dropout for every peer (default: the preset's 0.1; the GPU/TPU "
        "recipes use 0, which lets bert_jax's attention=auto pick the fused kernels)",
    )
    parser.add_argument(
        "--peak_shape", default="2048,768,3072", help="m,k,n of the matmul-peak measurement"
    )
    parser.add_argument(
        "--peak_reps", type=int, default=5, help="matmul-peak repetitions (0: none)"
    )
    parser.add_argument("--output", default="", help="also append the JSON lines to this file")
    return parser.parse_args(argv)


def config_and_batch(args: argparse.Namespace):
    """(BertConfig, host batch, predictions a row) of the flags --size, --attention_dropout,
    --batch, --seq and --predictions: the step every peer (and gpu_compile.py) runs."""
    from bert_jax.models.bert.config import BertConfig

    cfg = BertConfig.preset(args.size)
    if args.attention_dropout is not None:
        cfg = dataclasses.replace(cfg, attention_probs_dropout_prob=args.attention_dropout)
    predictions = args.predictions or max(1, round(0.15 * args.seq))
    return cfg, make_batch(cfg, args.batch, args.seq, predictions), predictions


def main(argv=None) -> int:
    args = parse_args(argv)

    from bert_jax import hardware
    from bert_jax.training import flops

    cfg, batch, predictions = config_and_batch(args)
    platform_name, kind = device_info()
    peak = hardware.peak_flops_per_device(kind)
    step_flops = flops.padded_step_flops(cfg, args.batch, args.seq, predictions)
    if args.what == "forward":
        step_flops /= 3
    lines, matmul_peaks = [], {}
    if args.peak_reps > 0:
        shape = tuple(int(x) for x in args.peak_shape.split(","))
        for dtype in ("float32", "bfloat16"):
            matmul_peaks[dtype] = matmul_peak(dtype, shape, args.peak_reps)
            row = {
                "peer": "matmul_peak",
                "dtype": dtype,
                "shape": list(shape),
                "gflops_per_s": matmul_peaks[dtype] / 1e9,
                "reps": args.peak_reps,
                "device": f"{platform_name}:{kind}",
            }
            lines.append(row)
            print(json.dumps(row), flush=True)
    peers, times, compile_s, peaks = [], {}, {}, {}
    for name in args.peers.split(","):
        try:
            fn, c, peak_fn = peer_fn(name)(cfg, batch, args)
        except Exception as e:  # noqa: BLE001 - report a peer that cannot run, keep the others
            print(
                json.dumps(
                    {"peer": name, "size": args.size, "skipped": f"{type(e).__name__}: {e}"[:300]}
                ),
                flush=True,
            )
            continue
        fn()  # one more warm-up (allocator, autotuning)
        peers.append((name, fn))
        peaks[name] = peak_fn
        times[name], compile_s[name] = [], c
    load_avg = [round(os.getloadavg()[0], 2)]
    for _ in range(args.rounds):
        for name, fn in peers:
            for _ in range(args.steps):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    load_avg.append(round(os.getloadavg()[0], 2))
    for name, _ in peers:
        median = statistics.median(times[name])
        row = {
            "peer": name,
            "size": args.size,
            "batch": args.batch,
            "seq": args.seq,
            "what": args.what,
            "dtype": args.dtype,
            "attention_dropout": cfg.attention_probs_dropout_prob,
            "median_s": median,
            "mean_s": statistics.mean(times[name]),
            "tokens_per_s": args.batch * args.seq / median,
            "compile_s": compile_s[name],
            "steps": len(times[name]),
            "predictions": predictions,
            "device": f"{platform_name}:{kind}",
            "versions": versions(),
            "load_avg_1m": load_avg,  # at the start and at the end of the timed rounds
        }
        row.update(peaks[name]())
        if name.startswith("bert_jax"):
            row.update(scan=args.scan, remat=args.remat, attention=args.attention)
        if "+" in name:
            row["xla_options"] = XLA_OPTIONS[name.partition("+")[2]]
        row["step_gflops_per_s"] = step_flops / median / 1e9
        if args.dtype in matmul_peaks:
            row["matmul_peak_gflops_per_s"] = matmul_peaks[args.dtype] / 1e9
            row["fraction_of_matmul_peak"] = step_flops / median / matmul_peaks[args.dtype]
        if peak:
            row["mfu"] = step_flops / median / peak
        lines.append(row)
        print(json.dumps(row), flush=True)
    if args.output:
        with open(args.output, "a") as f:
            for row in lines:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
