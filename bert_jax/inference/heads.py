"""What a task head computes, for any model family: labels of a sequence classifier, scores
of a cross-encoder (a one-output classifier over (query, passage) pairs, its logit through the
activation its directory names, as `sentence_transformers.CrossEncoder.predict`), and the
tokens a masked-LM head puts at each mask token (the tokenizer's own: BERT's "[MASK]", RoBERTa's
and XLM-R's "<mask>")."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.inference import batches, loading
from bert_jax.models.families import EncoderConfig, Role, family_of, get_model_class


@functools.partial(jax.jit, static_argnames=("model",))
def logits_step(params, batch, *, model: nn.Module):
    """Logits of one batch of a sequence classifier: float32 [B, num_labels]; of packed rows,
    one a text slot: [R, S, num_labels].

    Args:
      params: the classifier's parameters (an argument, never a constant of the program).
      batch: input_ids, token_type_ids, attention_mask int32 [B, L]; or packed rows
        (`batches.pack_texts`: segment_ids, position_ids [R, L] and cls_positions [R, S] too).
    """
    packed = {k: batch[k] for k in ("position_ids", "segment_ids", "cls_positions") if k in batch}
    out = model.apply(
        {"params": params},
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        **packed,
        **loading.token_type_inputs(model, batch["token_type_ids"]),
    )
    return out.logits.astype(jnp.float32)


def classifier_step(model: nn.Module) -> Callable:
    """`logits_step` of `model` compiled with this machine's inference options
    (`batches.tuned`): step(params, batch) -> float32 [B, num_labels]."""
    return functools.partial(batches.tuned(logits_step, ("model",)), model=model)


def classifier(
    config: EncoderConfig, name: str, command: str = "predict", dtype: str | None = None
) -> nn.Module:
    """The sequence classifier `name` of `config`'s family (what `logits_step` runs), computing
    in `dtype` (`loading.runtime`); raises ValueError, naming the head wanted, for any other
    head."""
    wanted = family_of(config).head_for(Role.SEQUENCE_CLASSIFICATION)
    if name != wanted:
        raise ValueError(f"{command} needs a sequence classifier ({wanted}), not {name}")
    return get_model_class(name)(config, loading.runtime(dtype))


def cross_encoder(config: EncoderConfig, name: str, dtype: str | None = None) -> nn.Module:
    """The classifier `name` as a cross-encoder (one output: num_labels = 1); raises ValueError
    for another head or another number of labels."""
    model = classifier(config, name, "rerank", dtype)
    if config.num_labels != 1:
        raise ValueError(
            f"rerank scores with a one-output model (num_labels=1, a cross-encoder); this "
            f"{name} has num_labels={config.num_labels}: use `predict` for its labels"
        )
    return model


# A one-output model's score from its logit (`cross_encoder.read_activation` reads which).
ACTIVATIONS = {
    "identity": lambda x: x,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


def scores(logits: np.ndarray, activation: str = "identity") -> np.ndarray:
    """A one-output model's scores: float32 [N] from logits [N, 1], through `activation`."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation](np.asarray(logits, np.float64)[:, 0]).astype(np.float32)


def label_names(config: EncoderConfig) -> tuple[str, ...]:
    """The classifier's label names (its config's, else "0", "1", ...)."""
    return config.label_names or tuple(str(i) for i in range(config.num_labels))


def probabilities(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis: float32 [N, num_labels] from logits [N, num_labels]."""
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return (probs / probs.sum(-1, keepdims=True)).astype(np.float32)


def predict(
    config: EncoderConfig,
    params,
    name: str,
    tokenizer,
    texts,
    texts_b=None,
    *,
    batch_size: int = 64,
    max_seq_length: int = 128,
    bucket_lengths: bool = True,
    pack: bool = True,
    progress: bool | None = None,
    activation: str = "identity",
    dtype: str | None = None,
) -> list[dict]:
    """Labels and probabilities of a sequence classification (or regression) model.

    Args:
      config, params, name: the classifier (its family's sequence classification head).
      tokenizer: its tokenizer; texts (and texts_b, pairs' second texts): N texts.
      Batching (`batch_size`, `max_seq_length`, `bucket_lengths`, `pack`, `progress`) is as in
        `embed`.
      activation: a regression's score from its logit (`ACTIVATIONS`; a cross-encoder's, from
        `checkpoints.cross_encoder.read_activation`: "sigmoid" for most).
      dtype: the compute dtype (`loading.runtime`; None: float32).

    Returns:
      N dicts: {"label": name, "probabilities": {name: float}}, or {"score": float} for a
      regression (num_labels = 1).
    """
    model = classifier(config, name, dtype=dtype)
    batching = batches.TextBatching(max_seq_length, batch_size, bucket_lengths, pack, progress)
    logits = batching.run(
        config, classifier_step(model), params, tokenizer, texts, texts_b, "predict"
    )
    if config.num_labels == 1:
        return [{"score": float(x)} for x in scores(logits, activation)]
    names = label_names(config)
    probs = probabilities(logits)
    return [
        {"label": names[int(np.argmax(p))], "probabilities": dict(zip(names, map(float, p)))}
        for p in probs
    ]


def top_predictions(
    model, params, features, positions: np.ndarray, top_k: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """The `top_k` tokens an MLM head puts at given positions, and their probabilities.

    Args:
      model: a masked-LM head of any family (class attribute `masked_lm`; any runtime).
      params: its parameters.
      features: {"input_ids", "token_type_ids", "attention_mask"}: int [N, L].
      positions: int [N, P], the positions to predict (the [MASK]s).
      top_k: K.

    Returns:
      (token ids int32 [N, P, K], probabilities float32 [N, P, K]), most probable first.
    """
    if not getattr(model, "masked_lm", False):
        raise ValueError(
            f"{type(model).__name__} has no MLM head; use one of "
            f"{loading.masked_lm_heads(model.config)}"
        )
    positions = np.asarray(positions, np.int32)

    @jax.jit
    def run(params, input_ids, token_type_ids, attention_mask, positions):
        out = model.apply(
            {"params": params},
            input_ids,
            attention_mask=attention_mask,
            masked_positions=positions,
            **loading.token_type_inputs(model, token_type_ids),
        )
        logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
        probs, ids = jax.lax.top_k(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), top_k)
        return ids, probs

    ids, probs = run(
        params, *(np.asarray(features[k], np.int32) for k in batches.INPUT_COLUMNS), positions
    )
    return np.asarray(ids, np.int32), np.asarray(probs, np.float32)


# BERT's mask token, which texts for another family's fill-mask may use in place of its own.
BERT_MASK = "[MASK]"


def with_mask_token(texts: Sequence[str], tokenizer) -> list[str]:
    """`texts` with BERT's "[MASK]" read as the tokenizer's own mask token ("<mask>") where that
    is unambiguous: the tokenizer's token is not "[MASK]", "[MASK]" is no token of its vocabulary
    and the text holds no token of its own; any other text is as given."""
    own = tokenizer.mask_token
    if own == BERT_MASK or tokenizer.token_to_id(BERT_MASK) is not None:
        return list(texts)
    return [t if own in t else t.replace(BERT_MASK, own) for t in texts]


def _mask_positions(input_ids: np.ndarray, tokenizer, texts) -> tuple[np.ndarray, np.ndarray]:
    """Each row's mask token positions, int32 [N, P] (P: the most masks of a row; a row with
    fewer ends in zeros), and each row's count [N]; raises ValueError naming a text without one
    and the tokenizer's mask token."""
    is_mask = input_ids == tokenizer.mask_id
    counts = is_mask.sum(1)
    if not counts.all():
        i = int(np.argmin(counts))
        raise ValueError(
            f"text {i + 1} ({texts[i]!r}) has no {tokenizer.mask_token} (or it was truncated)"
        )
    positions = np.zeros((len(texts), int(counts.max())), np.int32)
    for i, row in enumerate(is_mask):
        where = np.flatnonzero(row)
        positions[i, : len(where)] = where
    return positions, counts


def token_text(tokenizer, token_id: int) -> str:
    """What one token reads as in text ("less" for byte-level BPE's "Ġless", "world" for
    Unigram's "▁world"): its decoding, stripped; the piece itself where that is empty (a special
    token)."""
    return tokenizer.decode([int(token_id)]).strip() or tokenizer.id_to_token(token_id)


def fill_mask(
    config: EncoderConfig,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    head: str | None = None,
    top_k: int = 5,
    max_seq_length: int = 512,
) -> list[list[list[dict]]]:
    """The most probable tokens for every mask token of every text.

    Args:
      config, params: a masked-LM checkpoint of any family (`load_masked_lm`).
      tokenizer: its tokenizer; its `mask_token` ("[MASK]", "<mask>") in a text masks it there
        ("[MASK]" stands for "<mask>" where that is unambiguous: `with_mask_token`).
      texts: N texts, each with at least one mask token.
      head: the class `params` belong to (e.g. "BertForPreTraining"); None: the family's masked
        LM (BertForMaskedLM, ModernBertForMaskedLM).
      top_k: candidates per mask.
      max_seq_length: longer texts are cut (to at most the model's `max_sequence_length`).

    Returns:
      For each text, for each of its masks in order, `top_k` dicts {"token": the piece (str),
      "text": what it reads as (`token_text`: "less" for "Ġless"), "token_id": int, "score":
      float probability}, most probable first (as transformers' fill-mask).
    """
    if top_k < 1 or top_k > config.vocab_size:
        raise ValueError(f"top_k must be in [1, {config.vocab_size}], got {top_k}")
    model = loading.masked_lm_model(config, head)
    texts = with_mask_token(texts, tokenizer)
    encoded = batches.features(
        tokenizer, texts, None, min(max_seq_length, config.max_sequence_length)
    )
    longest = int(encoded["attention_mask"].sum(1).max())
    encoded = {k: encoded[k][:, :longest] for k in batches.INPUT_COLUMNS}
    positions, counts = _mask_positions(encoded["input_ids"], tokenizer, texts)
    ids, probs = top_predictions(model, params, encoded, positions, top_k)
    return [
        [
            [
                {
                    "token": tokenizer.id_to_token(t),
                    "text": token_text(tokenizer, t),
                    "token_id": int(t),
                    "score": float(p),
                }
                for t, p in zip(ids[i, j], probs[i, j])
            ]
            for j in range(int(counts[i]))
        ]
        for i in range(len(texts))
    ]
