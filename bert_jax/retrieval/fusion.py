"""Reciprocal rank fusion (Cormack, Clarke and Buettcher, SIGIR 2009) of several rankings of one
query's documents: score(d) = sum over the rankings r holding d of 1 / (k + rank_r(d)), ranks
from 1; a ranking without d adds nothing.

    ids, scores = fusion.reciprocal_rank_fusion([["a", "b"], ["b", "c"]], k=60)

Equal fused scores rank by the first ranking (the better rank there first, a document it lacks
after those it holds), then by the second, and so on: a document is in at least one ranking,
where ranks differ, so no two documents tie throughout.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

DEFAULT_K = 60  # the paper's constant, as most systems keep it


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Hashable]], k: float = DEFAULT_K
) -> tuple[list, list[float]]:
    """(the D distinct ids of `rankings`, best first; their fused scores, float64 descending).

    Args:
      rankings: R lists of ids, each best first, no id twice in one list.
      k: the constant added to each rank (> 0).
    """
    if k <= 0:
        raise ValueError(f"the fusion constant k must be positive, got {k}")
    scores: dict = {}
    ranks: dict = {}
    for r, ranking in enumerate(rankings):
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
            ranks.setdefault(doc, [math.inf] * len(rankings))[r] = rank
    order = sorted(scores, key=lambda d: (-scores[d], ranks[d]))
    return order, [scores[d] for d in order]
