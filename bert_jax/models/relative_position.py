"""Relative positions between a row's tokens, bucketed logarithmically past a distance: the
static [L, L] index tables of relative-position attention (DeBERTa-v2/v3's disentangled
attention reads `relative_positions`; MPNet's learned per-head score bias reads T5's buckets,
`t5_relative_position_buckets`).

Distances are between row indices, as transformers builds them (`build_relative_position`), so
they are numpy constants of a length, computed once per trace.

Dimension legend: L sequence length.
"""

from __future__ import annotations

import numpy as np


def make_log_bucket_position(
    relative_pos: np.ndarray, bucket_size: int, max_position: int
) -> np.ndarray:
    """Distances beyond bucket_size // 2 mapped to log-spaced buckets (transformers'
    `make_log_bucket_position`, in float32 as it computes them).

    Args:
      relative_pos: int distances (any shape).
      bucket_size: `position_buckets`; mid = bucket_size // 2.
      max_position: the distance the last bucket reaches (`relative_distance`).

    Returns:
      int32, the same shape: d where |d| <= mid, else sign(d) (mid + ceil(log(|d| / mid) /
      log((max_position - 1) / mid) x (mid - 1))).
    """
    rel = np.asarray(relative_pos, np.int64)
    mid = bucket_size // 2
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    ratio = abs_pos.astype(np.float32) / np.float32(mid)
    span = np.log(np.float32((max_position - 1) / mid))
    log_pos = np.ceil(np.log(ratio) / span * np.float32(mid - 1)) + np.float32(mid)
    return np.where(abs_pos <= mid, rel, log_pos * np.sign(rel)).astype(np.int32)


def relative_positions(length: int, bucket_size: int = -1, max_position: int = -1) -> np.ndarray:
    """int32 [L, L]: the distance i - j from query i to key j, bucketed
    (`make_log_bucket_position`) when both `bucket_size` and `max_position` are positive
    (transformers' `build_relative_position`); static for a length."""
    index = np.arange(length)
    rel = index[:, None] - index[None, :]
    if bucket_size > 0 and max_position > 0:
        rel = make_log_bucket_position(rel, bucket_size, max_position)
    return rel.astype(np.int32)


def t5_relative_position_buckets(
    length: int, num_buckets: int = 32, max_distance: int = 128
) -> np.ndarray:
    """int32 [L, L]: T5's bidirectional bucket of the distance from query i to key j (MPNet's
    `relative_position_bucket`, computed in float32 as transformers does); static for a length.

    Half the buckets are for keys after the query (j > i), half for the rest; in each half the
    first num_buckets // 4 distances have a bucket each and the others share log-spaced ones up
    to `max_distance`, beyond which all fall in the half's last bucket.

    Args:
      length: L, the row's length (distances are between row indices).
      num_buckets: buckets of both directions together (even).
      max_distance: the distance the last log-spaced bucket starts at.
    """
    index = np.arange(length)
    n = index[:, None] - index[None, :]  # query minus key: negative for keys after the query
    half = num_buckets // 2
    ret = np.where(n < 0, half, 0)
    n = np.abs(n)
    max_exact = half // 2
    ratio = np.maximum(n, 1).astype(np.float32) / np.float32(max_exact)  # n = 0 reads `n` below
    scaled = np.log(ratio) / np.float32(np.log(max_distance / max_exact)) * (half - max_exact)
    large = np.minimum(max_exact + scaled.astype(np.int64), half - 1)
    return (ret + np.where(n < max_exact, n, large)).astype(np.int32)
