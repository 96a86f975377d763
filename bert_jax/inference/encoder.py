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

from bert_jax.checkpoints.sentence_transformers import read_static_queries, resolve_prompt
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
    """How `embed` turns the encoder's outputs into sentence embeddings.

    Attributes:
      pooling, normalize, max_seq_length: as `embed` takes them.
      prompt: the text put before each text (a sentence-transformers prompt; "" none).
      truncate_dim: the embedding's first dimensions kept (Matryoshka), after normalization, as
        `SentenceTransformer.encode(truncate_dim=...)` keeps them; None: all.
      max_active_dims: a SPLADE vector's largest weights kept, the rest set to 0
        (`keep_max_active_dims`), as `SparseEncoder.encode(max_active_dims=...)` keeps them;
        None: all.
    """

    pooling: str = "cls"
    normalize: bool = False
    max_seq_length: int = 128
    prompt: str = ""
    truncate_dim: int | None = None
    max_active_dims: int | None = None


def embedding_options(
    settings,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_seq_length: int | None = None,
    prompt_name: str | None = None,
    prompt: str | None = None,
    task: str | None = None,
    truncate_dim: int | None = None,
    max_active_dims: int | None = None,
) -> tuple[EmbeddingOptions, list[str]]:
    """The options of an embedding run: each one given, else the sentence-transformers
    directory's (`settings`, a `SentenceTransformerSettings` or None), else the default
    (`EmbeddingOptions()`: CLS pooling, not normalized, 128 tokens); the prompt as
    `resolve_prompt` chooses it; `truncate_dim` as given; `max_active_dims` given, else a
    SparseEncoder directory's (config_sentence_transformers.json) where the pooling is SPLADE,
    else None.

    A given pooling or normalization that differs from the directory's is used, with a warning:
    the embeddings are then not the ones the model was trained to produce (a probe of another
    pooling is a legitimate use, a habit carried over from another model is not). A shorter
    max_seq_length is a speed choice and warns of nothing.

    Returns:
      (the options, the warnings to show the user).
    """
    default = EmbeddingOptions()
    text = resolve_prompt(settings, prompt_name, prompt, task)
    if settings is None:
        return EmbeddingOptions(
            pooling or default.pooling,
            default.normalize if normalize is None else normalize,
            max_seq_length or default.max_seq_length,
            text,
            truncate_dim,
            max_active_dims,
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
    pooling = settings.pooling if pooling is None else pooling
    if max_active_dims is None and pooling == "splade":  # a SparseEncoder's own count
        max_active_dims = settings.max_active_dims
    if normalize is None:  # SPLADE vectors are never normalized: a dense directory's Normalize
        normalize = settings.normalize and pooling != "splade"  # is its dense pooling's
    return EmbeddingOptions(
        pooling,
        normalize,
        max_seq_length or settings.max_seq_length or default.max_seq_length,
        text,
        truncate_dim,
        max_active_dims,
    ), warnings


class StaticQueries(NamedTuple):
    """An inference-free SparseEncoder's query side (its `SparseStaticEmbedding`): a query's
    vector is the weights of the tokens it holds, zero elsewhere; no model runs.

    Attributes:
      weight: float32 [V], one a vocabulary entry.
      tokenizer: the module's tokenizer; a query's tokens are its own, without special tokens.
      max_length: tokens a query keeps (None: all).
    """

    weight: np.ndarray
    tokenizer: object
    max_length: int | None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [N, V]: each text's tokens' weights (`SparseStaticEmbedding.forward`)."""
        out = np.zeros((len(texts), self.weight.shape[0]), np.float32)
        for row, ids in zip(out, self.tokenizer.encode_batch(list(texts))):
            ids = ids[: self.max_length]
            row[ids] = self.weight[ids]
        return out


class EmbeddingModel(NamedTuple):
    """A checkpoint's encoder with the options to embed by (`load_for_embedding`).

    Attributes:
      config, params, tokenizer: as `loading.load_embedder` returns them.
      options: the pooling, normalization, length, prompt and dimensions to use
        (`embedding_options`).
      warnings: what the user should be told about the options (given ones that override the
        sentence-transformers directory's).
      settings: the sentence-transformers directory's (None: none), whose prompts `for_task`
        chooses from.
      queries: an inference-free SparseEncoder's query side (None: queries run the model).
      task: "query" or "document" (`for_task`); None: the directory's default route.
    """

    config: EncoderConfig
    params: object
    tokenizer: object
    options: EmbeddingOptions
    warnings: list[str]
    settings: object = None
    queries: StaticQueries | None = None
    task: str | None = None

    def embed(self, texts: Sequence[str], **kwargs) -> np.ndarray:
        """`embed` of `texts` with this model's options (pooling, normalization, length,
        prompt, dimensions); `kwargs`: embed's other arguments (batch_size, layers, pack, ...).
        An inference-free SparseEncoder's queries are its `StaticQueries`' vectors."""
        if self.static_route():  # refused as the documents' SPLADE vectors refuse them:
            check_splade_options(kwargs.get("layers"), self.options.normalize)
            check_truncate_dim(self.config, "splade", self.options.truncate_dim)
            vectors = self.queries.embed([self.options.prompt + text for text in texts])
            return keep_max_active_dims(vectors, "splade", self.options.max_active_dims)
        return embed(
            self.config, self.params, self.tokenizer, texts, **self.options._asdict(), **kwargs
        )

    def for_task(self, task: str, prompt_name=None, prompt=None, flag="--prompt_name"):
        """This model with the prompt `SentenceTransformer.encode_query` (`task` "query") or
        `encode_document` ("document") puts before each text: `prompt`, else the one named
        `prompt_name` (`flag` names the option in the error), else the task's (`resolve_prompt`)."""
        prompt = resolve_prompt(self.settings, prompt_name, prompt, task, flag)
        return self._replace(options=self.options._replace(prompt=prompt), task=task)

    def static_route(self) -> bool:
        """Whether texts go to the `StaticQueries` (an inference-free SparseEncoder's queries:
        `task` "query", or no task where the directory's default route is "query").

        Raises:
          ValueError: no task, and the directory names no default route."""
        if self.queries is None:
            return False
        task = self.task or self.settings.default_task
        if task is None:
            raise ValueError(
                "the model routes texts by task (a Router without a default route): "
                "give --task query or --task document"
            )
        return task == "query"


def load_for_embedding(
    path: str,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_seq_length: int | None = None,
    prompt_name: str | None = None,
    prompt: str | None = None,
    truncate_dim: int | None = None,
    max_active_dims: int | None = None,
) -> EmbeddingModel:
    """`loading.load_embedder(path)` and its `embedding_options` (the given ones, else the
    sentence-transformers directory's, else the defaults).

    Raises:
      FileNotFoundError: no tokenizer.json or vocab.txt beside the weights.
      ValueError: a prompt_name the directory does not have.
    """
    config, params, tokenizer, settings = loading.load_embedder(path)
    queries = None
    if settings is not None and settings.query_module:
        queries = StaticQueries(*read_static_queries(settings.query_module))
    options, warnings = embedding_options(
        settings,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_seq_length,
        prompt_name=prompt_name,
        prompt=prompt,
        truncate_dim=truncate_dim,
        max_active_dims=max_active_dims,
    )
    check_max_active_dims(options.pooling, options.max_active_dims)
    batches.warn_beyond_positions(max_seq_length, config)
    if queries is not None and options.pooling != "splade":
        raise ValueError(
            f"{path} is an inference-free SparseEncoder: it embeds SPLADE vectors, not "
            f"{options.pooling} pooling"
        )
    return EmbeddingModel(config, params, tokenizer, options, warnings, settings, queries)


STEP_OPTIONS = ("model", "pooling", "normalize", "layers", "truncate_dim")


@functools.partial(jax.jit, static_argnames=STEP_OPTIONS)
def embed_step(
    params,
    batch,
    *,
    model: nn.Module,
    pooling: str,
    layers: tuple[int, ...] | None,
    normalize: bool = False,
    truncate_dim: int | None = None,
):
    """Pooled hidden states of one batch: float32 [B, P, E], P = len(layers) or 1 (last layer);
    of packed rows, one a text slot: [R, S, P, E]. With pooling "splade" (`model` a masked-LM
    head), SPLADE vectors of the logits: [B, 1, V] or [R, S, 1, V]. With `truncate_dim` D, E is
    D: the first D dimensions, after normalization.

    Args:
      params: the encoder's parameters (an argument, never a constant of the program).
      batch: input_ids, token_type_ids, attention_mask int32 [B, L]; or packed rows
        (`batches.pack_texts`: those [R, L] with segment_ids, position_ids [R, L] and
        cls_positions [R, S]), each text pooled from its own tokens.
      model: the encoder (`loading.encoder`); pooling, layers, normalize and truncate_dim as in
        `embed`.
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
            logits = out.logits.astype(jnp.float32)
            return splade_pool_segments(logits, batch["segment_ids"], slots)[..., None, :]
        return splade_pool(out.logits.astype(jnp.float32), batch["attention_mask"])[..., None, :]
    states = [out.last_hidden_state] if layers is None else [out.hidden_states[i] for i in layers]
    if pooling == "pooler":
        pooled = [out.pooler_output.astype(jnp.float32)] * len(states)
    elif packed:  # [R, S, E] a state
        segments, starts = batch["segment_ids"], batch["cls_positions"]
        pooled = [pool_segments(h, segments, starts, pooling) for h in states]
    else:  # [B, E] a state
        pooled = [pool(h, batch["attention_mask"], pooling) for h in states]
    pooled = jnp.stack(pooled, axis=-2).astype(jnp.float32)  # [B, P, E] or [R, S, P, E]
    if normalize:  # as torch's F.normalize (sentence-transformers' Normalize): x / max(|x|, 1e-12)
        norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
        pooled = pooled / jnp.maximum(norm, 1e-12)
    return pooled[..., :truncate_dim]  # Matryoshka: the first dimensions, after Normalize


def embedder(
    config: EncoderConfig,
    params,
    *,
    pooling: str = "cls",
    normalize: bool = False,
    layers: Sequence[int] | None = None,
    dtype: str | None = None,
    truncate_dim: int | None = None,
) -> tuple[Callable, dict]:
    """`embed_step` for `pooling`, `normalize`, `layers` and `truncate_dim` (as in `embed`),
    computing in `dtype` (`loading.runtime`; None: float32), and the encoder's parameters.

    Returns:
      (step(params, batch) -> float32 [B, P, E], the encoder's params).

    Raises:
      ValueError: an unknown pooling, "pooler" without a pooler layer, a layer out of range,
        "splade" with layers, normalization or truncate_dim, a truncate_dim outside
        [1, hidden_size], or for a checkpoint without a masked-LM head.
    """
    check_pooling(pooling, POOLINGS + SPARSE_POOLINGS)
    check_truncate_dim(config, pooling, truncate_dim)
    if pooling in SPARSE_POOLINGS:
        model, params = _splade_model(config, params, layers, normalize, dtype)
    else:
        model, params = loading.encoder(config, params, pooled=pooling == "pooler", dtype=dtype)
    if pooling == "pooler":
        loading.check_pooler(config, params)
    if layers is not None:
        num_states = config.num_hidden_layers + 1
        bad = [i for i in layers if not -num_states <= i < num_states]
        if bad:
            raise ValueError(f"layers {bad} out of range: there are {num_states} hidden states")
    step = functools.partial(
        batches.tuned(embed_step, STEP_OPTIONS),
        model=model,
        pooling=pooling,
        normalize=normalize,
        layers=None if layers is None else tuple(int(i) for i in layers),
        truncate_dim=truncate_dim,
    )
    return step, params


def check_truncate_dim(config: EncoderConfig, pooling: str, truncate_dim: int | None) -> None:
    """ValueError naming --truncate_dim where it is not a width the embeddings have."""
    if truncate_dim is None:
        return
    if pooling in SPARSE_POOLINGS:
        raise ValueError("--truncate_dim keeps a dense embedding's first dimensions; SPLADE "
                         "vectors (--sparse) have one a vocabulary entry")  # fmt: skip
    if not 1 <= truncate_dim <= config.hidden_size:
        raise ValueError(
            f"--truncate_dim {truncate_dim}: the embeddings have {config.hidden_size} "
            "dimensions; give 1 to that many"
        )


def check_max_active_dims(pooling: str, max_active_dims: int | None) -> None:
    """ValueError naming --max_active_dims where it is not a count of a SPLADE vector's weights."""
    if max_active_dims is None:
        return
    if pooling != "splade":
        raise ValueError(
            f"--max_active_dims keeps a SPLADE vector's largest weights (--sparse); {pooling} "
            "pooling gives dense embeddings (--truncate_dim keeps their first dimensions)"
        )
    if isinstance(max_active_dims, bool) or not isinstance(max_active_dims, int):
        raise ValueError(f"--max_active_dims must be an integer, got {max_active_dims!r}")
    if max_active_dims < 1:
        raise ValueError(f"--max_active_dims must be at least 1, got {max_active_dims}")


def keep_max_active_dims(vectors: np.ndarray, pooling: str, k: int | None) -> np.ndarray:
    """float32 [N, V] `vectors` with each row's k largest weights by magnitude kept and the rest
    set to 0, as sentence-transformers' `select_max_active_dims` keeps them (None: unchanged;
    rows with k or fewer non-zero weights are unchanged; of equal weights at the k-th place,
    any may be kept, as torch.topk keeps any of them)."""
    check_max_active_dims(pooling, k)
    if k is None or k >= vectors.shape[-1]:
        return vectors
    magnitude = -np.abs(vectors)
    top = np.argpartition(magnitude, k - 1, axis=-1)[..., :k]
    kept = np.zeros_like(vectors)
    np.put_along_axis(kept, top, np.take_along_axis(vectors, top, axis=-1), axis=-1)
    return kept


def check_splade_options(layers, normalize: bool) -> None:
    """ValueError for options SPLADE vectors do not take (--layers, --normalize)."""
    if layers is not None or normalize:
        raise ValueError("SPLADE vectors (--sparse) take neither --layers nor --normalize")


def _splade_model(config: EncoderConfig, params, layers, normalize: bool, dtype: str | None):
    """The family's masked-LM model and `params` (which must hold its head), for SPLADE."""
    check_splade_options(layers, normalize)
    family = family_of(config)
    if family.encoder_name not in params:
        raise ValueError(
            "SPLADE vectors (--sparse) pool the masked-LM head's logits; this checkpoint is the "
            f"bare encoder: give one with a masked-LM head ({family.head_for(Role.MASKED_LM)})"
        )
    return loading.masked_lm_model(config, dtype=dtype), params


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
    dtype: str | None = None,
    prompt: str = "",
    truncate_dim: int | None = None,
    max_active_dims: int | None = None,
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
      dtype: the compute dtype: None or "float32", or "bfloat16" (`loading.runtime`; the
        embeddings float32 either way).
      prompt: put before each text (a sentence-transformers prompt, `resolve_prompt`); its
        tokens count towards max_seq_length and are pooled, as sentence-transformers does.
      truncate_dim: keep the embeddings' first D dimensions (after normalization, as
        `SentenceTransformer.encode(truncate_dim=D)`): E is D.
      max_active_dims: pooling "splade": keep each vector's K largest weights, the rest 0
        (`keep_max_active_dims`, as `SparseEncoder.encode(max_active_dims=K)`).
    """
    check_max_active_dims(pooling, max_active_dims)
    step, params = embedder(
        config,
        params,
        pooling=pooling,
        normalize=normalize,
        layers=layers,
        dtype=dtype,
        truncate_dim=truncate_dim,
    )
    batching = batches.TextBatching(max_seq_length, batch_size, bucket_lengths, pack, progress)
    texts = [prompt + text for text in texts] if prompt else texts
    result = batching.run(config, step, params, tokenizer, texts, None, "embed")
    if layers is None:
        return keep_max_active_dims(result[:, 0], pooling, max_active_dims)
    return result


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
