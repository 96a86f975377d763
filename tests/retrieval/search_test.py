"""Exact top-k search (bert_jax.retrieval.search): the sharded search against numpy on 8
devices (ties, a corpus not divisible by 8, query chunks) and faiss's against it. (The module
imports no framework at module level: tests/layering_test.py.)"""

import jax
import numpy as np
import pytest

from bert_jax.retrieval import metrics as retrieval
from bert_jax.retrieval import search


def _reference(queries, corpus, k):
    scores = retrieval.cosine_scores(queries, corpus)
    top = retrieval.top_k(scores, k)  # a stable sort: equal scores in corpus order
    return np.take_along_axis(scores, top, axis=1), top


def test_search_equals_numpy_on_8_devices_with_ties_and_padding(monkeypatch):
    assert jax.local_device_count() == 8
    rng = np.random.default_rng(0)

    # Unit rows of four entries +-0.5 among 8: every score is a multiple of 1/4, so ties abound
    # and are exact however the device sums.
    def unit_rows(n):
        x = np.zeros((n, 8), np.float32)
        for row in x:
            row[rng.choice(8, 4, replace=False)] = rng.choice([-0.5, 0.5], 4)
        return x

    queries, corpus = unit_rows(11), unit_rows(37)  # 37 rows: 5 per device, 3 padding rows
    for k in (1, 6, 37):
        scores, indices = search.search(queries, corpus, k)
        want_scores, want = _reference(queries, corpus, k)
        assert scores.shape == indices.shape == (11, k) and indices.dtype == np.int32
        np.testing.assert_array_equal(indices, want)
        np.testing.assert_allclose(scores, want_scores, atol=1e-6)
    assert len(set(np.round(_reference(queries, corpus, 37)[0][0], 3))) < 37  # ties were there
    # Queries in chunks of 4 (the last one padded): one more program, the same answer.
    monkeypatch.setattr(search, "_MAX_CHUNK_SCORES", 4 * 5)
    before = search.chunk_program()._cache_size()
    scores, indices = search.search(queries, corpus, 6)
    np.testing.assert_array_equal(indices, _reference(queries, corpus, 6)[1])
    assert search.chunk_program()._cache_size() == before + 1
    search.search(queries[::-1], corpus[::-1], 6)  # the same shapes: compiled already
    assert search.chunk_program()._cache_size() == before + 1
    with pytest.raises(ValueError, match="k must be in"):
        search.search(queries, corpus, 38)


def test_faiss_search_equals_the_mesh_search():
    pytest.importorskip("faiss")
    rng = np.random.default_rng(5)
    queries, corpus = rng.normal(size=(37, 24)), rng.normal(size=(301, 24))
    ours = search.search(queries, corpus, 11)
    theirs = search.search_faiss(queries, corpus, 11, chunk=8)  # queries in 5 chunks
    np.testing.assert_array_equal(theirs.indices, ours.indices)
    np.testing.assert_allclose(theirs.scores, ours.scores, atol=1e-6)
    with pytest.raises(ValueError, match=r"k must be in \[1, 301\]"):
        search.search_faiss(queries, corpus, 302)


def test_sparse_search_ranks_by_dot_product_with_or_without_scipy(monkeypatch):
    """SPLADE vectors (>= 0, mostly 0; weights of quarters, so that ties are exact): the top k of
    their dot products, equal scores in corpus order, from a scipy.sparse matrix, a dense array,
    and without scipy (numpy), in query chunks."""
    rng = np.random.default_rng(2)
    queries, corpus = (
        (rng.integers(0, 4, size=(n, 50)) * (rng.random((n, 50)) < 0.1) / 4).astype(np.float32)
        for n in (9, 23)
    )
    dots = queries.astype(np.float64) @ corpus.T.astype(np.float64)
    want = retrieval.top_k(dots, 5)
    sparse = pytest.importorskip("scipy.sparse")
    for q, c in ((queries, corpus), (sparse.csr_matrix(queries), sparse.csr_matrix(corpus))):
        found = search.search_sparse(q, c, 5, chunk=4)
        np.testing.assert_array_equal(found.indices, want)
        np.testing.assert_allclose(found.scores, np.take_along_axis(dots, want, 1), rtol=1e-6)
    monkeypatch.setitem(__import__("sys").modules, "scipy", None)  # scipy absent: numpy
    assert isinstance(search.as_sparse(queries), np.ndarray)
    np.testing.assert_array_equal(search.search_sparse(queries, corpus, 5).indices, want)
    with pytest.raises(ValueError, match=r"k=24 outside \[1, 23\]"):
        search.search_sparse(queries, corpus, 24)
