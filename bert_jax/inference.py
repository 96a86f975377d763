"""Using a trained model: embeddings of a text file, batch prediction, attention heat maps.

    python -m bert_jax.inference embed --model DIR --input texts.txt --output emb.npy --pooling mean
    python -m bert_jax.inference predict --model runs/genre --input lines.txt --output preds.jsonl
    python -m bert_jax.inference attention --model DIR --text "Fair is foul" --layer 2 --head 0 \\
        --output attention.png

`--model` is a Hugging Face directory, a bert_jax export, a train.py or fine-tuning workdir; the
tokenizer (tokenizer.json / vocab.txt) is taken from beside it. Input files hold one text a line
(blank lines skipped; a tab separates the two texts of a pair).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import convert
from bert_jax.config import BertConfig
from bert_jax.data import batching, tokenization
from bert_jax.data.glue import encode_texts
from bert_jax.model import BertModel, get_model_class

POOLINGS = ("cls", "mean", "pooler")


def load(path: str, model: str | None = None):
    """(config, params, model class name, tokenizer) for inference from any checkpoint path."""
    path = os.fspath(path)
    if os.path.isdir(os.path.join(path, "export")):  # a run directory: its exported model
        path_model = os.path.join(path, "export")
    else:
        path_model = path
    config, params, name, _ = convert.load_any(path_model, model)
    for folder in (path, os.path.join(path, "hf"), os.path.join(path, "data"), path_model):
        for file in ("tokenizer.json", "vocab.txt"):
            if os.path.isfile(os.path.join(folder, file)):
                tokenizer = tokenization.load_tokenizer(os.path.join(folder, file))
                if tokenizer.vocab_size != config.vocab_size:
                    raise ValueError(
                        f"{folder}/{file} has {tokenizer.vocab_size} tokens but the model "
                        f"{config.vocab_size}"
                    )
                return config, params, name, tokenizer
    raise FileNotFoundError(f"no tokenizer.json or vocab.txt beside {path}")


def read_texts(path: str) -> tuple[list[str], list[str] | None]:
    """Lines of a text file; "a<TAB>b" lines make pairs. Blank lines are skipped."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if not lines:
        raise ValueError(f"{path} holds no text")
    if all("\t" in line for line in lines):
        pairs = [line.split("\t", 1) for line in lines]
        return [a for a, _ in pairs], [b for _, b in pairs]
    return lines, None


def _features(tokenizer, texts, texts_b, max_seq_length):
    features, stats = encode_texts(tokenizer, list(texts), texts_b, max_seq_length)
    stats.log()
    features["example_weights"] = np.ones(len(texts), np.float32)
    return features


def embed(
    config: BertConfig,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    pooling: str = "cls",
    layers: Sequence[int] | None = None,
    batch_size: int = 64,
    max_seq_length: int = 128,
) -> np.ndarray:
    """Sentence embeddings: [N, E] float32, or [N, len(layers), E] for per-layer embeddings.

    Args:
      pooling: "cls" (the [CLS] hidden state), "mean" (mean over real tokens, as
        sentence-transformers does), or "pooler" (the tanh pooler output).
      layers: hidden-state indices (0 = embeddings, -1 = last layer) to pool each of.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    params = params.get("bert", params)
    model = BertModel(config, add_pooling_layer="pooler" in params)
    if pooling == "pooler" and "pooler" not in params:
        raise ValueError("this checkpoint has no pooler; use pooling='cls' or 'mean'")
    features = _features(tokenizer, texts, None, max_seq_length)

    @jax.jit
    def run(batch):
        out = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["token_type_ids"],
            batch["attention_mask"],
            output_hidden_states=layers is not None,
        )
        states = (
            [out.last_hidden_state] if layers is None else [out.hidden_states[i] for i in layers]
        )
        mask = batch["attention_mask"][..., None].astype(jnp.float32)
        pooled = []
        for h in states:
            if pooling == "cls":
                pooled.append(h[:, 0])
            elif pooling == "mean":
                pooled.append((h * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0))
            else:
                pooled.append(out.pooler_output)
        return jnp.stack(pooled, axis=1)

    outputs, indices = [], []
    buckets = batching.length_buckets(max_seq_length)
    for batch, idx in batching.batches(
        features, batch_size, bucket_boundaries=buckets, return_indices=True
    ):
        outputs.append(np.asarray(run(batch)))
        indices.append(idx)
    result = batching.unbatch(outputs, indices, len(texts)).astype(np.float32)
    return result[:, 0] if layers is None else result


def predict(
    config: BertConfig,
    params,
    name: str,
    tokenizer,
    texts,
    texts_b=None,
    *,
    batch_size: int = 64,
    max_seq_length: int = 128,
) -> list[dict]:
    """Labels and probabilities of a sequence classification (or regression) model."""
    if name != "BertForSequenceClassification":
        raise ValueError(f"predict needs a BertForSequenceClassification model, not {name}")
    model = get_model_class(name)(config)
    features = _features(tokenizer, texts, texts_b, max_seq_length)
    run = jax.jit(
        lambda b: (
            model.apply(
                {"params": params}, b["input_ids"], b["token_type_ids"], b["attention_mask"]
            ).logits
        )
    )
    outputs, indices = [], []
    for batch, idx in batching.batches(
        features,
        batch_size,
        bucket_boundaries=batching.length_buckets(max_seq_length),
        return_indices=True,
    ):
        outputs.append(np.asarray(run(batch)))
        indices.append(idx)
    logits = batching.unbatch(outputs, indices, len(texts))
    if config.num_labels == 1:
        return [{"score": float(x[0])} for x in logits]
    names = config.label_names or tuple(str(i) for i in range(config.num_labels))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return [
        {"label": names[int(np.argmax(p))], "probabilities": dict(zip(names, map(float, p)))}
        for p in probs
    ]


def attention_map(
    config: BertConfig,
    params,
    tokenizer,
    text: str,
    layer: int,
    head: int,
    output: str,
    text_b: str | None = None,
) -> np.ndarray:
    """Draws one layer's head's attention over a sentence as a heat map PNG; returns it [L, L]."""
    if not 0 <= layer < config.num_hidden_layers:
        raise ValueError(f"layer must be in [0, {config.num_hidden_layers}), got {layer}")
    if not 0 <= head < config.num_attention_heads:
        raise ValueError(f"head must be in [0, {config.num_attention_heads}), got {head}")
    params = params.get("bert", params)
    model = BertModel(config, add_pooling_layer="pooler" in params)
    features = _features(tokenizer, [text], None if text_b is None else [text_b], 512)
    n = int(features["attention_mask"][0].sum())
    out = model.apply(
        {"params": params},
        features["input_ids"][:, :n],
        features["token_type_ids"][:, :n],
        output_attentions=True,
    )
    probs = np.asarray(out.attentions[layer][0, head])
    vocab = {i: t for t, i in tokenizer.tokenizer.get_vocab().items()}
    tokens = [vocab[int(i)] for i in features["input_ids"][0, :n]]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = max(4.0, 0.35 * n)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = ax.imshow(probs, cmap="viridis", vmin=0.0, vmax=float(probs.max()))
    ax.set_xticks(range(n), tokens, rotation=90)
    ax.set_yticks(range(n), tokens)
    ax.set_xlabel("attended token (key)")
    ax.set_ylabel("attending token (query)")
    ax.set_title(f"layer {layer}, head {head}")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return probs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bert_jax.inference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("embed", help="embeddings of a text file into .npy")
    e.add_argument("--pooling", choices=POOLINGS, default="cls")
    e.add_argument("--layers", default="", help="comma-separated hidden-state indices, e.g. -1,-2")
    p = sub.add_parser("predict", help="labels of a text file with a fine-tuned classifier")
    a = sub.add_parser("attention", help="a heat map PNG of one layer's head's attention")
    a.add_argument("--text", required=True)
    a.add_argument("--layer", type=int, required=True)
    a.add_argument("--head", type=int, required=True)
    for s in (e, p, a):
        s.add_argument("--model", required=True, help="checkpoint or run directory")
        s.add_argument("--output", required=True)
    for s in (e, p):
        s.add_argument("--input", required=True, help="one text a line (TAB separates a pair)")
        s.add_argument("--batch_size", type=int, default=64)
        s.add_argument("--max_seq_length", type=int, default=128)
    args = parser.parse_args(argv)
    try:
        if args.command == "embed":
            config, params, _, tokenizer = load(args.model, "BertModel")
            texts, _ = read_texts(args.input)
            layers = [int(x) for x in args.layers.split(",")] if args.layers else None
            emb = embed(
                config,
                params,
                tokenizer,
                texts,
                pooling=args.pooling,
                layers=layers,
                batch_size=args.batch_size,
                max_seq_length=args.max_seq_length,
            )
            np.save(args.output, emb)
            print(f"wrote {emb.shape} embeddings to {args.output}")
        elif args.command == "predict":
            config, params, name, tokenizer = load(args.model)
            texts, texts_b = read_texts(args.input)
            rows = predict(
                config,
                params,
                name,
                tokenizer,
                texts,
                texts_b,
                batch_size=args.batch_size,
                max_seq_length=args.max_seq_length,
            )
            with open(args.output, "w", encoding="utf-8") as f:
                for text, row in zip(texts, rows):
                    f.write(json.dumps({"text": text, **row}) + "\n")
            print(f"wrote {len(rows)} predictions to {args.output}")
        else:
            config, params, _, tokenizer = load(args.model, "BertModel")
            attention_map(config, params, tokenizer, args.text, args.layer, args.head, args.output)
            print(f"wrote {args.output}")
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
