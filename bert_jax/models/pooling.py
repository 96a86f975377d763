"""Pooling: one vector per text from an encoder's token states, for every user of it.

Dimensions: B texts, R packed rows, S text slots a packed row, L tokens, E hidden.

The poolings bert_jax computes, and how each is written in sentence-transformers' `Pooling`
module (`1_Pooling/config.json`: one flag per mode in formats 2-5, `pooling_mode` in 6.x):

    name      the vector                                         sentence-transformers
    "mean"    the mean of the text's real tokens' states         pooling_mode_mean_tokens
    "cls"     the text's first token's state ([CLS], <s>)        pooling_mode_cls_token
    "pooler"  the encoder's pooler layer (tanh(W h_cls + b))     (none: not exportable)
    "splade"  max over the text's real tokens of log(1 + relu(   SpladePooling (max, relu) after
              the masked-LM logits)): a sparse [V] vector        an MLMTransformer (a SparseEncoder)

Who takes which:
  SENTENCE_POOLINGS  the embedding job trains them (the contrastive objective), and
                     sentence-transformers directories are written and read with them
                     (`checkpoints.sentence_transformers`).
  POOLINGS           `python -m bert_jax.inference embed --pooling` (`inference.encoder`): those
                     and the pooler layer, for a family and checkpoint that have one.
  CLASSIFIER_POOLINGS ModernBERT's `classifier_pooling` (its classifier heads' input, computed in
                     its model: "cls" is the first *real* token there, as transformers reads it).
  EUROBERT_CLASSIFIER_POOLINGS  EuroBERT's (transformers' EuroBertForSequenceClassification):
                     "bos" the first token's state, "mean" the real tokens' mean, "late" every
                     token classified, then the logits averaged over the real tokens.

  SPARSE_POOLINGS    the SPLADE model (`training.splade`, `inference embed --sparse`): pooled
                     from the logits of any family's masked-LM head (`Role.MASKED_LM`), not from
                     the hidden states, so that a text is a weight per vocabulary entry.

`pool` and `pool_segments` compute "mean" and "cls" (the pooler is a layer of the model);
`splade_pool` and `splade_pool_segments` compute "splade"; `token_presence` the query side of
an inference-free SPLADE model (`training.splade.InferenceFreeObjective`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

SENTENCE_POOLINGS = ("mean", "cls")
SPARSE_POOLINGS = ("splade",)
POOLINGS = ("cls", "mean", "pooler")
CLASSIFIER_POOLINGS = ("cls", "mean")
EUROBERT_CLASSIFIER_POOLINGS = ("bos", "mean", "late")
# sentence-transformers' Pooling flags (formats 2-5) and the mode each stands for; bert_jax
# computes those of SENTENCE_POOLINGS, the others are read only to name them in an error.
ST_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def check_pooling(pooling: str, choices: tuple[str, ...] = SENTENCE_POOLINGS) -> None:
    """Raises ValueError naming `pooling` and `choices` where it is not one of them."""
    if pooling not in choices:
        raise ValueError(f"pooling must be one of {choices}, got {pooling!r}")


def pool(hidden: jax.Array, attention_mask: jax.Array, pooling: str) -> jax.Array:
    """Sentence embeddings as sentence-transformers' Pooling module computes them.

    Args:
      hidden: token states [..., L, E] (any float dtype).
      attention_mask: int [..., L], 1 for a real token.
      pooling: "mean" (over the real tokens) or "cls" (position 0's state).

    Returns:
      float32 [..., E].
    """
    hidden = hidden.astype(jnp.float32)
    if pooling == "cls":
        return hidden[..., 0, :]
    mask = attention_mask[..., None].astype(jnp.float32)
    return (hidden * mask).sum(-2) / jnp.maximum(mask.sum(-2), 1.0)


def pool_segments(
    hidden: jax.Array, segment_ids: jax.Array, cls_positions: jax.Array, pooling: str
) -> jax.Array:
    """`pool` of each text of packed rows, from its own tokens.

    Args:
      hidden: token states [R, L, E].
      segment_ids: int [R, L]: slot s holds segment id s + 1, 0 padding.
      cls_positions: int [R, S]: each slot's first token.
      pooling: "mean" or "cls".

    Returns:
      float32 [R, S, E] (an empty slot's vector is meaningless).
    """
    hidden = hidden.astype(jnp.float32)
    if pooling == "cls":
        return jnp.take_along_axis(hidden, cls_positions[..., None].astype(jnp.int32), axis=1)
    slots = jnp.arange(1, cls_positions.shape[1] + 1)
    weights = (segment_ids[:, None, :] == slots[None, :, None]).astype(jnp.float32)  # [R, S, L]
    total = jnp.einsum("rsl,rle->rse", weights, hidden)
    return total / jnp.maximum(weights.sum(-1, keepdims=True), 1.0)


def splade_activation(logits: jax.Array) -> jax.Array:
    """log(1 + relu(logits)), float32, of any shape: each token's weight for each vocabulary
    entry (SPLADE's log saturation: >= 0, growing slowly with the logit)."""
    return jnp.log1p(jax.nn.relu(logits.astype(jnp.float32)))


def splade_pool(logits: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """SPLADE vectors as sentence-transformers' SpladePooling (max, relu) computes them: the
    maximum over a text's real tokens of `splade_activation` of its masked-LM logits.

    Args:
      logits: masked-LM logits [..., L, V] (any float dtype).
      attention_mask: int [..., L], 1 for a real token (a padding token's weights are 0, the
        least any weight can be).

    Returns:
      float32 [..., V], every entry >= 0 (mostly 0 in a trained model).

    log1p is monotone, so the maximum is taken of relu(logits) first (a padding token's 0) and
    the logarithm applied to [..., V] rather than [..., L, V]: the same values and gradients
    (tests/embed/splade_test.py) without a logarithm for every token's every entry.
    """
    mask = attention_mask[..., None].astype(jnp.float32)
    return jnp.log1p((jax.nn.relu(logits.astype(jnp.float32)) * mask).max(axis=-2))


def splade_pool_segments(logits: jax.Array, segment_ids: jax.Array, num_slots: int) -> jax.Array:
    """`splade_pool` of each text of packed rows, from its own tokens.

    Args:
      logits: masked-LM logits [R, L, V].
      segment_ids: int [R, L]: slot s holds segment id s + 1, 0 padding.
      num_slots: S, the slots a row.

    Returns:
      float32 [R, S, V] (an empty slot's vector is 0).
    """
    rows, length, vocab = logits.shape
    # Token (r, l) of slot s goes to segment r * S + s; padding to the dropped segment R * S.
    slot = segment_ids.astype(jnp.int32) - 1
    segment = jnp.where(slot >= 0, jnp.arange(rows)[:, None] * num_slots + slot, rows * num_slots)
    pooled = jax.ops.segment_max(  # the raw logits' maximum first, then the activation
        logits.reshape(rows * length, vocab),
        segment.reshape(-1),
        num_segments=rows * num_slots + 1,
    )
    return splade_activation(pooled[:-1]).reshape(rows, num_slots, vocab)  # empty: -inf -> 0


def token_presence(
    input_ids: jax.Array, segment_ids: jax.Array, vocab_size: int, num_slots: int = 1
) -> jax.Array:
    """Which vocabulary entries each text holds, its first and last tokens (the special tokens
    that start and end it: [CLS] and [SEP], <s> and </s>) aside: an inference-free SPLADE
    model's query is these times a weight per entry (sentence-transformers'
    `SparseStaticEmbedding`, which tokenizes queries without special tokens).

    Args:
      input_ids: int [R, L].
      segment_ids: int [R, L]: slot s holds segment id s + 1, 0 padding (an unpadded row's
        attention mask is a row of one slot).
      vocab_size: V; num_slots: S, the slots a row.

    Returns:
      float32 [R, S, V]: 1 where slot s holds the entry, else 0.
    """
    rows = input_ids.shape[0]
    segments = segment_ids.astype(jnp.int32)
    before = jnp.pad(segments[:, :-1], ((0, 0), (1, 0)))
    after = jnp.pad(segments[:, 1:], ((0, 0), (0, 1)))
    inner = (segments > 0) & (before == segments) & (after == segments)
    slot = jnp.where(inner, segments - 1, num_slots)  # the rest: a dropped slot
    out = jnp.zeros((rows, num_slots + 1, vocab_size), jnp.float32)
    out = out.at[jnp.arange(rows)[:, None], slot, input_ids].set(1.0)
    return out[:, :num_slots]


def st_splade_pooling_config(vocab_size: int) -> dict:
    """The `SpladePooling` module's config.json: max pooling of log(1 + relu(logits)) over the
    vocabulary's `vocab_size` entries."""
    return {
        "pooling_strategy": "max",
        "activation_function": "relu",
        "word_embedding_dimension": vocab_size,
    }


def st_pooling_config(pooling: str, hidden_size: int) -> dict:
    """The `1_Pooling/config.json` of `pooling` (one of SENTENCE_POOLINGS), in the flags format
    every sentence-transformers version since 2 reads."""
    check_pooling(pooling)
    flags = {flag: mode == pooling for flag, mode in ST_POOLING_FLAGS.items()}
    return {"word_embedding_dimension": hidden_size, **flags, "include_prompt": True}


def st_pooling_modes(config: dict) -> list[str]:
    """The modes a `1_Pooling/config.json` sets, either format (none set in the flags format
    means mean, as sentence-transformers reads it); the caller checks there is one it computes."""
    mode = config.get("pooling_mode")
    if mode is None:
        return [m for flag, m in ST_POOLING_FLAGS.items() if config.get(flag)] or ["mean"]
    return [mode] if isinstance(mode, str) else list(mode)
