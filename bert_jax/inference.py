"""Using a trained model: embeddings of a text file, batch prediction, attention heat maps.

    python -m bert_jax.inference embed --model DIR --input texts.txt --output emb.npy --pooling mean
    python -m bert_jax.inference predict --model runs/genre --input lines.txt --output preds.jsonl
    python -m bert_jax.inference attention --model DIR --text "Fair is foul" --layer 2 --head 0 \\
        --output attention.png
    python -m bert_jax.inference fill-mask --model runs/pretrain_tiny "to be or not to [MASK] ..."

`--model` is a Hugging Face directory, a bert_jax export, a train.py or fine-tuning workdir; the
tokenizer (tokenizer.json / vocab.txt) is taken from beside it. Input files hold one text a line, in
UTF-8 (a tab separates the two texts of a pair); output row i is input line i. A blank line before
the last text is an error naming it (blank lines at the end are dropped), and so are bytes that are
not UTF-8 (naming the line and byte offset).
"""

from __future__ import annotations

import argparse
import dataclasses
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

from bert_jax import tokenization
from bert_jax.checkpoints import pretrained, table
from bert_jax.data import batching
from bert_jax.data.text_io import encode_texts
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.bert.model import BertForMaskedLM, BertModel
from bert_jax.models.families import get_model_class

POOLINGS = ("cls", "mean", "pooler")
PROGRESS_MIN_BATCHES = 20  # a progress bar from this many batches on (`progress=None`)


def load(path: str, model: str | None = None):
    """(config, params, model class name, tokenizer) for inference from any checkpoint path."""
    loaded = pretrained.from_pretrained(path, model)
    if loaded.tokenizer is None:
        raise FileNotFoundError(f"no tokenizer.json or vocab.txt beside {path}")
    return loaded.config, loaded.params, loaded.head, loaded.tokenizer


def read_texts(path: str) -> tuple[list[str], list[str] | None]:
    """The texts of a file, one a line, so that output row i belongs to line i + 1; "a<TAB>b"
    lines (every line) make pairs.

    Blank lines at the end of the file are dropped; a blank line before the last text is an
    error naming it (a row of its own would be an embedding of nothing; skipping it would shift
    every later row). Bytes that are not UTF-8 are an error naming the line and byte offset,
    never replaced.

    Raises:
      ValueError: a blank line, invalid UTF-8, or no text at all, naming `path` and the line.
    """
    with open(path, "rb") as f:
        raw = f.read()
    lines, offset = [], 0
    for number, chunk in enumerate(raw.split(b"\n"), start=1):
        try:
            line = chunk.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}: line {number} is not UTF-8: byte offset {offset + e.start} in the file "
                f"(byte {e.start} of the line) is {chunk[e.start : e.start + 1]!r}; save the "
                "file as UTF-8"
            ) from None
        lines.append(line.rstrip("\r").removeprefix("\ufeff") if number == 1 else line.rstrip("\r"))
        offset += len(chunk) + 1
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError(f"{path} holds no text")
    blank = [i for i, line in enumerate(lines, start=1) if not line.strip()]
    if blank:
        raise ValueError(
            f"{path}: line {blank[0]} is blank ({len(blank)} blank line(s) before the last text:"
            f" {blank[:10]}); every line is one text and output row i is line i, so remove them "
            "or put text there"
        )
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
        {"params": params},
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        **_token_types(model, batch["token_type_ids"]),
    )
    return out.logits.astype(jnp.float32)


def _token_types(model: nn.Module, token_type_ids) -> dict:
    """{"token_type_ids": ...} for a head that reads them; {} for a family without (ModernBERT)."""
    return {"token_type_ids": token_type_ids} if getattr(model, "token_types", True) else {}


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
    if not name.endswith("ForSequenceClassification"):
        raise ValueError(
            f"predict needs a sequence classifier (BertForSequenceClassification, "
            f"ModernBertForSequenceClassification), not {name}"
        )
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


# ---- fill-mask: what a masked-LM head predicts ----
MLM_MODELS = ("BertForMaskedLM", "BertForPreTraining", "ModernBertForMaskedLM")


def load_masked_lm(path: str):
    """(config, BertForMaskedLM params, tokenizer) of any checkpoint with an MLM head.

    Raises:
      ValueError: the checkpoint has no MLM head (`cls/predictions`), e.g. a sentence encoder.
    """
    try:
        config, params, _, tokenizer = load(path, "BertForMaskedLM")
    except table.ConversionError as err:
        if "cls/predictions" not in str(err):
            raise
        raise ValueError(
            f"{path} has no masked-LM head (no cls/predictions weights), so it cannot fill in "
            f"[MASK]: fill-mask needs a {' or '.join(MLM_MODELS)} checkpoint"
        ) from None
    return config, params, tokenizer


def top_predictions(
    model, params, features, positions: np.ndarray, top_k: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """The `top_k` tokens an MLM head puts at given positions, and their probabilities.

    Args:
      model: an MLM head (BertForMaskedLM, BertForPreTraining, ModernBertForMaskedLM; any
        runtime).
      params: its parameters.
      features: {"input_ids", "token_type_ids", "attention_mask"}: int [N, L].
      positions: int [N, P], the positions to predict (the [MASK]s).
      top_k: K.

    Returns:
      (token ids int32 [N, P, K], probabilities float32 [N, P, K]), most probable first.
    """
    if not getattr(model, "masked_lm", False):
        raise ValueError(f"{type(model).__name__} has no MLM head; use one of {MLM_MODELS}")
    positions = np.asarray(positions, np.int32)

    @jax.jit
    def run(params, input_ids, token_type_ids, attention_mask, positions):
        out = model.apply(
            {"params": params},
            input_ids,
            attention_mask=attention_mask,
            masked_positions=positions,
            **_token_types(model, token_type_ids),
        )
        logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
        probs, ids = jax.lax.top_k(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), top_k)
        return ids, probs

    columns = ("input_ids", "token_type_ids", "attention_mask")
    ids, probs = run(params, *(np.asarray(features[k], np.int32) for k in columns), positions)
    return np.asarray(ids, np.int32), np.asarray(probs, np.float32)


def fill_mask(
    config: BertConfig,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    top_k: int = 5,
    max_seq_length: int = 512,
) -> list[list[list[dict]]]:
    """The most probable tokens for every [MASK] of every text.

    Args:
      config, params: a BertForMaskedLM (`load_masked_lm`).
      tokenizer: its WordPiece tokenizer; "[MASK]" in a text is its mask token.
      texts: N texts, each with at least one [MASK].
      top_k: candidates per [MASK].
      max_seq_length: longer texts are cut (to at most the model's max_position_embeddings).

    Returns:
      For each text, for each of its [MASK]s in order, `top_k` dicts {"token": str, "token_id":
      int, "score": float probability}, most probable first (as transformers' fill-mask).
    """
    if top_k < 1 or top_k > config.vocab_size:
        raise ValueError(f"top_k must be in [1, {config.vocab_size}], got {top_k}")
    features = _features(
        tokenizer, texts, None, min(max_seq_length, config.max_position_embeddings)
    )
    longest = int(features["attention_mask"].sum(1).max())
    features = {k: v[:, :longest] for k, v in features.items() if k != "example_weights"}
    is_mask = features["input_ids"] == tokenizer.mask_id
    counts = is_mask.sum(1)
    if not counts.all():
        i = int(np.argmin(counts))
        raise ValueError(f"text {i + 1} ({texts[i]!r}) has no [MASK] (or it was truncated)")
    positions = np.zeros((len(texts), int(counts.max())), np.int32)
    for i, row in enumerate(is_mask):
        where = np.flatnonzero(row)
        positions[i, : len(where)] = where
    ids, probs = top_predictions(BertForMaskedLM(config), params, features, positions, top_k)
    return [
        [
            [
                {"token": tokenizer.id_to_token(t), "token_id": int(t), "score": float(p)}
                for t, p in zip(ids[i, j], probs[i, j])
            ]
            for j in range(int(counts[i]))
        ]
        for i in range(len(texts))
    ]


def masked_examples(batch, tokenizer, num_examples: int = 4, context_tokens: int = 20):
    """Held-out lines with one whole word masked, for showing what a pretrained model learned.

    From a pretraining batch, each row's original tokens (its masks undone) are cut to a window
    of the first segment, and the alphabetic whole word nearest the window's middle is masked.

    Args:
      batch: a host pretraining batch: input_ids, token_type_ids, masked_lm_positions,
        masked_lm_ids, masked_lm_weights ([B, L] and [B, P]).
      tokenizer: the batch's WordPiece tokenizer.
      num_examples: N, at most B.
      context_tokens: the window's length in tokens.

    Returns:
      (features {"input_ids", "token_type_ids", "attention_mask"} int32 [N, W + 2],
       positions int32 [N, 1], texts with "[MASK]" [N], answers [N]).
    """
    ids = np.array(batch["input_ids"])
    rows = np.arange(ids.shape[0])[:, None]
    real = np.asarray(batch["masked_lm_weights"]) > 0
    ids[rows.repeat(real.shape[1], 1)[real], np.asarray(batch["masked_lm_positions"])[real]] = (
        np.asarray(batch["masked_lm_ids"])[real]
    )
    special = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id}
    width = context_tokens + 2
    out_ids, positions, texts, answers = [], [], [], []
    for row, types in zip(ids, np.asarray(batch["token_type_ids"])):
        words = [int(t) for t, s in zip(row, types) if s == 0 and int(t) not in special]
        window = words[:context_tokens]
        pieces = [tokenizer.id_to_token(t) for t in window]
        whole = [
            i
            for i, p in enumerate(pieces)
            if p.isalpha()
            and not p.startswith("##")
            and (i + 1 == len(pieces) or not pieces[i + 1].startswith("##"))
        ]
        if len(window) < 6 or not whole:
            continue
        target = min(whole, key=lambda i: abs(i - len(window) / 2))
        answers.append(pieces[target])
        pieces[target] = tokenization.MASK
        texts.append(_join_pieces(pieces))
        window[target] = tokenizer.mask_id
        row_ids = [tokenizer.cls_id, *window, tokenizer.sep_id]
        out_ids.append(row_ids + [tokenizer.pad_id] * (width - len(row_ids)))
        positions.append([target + 1])
        if len(texts) == num_examples:
            break
    if not texts:
        raise ValueError("the batch holds no line with a whole word to mask")
    input_ids = np.array(out_ids, np.int32)
    features = {
        "input_ids": input_ids,
        "token_type_ids": np.zeros_like(input_ids),
        "attention_mask": (input_ids != tokenizer.pad_id).astype(np.int32),
    }
    return features, np.array(positions, np.int32), texts, answers


def _join_pieces(pieces: Sequence[str]) -> str:
    """WordPiece strings back to text ("##" pieces glued to the word before)."""
    text = ""
    for p in pieces:
        text += p[2:] if p.startswith("##") else (" " if text else "") + p
    return text


def format_predictions(texts, answers, columns, id_to_token) -> str:
    """Masked lines, each with every column's top predictions and their probabilities.

    Args:
      texts: N lines with [MASK]; answers: N masked words (or None).
      columns: (title, ids [N, 1, K], probs [N, 1, K]) per column, e.g. before and after training.
      id_to_token: token id -> string.
    """
    lines = []
    for i, text in enumerate(texts):
        lines.append(f"  {text}" + (f"   (masked: {answers[i]})" if answers else ""))
        for title, ids, probs in columns:
            guesses = ", ".join(f"{id_to_token(t)} {p:.2f}" for t, p in zip(ids[i, 0], probs[i, 0]))
            lines.append(f"    {title}: {guesses}")
    return "\n".join(lines)


@dataclasses.dataclass
class FillMaskDemo:
    """Held-out lines with a whole word masked, and a model's top guesses there at chosen steps
    (the pretraining job shows them before and after training).

    Attributes:
      features: {"input_ids", "token_type_ids", "attention_mask"} int32 [N, W + 2].
      positions: int32 [N, 1], each line's masked position.
      texts: the N lines, "[MASK]" in place of the word.
      answers: the N masked words.
      tokenizer: the lines' WordPiece tokenizer.
      columns: (title, token ids int32 [N, 1, K], probabilities float32 [N, 1, K]), one per
        `predict` call, in order.
    """

    features: dict[str, np.ndarray]
    positions: np.ndarray
    texts: list[str]
    answers: list[str]
    tokenizer: tokenization.WordPieceTokenizer
    columns: list[tuple[str, np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)

    def predict(self, model, params, label: str) -> None:
        """Adds a column titled `label`: the top guesses of `model` (an MLM head) under `params`."""
        self.columns.append((label, *top_predictions(model, params, self.features, self.positions)))

    def format(self) -> str:
        """A title line, then each line with every column's guesses (`format_predictions`)."""
        rows = format_predictions(
            self.texts, self.answers, self.columns, self.tokenizer.id_to_token
        )
        return "Held-out lines with a word masked, and the model's top guesses:\n" + rows


def fill_mask_demo(batch, tokenizer_path: str | None, num_examples: int = 4) -> FillMaskDemo | None:
    """Held-out lines of a pretraining batch to show a model's guesses on (`masked_examples`).

    Args:
      batch: a host pretraining batch (input_ids, token_type_ids [B, L]; masked_lm_positions,
        masked_lm_ids, masked_lm_weights [B, P]).
      tokenizer_path: the batch's vocabulary file (vocab.txt or tokenizer.json), or None.
      num_examples: N, the lines to show (at most B).

    Returns:
      The demonstration, no column predicted yet; None where it cannot run: no tokenizer file at
      `tokenizer_path`, or several processes.
    """
    if not (tokenizer_path and os.path.isfile(tokenizer_path)):
        return None
    if jax.process_count() > 1:  # the host-side demonstration needs every parameter on one host
        return None
    tokenizer = tokenization.load_tokenizer(tokenizer_path)
    return FillMaskDemo(*masked_examples(batch, tokenizer, num_examples), tokenizer)


def _parser() -> argparse.ArgumentParser:
    """The command line: the subcommands embed, predict, attention and fill-mask."""
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
    f = sub.add_parser("fill-mask", help="the most probable tokens for each [MASK] of a text")
    f.add_argument("texts", nargs="+", help='texts with "[MASK]" in them')
    f.add_argument("--top_k", type=int, default=5)
    f.add_argument("--json", action="store_true", help="print JSON lines, one per text")
    for s in (e, p, a, f):
        s.add_argument("--model", required=True, help="checkpoint or run directory")
    for s in (e, p, a):
        s.add_argument("--output", required=True)
    for s in (e, p):
        s.add_argument(
            "--input",
            required=True,
            help="UTF-8 text, one text a line (TAB separates a pair); row i of the output is "
            "line i; a blank line (but at the end) is an error",
        )
        s.add_argument("--batch_size", type=int, default=64)
        s.add_argument("--max_seq_length", type=int, default=128)
    return parser


def _run_embed(args: argparse.Namespace) -> None:
    """`embed`: writes the --input lines' float32 [N, E] (or [N, len(layers), E]) embeddings."""
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


def _run_predict(args: argparse.Namespace) -> None:
    """`predict`: writes a JSON line per --input line, its text and prediction, to --output."""
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


def _run_fill_mask(args: argparse.Namespace) -> None:
    """`fill-mask`: prints each text's top --top_k tokens per [MASK] (JSON lines with --json)."""
    config, params, tokenizer = load_masked_lm(args.model)
    results = fill_mask(config, params, tokenizer, args.texts, top_k=args.top_k)
    for text, masks in zip(args.texts, results):
        if args.json:
            print(json.dumps({"text": text, "masks": masks}))
            continue
        print(text)
        for j, candidates in enumerate(masks):
            guesses = "  ".join(f"{c['token']} {c['score']:.3f}" for c in candidates)
            print(f"  [MASK] {j + 1}: {guesses}")


def _run_attention(args: argparse.Namespace) -> None:
    """`attention`: writes the heat map PNG of --layer's --head on --text to --output."""
    config, params, _, tokenizer = load(args.model, "BertModel")
    attention_map(config, params, tokenizer, args.text, args.layer, args.head, args.output)
    print(f"wrote {args.output}")


_COMMANDS = {
    "embed": _run_embed,
    "predict": _run_predict,
    "fill-mask": _run_fill_mask,
    "attention": _run_attention,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line (`argv`, default sys.argv); 1 after an error it printed, else 0."""
    args = _parser().parse_args(argv)
    try:
        _COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from bert_jax import cli  # a user's mistake: `error: <message>`, status 1; Ctrl-C: 130

    sys.exit(cli.run(main))
