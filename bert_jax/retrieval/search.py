"""Exact top-k search by cosine similarity: each query's k nearest corpus rows, on the local
devices (`search`: the corpus sharded by rows over a mesh) or on the host's cores (`search_faiss`:
faiss's exact inner-product index, for a corpus beyond the devices' memory). Both give the same
candidates, equal scores in ascending corpus row order. SPLADE vectors are searched by their dot
product as sparse matrices (`search_sparse`: scipy.sparse where installed, else numpy).

    from bert_jax.retrieval import search
    candidates = search.search(query_emb, corpus_emb, k=10)   # Candidates(scores, indices)
    candidates = search.SEARCHES["faiss"](query_emb, corpus_emb, 10)

Dimensions: Q queries, N corpus rows, E embedding width, k candidates per query, D devices,
S = ceil(N / D) rows a device, C queries a chunk. Numpy at import: JAX is imported when `search`
runs (the rest of `retrieval` is host-side), faiss when `search_faiss` does.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from bert_jax.retrieval import metrics

_AXIS = "corpus"
# The most [C, S] float32 scores one device holds at once (64 MiB).
_MAX_CHUNK_SCORES = 1 << 24


class Candidates(NamedTuple):
    """Each query's best corpus texts, best first.

    Attributes:
      scores: float32 [Q, k] cosine similarities, descending.
      indices: int32 [Q, k] corpus rows; equal scores in ascending row order.
    """

    scores: np.ndarray
    indices: np.ndarray


def _shard_top_k(queries, corpus, *, k: int, num_valid: int):
    """One device: its [S, E] corpus rows' top min(k, S) for [C, E] queries, global indices."""
    import jax
    import jax.numpy as jnp

    rows = corpus.shape[0]
    scores = jnp.matmul(queries, corpus.T, precision=jax.lax.Precision.HIGHEST)  # [C, S]
    index = jax.lax.axis_index(_AXIS) * rows + jnp.arange(rows, dtype=jnp.int32)  # [S]
    scores = jnp.where(index < num_valid, scores, -jnp.inf)  # padding rows never win
    top_scores, top = jax.lax.top_k(scores, min(k, rows))  # equal scores: lower index first
    return top_scores, index[top]


def _chunk_top_k(queries, corpus, *, k: int, num_valid: int, mesh):
    """[C, E] replicated queries against the [N', E] corpus sharded by rows: (float32 [C, k],
    int32 [C, k]). Each device's candidates, concatenated in device (so row) order, are merged
    by one more top_k, which keeps equal scores in ascending row order."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    local = jax.shard_map(
        lambda q, c: _shard_top_k(q, c, k=k, num_valid=num_valid),
        mesh=mesh,
        in_specs=(P(), P(_AXIS, None)),
        out_specs=(P(None, _AXIS), P(None, _AXIS)),
    )
    scores, index = local(queries, corpus)  # [C, D * min(k, S)]
    top_scores, top = jax.lax.top_k(scores, k)
    return top_scores, jnp.take_along_axis(index, top, axis=1)


@functools.cache
def chunk_program():
    """`_chunk_top_k` compiled (`jax.jit`, k, num_valid and the mesh static): one program per
    chunk shape, kept for the process."""
    import jax

    return jax.jit(_chunk_top_k, static_argnames=("k", "num_valid", "mesh"))


def _search_inputs(queries, corpus, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Both searches' inputs: the unit float32 rows of [Q, E] queries and an [N, E] corpus;
    ValueError for other shapes or a k outside [1, N]."""
    queries, corpus = metrics.unit(queries), metrics.unit(corpus)
    if queries.ndim != 2 or corpus.ndim != 2 or queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"embeddings must be [Q, E] and [N, E]; got {queries.shape}, {corpus.shape}"
        )
    if not 1 <= k <= corpus.shape[0]:
        raise ValueError(f"k must be in [1, {corpus.shape[0]}] (the corpus size), got {k}")
    return queries, corpus


def search(queries: np.ndarray, corpus: np.ndarray, k: int) -> Candidates:
    """The exact top k of cosine similarity, the corpus sharded over the local devices.

    The corpus is padded to a multiple of the device count with rows that are never chosen;
    queries go in chunks of C (the last one padded) so that a device holds [C, S] scores at
    once, one compiled program for every chunk.

    Args:
      queries: float [Q, E].
      corpus: float [N, E].
      k: candidates per query, 1 <= k <= N.

    Returns:
      Candidates: scores float32 [Q, k] descending, indices int32 [Q, k] (equal scores in
      ascending corpus order).
    """
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    queries, corpus = _search_inputs(queries, corpus, k)
    (num_queries, width), num_docs = queries.shape, corpus.shape[0]
    devices = jax.local_devices()
    mesh = Mesh(np.array(devices), (_AXIS,))
    rows = -(-num_docs // len(devices))  # S, rows per device
    padded = np.zeros((rows * len(devices), width), np.float32)
    padded[:num_docs] = corpus
    corpus_on_mesh = jax.device_put(padded, NamedSharding(mesh, P(_AXIS, None)))
    chunk = max(1, min(_MAX_CHUNK_SCORES // rows, 1 << max(num_queries - 1, 0).bit_length()))
    replicated = NamedSharding(mesh, P())
    program = chunk_program()
    scores = np.empty((num_queries, k), np.float32)
    indices = np.empty((num_queries, k), np.int32)
    for start in range(0, num_queries, chunk):
        part = queries[start : start + chunk]
        block = np.zeros((chunk, width), np.float32)
        block[: len(part)] = part
        s, i = program(
            jax.device_put(block, replicated), corpus_on_mesh, k=k, num_valid=num_docs, mesh=mesh
        )
        scores[start : start + len(part)] = np.asarray(s)[: len(part)]
        indices[start : start + len(part)] = np.asarray(i)[: len(part)]
    return Candidates(scores, indices)


def faiss_module():
    """The faiss module; ImportError saying how to install it."""
    try:
        import faiss
    except ImportError as e:
        raise ImportError(
            "a faiss search needs faiss: pip install faiss-cpu (or the project's `retrieval` extra)"
        ) from e
    return faiss


def search_faiss(queries: np.ndarray, corpus: np.ndarray, k: int, chunk: int = 4096) -> Candidates:
    """`search` by faiss on the host's CPU cores, for a corpus whose embeddings do not fit the
    devices' memory: an exact inner-product index (`faiss.IndexFlatIP`) over the unit rows, the
    queries `chunk` at a time. faiss's candidates (2k + 8 of them, so that a run of equal
    scores across the k-th place is held whole) are scored again on the host, one float32 dot
    product each, and the top k kept with equal scores in corpus order, as `search` orders
    them: faiss's blocked sums can give equal rows scores a bit apart, and its choice among
    equal scores is its own. The same candidates as `search`, except where two scores differ
    only in their last float32 bits (the sums run in another order).

    Raises:
      ImportError: faiss is not installed, saying how to install it.
    """
    faiss = faiss_module()
    queries, corpus = _search_inputs(queries, corpus, k)
    index = faiss.IndexFlatIP(corpus.shape[1])
    index.add(corpus)
    wide = min(corpus.shape[0], 2 * k + 8)  # room for equal scores across the k-th place
    scores = np.empty((queries.shape[0], k), np.float32)
    indices = np.empty((queries.shape[0], k), np.int32)
    for start in range(0, queries.shape[0], chunk):
        part = queries[start : start + chunk]
        found = index.search(part, wide)[1]  # [C, wide]
        s = np.einsum("qe,qke->qk", part, corpus[found]).astype(np.float32)
        order = np.lexsort((found, -s), axis=1)[:, :k]  # equal scores in corpus order
        scores[start : start + len(part)] = np.take_along_axis(s, order, 1)
        indices[start : start + len(part)] = np.take_along_axis(found, order, 1)
    return Candidates(scores, indices)


def as_sparse(vectors):
    """float32 [N, V] vectors as a scipy.sparse CSR matrix (as they are where they are one);
    a dense numpy array where scipy is not installed."""
    try:
        from scipy import sparse
    except ImportError:
        return np.asarray(vectors, np.float32)
    if sparse.issparse(vectors):
        return sparse.csr_matrix(vectors, dtype=np.float32)
    return sparse.csr_matrix(np.asarray(vectors, np.float32))


def search_sparse(queries, corpus, k: int, chunk: int = 1024) -> Candidates:
    """The exact top k of the dot product of sparse vectors (SPLADE's: `inference embed
    --sparse`), as sparse matrix products on the host, `chunk` queries at a time.

    Args:
      queries: [Q, V] vectors, a numpy array or a scipy.sparse matrix (`as_sparse`).
      corpus: [N, V] vectors, the same kinds.
      k: candidates a query, in [1, N].

    Returns:
      Candidates: float32 dot products [Q, k], descending, equal scores in ascending row
      order (the products summed in float64, then rounded, as `metrics.cosine_scores`).

    Raises:
      ValueError: widths that differ, or k outside [1, N].
    """
    queries, corpus = as_sparse(queries), as_sparse(corpus)
    if queries.ndim != 2 or corpus.ndim != 2 or queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"vectors must be [Q, V] and [N, V]; got {queries.shape} and {corpus.shape}"
        )
    if not 1 <= k <= corpus.shape[0]:
        raise ValueError(f"k={k} outside [1, {corpus.shape[0]}] (the corpus rows)")
    corpus_t = corpus.T.astype(np.float64)
    scores = np.empty((queries.shape[0], k), np.float32)
    indices = np.empty((queries.shape[0], k), np.int32)
    for start in range(0, queries.shape[0], chunk):
        product = queries[start : start + chunk].astype(np.float64) @ corpus_t  # [C, N]
        dense = np.asarray(product.toarray() if hasattr(product, "toarray") else product)
        dense = dense.astype(np.float32)
        top = metrics.top_k(dense, k)
        scores[start : start + len(top)] = np.take_along_axis(dense, top, 1)
        indices[start : start + len(top)] = top
    return Candidates(scores, indices)


# The searches by the name the commands give them (`--search` of mining, `--index` of search).
# Dense embeddings only: `search_sparse` (dot products of sparse vectors) is search's own.
SEARCHES = {"mesh": search, "faiss": search_faiss}
