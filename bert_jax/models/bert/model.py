"""BERT in Flax linen: the encoder of google-research/bert and every Hugging Face task head.

Post-LayerNorm layers, exact (erf) GELU by default, absolute learned positions, a tanh pooler on
[CLS], and an MLM decoder tied to the word embeddings with its own bias. Submodule names mirror
Hugging Face's `BertModel` state dict (`encoder/layer_3/attention/self/query`), so conversion is a
rename and a transpose.

Dimension legend:
  B batch            L sequence length     E hidden size (hidden_size)
  H attention heads  D head size (E / H)   F intermediate size
  V vocabulary       P predictions per sequence (masked positions)
  S sequences packed in one row            C choices (multiple choice)   N labels

Logical axis names carried by the parameters (mapped to mesh axes by `bert_jax.parallel.sharding`):
  vocab, embed, heads, kv, mlp, layers (the stacked axis under `scan_layers`); None = replicated.
Activations use act_batch, act_len, act_embed, act_heads, act_mlp.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax.activations import ACTIVATIONS, REMAT_POLICIES
from bert_jax.models.attention import AttentionMask, attend, dropout
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig

Array = jax.Array


# --------------------------------------------------------------------------------------------
# Outputs (pytrees, Hugging Face field names)
# --------------------------------------------------------------------------------------------
@flax.struct.dataclass
class BertModelOutput:
    """last_hidden_state [B, L, E]; pooler_output [B, E] (or [B, S, E] packed) or None;
    hidden_states: L+1 arrays [B, L, E] (embeddings, then each layer) when asked for;
    attentions: one [B, H, L, L] float32 array per layer when asked for."""

    last_hidden_state: Array
    pooler_output: Array | None = None
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


@flax.struct.dataclass
class BertForPreTrainingOutput:
    """prediction_logits [B, L, V], or [B, P, V] at `masked_positions`;
    seq_relationship_logits [B, 2] (or [B, S, 2] packed). Logits are float32."""

    prediction_logits: Array
    seq_relationship_logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


@flax.struct.dataclass
class MaskedLMOutput:
    """logits [B, L, V], or [B, P, V] at `masked_positions`; float32."""

    logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


@flax.struct.dataclass
class ClassifierOutput:
    """logits: [B, N] sequence classification (N = 1: regression), [B, 2] next-sentence,
    [B, C] multiple choice, [B, L, N] token classification; float32."""

    logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


@flax.struct.dataclass
class QuestionAnsweringOutput:
    """start_logits, end_logits [B, L]; float32."""

    start_logits: Array
    end_logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------
def _kernel_init(cfg: BertConfig, axes: tuple[str | None, ...]):
    init = jax.nn.initializers.truncated_normal(stddev=cfg.initializer_range)
    return nn.with_logical_partitioning(init, axes)


def _zeros(axes: tuple[str | None, ...]):
    return nn.with_logical_partitioning(jax.nn.initializers.zeros, axes)


def _weights(
    module: nn.Module, in_shape, features, in_axes, out_axes, stddev, param_dtype, use_bias=True
):
    """Creates a dense layer's kernel [*in_shape, *features] and bias [*features] (None without
    `use_bias`) in `module`.

    The kernel is created at its final (e.g. head-split [E, H, D]) shape, so its logical axes
    hold from initialization on, under any mesh.
    """
    init = jax.nn.initializers.truncated_normal(stddev=stddev)
    kernel = module.param(
        "kernel",
        nn.with_logical_partitioning(init, (*in_axes, *out_axes)),
        (*in_shape, *features),
        param_dtype,
    )
    if not use_bias:
        return kernel, None
    bias = module.param("bias", _zeros(out_axes), features, param_dtype)
    return kernel, bias


class DenseWeights(nn.Module):
    """A dense layer's (kernel, bias), not applied: lets several projections run as one matmul
    while each keeps its own parameters, named as in the checkpoints."""

    features: tuple[int, ...]
    in_axes: tuple[str | None, ...]
    out_axes: tuple[str | None, ...]
    stddev: float = 0.02
    param_dtype: Any = "float32"

    @nn.compact
    def __call__(self, in_shape: tuple[int, ...]):
        return _weights(
            self,
            in_shape,
            self.features,
            self.in_axes,
            self.out_axes,
            self.stddev,
            self.param_dtype,
        )


class Dense(nn.Module):
    """y = x . W + b, contracting the last len(in_axes) axes of x with W [*in, *features].

    Attributes:
      features: output dims, e.g. (H, D) or (E,).
      in_axes / out_axes: logical axis names of the contracted input dims / the output dims.
      stddev: truncated-normal initializer stddev (the config's initializer_range).
      dtype / param_dtype: compute / storage dtypes.
      out_dtype: dtype the matmul accumulates into and returns (None: `dtype`); float32 for
        output layers, so that bfloat16 compute does not round logits to 8 bits of mantissa.
      use_bias: whether there is a bias (ModernBERT's layers have none).
    """

    features: tuple[int, ...]
    in_axes: tuple[str | None, ...]
    out_axes: tuple[str | None, ...]
    stddev: float = 0.02
    dtype: Any = "float32"
    param_dtype: Any = "float32"
    out_dtype: Any = None
    use_bias: bool = True

    @nn.compact
    def __call__(self, x):
        n_in = len(self.in_axes)
        kernel, bias = _weights(
            self,
            x.shape[x.ndim - n_in :],
            self.features,
            self.in_axes,
            self.out_axes,
            self.stddev,
            self.param_dtype,
            self.use_bias,
        )
        out_dtype = self.dtype if self.out_dtype is None else self.out_dtype
        x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
        contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))
        y = jax.lax.dot_general(x, kernel, (contract, ((), ())), preferred_element_type=out_dtype)
        return y if bias is None else y + bias.astype(out_dtype)


class Dropout(nn.Module):
    """Inverted dropout drawn as raw 32-bit random words against an integer threshold.

    The same distribution as `nn.Dropout` (keep probability exact to 2^-32) without turning
    every word into a float first, which costs a third of the random-number time on CPUs.
    """

    rate: float

    @nn.compact
    def __call__(self, x, *, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"))


def _dense(cfg, rt, features, in_axes, out_axes, name, out_dtype=None, use_bias=True, stddev=None):
    features = features if isinstance(features, tuple) else (features,)
    return Dense(
        features,
        tuple(in_axes),
        tuple(out_axes),
        stddev=cfg.initializer_range if stddev is None else stddev,
        dtype=rt.dtype,
        param_dtype=rt.param_dtype,
        out_dtype=out_dtype,
        use_bias=use_bias,
        name=name,
    )


def _layer_norm(cfg, rt, name="LayerNorm"):
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        dtype=rt.dtype,
        param_dtype=rt.param_dtype,
        scale_init=nn.with_logical_partitioning(jax.nn.initializers.ones, ("embed",)),
        bias_init=_zeros(("embed",)),
        name=name,
    )


def _constrain(x: Array, *axes: str | None) -> Array:
    return nn.with_logical_constraint(x, axes)


class Embed(nn.Module):
    """A lookup table `embedding` [num, E]: ids [...] -> [..., E] in `dtype`.

    Rows are read from the table in its parameter dtype and then cast, so the backward pass
    adds the gradients of repeated ids in float32 (a scatter-add in bfloat16 rounds each sum).
    `one_hot=True` looks up by a one-hot matmul instead, for small tables whose ids repeat
    thousands of times a batch (positions, token types): the backward is then a matmul, where
    a scatter-add would serialize on the few rows it writes (on an H100, BERT-large's 2-row
    token-type table's scatter took 33 of 148 ms a step). The matmul is exact: float32 at
    HIGHEST precision, each output the one product 1 x row.

    Under FSDP the table's E axis is sharded; it is gathered whole along that axis before the
    lookup (as FSDP does for every weight), so the output comes out batch-sharded.
    """

    num_embeddings: int
    features: int
    axes: tuple[str | None, str | None]
    stddev: float = 0.02
    dtype: Any = "float32"
    param_dtype: Any = "float32"
    one_hot: bool = False

    @nn.compact
    def __call__(self, ids):
        init = jax.nn.initializers.truncated_normal(stddev=self.stddev)
        table = self.param(
            "embedding",
            nn.with_logical_partitioning(init, self.axes),
            (self.num_embeddings, self.features),
            self.param_dtype,
        )
        table = nn.with_logical_constraint(table, (self.axes[0], None))
        if self.one_hot:
            one_hot = jax.nn.one_hot(ids, self.num_embeddings, dtype=table.dtype)  # [..., num]
            rows = jnp.dot(one_hot, table, precision=jax.lax.Precision.HIGHEST)
        else:
            rows = jnp.take(table, ids, axis=0)
        return rows.astype(self.dtype)


class BertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout. Returns [B, L, E]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, input_ids, token_type_ids, position_ids, *, deterministic: bool):
        cfg, rt = self.config, self.runtime

        def embed(num, axes, name, one_hot=False):
            return Embed(
                num,
                cfg.hidden_size,
                axes,
                cfg.initializer_range,
                rt.dtype,
                rt.param_dtype,
                one_hot,
                name=name,
            )

        x = embed(cfg.padded_vocab_size, ("vocab", "embed"), "word_embeddings")(input_ids)
        x += embed(
            cfg.max_position_embeddings, (None, "embed"), "position_embeddings", one_hot=True
        )(position_ids)
        x += embed(cfg.type_vocab_size, (None, "embed"), "token_type_embeddings", one_hot=True)(
            token_type_ids
        )
        x = _layer_norm(cfg, rt)(x)
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        return _constrain(x, "act_batch", "act_len", "act_embed")


class BertSelfAttention(nn.Module):
    """Query/key/value projections and attention. Returns context [B, L, H, D] and probs or None.

    The kernel is the one `bert_jax.models.attention.attend` picks; asking for the probabilities
    (`output_attentions`) takes the xla path, which forms them.
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask: AttentionMask, *, deterministic: bool, output_attentions: bool):
        cfg, rt = self.config, self.runtime
        heads = (cfg.num_attention_heads, cfg.head_dim)

        # The three projections run as one matmul [E] x [E, 3, H, D] (a third of the launches and
        # one wide GEMM); their weights stay separate parameters, named as in the checkpoints.
        weights = [
            DenseWeights(
                heads, ("embed",), ("heads", "kv"), cfg.initializer_range, rt.param_dtype, name=name
            )((cfg.hidden_size,))
            for name in ("query", "key", "value")
        ]
        kernel = jnp.stack([w.astype(rt.dtype) for w, _ in weights], axis=1)  # [E, 3, H, D]
        bias = jnp.stack([b.astype(rt.dtype) for _, b in weights], axis=0)  # [3, H, D]
        qkv = jax.lax.dot_general(x.astype(rt.dtype), kernel, (((2,), (0,)), ((), ()))) + bias
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, L, H, D] each
        q = _constrain(q, "act_batch", "act_len", "act_heads", None)
        k = _constrain(k, "act_batch", "act_len", "act_heads", None)
        v = _constrain(v, "act_batch", "act_len", "act_heads", None)
        dropping = not deterministic and cfg.attention_probs_dropout_prob > 0.0
        rng = self.make_rng("dropout") if dropping else None
        return attend(
            q,
            k,
            v,
            mask,
            config=cfg,
            runtime=rt,
            dropout_rng=rng,
            output_attentions=output_attentions,
        )


class BertOutput(nn.Module):
    """Dense projection back to E, dropout, residual add, post-LayerNorm: LN(x + dropout(W h)).

    Serves as both `attention/output` (h is the per-head context [B, L, H, D]) and the layer's
    `output` (h is the intermediate activation [B, L, F]).
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    from_heads: bool = False

    @nn.compact
    def __call__(self, h, residual, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        if self.from_heads:
            dense = _dense(cfg, rt, cfg.hidden_size, ("heads", "kv"), ("embed",), "dense")
        else:
            dense = _dense(cfg, rt, cfg.hidden_size, ("mlp",), ("embed",), "dense")
        y = Dropout(cfg.hidden_dropout_prob)(dense(h), deterministic=deterministic)
        return _layer_norm(cfg, rt)(y + residual)


class BertAttention(nn.Module):
    """Self-attention sub-layer (`attention/self` + `attention/output`): [B, L, E], probs."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask, *, deterministic: bool, output_attentions: bool):
        cfg, rt = self.config, self.runtime
        context, probs = BertSelfAttention(cfg, rt, name="self")(
            x, mask, deterministic=deterministic, output_attentions=output_attentions
        )
        out = BertOutput(cfg, rt, from_heads=True, name="output")(
            context, x, deterministic=deterministic
        )
        return out, probs


class BertIntermediate(nn.Module):
    """Feed-forward expansion with the configured activation: [B, L, E] -> [B, L, F]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x):
        cfg, rt = self.config, self.runtime
        h = _dense(cfg, rt, cfg.intermediate_size, ("embed",), ("mlp",), "dense")(x)
        h = ACTIVATIONS[cfg.hidden_act](h)
        return _constrain(h, "act_batch", "act_len", "act_mlp")


class BertLayer(nn.Module):
    """One post-LayerNorm transformer layer.

    The run mode lives in attributes rather than call arguments so that `nn.scan` and
    `nn.remat` see only arrays. `__call__(x [B, L, E], mask) -> (x', (x' or None, probs or None))`,
    the (carry, output) shape `nn.scan` wants.
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    deterministic: bool = True
    output_hidden_states: bool = False
    output_attentions: bool = False

    @nn.compact
    def __call__(self, x, mask):
        cfg, rt, det = self.config, self.runtime, self.deterministic
        a, probs = BertAttention(cfg, rt, name="attention")(
            x, mask, deterministic=det, output_attentions=self.output_attentions
        )
        h = BertIntermediate(cfg, rt, name="intermediate")(a)
        y = BertOutput(cfg, rt, name="output")(h, a, deterministic=det)
        y = _constrain(y, "act_batch", "act_len", "act_embed")
        return y, (y if self.output_hidden_states else None, probs)


class BertEncoder(nn.Module):
    """The layers: `layer_0 ... layer_{n-1}`, or one scanned `layer` with stacked weights."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(
        self,
        x,
        mask,
        *,
        deterministic: bool,
        output_hidden_states: bool,
        output_attentions: bool,
    ):
        cfg, rt = self.config, self.runtime
        layer_cls = BertLayer
        if rt.remat_policy != "none":
            layer_cls = nn.remat(
                BertLayer, policy=REMAT_POLICIES[rt.remat_policy], prevent_cse=not rt.scan_layers
            )
        kwargs = dict(
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        if rt.scan_layers:
            scanned = nn.scan(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast,
                length=cfg.num_hidden_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, (states, probs) = scanned(cfg, rt, name="layer", **kwargs)(x, mask)
            states = tuple(states) if output_hidden_states else None  # unstack [n, B, L, E]
            probs = tuple(probs) if output_attentions else None
        else:
            states, probs = [], []
            for i in range(cfg.num_hidden_layers):
                x, (s, p) = layer_cls(cfg, rt, name=f"layer_{i}", **kwargs)(x, mask)
                states.append(s)
                probs.append(p)
            states = tuple(states) if output_hidden_states else None
            probs = tuple(probs) if output_attentions else None
        return x, states, probs


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): [B, L, E] -> [B, E]; with cls_positions [B, S] -> [B, S, E]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, sequence_output, cls_positions=None):
        cfg, rt = self.config, self.runtime
        if cls_positions is None:
            first = sequence_output[:, 0]
        else:
            first = jnp.take_along_axis(sequence_output, cls_positions[..., None], axis=1)
        return jnp.tanh(_dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(first))


def encoder_inputs(runtime: RuntimeConfig, input_ids: Array, **arrays: Array | None):
    """An encoder's [B, L] inputs checked, with defaults where None: token_type_ids zeros,
    attention_mask ones, position_ids 0..L-1. Returns the `arrays` in their order."""
    if runtime.dtype == "auto":
        raise ValueError(
            "RuntimeConfig.dtype='auto' is resolved once per run, before the model is built: "
            "runtime.resolved(bert_jax.hardware.current_platform())"
        )
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length]; got shape {input_ids.shape}")
    defaults = dict(
        token_type_ids=lambda: jnp.zeros_like(input_ids),
        attention_mask=lambda: jnp.ones_like(input_ids),
        position_ids=lambda: jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape),
    )
    out = []
    for name, arr in arrays.items():
        arr = defaults[name]() if arr is None else arr
        if arr.shape != input_ids.shape:
            raise ValueError(
                f"{name} has shape {arr.shape} but input_ids has shape {input_ids.shape}"
            )
        out.append(arr)
    return tuple(out)


class BertModel(nn.Module):
    """The BERT encoder: embeddings, layers and (optionally) the pooler.

    Call arguments:
      input_ids: [B, L] int token ids.
      token_type_ids: [B, L] int segment A/B ids; zeros when omitted.
      attention_mask: [B, L] 1 for real tokens, 0 for padding; ones when omitted.
      position_ids: [B, L] int positions; 0..L-1 when omitted (restart per packed sequence).
      segment_ids: [B, L] int ids of packed sequences (0 = padding); attention stays inside one.
      cls_positions: [B, S] int positions of each packed sequence's [CLS] for the pooler.
      deterministic: False turns dropout on (needs `rngs={"dropout": key}`).
      output_hidden_states / output_attentions: also return every layer's states / probabilities.
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    add_pooling_layer: bool = True

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        position_ids=None,
        segment_ids=None,
        cls_positions=None,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> BertModelOutput:
        cfg, rt = self.config, self.runtime
        token_type_ids, attention_mask, position_ids = encoder_inputs(
            rt,
            input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        seq_len = input_ids.shape[1]
        if seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        x = BertEmbeddings(cfg, rt, name="embeddings")(
            input_ids, token_type_ids, position_ids, deterministic=deterministic
        )
        mask = AttentionMask(attention_mask.astype(bool), segment_ids)
        y, states, probs = BertEncoder(cfg, rt, name="encoder")(
            x,
            mask,
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        pooled = None
        if self.add_pooling_layer:
            pooled = BertPooler(cfg, rt, name="pooler")(y, cls_positions)
        return BertModelOutput(
            last_hidden_state=y,
            pooler_output=pooled,
            hidden_states=(x, *states) if output_hidden_states else None,
            attentions=probs,
        )


# --------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------
def gather_positions(sequence: Array, positions: Array) -> Array:
    """sequence [B, L, E], positions [B, P] int -> [B, P, E] (the original's gather_indexes)."""
    return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class TransformHead(nn.Module):
    """`cls/predictions/transform`: LayerNorm(act(W h + b)), [..., E] -> [..., E]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h):
        cfg, rt = self.config, self.runtime
        h = _dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(h)
        return _layer_norm(cfg, rt)(ACTIVATIONS[cfg.hidden_act](h))


class BertLMPredictionHead(nn.Module):
    """`cls/predictions`: dense + activation + LayerNorm, then logits against the tied word
    embeddings plus an own output bias. h [..., E], embedding [V', E] (V' = the padded vocabulary,
    `BertConfig.padded_vocab_size`) -> float32 logits [..., V]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, embedding):
        cfg, rt = self.config, self.runtime
        t = TransformHead(cfg, rt, name="transform")(h)
        bias = self.param("bias", _zeros(("vocab",)), (cfg.padded_vocab_size,), rt.param_dtype)
        # Accumulated and returned in float32: a bfloat16 result would round every logit to 8
        # bits of mantissa before the loss sees it.
        logits = jnp.einsum(
            "...e,ve->...v",
            t.astype(rt.dtype),
            embedding.astype(rt.dtype),
            preferred_element_type=jnp.float32,
        )
        # The padding rows of the table (`vocab_pad_multiple`) are no tokens: cut them off.
        return (logits + bias.astype(jnp.float32))[..., : cfg.vocab_size]


class BertPreTrainingHeads(nn.Module):
    """`cls`: the MLM head (`predictions`) and/or the NSP head (`seq_relationship`)."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    mlm: bool = True
    nsp: bool = True

    @nn.compact
    def __call__(self, sequence_output, pooled_output, embedding, masked_positions=None):
        cfg, rt = self.config, self.runtime
        mlm_logits = nsp_logits = None
        if self.mlm:
            h = sequence_output
            if masked_positions is not None:
                h = gather_positions(h, masked_positions)  # [B, P, E]
            mlm_logits = BertLMPredictionHead(cfg, rt, name="predictions")(h, embedding)
        if self.nsp:
            nsp = _dense(cfg, rt, 2, ("embed",), (None,), "seq_relationship")
            nsp_logits = nsp(pooled_output).astype(jnp.float32)
        return mlm_logits, nsp_logits


def _word_embedding(module: nn.Module) -> Array:
    """The word-embedding table [V', E] (V' = `padded_vocab_size`) of the module's `bert` child,
    for the tied decoder."""
    table = module.variables["params"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
    return nn.meta.unbox(table)


class _Head(nn.Module):
    """A task head on top of `bert` (a BertModel). Every head takes BertModel's inputs:

      input_ids, token_type_ids, attention_mask, position_ids, segment_ids: [B, L]
        ([B, C, L] for multiple choice), as BertModel's;
      cls_positions: [B, S] [CLS] of each packed sequence (pooled heads);
      masked_positions: [B, P] positions to compute MLM logits at (MLM heads only);
      deterministic, output_hidden_states, output_attentions: as BertModel's.

    Subclasses set `pooled` (whether the head reads the pooler) and implement `head(out, ...)`;
    another family's heads (`models.modernbert.model`) share this call and override `encode`.
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    pooled: ClassVar[bool] = True
    choices: ClassVar[bool] = False  # inputs are [B, C, L]: encode every choice
    masked_lm: ClassVar[bool] = False  # accepts masked_positions
    token_types: ClassVar[bool] = True  # reads token_type_ids (a family without them: False)

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        position_ids=None,
        segment_ids=None,
        cls_positions=None,
        masked_positions=None,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ):
        if masked_positions is not None and not self.masked_lm:
            raise ValueError(f"{type(self).__name__} has no MLM head; masked_positions is for one")
        inputs = dict(
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            segment_ids=segment_ids,
        )
        batch_shape = input_ids.shape
        if self.choices:
            if input_ids.ndim != 3:
                raise ValueError(
                    f"{type(self).__name__} takes input_ids [batch, choices, length]; "
                    f"got {input_ids.shape}"
                )
            flat = lambda a: None if a is None else a.reshape(-1, a.shape[-1])  # noqa: E731
            input_ids, inputs = flat(input_ids), {k: flat(v) for k, v in inputs.items()}
        out = self.encode(
            input_ids,
            inputs,
            cls_positions=cls_positions if self.pooled else None,
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        return self.head(
            out,
            deterministic=deterministic,
            masked_positions=masked_positions,
            batch_shape=batch_shape,
        )

    def encode(self, input_ids, inputs, **kwargs) -> BertModelOutput:
        """The encoder's outputs (pooled when `pooled`): `bert`, a BertModel."""
        model = BertModel(self.config, self.runtime, add_pooling_layer=self.pooled, name="bert")
        return model(input_ids, **inputs, **kwargs)

    def _dropout(self, x, deterministic):
        cfg = self.config
        rate = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
        return Dropout(rate)(x, deterministic=deterministic)

    def _linear(self, x, features: int, name: str):
        cfg, rt = self.config, self.runtime
        # Accumulated in float32: a bfloat16 result would round every logit (and a regression
        # output) to 8 bits of mantissa, and the predictions of a barely trained model to one value.
        return _dense(cfg, rt, features, ("embed",), (None,), name, out_dtype=jnp.float32)(x)


class BertForPreTraining(_Head):
    """Masked LM + next sentence prediction, as in the original pretraining.

    With `masked_positions` [B, P] the MLM logits are computed only there ([B, P, V]), which is
    what pretraining needs and costs P/L of the full head; equal to gathering the full [B, L, V]
    logits at those positions.
    """

    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        mlm, nsp = BertPreTrainingHeads(self.config, self.runtime, name="cls")(
            out.last_hidden_state, out.pooler_output, _word_embedding(self), masked_positions
        )
        return BertForPreTrainingOutput(mlm, nsp, out.hidden_states, out.attentions)


class BertForMaskedLM(_Head):
    """Masked LM only (no pooler, as in Hugging Face). `masked_positions` as in pretraining."""

    pooled = False
    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        mlm, _ = BertPreTrainingHeads(self.config, self.runtime, nsp=False, name="cls")(
            out.last_hidden_state, None, _word_embedding(self), masked_positions
        )
        return MaskedLMOutput(mlm, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(_Head):
    """Next-sentence prediction only: logits [B, 2], 0 = B follows A, 1 = B is random."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        _, nsp = BertPreTrainingHeads(self.config, self.runtime, mlm=False, name="cls")(
            out.last_hidden_state, out.pooler_output, None
        )
        return ClassifierOutput(nsp, out.hidden_states, out.attentions)


class BertForSequenceClassification(_Head):
    """Pooled [CLS] -> dropout -> `classifier`: logits [B, N]; N = 1 is regression.

    With packed rows (`segment_ids`, `cls_positions` [B, S]) the logits are [B, S, N].
    """

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        pooled = self._dropout(out.pooler_output, deterministic)
        logits = self._linear(pooled, self.config.num_labels, "classifier")
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class BertForMultipleChoice(_Head):
    """Inputs [B, C, L]; each choice is encoded, pooled and scored: logits [B, C]."""

    choices = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        pooled = self._dropout(out.pooler_output, deterministic)
        logits = self._linear(pooled, 1, "classifier")  # [B*C, 1]
        return ClassifierOutput(logits.reshape(batch_shape[:2]), out.hidden_states, out.attentions)


class BertForTokenClassification(_Head):
    """Per-token labels (NER): sequence output -> dropout -> `classifier`: logits [B, L, N]."""

    pooled = False

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        h = self._dropout(out.last_hidden_state, deterministic)
        logits = self._linear(h, self.config.num_labels, "classifier")
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class BertForQuestionAnswering(_Head):
    """Extractive QA: `qa_outputs` maps each token to start/end logits, each [B, L]."""

    pooled = False

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self._linear(out.last_hidden_state, 2, "qa_outputs")
        return QuestionAnsweringOutput(
            logits[..., 0], logits[..., 1], out.hidden_states, out.attentions
        )


MODEL_CLASSES: dict[str, type[nn.Module]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForMaskedLM,
        BertForNextSentencePrediction,
        BertForSequenceClassification,
        BertForMultipleChoice,
        BertForTokenClassification,
        BertForQuestionAnswering,
    )
}


def init_params(model: nn.Module, rng: Array, seq_len: int = 8) -> Any:
    """`model`'s parameters (boxed with logical axes), initialized from a dummy batch."""
    shape = (1, 2, seq_len) if getattr(model, "choices", False) else (1, seq_len)
    ids = jnp.zeros(shape, jnp.int32)
    return model.init({"params": rng}, ids)["params"]


def count_params(params: Any) -> int:
    """Total number of parameter scalars in a (possibly boxed) parameter tree."""
    return sum(x.size for x in jax.tree_util.tree_leaves(nn.meta.unbox(params)))


def _encoder_of(params: dict) -> tuple[dict, str | None]:
    """The `encoder` subtree of a BertModel or task-head parameter tree, and its parent key."""
    if "encoder" in params:
        return params, None
    if "bert" in params and "encoder" in params["bert"]:
        return params["bert"], "bert"
    raise ValueError("parameter tree has neither 'encoder' nor 'bert/encoder'")


def is_stacked(params: dict) -> bool:
    """True when the layers are stacked on a leading axis (the `scan_layers` layout); False for
    a tree without a BERT encoder (another family's, never stacked)."""
    if "encoder" not in params and "encoder" not in params.get("bert", {}):
        return False
    parent, _ = _encoder_of(params)
    return "layer" in parent["encoder"]


def stack_layers(params: dict) -> dict:
    """`encoder/layer_i/...` (one subtree per layer) -> `encoder/layer/...` with a leading [n] axis.

    The inverse of `unstack_layers`; used to load per-layer checkpoints into a scanned model.
    """
    if is_stacked(params):
        return params
    parent, key = _encoder_of(params)
    layers = parent["encoder"]
    n = len(layers)
    order = [layers[f"layer_{i}"] for i in range(n)]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *order)
    new_parent = {**parent, "encoder": {"layer": stacked}}
    return new_parent if key is None else {**params, key: new_parent}


def unstack_layers(params: dict) -> dict:
    """`encoder/layer/...` with a leading [n] axis -> `encoder/layer_i/...` per layer."""
    if not is_stacked(params):
        return params
    parent, key = _encoder_of(params)
    stacked = parent["encoder"]["layer"]
    n = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    layers = {f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: x[i], stacked) for i in range(n)}
    new_parent = {**parent, "encoder": layers}
    return new_parent if key is None else {**params, key: new_parent}
