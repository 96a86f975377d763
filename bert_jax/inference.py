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
import functools
import json
import os
import sys
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from bert_jax import convert
from bert_jax.config import BertConfig
from bert_jax.data import batching, tokenization
from bert_jax.data.glue import encode_texts
from bert_jax.model import BertModel, get_model_class

POOLINGS = ("cls", "mean", "pooler")
PROGRESS_MIN_BATCHES = 20  # a progress bar from this many batches on (`progress=None`)


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


def inference_buckets(max_seq_length: int) -> tuple[int, ...]:
    """Token-axis sizes a batch is padded to: every 8 tokens up to 64, then every 32.

    Batches hold rows of similar length (grouped by bucket), and most sentences are short, so the
    fine steps at the start save most of the padding; each size compiles once per process.
    """
    fine = {b for b in range(8, 64, 8) if b < max_seq_length}
    return tuple(sorted(fine | set(batching.length_buckets(max_seq_length))))


def _run_batched(
    step_fn,
    params,
    features: dict[str, np.ndarray],
    *,
    batch_size: int,
    buckets: Sequence[int] | None,
    progress: bool | None,
    desc: str,
) -> np.ndarray:
    """`step_fn(params, batch)` -> [B, ...] over batches of the features, in input order.

    Rows are grouped by length bucket (each batch padded to its bucket); `buckets=None` pads every
    batch to the features' full length. The parameters go to the device once and enter every call
    as arguments, so each bucket compiles one program, whatever the parameters hold.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = batching.num_rows(features)
    if n == 0:
        raise ValueError("no texts to run")
    params = jax.device_put(params)
    inputs = {k: features[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    inputs["example_weights"] = features["example_weights"]
    total = batching.num_batches(n, batch_size)
    show = total >= PROGRESS_MIN_BATCHES if progress is None else progress
    bar = tqdm.tqdm(total=n, disable=not show, desc=desc, unit="text")
    outputs, indices, pending = [], [], None
    for batch, idx in batching.batches(
        inputs,
        batch_size,
        bucket_boundaries=buckets,
        group_by_length=buckets is not None,  # similar lengths together: little padding
        return_indices=True,
    ):
        batch.pop("example_weights")
        out = step_fn(params, batch)  # dispatched asynchronously: the next batch is cut meanwhile
        if pending is not None:
            outputs.append(np.asarray(pending[0]))
            bar.update(pending[1])
        pending = (out, int(np.sum(idx >= 0)))
        indices.append(idx)
    outputs.append(np.asarray(pending[0]))
    bar.update(pending[1])
    bar.close()
    return batching.unbatch(outputs, indices, n)


@functools.partial(jax.jit, static_argnames=("model", "pooling", "layers"))
def embed_step(params, batch, *, model: BertModel, pooling: str, layers: tuple[int, ...] | None):
    """Pooled hidden states of one batch: float32 [B, P, E], P = len(layers) or 1 (last layer).

    Args:
      params: BertModel parameters (an argument, never a constant of the program).
      batch: input_ids, token_type_ids, attention_mask int32 [B, L].
      model: the BertModel; pooling and layers as in `embed`.
    """
    out = model.apply(
        {"params": params},
        batch["input_ids"],
        batch["token_type_ids"],
        batch["attention_mask"],
        output_hidden_states=layers is not None,
    )
    states = [out.last_hidden_state] if layers is None else [out.hidden_states[i] for i in layers]
    mask = batch["attention_mask"][..., None].astype(jnp.float32)  # [B, L, 1]
    pooled = []
    for h in states:
        h = h.astype(jnp.float32)
        if pooling == "cls":
            pooled.append(h[:, 0])
        elif pooling == "mean":
            pooled.append((h * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0))
        else:
            pooled.append(out.pooler_output.astype(jnp.float32))
    return jnp.stack(pooled, axis=1)


@functools.partial(jax.jit, static_argnames=("model",))
def logits_step(params, batch, *, model: nn.Module):
    """Logits of one batch of a sequence classifier: float32 [B, num_labels].

    Args:
      params: the classifier's parameters (an argument, never a constant of the program).
      batch: input_ids, token_type_ids, attention_mask int32 [B, L].
    """
    out = model.apply(
        {"params": params}, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    )
    return out.logits.astype(jnp.float32)


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
    bucket_lengths: bool = True,
    progress: bool | None = None,
) -> np.ndarray:
    """Sentence embeddings: [N, E] float32, or [N, len(layers), E] for per-layer embeddings.

    Args:
      pooling: "cls" (the [CLS] hidden state), "mean" (mean over real tokens, as
        sentence-transformers does), or "pooler" (the tanh pooler output).
      layers: hidden-state indices (0 = embeddings, -1 = last layer) to pool each of.
      batch_size: texts per batch (B).
      max_seq_length: tokens kept per text (longer texts are truncated).
      bucket_lengths: batch texts of similar length, each batch padded to the next of
        `inference_buckets(max_seq_length)`; False pads every batch to max_seq_length (the
        results are the same).
      progress: show a progress bar; None: when there are at least PROGRESS_MIN_BATCHES batches.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    params = params.get("bert", params)
    model = BertModel(config, add_pooling_layer="pooler" in params)
    if pooling == "pooler" and "pooler" not in params:
        raise ValueError("this checkpoint has no pooler; use pooling='cls' or 'mean'")
    if layers is not None:
        num_states = config.num_hidden_layers + 1
        bad = [i for i in layers if not -num_states <= i < num_states]
        if bad:
            raise ValueError(f"layers {bad} out of range: there are {num_states} hidden states")
    features = _features(tokenizer, texts, None, max_seq_length)
    step = functools.partial(
        embed_step,
        model=model,
        pooling=pooling,
        layers=None if layers is None else tuple(int(i) for i in layers),
    )
    result = _run_batched(
        step,
        params,
        features,
        batch_size=batch_size,
        buckets=inference_buckets(max_seq_length) if bucket_lengths else None,
        progress=progress,
        desc="embed",
    )
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
    bucket_lengths: bool = True,
    progress: bool | None = None,
) -> list[dict]:
    """Labels and probabilities of a sequence classification (or regression) model.

    Batching (`batch_size`, `max_seq_length`, `bucket_lengths`, `progress`) is as in `embed`.
    """
    if name != "BertForSequenceClassification":
        raise ValueError(f"predict needs a BertForSequenceClassification model, not {name}")
    model = get_model_class(name)(config)
    features = _features(tokenizer, texts, texts_b, max_seq_length)
    logits = _run_batched(
        functools.partial(logits_step, model=model),
        params,
        features,
        batch_size=batch_size,
        buckets=inference_buckets(max_seq_length) if bucket_lengths else None,
        progress=progress,
        desc="predict",
    )
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
