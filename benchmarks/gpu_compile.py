"""The memory a GPU step will take, predicted without the GPU: the pretraining step of
benchmarks/pretrain_step.py, or the packed embedding step of `inference embed`, compiled
deviceless for one card (`bert_jax.parallel.aot.gpu_devices`).

    python benchmarks/gpu_compile.py --card=h100 --size=large --batch=128 --seq=128 --scan \\
        --attention_dropout=0
    python benchmarks/gpu_compile.py --what=embed --card=l4 --size=minilm --batch=256 --seq=128 \\
        --segments=16 --dtype=float32

`--what=embed`: `inference.encoder.embed_step` (mean pooling, normalized) over `--batch` packed
rows of `--seq` tokens, each holding up to `--segments` texts (0: padded rows, one text each),
with the row's segment ids, restarting positions and each text's first position; the embedding
row also counts the kernels the card would launch (`gpu_step_hlo.hlo_counts`).

Prints one JSON line per run with the fields of pretrain_step.py's bert_jax rows that a compile
gives (xla_plan_bytes: arguments + outputs + temporaries - aliased, the figure pretrain_step.py
reports beside the real allocator peak on a GPU) and compile_s, so that a prediction made here
can be set beside the measurement made on the card (benchmarks/RESULTS_gpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_plan(card: str, cfg, batch: dict, args) -> dict:
    """Compiles one AdamW pretraining step (bert_jax_peer's) for `card`; its memory plan."""
    import flax.linen as nn
    import jax

    from bert_jax.models.bert import model as M
    from bert_jax.models.config import RuntimeConfig
    from bert_jax.parallel import aot
    from bert_jax.training import experiment, objectives, optimizer, steps

    device = aot.gpu_devices(card)[0]
    mesh = jax.sharding.Mesh([device], ("data",))
    runtime = RuntimeConfig(
        dtype=args.dtype,
        scan_layers=args.scan,
        remat_policy=args.remat,
        attention=args.attention,
        dropout_rng=args.dropout_rng,
    ).resolved("cuda", compute_capability=device.compute_capability)
    model = M.BertForPreTraining(cfg, runtime)
    tx = optimizer.make_optimizer("adamw", 1e-4, weight_decay=0.01)
    state = jax.eval_shape(
        lambda r: nn.unbox(steps.init_train_state(r, model=model, tx=tx)), jax.random.PRNGKey(0)
    )
    on_card = jax.sharding.SingleDeviceSharding(device)
    put = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_card)  # noqa: E731
    state, batch = jax.tree.map(put, state), jax.tree.map(put, batch)
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        fn = experiment.compile_train_step(model, tx, objectives.get_objective("pretraining"))
        compiled = fn.lower(state, batch).compile()
    return plan_figures(compiled, time.perf_counter() - start, runtime.dtype, args.hlo)[0]


def plan_figures(compiled, compile_s: float, dtype: str, hlo_path: str) -> tuple[dict, str]:
    """A compiled program's memory plan (bytes), compile seconds, cuDNN attention calls and the
    bytes XLA counts it accessing (a loop body counted once); and its optimized HLO text, also
    written to `hlo_path` where one is given."""
    from bert_jax.parallel import aot

    m = compiled.memory_analysis()
    hlo = compiled.as_text()
    if hlo_path:
        with open(hlo_path, "w") as f:
            f.write(hlo)
    figures = {
        "xla_plan_bytes": int(
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            + m.temp_size_in_bytes
            - m.alias_size_in_bytes
        ),
        "temp_bytes": int(m.temp_size_in_bytes),
        "compile_s": compile_s,
        "dtype": dtype,
        "cudnn_attention_calls": hlo.count('custom_call_target="__cudnn$fmha'),
        "xla_bytes_accessed": aot.cost_counts(compiled)[1],
    }
    return figures, hlo


# all-MiniLM-L6-v2's shape (sentence-transformers' default model): `--size=minilm`.
MINILM = {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12,
          "intermediate_size": 1536}  # fmt: skip


def compile_embed_plan(card: str, args) -> dict:
    """Compiles `inference.encoder.embed_step` for `card` on packed (or padded) rows; its memory
    plan and the kernels of its optimized HLO."""
    import jax
    import jax.numpy as jnp

    from benchmarks.gpu_step_hlo import hlo_counts
    from bert_jax.inference.encoder import embed_step
    from bert_jax.models.bert import model as M
    from bert_jax.models.bert.config import BertConfig
    from bert_jax.models.config import RuntimeConfig
    from bert_jax.parallel import aot

    cfg = (
        BertConfig.preset("base", **MINILM)
        if args.size == "minilm"
        else BertConfig.preset(args.size)
    )
    device = aot.gpu_devices(card)[0]
    runtime = RuntimeConfig(dtype=args.dtype, attention=args.attention).resolved(
        "cuda", compute_capability=device.compute_capability
    )
    model = M.BertModel(cfg, runtime, add_pooling_layer=False)
    on_card = jax.sharding.SingleDeviceSharding(device)
    rows, length, slots = args.batch, args.seq, args.segments
    ids = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=on_card)
    batch = {k: ids for k in ("input_ids", "token_type_ids", "attention_mask")}
    if slots:
        batch.update(segment_ids=ids, position_ids=ids)
        batch["cls_positions"] = jax.ShapeDtypeStruct((rows, slots), jnp.int32, sharding=on_card)
    params = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    )
    params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_card), params
    )
    start = time.perf_counter()
    with jax.set_mesh(jax.sharding.Mesh([device], ("data",))):  # the model resolves for the card
        lowered = embed_step.lower(
            params, batch, model=model, pooling="mean", layers=None, normalize=True
        )
    compiled = lowered.compile()
    figures, hlo = plan_figures(compiled, time.perf_counter() - start, runtime.dtype, args.hlo)
    return {
        **figures,
        "triton_gemm_fusions": hlo.count('"kind":"__triton'),
        "cublas_gemm_calls": hlo.count('custom_call_target="__cublas$gemm'),
        **hlo_counts(hlo),
    }


def parse_args(argv=None) -> argparse.Namespace:
    """The script's flags (argparse exits naming a bad one)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--what", default="train_step", choices=("train_step", "embed"))
    parser.add_argument("--card", default="h100", help="a card of bert_jax.hardware.GPU_CARDS")
    parser.add_argument("--size", default="large", help="a BertConfig preset (embed: or minilm)")
    parser.add_argument("--segments", type=int, default=16, help="embed: texts a row (0: padded)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=0, help="0: 15%% of seq")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--remat", default="none")
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--attention_dropout", type=float, default=None)
    parser.add_argument("--dropout_rng", default="threefry", help="threefry | rbg (RuntimeConfig)")
    parser.add_argument("--output", default="", help="also append the JSON line to this file")
    parser.add_argument("--hlo", default="", help="write the optimized HLO text to this file")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    import jax

    from benchmarks.pretrain_step import config_and_batch

    if args.what == "embed":
        row = {"peer": "bert_jax", "what": "deviceless_compile_embed", "card": args.card,
               "size": args.size, "rows": args.batch, "seq": args.seq,
               "segments": args.segments, "attention": args.attention, "jax": jax.__version__,
               **compile_embed_plan(args.card, args)}  # fmt: skip
        return _emit(row, args.output)

    cfg, host_batch, _ = config_and_batch(args)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in host_batch.items()}
    row = {
        "peer": "bert_jax",
        "what": "deviceless_compile",
        "card": args.card,
        "size": args.size,
        "batch": args.batch,
        "seq": args.seq,
        "scan": args.scan,
        "remat": args.remat,
        "attention": args.attention,
        "attention_dropout": cfg.attention_probs_dropout_prob,
        "jax": jax.__version__,
        **compile_plan(args.card, cfg, batch, args),
    }
    return _emit(row, args.output)


def _emit(row: dict, output: str) -> int:
    """Prints the JSON line; also appends it to `output` where one is given."""
    print(json.dumps(row), flush=True)
    if output:
        with open(output, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
