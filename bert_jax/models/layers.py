"""The building blocks every family's modules are made of: dense layers, embeddings, dropout,
LayerNorm, activation sharding constraints, the checked encoder inputs and the [CLS] pooler; the
post-LayerNorm layer stack (`PostLNEncoder`) of the families whose layers are
google-research/bert's.

Nothing here names a family: sizes come from the module's attributes or from the config's
shared fields (`models.config.EncoderConfig`: hidden_size, initializer_range, ...), and the
parameter names (`kernel`, `bias`, `embedding`, `scale`, and the stack's `attention/self/query`,
`intermediate/dense`, ...) are the ones every checkpoint uses.

Dimensions: the letters of `bert_jax.models`' legend.

Logical axis names carried by the parameters (mapped to mesh axes by `bert_jax.parallel.sharding`):
  vocab, embed, heads, kv, mlp, layers (the stacked axis under `scan_layers`); None = replicated.
Activations use act_batch, act_len, act_embed, act_heads, act_mlp.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.activations import ACTIVATIONS, REMAT_POLICIES, kept_input_only
from bert_jax.models.attention import AttentionMask, dropout, layer_attend
from bert_jax.models.config import EncoderConfig, RuntimeConfig

Array = jax.Array
Axes = tuple[str | None, ...]


def zeros_init(axes: Axes):
    """A zeros initializer carrying the logical `axes` (biases)."""
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
    bias = module.param("bias", zeros_init(out_axes), features, param_dtype)
    return kernel, bias


class DenseWeights(nn.Module):
    """A dense layer's (kernel [*in_shape, *features], bias [*features]), not applied: lets
    several projections run as one matmul while each keeps its own parameters, named as in the
    checkpoints."""

    features: tuple[int, ...]
    in_axes: Axes
    out_axes: Axes
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
    in_axes: Axes
    out_axes: Axes
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


def dense(
    cfg: EncoderConfig,
    rt: RuntimeConfig,
    features: int | tuple[int, ...],
    in_axes: Axes,
    out_axes: Axes,
    name: str,
    out_dtype: Any = None,
    use_bias: bool = True,
    stddev: float | None = None,
) -> Dense:
    """A `Dense` named `name` in the run's dtypes, initialized with stddev `cfg.initializer_range`
    unless `stddev` is given: [..., *in] -> [..., *features]."""
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


def layer_norm(
    rt: RuntimeConfig, epsilon: float, name: str = "LayerNorm", use_bias: bool = True
) -> nn.LayerNorm:
    """LayerNorm over E ([..., E] -> [..., E]; statistics in float32), `scale` and (with
    `use_bias`) `bias` [E] on the `embed` axis.

    Under a compute dtype narrower than float32 the backward pass keeps only the input (in the
    compute dtype) and recomputes the float32 statistics from it: autodiff of the float32 LayerNorm
    would keep the input, its centred copy and the normalized values, each [..., E] in float32 (on
    BERT-large 128 x 128 in bfloat16, 9 GiB of the step's 32). Recomputing is the same arithmetic
    on the same input: the values are the plain LayerNorm's, the gradients too up to where XLA
    rounds a float32 intermediate to bfloat16 (tests/models/residuals_test.py). float32 runs are as
    before.
    """
    cls = nn.LayerNorm
    if rt.dtype != "float32":
        cls = nn.remat(nn.LayerNorm, prevent_cse=not rt.scan_layers)
    return cls(
        epsilon=epsilon,
        use_bias=use_bias,
        dtype=rt.dtype,
        param_dtype=rt.param_dtype,
        scale_init=nn.with_logical_partitioning(jax.nn.initializers.ones, ("embed",)),
        bias_init=zeros_init(("embed",)),
        name=name,
    )


def constrain(x: Array, *axes: str | None) -> Array:
    """`x` constrained to the logical activation `axes`, one per dim (e.g. act_batch, act_len)."""
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


def embedding(
    cfg: EncoderConfig, rt: RuntimeConfig, rows: int, width: int, name: str, *, word: bool = False
) -> Embed:
    """An `Embed` table `name` [rows, width] in the run's dtypes, initialized with stddev
    `cfg.initializer_range`: the word table (`word`: its rows on the `vocab` axis, read by a
    gather) or a small one (positions, token types: replicated rows, read by a one-hot matmul)."""
    axes = ("vocab", "embed") if word else (None, "embed")
    return Embed(
        rows, width, axes, cfg.initializer_range, rt.dtype, rt.param_dtype, not word, name=name
    )


def gather_positions(sequence: Array, positions: Array) -> Array:
    """sequence [B, L, E], positions [B, P] int -> [B, P, E] (the original's gather_indexes)."""
    return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


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


def first_tokens(sequence: Array, cls_positions: Array | None) -> Array:
    """The states of each sequence's first token ([CLS], `<s>`): sequence [B, L, E] -> [B, E] at
    position 0 (as transformers reads it, a pad in a left-padded row), or [B, S, E] at
    cls_positions [B, S] (packed rows)."""
    if cls_positions is None:
        return sequence[:, 0]
    return gather_positions(sequence, cls_positions)


class Pooler(nn.Module):
    """`pooler`: tanh(W h_first + b), [B, L, E] -> [B, E] ([B, S, E] at cls_positions [B, S])."""

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, sequence_output, cls_positions=None):
        cfg, rt = self.config, self.runtime
        first = first_tokens(sequence_output, cls_positions)
        return jnp.tanh(dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(first))


# ---- The post-LayerNorm layer stack: LN(x + attention(x)), then LN(a + W2 act(W1 a)), n times ----
# The encoder of the families whose layers are google-research/bert's, under Hugging Face's
# names (`encoder/layer_3/attention/self/query`, `.../attention/output/LayerNorm`,
# `.../intermediate/dense`, `.../output/dense`). Its config reads, besides `EncoderConfig`'s
# shared fields: num_hidden_layers, intermediate_size, hidden_act, hidden_dropout_prob,
# attention_probs_dropout_prob and layer_norm_eps.
LAYER_NAME = "layer_{}"  # the stack's layers in the encoder's tree (`encoder.layer.N`)
SCANNED_LAYER = "layer"  # the one stacked layer under `scan_layers`


def qkv_heads(
    cfg: EncoderConfig, rt: RuntimeConfig, x: Array, names=("query", "key", "value")
) -> tuple[Array, Array, Array]:
    """The query, key and value projections of x [B, L, E], each [B, L, H, D] in the compute
    dtype, their `DenseWeights` submodules `names` of the compact module calling it.

    The three run as one matmul [E] x [E, 3, H, D] (a third of the launches and one wide GEMM);
    their weights stay separate parameters, named as in the checkpoints.
    """
    heads = (cfg.num_attention_heads, cfg.head_dim)
    weights = [
        DenseWeights(
            heads, ("embed",), ("heads", "kv"), cfg.initializer_range, rt.param_dtype, name=name
        )((cfg.hidden_size,))
        for name in names
    ]
    kernel = jnp.stack([w.astype(rt.dtype) for w, _ in weights], axis=1)  # [E, 3, H, D]
    bias = jnp.stack([b.astype(rt.dtype) for _, b in weights], axis=0)  # [3, H, D]
    qkv = jax.lax.dot_general(x.astype(rt.dtype), kernel, (((2,), (0,)), ((), ()))) + bias
    return tuple(
        constrain(qkv[:, :, i], "act_batch", "act_len", "act_heads", None) for i in range(3)
    )


class SelfAttention(nn.Module):
    """Query/key/value projections and attention. Returns context [B, L, H, D] and probs or None.

    The kernel is the one `bert_jax.models.attention.attend` picks; asking for the probabilities
    (`output_attentions`) takes the xla path, which forms them.
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask: AttentionMask, *, deterministic: bool, output_attentions: bool):
        cfg, rt = self.config, self.runtime
        q, k, v = qkv_heads(cfg, rt, x)
        return layer_attend(
            self, q, k, v, mask, deterministic=deterministic, output_attentions=output_attentions
        )


class ResidualOutput(nn.Module):
    """Dense projection back to E, dropout, residual add, post-LayerNorm: LN(x + dropout(W h)).

    Serves as both `attention/output` (h is the per-head context [B, L, H, D]) and the layer's
    `output` (h is the intermediate activation [B, L, F]).
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    from_heads: bool = False

    @nn.compact
    def __call__(self, h, residual, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        in_axes = ("heads", "kv") if self.from_heads else ("mlp",)
        out = dense(cfg, rt, cfg.hidden_size, in_axes, ("embed",), "dense")
        y = Dropout(cfg.hidden_dropout_prob)(out(h), deterministic=deterministic)
        return layer_norm(rt, cfg.layer_norm_eps)(y + residual)


class Attention(nn.Module):
    """Self-attention sub-layer (`attention/self` + `attention/output`): [B, L, E], probs."""

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask, *, deterministic: bool, output_attentions: bool):
        cfg, rt = self.config, self.runtime
        context, probs = SelfAttention(cfg, rt, name="self")(
            x, mask, deterministic=deterministic, output_attentions=output_attentions
        )
        out = ResidualOutput(cfg, rt, from_heads=True, name="output")(
            context, x, deterministic=deterministic
        )
        return out, probs


class Intermediate(nn.Module):
    """Feed-forward expansion with the configured activation: [B, L, E] -> [B, L, F]."""

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x):
        cfg, rt = self.config, self.runtime
        h = dense(cfg, rt, cfg.intermediate_size, ("embed",), ("mlp",), "dense")(x)
        act = ACTIVATIONS[cfg.hidden_act]
        if rt.dtype != "float32":  # keep h alone for the backward pass (PyTorch's two [B, L, F])
            act = kept_input_only(act, scanned=rt.scan_layers)
        return constrain(act(h), "act_batch", "act_len", "act_mlp")


class PostLNLayer(nn.Module):
    """One post-LayerNorm transformer layer: `attention`, then `intermediate`/`output`.

    The run mode lives in attributes rather than call arguments so that `nn.scan` and
    `nn.remat` see only arrays. `__call__(x [B, L, E], mask, *extra) -> (x', (x' or None,
    probs or None))`, the (carry, output) shape `nn.scan` wants; `extra` goes to the attention
    after the mask (a family's position scores: MPNet's bias, DeBERTa's relative table).

    A family whose layers differ in their attention only subclasses this with its
    `attention_cls`, a module `(cfg, rt)` called `(x, mask, *extra, deterministic=,
    output_attentions=) -> (a [B, L, E], probs)`.
    """

    attention_cls: ClassVar[type[nn.Module]] = Attention  # BERT's
    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    deterministic: bool = True
    output_hidden_states: bool = False
    output_attentions: bool = False

    @nn.compact
    def __call__(self, x, mask, *extra):
        cfg, rt, det = self.config, self.runtime, self.deterministic
        a, probs = self.attention_cls(cfg, rt, name="attention")(
            x, mask, *extra, deterministic=det, output_attentions=self.output_attentions
        )
        h = Intermediate(cfg, rt, name="intermediate")(a)
        y = ResidualOutput(cfg, rt, name="output")(h, a, deterministic=det)
        y = constrain(y, "act_batch", "act_len", "act_embed")
        return y, (y if self.output_hidden_states else None, probs)


class PostLNEncoder(nn.Module):
    """The layers (`layer_cls`): `layer_0 ... layer_{n-1}`, or one scanned `layer` with stacked
    weights. A family whose layers also read position scores (MPNet's bias, DeBERTa's relative
    table) subclasses it with its `layer_cls` and `layer_inputs`.

    `__call__(x [B, L, E], mask) -> (y [B, L, E], states, probs)`: states the n layers' outputs
    [B, L, E] with `output_hidden_states`, probs their attention probabilities [B, H, L, L] with
    `output_attentions`, else None. `remat_policy` rematerializes each layer.
    """

    layer_cls: ClassVar[type[nn.Module]] = PostLNLayer
    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(
        self,
        x,
        mask: AttentionMask,
        *,
        deterministic: bool,
        output_hidden_states: bool,
        output_attentions: bool,
    ):
        kwargs = dict(
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        extra = self.layer_inputs(x)
        return run_layers(self.layer_cls, self.config, self.runtime, kwargs, x, mask, *extra)

    def layer_inputs(self, x) -> tuple:
        """What every layer takes after the mask, from the layers' input x [B, L, E] (called
        inside `__call__`'s scope, so it may hold parameters): nothing here."""
        return ()


def post_ln_layer_flops(cfg: EncoderConfig, seq_lengths: np.ndarray) -> float:
    """Forward model FLOPs of one `PostLNLayer` for sequences of the given real lengths n (any
    shape), counted as `bert_jax.training.flops` says (2 per multiply-add, padding counts
    nothing): per real token the Q, K, V and output projections 4 * 2E^2 and the feed-forward
    layer (E -> F -> E) 2 * 2EF; attention scores and context 2 * 2E per (query, key) pair, every
    pair of a sequence's n real tokens (n^2, bidirectional, no causal halving)."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    return 2.0 * (4 * e * e + 2 * e * f) * n.sum() + 2.0 * 2.0 * e * (n**2).sum()


def run_layers(
    layer_cls: type[nn.Module],
    cfg: EncoderConfig,
    rt: RuntimeConfig,
    kwargs: dict,
    x: Array,
    *args,
    layer_name: str = LAYER_NAME,
    scanned_layer: str = SCANNED_LAYER,
):
    """`cfg.num_hidden_layers` layers of `layer_cls` over x [B, L, E], called inside an encoder's
    compact `__call__`: `layer_name.format(i)` for i < n, or one scanned `scanned_layer` with
    stacked weights under `rt.scan_layers`; each rematerialized under `rt.remat_policy`.

    A layer is `layer_cls(cfg, rt, **kwargs)` (its run mode in attributes, so that `nn.scan` and
    `nn.remat` see only arrays) and maps `(x, *args)` to `(x', (state or None, probs or None))`;
    `args` are the same for every layer (the mask, rotary angles).

    Returns:
      (y [B, L, E], states, probs): the n layers' outputs [B, L, E] with
      kwargs["output_hidden_states"], their probabilities [B, H, L, L] with
      kwargs["output_attentions"], else None.
    """
    if rt.remat_policy != "none":
        layer_cls = nn.remat(
            layer_cls, policy=REMAT_POLICIES[rt.remat_policy], prevent_cse=not rt.scan_layers
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
        x, (states, probs) = scanned(cfg, rt, name=scanned_layer, **kwargs)(x, *args)
        # unstack [n, B, L, E] (and [n, B, H, L, L]) into n arrays
    else:
        states, probs = [], []
        for i in range(cfg.num_hidden_layers):
            x, (s, p) = layer_cls(cfg, rt, name=layer_name.format(i), **kwargs)(x, *args)
            states.append(s)
            probs.append(p)
    states = tuple(states) if kwargs["output_hidden_states"] else None
    probs = tuple(probs) if kwargs["output_attentions"] else None
    return x, states, probs
