"""Relative positions between a row's tokens, bucketed logarithmically past a distance: the
static [L, L] index tables of relative-position attention (DeBERTa-v2/v3's disentangled
attention reads them; T5-style biases would too).

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
