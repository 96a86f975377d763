"""Packing efficiency of the pretraining pipeline: real tokens per token slot, packed and not.

    python benchmarks/packing_efficiency.py                          # short_seq_prob 0.1 and 0.5
    python benchmarks/packing_efficiency.py --short_seq_probs=0.5 --max_segments=3
    python benchmarks/packing_efficiency.py --plays=2 --short_seq_probs=0.5 --batch=32  # small

Builds the default Shakespeare corpus (`build.build_default_corpus_shards`: 128 tokens, 20
predictions, NSP, dupe_factor 5, dynamic masking; or the same recipe on the first `--plays` plays)
once per short_seq_prob into --data_dir, reads
one epoch on one host through `make_pretraining_loader` without and with `pack_sequences`, and
prints one JSON line per run:

    short_seq_prob, packed, rows        the setting, rows read (empty padding rows not counted)
    sequences, real_tokens              examples and their real tokens (the same in both runs)
    efficiency                          real_tokens / (rows * L)
    sequences_per_row                   mean packed sequences per row
    rows_at_max_segments                share of rows holding max_segments sequences
    max_predictions_in_a_row, p_row     the fullest row's predictions, and the slots it had
    rows_per_s                          pipeline throughput (one process, no workers)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bert_jax.pretrain.data import build, default_corpus, pipeline  # noqa: E402
from bert_jax.pretrain.data.examples import PretrainingOptions  # noqa: E402


def _shards(data_dir: str, short_seq_prob: float, plays: int = 0) -> str:
    """The default corpus build, with `short_seq_prob` (0.1 is the default build itself); with
    `plays`, the same recipe on the first `plays` plays (one shard each, at most 8)."""
    out = os.path.join(
        data_dir, f"shakespeare_ssp{short_seq_prob}" + (f"_plays{plays}" if plays else "")
    )
    tokenizer = default_corpus.default_corpus_tokenizer(os.path.join(data_dir, "vocab"))
    options = PretrainingOptions(dupe_factor=5, static_masking=False, short_seq_prob=short_seq_prob)
    if not plays:
        build.build_default_corpus_shards(out, tokenizer, options, progress=False)
    else:
        documents = default_corpus.default_corpus_documents()[:plays]
        shards = min(plays, 8)
        build.build_pretraining_shards(
            documents, out, tokenizer, options, num_shards=shards, progress=False
        )
    return out


def measure(path: str, short_seq_prob: float, packed: bool, args) -> dict:
    """Reads one epoch; returns the counts."""
    loader = pipeline.make_pretraining_loader(
        path,
        batch_size=args.batch,
        seed=0,
        num_epochs=1,
        shard_index=0,
        shard_count=1,
        pack_sequences=packed,
        max_segments=args.max_segments,
        num_packing_bins=args.num_packing_bins,
    )
    rows = sequences = tokens = at_cap = 0
    max_predictions = 0
    start = time.perf_counter()
    for batch in loader:
        lengths = batch["attention_mask"].sum(axis=1)
        rows += int((lengths > 0).sum())
        tokens += int(lengths.sum())
        predictions = batch["masked_lm_weights"].sum(axis=1)
        max_predictions = max(max_predictions, int(predictions.max()))
        if packed:
            per_row = batch["next_sentence_weights"].sum(axis=1)
            sequences += int(per_row.sum())
            at_cap += int((per_row == args.max_segments).sum())
        else:
            sequences += int((lengths > 0).sum())
    seconds = time.perf_counter() - start
    seq_len = batch["input_ids"].shape[1]
    return {
        "short_seq_prob": short_seq_prob,
        "packed": packed,
        "rows": rows,
        "sequences": sequences,
        "real_tokens": tokens,
        "efficiency": round(tokens / (rows * seq_len), 4),
        "sequences_per_row": round(sequences / rows, 3),
        "rows_at_max_segments": round(at_cap / rows, 4) if packed else None,
        "max_predictions_in_a_row": max_predictions,
        "p_row": int(batch["masked_lm_weights"].shape[1]),
        "rows_per_s": round(rows / seconds, 1),
        "max_segments": args.max_segments if packed else None,
        "num_packing_bins": args.num_packing_bins if packed else None,
        "batch": args.batch,
        "mean_sequence_length": round(float(np.divide(tokens, sequences)), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default=os.path.join("/tmp", "bert_jax_packing"))
    parser.add_argument("--short_seq_probs", default="0.1,0.5")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max_segments", type=int, default=4)
    parser.add_argument("--num_packing_bins", type=int, default=128)
    parser.add_argument("--plays", type=int, default=0, help="the first N plays (0: all 38)")
    args = parser.parse_args()
    for short_seq_prob in [float(p) for p in args.short_seq_probs.split(",")]:
        path = _shards(args.data_dir, short_seq_prob, args.plays)
        for packed in (False, True):
            print(json.dumps(measure(path, short_seq_prob, packed, args)), flush=True)


if __name__ == "__main__":
    main()
