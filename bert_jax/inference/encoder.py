"""What the bare encoder computes, for any model family: sentence embeddings and attention maps.

The encoder is the checkpoint's family's base model (`loading.encoder`), so a BERT and a ModernBERT
directory run the same way; inputs a family lacks (ModernBERT's token types) are not passed. A
sentence-transformers directory says how it embeds (pooling, normalization, max_seq_length):
`embedding_options` takes those as the defaults, so that `embed` computes what
`SentenceTransformer(DIR).encode` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.inference import batches, loading
from bert_jax.models.families import EncoderConfig, Role, family_of
from bert_jax.models.pooling import (
    POOLINGS,
    SPARSE_POOLINGS,
    check_pooling,
    pool,
    pool_segments,
    splade_pool,
    splade_pool_segments,
)


class EmbeddingOptions(NamedTuple):
    """How `embed` turns the encoder's outputs into sentence embeddings."""

    pooling: str = "cls"
    normalize: bool = False
    max_seq_length: int = 128


def embedding_options(
    settings,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_seq_length: int | None = None,
) -> tuple[EmbeddingOptions, list[str]]:
    """The options of an embedding run: each one given, else the sentence-transformers
    directory's (`settings`, a `SentenceTransformerSettings` or None), else the default
    (`EmbeddingOptions()`: CLS pooling, not normalized, 128 tokens).

    A given pooling or normalization that differs from the directory's is used, with a warning:
    the embeddings are then not the ones the model was trained to produce (a probe of another
    pooling is a legitimate use, a habit carried over from another model is not). A shorter
    max_seq_length is a speed choice and warns of nothing.

    Returns:
      (the options, the warnings to show the user).
    """
    default = EmbeddingOptions()
    if settings is None:
        return EmbeddingOptions(
            pooling or default.pooling,
            default.normalize if normalize is None else normalize,
            max_seq_length or default.max_seq_length,
        ), []
    warnings = []
    for name, given, own in (
        ("pooling", pooling, settings.pooling),
        ("normalize", normalize, settings.normalize),
    ):
        if given is not None and given != own:
            warnings.append(
                f"the sentence-transformers directory says {name}={own!r}; {name}={given!r} "
                "overrides it, so these are not the embeddings the model was trained to produce"
            )
    return EmbeddingOptions(
        settings.pooling if pooling is None else pooling,
        settings.normalize if normalize is None else normalize,
        max_seq_length or settings.max_seq_length or default.max_seq_length,
    ), warnings


class EmbeddingModel(NamedTuple):
    """A checkpoint's encoder with the options to embed by (`load_for_embedding`).

    Attributes:
      config, params, tokenizer: as `loading.load_embedder` returns them.
      options: the pooling, normalization and length to use (`embedding_options`).
      warnings: what the user should be told about the options (given ones that override the
        sentence-transformers directory's).
    """

    config: EncoderConfig
    params: object
    tokenizer: object
    options: EmbeddingOptions
    warnings: list[str]

    def embed(self, texts: Sequence[str], **kwargs) -> np.ndarray:
        """`embed` of `texts` with this model's pooling, normalization and length; `kwargs`:
        embed's other arguments (batch_size, layers, pack, ...)."""
        return embed(
            self.config,
            self.params,
            self.tokenizer,
            texts,
            pooling=self.options.pooling,
            normalize=self.options.normalize,
            max_seq_length=self.options.max_seq_length,
            **kwargs,
        )


def load_for_embedding(
    path: str,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_seq_length: int | None = None,
) -> EmbeddingModel:
    """`loading.load_embedder(path)` and its `embedding_options` (the given ones, else the
    sentence-transformers directory's, else the defaults).

    Raises:
      FileNotFoundError: no tokenizer.json or vocab.txt beside the weights.
    """
    config, params, tokenizer, settings = loading.load_embedder(path)
    options, warnings = embedding_options(
        settings, pooling=pooling, normalize=normalize, max_seq_length=max_seq_length
    )
    return EmbeddingModel(config, params, tokenizer, options, warnings)


@functools.partial(jax.jit, static_argnames=("model", "pooling", "normalize", "layers"))
def embed_step(
    params,
    batch,
    *,
    model: nn.Module,
    pooling: str,
    layers: tuple[int, ...] | None,
    normalize: bool = False,
):
    """Pooled hidden states of one batch: float32 [B, P, E], P = len(layers) or 1 (last layer);
    of packed rows, one a text slot: [R, S, P, E]. With pooling "splade" (`model` a masked-LM
    head), SPLADE vectors of the logits: [B, 1, V] or [R, S, 1, V].

    Args:
      params: the encoder's parameters (an argument, never a constant of the program).
      batch: input_ids, token_type_ids, attention_mask int32 [B, L]; or packed rows
        (`batches.pack_texts`: those [R, L] with segment_ids, position_ids [R, L] and
        cls_positions [R, S]), each text pooled from its own tokens.
      model: the encoder (`loading.encoder`); pooling, layers and normalize as in `embed`.
    """
    packed = "segment_ids" in batch
    rows = {k: batch[k] for k in ("position_ids", "segment_ids", "cls_positions") if k in batch}
    out = model.apply(
        {"params": params},
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        output_hidden_states=layers is not None,
        **rows,
        **loading.token_type_inputs(model, batch["token_type_ids"]),
    )
    if pooling == "splade":  # the masked-LM logits [B, L, V] (or [R, L, V]), max-pooled
        if packed:
            slots = batch["cls_positions"].shape[1]
            return splade_pool_segments(out.logits, batch["segment_ids"], slots)[..., None, :]
        return splade_pool(out.logits, batch["attention_mask"])[..., None, :]
    states = [out.last_hidden_state] if layers is None else [out.hidden_states[i] for i in layers]
    if pooling == "pooler":
        pooled = [out.pooler_output.astype(jnp.float32)] * len(states)
    elif packed:  # [R, S, E] a state
        segments, starts = batch["segment_ids"], batch["cls_positions"]
        pooled = [pool_segments(h, segments, starts, pooling) for h in states]
    else:  # [B, E] a state
        pooled = [pool(h, batch["attention_mask"], pooling) for h in states]
    pooled = jnp.stack(pooled, axis=-2)  # [B, P, E] or [R, S, P, E]
    if normalize:  # as torch's F.normalize (sentence-transformers' Normalize): x / max(|x|, 1e-12)
        norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
        pooled = pooled / jnp.maximum(norm, 1e-12)
    return pooled


def embedder(
    config: EncoderConfig,
    params,
    *,
    pooling: str = "cls",
    normalize: bool = False,
    layers: Sequence[int] | None = None,
) -> tuple[Callable, dict]:
    """`embed_step` for `pooling`, `normalize` and `layers` (as in `embed`), and the encoder's
    parameters.

    Returns:
      (step(params, batch) -> float32 [B, P, E], the encoder's params).

    Raises:
      ValueError: an unknown pooling, "pooler" without a pooler layer, a layer out of range,
        "splade" with layers or normalization, or for a checkpoint without a masked-LM head.
    """
    check_pooling(pooling, POOLINGS + SPARSE_POOLINGS)
    if pooling in SPARSE_POOLINGS:
        model, params = _splade_model(config, params, layers, normalize)
    else:
        model, params = loading.encoder(config, params, pooled=pooling == "pooler")
    if pooling == "pooler":
        loading.check_pooler(config, params)
    if layers is not None:
        num_states = config.num_hidden_layers + 1
        bad = [i for i in layers if not -num_states <= i < num_states]
        if bad:
            raise ValueError(f"layers {bad} out of range: there are {num_states} hidden states")
    step = functools.partial(
        batches.tuned(embed_step, ("model", "pooling", "normalize", "layers")),
        model=model,
        pooling=pooling,
        normalize=normalize,
        layers=None if layers is None else tuple(int(i) for i in layers),
    )
    return step, params


def _splade_model(config: EncoderConfig, params, layers, normalize: bool):
    """The family's masked-LM model and `params` (which must hold its head), for SPLADE."""
    if layers is not None or normalize:
        raise ValueError("SPLADE vectors (--sparse) take neither --layers nor --normalize")
    family = family_of(config)
    if family.encoder_name not in params:
        raise ValueError(
            "SPLADE vectors (--sparse) pool the masked-LM head's logits; this checkpoint is the "
            f"bare encoder: give one with a masked-LM head ({family.head_for(Role.MASKED_LM)})"
        )
    return loading.masked_lm_model(config), params


def embed(
    config: EncoderConfig,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    pooling: str = "cls",
    normalize: bool = False,
    layers: Sequence[int] | None = None,
    batch_size: int = 64,
    max_seq_length: int = 128,
    bucket_lengths: bool = True,
    pack: bool = True,
    progress: bool | None = None,
) -> np.ndarray:
    """Sentence embeddings: [N, E] float32, or [N, len(layers), E] for per-layer embeddings.

    Args:
      config, params: any family's checkpoint; the params of its encoder or of any of its heads.
      tokenizer: its tokenizer; texts: N texts.
      pooling: "cls" (the first token's hidden state), "mean" (mean over real tokens, as
        sentence-transformers does), or "pooler" (the output of the encoder's pooler layer,
        a tanh layer over the first token; an error for a family or checkpoint without one);
        "splade": SPLADE vectors [N, V] of a masked-LM checkpoint (`models.pooling.splade_pool`,
        what sentence-transformers' SparseEncoder computes).
      normalize: scale each embedding to unit L2 norm (sentence-transformers' Normalize).
      layers: hidden-state indices (0 = embeddings, -1 = last layer) to pool each of.
      batch_size: texts per batch (B).
      max_seq_length: tokens kept per text (longer texts are truncated), at most the model's
        `max_sequence_length`.
      bucket_lengths: batch texts of similar length, each batch padded to the next of
        `inference_buckets(max_seq_length)`; False pads every batch to max_seq_length (the
        results are the same).
      pack: put the texts several to a row (`batches.pack_texts`), each pooled from its own
        tokens: the same embeddings (within float32 rounding) from fewer padding tokens.
      progress: show a progress bar; None: when there are at least PROGRESS_MIN_BATCHES batches.
    """
    step, params = embedder(config, params, pooling=pooling, normalize=normalize, layers=layers)
    result = batches.run_texts(
        step,
        params,
        tokenizer,
        texts,
        None,
        max_seq_length=min(max_seq_length, config.max_sequence_length),  # the model's positions
        batch_size=batch_size,
        bucket_lengths=bucket_lengths,
        pack=pack,
        progress=progress,
        desc="embed",
    )
    return result[:, 0] if layers is None else result


def attention_map(
    config: EncoderConfig,
    params,
    tokenizer,
    text: str,
    layer: int,
    head: int,
    output: str,
    text_b: str | None = None,
) -> np.ndarray:
    """Draws one layer's head's attention over a sentence as a heat map PNG; returns it [L, L]
    float32, row i the attention of query token i (a local layer's rows are zero outside its
    window).

    Args:
      config, params: any family's checkpoint; the params of its encoder or of any of its heads.
      tokenizer: its tokenizer; text (and text_b, a pair's second text): the sentence, L tokens.
      layer, head: which layer (0-based) and which of its heads.
      output: the PNG file to write.
    """
    if not 0 <= layer < config.num_hidden_layers:
        raise ValueError(f"layer must be in [0, {config.num_hidden_layers}), got {layer}")
    if not 0 <= head < config.num_attention_heads:
        raise ValueError(f"head must be in [0, {config.num_attention_heads}), got {head}")
    model, params = loading.encoder(config, params)
    encoded = batches.features(tokenizer, [text], None if text_b is None else [text_b], 512)
    n = int(encoded["attention_mask"][0].sum())
    out = model.apply(
        {"params": params},
        encoded["input_ids"][:, :n],
        output_attentions=True,
        **loading.token_type_inputs(model, encoded["token_type_ids"][:, :n]),
    )
    probs = np.asarray(out.attentions[layer][0, head], np.float32)
    tokens = [tokenizer.id_to_token(int(i)) for i in encoded["input_ids"][0, :n]]
    draw_heat_map(probs, tokens, f"layer {layer}, head {head}", output)
    return probs


def draw_heat_map(probs: np.ndarray, tokens: Sequence[str], title: str, output: str) -> None:
    """Writes `probs` [L, L] (query rows, key columns), labelled by the L `tokens`, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(tokens)
    size = max(4.0, 0.35 * n)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = ax.imshow(probs, cmap="viridis", vmin=0.0, vmax=float(probs.max()))
    ax.set_xticks(range(n), tokens, rotation=90)
    ax.set_yticks(range(n), tokens)
    ax.set_xlabel("attended token (key)")
    ax.set_ylabel("attending token (query)")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
