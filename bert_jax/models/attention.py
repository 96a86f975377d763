"""Self-attention kernels, the masks they take, and the one function that chooses among them.

Implementations (`RuntimeConfig.attention`):
  xla        einsum + float32 softmax: the exact reference, the only one with attention-probability
             dropout. Any platform, dtype, head size and mask.
  cudnn      cuDNN flash attention via `jax.nn.dot_product_attention`: CUDA GPUs, bfloat16, head
             size a multiple of 8 up to 128.
  fused_xla  the same call lowered by XLA: any platform.
  splash     Pallas splash attention with segment ids: TPUs (Pallas interpret mode on a CPU).
  auto       `resolve_attention` picks: xla when training with attention-probability dropout or
             with a score bias, else cudnn on CUDA where it applies, splash on TPU, xla otherwise.

Masks reach every kernel whole (cudnn and fused_xla: the boolean mask; splash: segment ids), so
left padding, holes and packed rows are exact at real tokens; outputs at padding differ between
kernels and nothing reads them. A local layer's `AttentionMask.window` is a band in the boolean
mask, and splash's `LocalMask` on TPU. A score bias (`attend(..., bias=)`, DeBERTa's
relative-position scores; configs with a true `attention_score_bias`) and a scale other than
1 / sqrt(D) are taken by xla and fused_xla only.

Dimension legend: B batch, L length, H heads, D head size.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax import hardware
from bert_jax.models.config import EncoderConfig, RuntimeConfig

Array = jax.Array

CUDNN_DTYPES = ("bfloat16",)  # float16 is refused by RuntimeConfig (no loss scaling)
SPLASH_BLOCKS = (512, 256, 128)  # block sizes tried, largest first; 128 lanes is the least


# ---- Choosing ----
def takes_score_bias(cfg: EncoderConfig) -> bool:
    """Whether the model's attention adds a score term of its own to the scaled scores (its
    config's `attention_score_bias`: DeBERTa's relative positions), which only the xla and
    fused_xla kernels take."""
    return bool(getattr(cfg, "attention_score_bias", False))


def cudnn_supports(cfg: EncoderConfig, dtype: str) -> bool:
    """Whether cuDNN's flash attention takes this model's heads in `dtype` (on a CUDA GPU)."""
    head = cfg.head_dim
    return dtype in CUDNN_DTYPES and head % 8 == 0 and head <= hardware.CUDNN_MAX_HEAD_DIM


def resolve_attention(
    runtime: RuntimeConfig,
    cfg: EncoderConfig,
    platform: str,
    *,
    training: bool,
    compute_capability: str | None = None,
) -> str:
    """The attention implementation a layer runs: `runtime.attention` checked, or `auto` chosen.

    Pure: depends only on its arguments, so every platform can be checked from any machine.

    Args:
      runtime: the run-time config; its dtype may still be "auto" (resolved here for `platform`).
      cfg: the architecture (head size, attention-probability dropout).
      platform: "cpu", "cuda" (or "gpu"), "rocm" or "tpu"; see `hardware.current_platform`.
      training: dropout is on (`deterministic=False`).
      compute_capability: the CUDA GPU's, "major.minor" (None: unknown, taken as able). cuDNN's
        flash attention needs `hardware.CUDNN_MIN_COMPUTE_CAPABILITY`; below it `auto` is xla.

    Returns:
      "xla", "cudnn", "fused_xla" or "splash".

    Raises:
      ValueError: an explicit choice that cannot run here, naming what to use instead.
    """
    platform = hardware.check_platform(platform)
    dtype = runtime.compute_dtype(platform, compute_capability=compute_capability)
    dropping = training and cfg.attention_probs_dropout_prob > 0.0
    if runtime.attention == "auto":
        return _choose(cfg, platform, dtype, dropping, compute_capability)
    _check_choice(runtime.attention, cfg, platform, dtype, dropping, compute_capability)
    return runtime.attention


def _choose(
    cfg: EncoderConfig, platform: str, dtype: str, dropping: bool, compute_capability: str | None
) -> str:
    """What `auto` runs: xla when dropping attention probabilities (the only kernel that does) or
    adding a score bias, cudnn on CUDA where it takes the heads and the card, splash on TPU, else
    xla."""
    if dropping or takes_score_bias(cfg):
        return "xla"
    if (
        platform == "cuda"
        and cudnn_supports(cfg, dtype)
        and hardware.has_cudnn_flash_attention(compute_capability)
    ):
        return "cudnn"
    if platform == "tpu":
        return "splash"
    return "xla"


def _check_choice(
    choice: str,
    cfg: EncoderConfig,
    platform: str,
    dtype: str,
    dropping: bool,
    compute_capability: str | None,
) -> None:
    """Raises a ValueError naming what to use instead when the kernel `choice` cannot run here."""
    prefix = f"RuntimeConfig.attention={choice!r}"
    if choice in ("cudnn", "splash") and takes_score_bias(cfg):
        raise ValueError(
            f"{prefix} cannot add {cfg.display_name}'s relative-position scores to the attention "
            "scores (the kernel takes no score bias); use attention='xla' (or 'auto', which picks "
            "it, or 'fused_xla')"
        )
    if choice != "xla" and dropping:
        raise ValueError(
            f"{prefix} cannot apply attention-probability dropout "
            f"(attention_probs_dropout_prob={cfg.attention_probs_dropout_prob}); set it to 0.0 or "
            "use attention='xla' or 'auto'"
        )
    if choice == "cudnn":
        _check_cudnn(prefix, cfg, platform, dtype, compute_capability)
    if choice == "splash" and platform not in ("tpu", "cpu"):
        raise ValueError(
            f"{prefix} is a TPU kernel (interpreted on CPU for tests), not for {platform!r}; "
            "use attention='auto'"
        )


def _check_cudnn(
    prefix: str, cfg: EncoderConfig, platform: str, dtype: str, compute_capability: str | None
) -> None:
    """cuDNN's flash attention needs a CUDA card of `hardware.CUDNN_MIN_COMPUTE_CAPABILITY`
    and heads it takes (`cudnn_supports`)."""
    if platform != "cuda":
        raise ValueError(
            f"{prefix} needs a CUDA GPU, not {platform!r}; use attention='auto' (or "
            "'splash' on TPU, 'xla' anywhere)"
        )
    if not hardware.has_cudnn_flash_attention(compute_capability):
        least = ".".join(map(str, hardware.CUDNN_MIN_COMPUTE_CAPABILITY))
        raise ValueError(
            f"{prefix} needs a GPU of compute capability {least} or later (cuDNN's flash "
            f"attention), not {compute_capability}; use attention='auto' (xla there) or 'xla'"
        )
    if not cudnn_supports(cfg, dtype):
        raise ValueError(
            f"{prefix} takes {CUDNN_DTYPES} heads of a size that is a multiple of 8 up to "
            f"{hardware.CUDNN_MAX_HEAD_DIM}, not {dtype} heads of size {cfg.head_dim}; "
            "use attention='auto' or 'xla'"
        )


# ---- Masks ----
def attention_mask_to_bias_mask(attention_mask: Array, segment_ids: Array | None) -> Array:
    """The boolean key mask the xla and fused kernels receive.

    Args:
      attention_mask: [B, L] int/bool, 1 for real tokens, 0 for padding.
      segment_ids: optional [B, L] int, packed-sequence ids (0 = padding); when given, a query
        attends only to keys of its own segment.

    Returns:
      bool [B, 1, 1, L] (padding only) or [B, 1, L, L] (packed segments); True = attend.
    """
    if segment_ids is None:
        return attention_mask.astype(bool)[:, None, None, :]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    valid = (segment_ids != 0)[:, None, :] & attention_mask.astype(bool)[:, None, :]
    return (same & valid)[:, None, :, :]


@flax.struct.dataclass
class AttentionMask:
    """Which keys each query attends to, kept small ([B, L]) until a kernel asks for its form.

    Attributes:
      tokens: bool [B, L], True at real tokens (any pattern: right or left padding, holes).
      segment_ids: int [B, L] packed-sequence ids (0 = padding), or None for one sequence a row.
      window: a local layer's reach, static: a query at index i sees keys at indices within
        `window` of i on either side (and the rest of the mask); None = global.
      mask_queries: static; True masks a padding query's whole row too (it attends no key, so
        its probabilities are uniform), as transformers' DeBERTa does: only outputs at padding
        change, to be transformers' there too.
    """

    tokens: Array
    segment_ids: Array | None = None
    window: int | None = flax.struct.field(pytree_node=False, default=None)
    mask_queries: bool = flax.struct.field(pytree_node=False, default=False)

    def local(self, window: int | None) -> AttentionMask:
        """The same rows seen through a sliding window of `window` keys a side (None: global)."""
        return self.replace(window=window)

    def dense(self) -> Array:
        """bool [B, 1, 1|L, L] ([B, 1, L, L] with a window or `mask_queries`), True = attend
        (`attention_mask_to_bias_mask`, then the padding queries' rows, then the window's band)."""
        dense = attention_mask_to_bias_mask(self.tokens, self.segment_ids)
        if self.mask_queries:
            dense = dense & self.tokens.astype(bool)[:, None, :, None]
        if self.window is None:
            return dense
        index = jnp.arange(self.tokens.shape[1])
        band = jnp.abs(index[:, None] - index[None, :]) <= self.window  # [L, L]
        return dense & band

    def ids(self) -> Array:
        """int32 [B, L]: a real token attends exactly the real tokens of equal id; 0 = padding."""
        if self.segment_ids is None:
            return self.tokens.astype(jnp.int32)
        return jnp.where(self.tokens, self.segment_ids.astype(jnp.int32), 0)


# ---- xla: the exact reference ----
def dropout_keep(rng: Array, shape: tuple[int, ...], rate: float) -> Array:
    """bool `shape`, True with probability 1 - rate: raw 32-bit words against an integer
    threshold (exact to 2^-32, without turning every word into a float first)."""
    threshold = min(int(round(rate * 2.0**32)), 2**32 - 1)
    return jax.random.bits(rng, shape, jnp.uint32) >= jnp.uint32(threshold)


def dropout(x: Array, rate: float, rng: Array) -> Array:
    """x with each element zeroed with probability `rate`, the others scaled by 1 / (1 - rate)."""
    keep = dropout_keep(rng, x.shape, rate)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _softmax_attend(scores, mask, v, rng, rate):
    """softmax(scores where mask) [B, H, L, L] float32, dropped out, times v [B, L, H, D].

    Returns [B, L, H, D] in v's dtype. Keeps one copy of the probabilities for the backward
    pass, in v's dtype (2 bytes a score in bfloat16; the float32 scores, a boolean mask per
    score and a dropped copy are not kept), and recomputes the dropout mask from `rng` there.

    For a TPU with dropout, the probabilities sit behind an optimization barrier: undifferentiated
    (GradCache's first pass) libtpu 0.0.42 otherwise crashes compiling the softmax, a bfloat16
    dropout and the value matmul fused (benchmarks/RESULTS_tpu.md, "The libtpu crash GradCache
    met"). Elsewhere it would only cost a pass over the probabilities.
    """
    probs = _probs(scores, mask, v.dtype)
    if rng is not None and hardware.current_platform() == "tpu":
        probs = jax.lax.optimization_barrier(probs)
    return _attend(probs, v, rng, rate)


def _probs(scores, mask, dtype):
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1).astype(dtype)  # [B, H, L, L]


def _attend(probs, v, rng, rate):
    return jnp.einsum("bhqk,bkhd->bqhd", _dropped(probs, rng, rate), v)


def _dropped(probs, rng, rate):
    return probs if rng is None else dropout(probs, rate, rng)


def _softmax_attend_fwd(scores, mask, v, rng, rate):
    probs = _probs(scores, mask, v.dtype)
    return _attend(probs, v, rng, rate), (probs, mask, v, rng)


def _softmax_attend_bwd(rate, residuals, g):
    probs, mask, v, rng = residuals
    kept = _dropped(probs, rng, rate)
    dv = jnp.einsum("bhqk,bqhd->bkhd", kept, g, preferred_element_type=jnp.float32)
    dkept = jnp.einsum("bqhd,bkhd->bhqk", g, v, preferred_element_type=jnp.float32)
    if rng is not None:  # d(dropout): the same mask and scale
        dkept = jnp.where(dropout_keep(rng, probs.shape, rate), dkept / (1.0 - rate), 0.0)
    p = probs.astype(jnp.float32)
    dscores = p * (dkept - jnp.sum(dkept * p, axis=-1, keepdims=True))
    return jnp.where(mask, dscores, 0.0), None, dv.astype(v.dtype), None


_softmax_attend.defvjp(_softmax_attend_fwd, _softmax_attend_bwd)


def xla_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    return_probs: bool = False,
    bias: Array | None = None,
    scale: float | None = None,
) -> tuple[Array, Array | None]:
    """Reference scaled dot-product attention.

    Scores accumulate in float32 (never rounded to the compute dtype), and the scale, the mask
    and the softmax run in float32, as in the original; the probabilities are then kept once, in
    the compute dtype, for both the value matmul and the backward pass.

    Args:
      q, k, v: [B, L, H, D] in the compute dtype.
      mask: bool [B, 1, 1|L, L], True = attend.
      dropout_rate / dropout_rng: attention-probability dropout; none when the rng is None.
      return_probs: also return the float32 probabilities (before dropout).
      bias: float32 [B|1, H|1, L, L] added to the scaled scores before the mask, or None.
      scale: the scores' factor; None: 1 / sqrt(D).

    Returns:
      context [B, L, H, D] in v's dtype, and probabilities [B, H, L, L] float32 or None.
    """
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    if scale is None:
        scores = scores / jnp.sqrt(jnp.float32(q.shape[-1]))  # [B, H, L, L]
    else:
        scores = scores * jnp.float32(scale)
    if bias is not None:
        scores = scores + bias.astype(jnp.float32)
    rng = dropout_rng if dropout_rate > 0.0 else None
    context = _softmax_attend(scores, mask, v, rng, float(dropout_rate))
    probs = None
    if return_probs:
        probs = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)
    return context, probs


# ---- Fused kernels ----
def _pad_length(x: Array, length: int, value=0) -> Array:
    """x [B, L, ...] padded with `value` along L to `length`."""
    pad = [(0, 0)] * x.ndim
    pad[1] = (0, length - x.shape[1])
    return jnp.pad(x, pad, constant_values=value)


def fused_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: AttentionMask,
    implementation: str,
    bias: Array | None = None,
    scale: float | None = None,
):
    """`jax.nn.dot_product_attention` ("cudnn" or "fused_xla") with the whole boolean mask.

    cuDNN takes a mask as a bias of shape [B, 1, L, L] and, when training, an even length: odd
    lengths are padded by one masked position inside the call.

    Args:
      q, k, v: [B, L, H, D]; mask: the rows' `AttentionMask`.
      bias: float32 [B|1, H|1, L, L] added to the scaled scores (fused_xla only), or None.
      scale: the scores' factor; None: 1 / sqrt(D).

    Returns:
      context [B, L, H, D] in q's dtype.
    """
    dense = mask.dense()  # [B, 1, 1|L, L]
    if implementation == "fused_xla":
        return jax.nn.dot_product_attention(
            q, k, v, bias=bias, mask=dense, scale=scale, implementation="xla"
        )
    if bias is not None:
        raise ValueError("cuDNN's attention here takes no score bias; use attention='xla'")
    batch, length = q.shape[:2]
    padded = length + length % 2
    dense = jnp.broadcast_to(dense, (batch, 1, length, length))
    if padded != length:
        q, k, v = (_pad_length(x, padded) for x in (q, k, v))
        dense = jnp.pad(dense, ((0, 0), (0, 0), (0, 1), (0, 1)))  # pad keys: never attended
    out = jax.nn.dot_product_attention(q, k, v, mask=dense, scale=scale, implementation="cudnn")
    return out[:, :length]


def _splash_kernel(num_heads: int, length: int, interpret: bool, window: int | None = None):
    """A splash kernel for [H, length, D] inputs (length a multiple of 128): no static mask, or
    a `LocalMask` of `window` keys a side.

    Built per trace, never cached: its mask tables become arrays of the trace that builds it."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    block = next(b for b in SPLASH_BLOCKS if length % b == 0)
    sizes = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        use_fused_bwd_kernel=True,
    )
    if window is None:
        head_mask = splash.FullMask((length, length))
    else:
        head_mask = splash.LocalMask((length, length), window_size=(window, window), offset=0)
    static = splash.MultiHeadMask([head_mask] * num_heads)
    return splash.make_splash_mha(
        static, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )


def _splash_shard(q, k, v, ids, *, interpret: bool, window: int | None):
    """Splash attention on one shard: q, k, v [B, L, H, D] (L a multiple of 128), ids [B, L]."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    kernel = _splash_kernel(q.shape[2], q.shape[1], interpret, window)
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [B, L, H, D] <-> [B, H, L, D]
    out = jax.vmap(kernel)(
        heads_first(q), heads_first(k), heads_first(v), splash.SegmentIds(q=ids, kv=ids)
    )
    return heads_first(out)


def _dividing(axes, size: int, mesh):
    """`axes` (a PartitionSpec entry) when their mesh sizes divide `size`, else None."""
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    return axes if size % math.prod(mesh.shape[n] for n in names) == 0 else None


def splash_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: AttentionMask,
    *,
    interpret: bool,
    scale: float | None = None,
):
    """Pallas TPU splash attention with segment ids: padding and packed rows both become ids;
    a local layer's window becomes the kernel's static `LocalMask`.

    The length is padded inside the call to a multiple of 128 (the kernel's least block), the pad
    given id 0 like padding, so any length runs. Under a mesh the kernel runs per shard
    (`shard_map`) over the batch and head axes of the activation sharding rules.

    Args:
      q, k, v: [B, L, H, D] in the compute dtype.
      mask: the rows' `AttentionMask`.
      interpret: run the kernel in Pallas interpret mode (CPU tests).
      scale: the scores' factor; None: 1 / sqrt(D).

    Returns:
      context [B, L, H, D] in q's dtype.
    """
    length = q.shape[1]
    padded = -(-length // 128) * 128
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q = q * jnp.asarray(scale, q.dtype)  # splash does not scale
    q, k, v = (_pad_length(x, padded) for x in (q, k, v))
    ids = _pad_length(mask.ids(), padded)  # [B, Lp]
    local = functools.partial(_splash_shard, interpret=interpret, window=mask.window)
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and math.prod(mesh.shape.values()) > 1:
        spec = nn.logical_to_mesh_axes(("act_batch", "act_len", "act_heads", None))
        if spec[1] is not None:
            raise ValueError(
                f"attention='splash' does not split the sequence axis (act_len -> {spec[1]!r}); "
                "map act_len to None or use attention='xla'"
            )
        # Axes that do not divide their dimension (a batch of 1 at init) stay whole.
        spec = jax.sharding.PartitionSpec(
            *(_dividing(axes, n, mesh) for axes, n in zip(spec, q.shape, strict=True))
        )
        ids_spec = jax.sharding.PartitionSpec(spec[0], None)
        local = jax.shard_map(
            local, in_specs=(spec, spec, spec, ids_spec), out_specs=spec, check_vma=False
        )
    return local(q, k, v, ids)[:, :length]


# ---- Dispatch ----
def layer_attend(
    module: nn.Module,
    q: Array,
    k: Array,
    v: Array,
    mask: AttentionMask,
    *,
    deterministic: bool,
    output_attentions: bool = False,
    **kwargs,
) -> tuple[Array, Array | None]:
    """`attend` from a layer's call: with `module`'s config and runtime, and its "dropout" key
    when training (`deterministic` False) with a nonzero `attention_probs_dropout_prob`.
    kwargs: `attend`'s bias and scale. Returns what `attend` returns."""
    cfg = module.config
    training = not deterministic and cfg.attention_probs_dropout_prob > 0.0
    return attend(
        q, k, v, mask, config=cfg, runtime=module.runtime,
        dropout_rng=module.make_rng("dropout") if training else None,
        output_attentions=output_attentions, **kwargs,
    )  # fmt: skip


def attend(
    q: Array,
    k: Array,
    v: Array,
    mask: AttentionMask,
    *,
    config: EncoderConfig,
    runtime: RuntimeConfig,
    dropout_rng: Array | None = None,
    output_attentions: bool = False,
    bias: Array | None = None,
    scale: float | None = None,
) -> tuple[Array, Array | None]:
    """Attention through the kernel `resolve_attention` picks here; what every family's layers call.

    Args:
      q, k, v: [B, L, H, D] in the compute dtype (scaled by `scale` here, not before).
      mask: the rows' `AttentionMask` (a local layer's carries its window).
      config: the architecture (`BertConfig`, `ModernBertConfig`): its head size and
        `attention_probs_dropout_prob`; `attention_score_bias` when it passes `bias`.
      runtime: the run-time config (dtype, `attention`).
      dropout_rng: attention-probability dropout's key when training with it, else None.
      output_attentions: also return the probabilities, which takes the xla path (it forms them).
      bias: float32 [B|1, H|1, L, L] added to the scaled scores before the mask and the softmax
        (DeBERTa's relative-position scores), or None; xla and fused_xla only.
      scale: the scores' factor; None: 1 / sqrt(D).

    Returns:
      context [B, L, H, D] in v's dtype, and probabilities [B, H, L, L] float32 or None.
    """
    platform = hardware.current_platform()
    implementation = resolve_attention(runtime, config, platform, training=dropout_rng is not None)
    if bias is not None and implementation not in ("xla", "fused_xla"):
        raise ValueError(
            f"a score bias takes attention='xla' or 'fused_xla', not {implementation!r}; "
            "the config must say `attention_score_bias`"
        )
    if implementation == "xla" or output_attentions:
        rate = config.attention_probs_dropout_prob if dropout_rng is not None else 0.0
        return xla_attention(
            q,
            k,
            v,
            mask.dense(),
            dropout_rate=rate,
            dropout_rng=dropout_rng,
            return_probs=output_attentions,
            bias=bias,
            scale=scale,
        )
    if implementation == "splash":
        return splash_attention(q, k, v, mask, interpret=platform != "tpu", scale=scale), None
    return fused_attention(q, k, v, mask, implementation, bias=bias, scale=scale), None
