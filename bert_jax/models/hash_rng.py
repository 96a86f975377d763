"""A JAX key implementation whose bits are a counter hash: dropout masks at a fraction of
threefry's cost on CPUs (`RuntimeConfig.dropout_rng="hash"`).

Threefry-2x32 spends 20 rounds on every two 32-bit words; on a 2-core AMD EPYC that was 20-24 ns
a word, and a reranker step of MiniLM with dropout draws about 38 million words (18% of its step,
benchmarks/RESULTS.md "Where the reranker's remaining speed goes"). Here a key is threefry's
two words, split and folded in by threefry exactly as a threefry key is (so flax's `make_rng`
gives each module and call its own key), and only `random_bits` differs: word i of a draw is

    fmix32(fmix32(i + k0) ^ k1)

with (k0, k1) the key's words and fmix32 MurmurHash3's 32-bit finalizer (two multiplies and
three xor-shifts, a bijection whose every output bit depends on every input bit). The counter i
is the word's position in the whole array, so the bits are the same whatever the sharding or
platform, as threefry's are. That is enough for dropout masks (each word compared once with a
threshold, keys from threefry); it is not a generator for anything that needs cryptographic
strength.
"""

from __future__ import annotations

import math

import jax
import jax.extend.random as jax_random
import jax.numpy as jnp

_THREEFRY = jax_random.threefry_prng_impl
_WIDTHS = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}


def _fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's finalizer of uint32 words (a bijection of 32-bit words)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def hash_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    """Unsigned `bit_width`-bit words (8, 16 or 32) of `shape` from key data uint32 [2]: the low
    bits of one hashed word each. ValueError for other widths and past 2^32 words a draw."""
    if bit_width not in _WIDTHS:
        raise ValueError(
            f"runtime.dropout_rng='hash' draws 8-, 16- or 32-bit words, not {bit_width}"
        )
    size = math.prod(shape)
    if size >= 2**32:
        raise ValueError(
            f"runtime.dropout_rng='hash' draws fewer than 2^32 words at once, not {shape}: use "
            "dropout_rng='threefry'"
        )
    counter = jax.lax.iota(jnp.uint32, size).reshape(shape)
    return _fmix32(_fmix32(counter + key[0]) ^ key[1]).astype(_WIDTHS[bit_width])


HASH = jax_random.define_prng_impl(
    key_shape=_THREEFRY.key_shape,
    seed=_THREEFRY.seed,
    split=_THREEFRY.split,
    random_bits=hash_bits,
    fold_in=_THREEFRY.fold_in,
    name="hash",
    tag="hsh",
)


def hash_key(threefry_key: jax.Array) -> jax.Array:
    """The hash key with a threefry key's words (a typed key or raw uint32 [2])."""
    data = threefry_key
    if jax.dtypes.issubdtype(threefry_key.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(threefry_key)
    return jax.random.wrap_key_data(data, impl=HASH)
