"""Fine-tuned models scored: model outputs for every row of an evaluation split
(`predict_split`), the task's metrics on it with its prediction files (`score`), and the final
metrics of a seed over every split (`evaluate_splits`). A NaN metric stops the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from bert_jax.data import batching
from bert_jax.finetune.task import EvalSet
from bert_jax.inference import batches
from bert_jax.parallel import sharding
from bert_jax.paths import as_path
from bert_jax.training import experiment


def predict_split(exp: experiment.Experiment, params, eval_set: EvalSet, batch_size: int, buckets):
    """Model outputs for every row of `eval_set`, in feature order (fillers dropped)."""
    if batch_size % sharding.data_parallel_size(exp.mesh):
        raise ValueError(f"eval_batch_size={batch_size} must split over the data-parallel devices")
    predict = exp.predict_fn()
    rows = sharding.host_batch_rows(exp.mesh, batch_size)
    outputs, indices = [], []
    with jax.set_mesh(exp.mesh):
        for batch, idx in batching.batches(
            eval_set.features,
            batch_size,
            bucket_boundaries=buckets,
            group_by_length=buckets is not None,  # short rows together: padded to their bucket
            return_indices=True,
        ):
            local = {k: v[rows] for k, v in batch.items()}
            out = predict(params, sharding.global_batch_from_local(local, exp.mesh))
            out = jax.device_get(
                jax.tree_util.tree_map(
                    lambda x: multihost_utils.process_allgather(x, tiled=True), out
                )
            )
            outputs.append(out)
            indices.append(idx)
    n = batching.num_rows(eval_set.features)
    fields = [
        f.name for f in dataclasses.fields(outputs[0]) if getattr(outputs[0], f.name) is not None
    ]
    fields = [f for f in fields if f not in ("hidden_states", "attentions")]
    return {f: batching.unbatch([getattr(o, f) for o in outputs], indices, n) for f in fields}


def _require_finite(scores: Mapping[str, float], split: str) -> None:
    """Stops the run on a NaN metric rather than reporting or averaging a meaningless score."""
    bad = sorted(k for k, v in scores.items() if not np.isfinite(v))
    if bad:
        raise FloatingPointError(
            f"{split} metric(s) {', '.join(bad)} are NaN ({scores}): the predictions hold NaN or "
            "are constant, or the labels are; stopping"
        )


def evaluate_splits(exp, params, task, data, ft, buckets, out_dir=None) -> dict[str, float]:
    """The final metrics: dev as they are, a labelled test split as test_<metric> (the test set
    only with `ft.evaluate_test`); prediction files go to `out_dir`."""
    final = {}
    for eval_set in data.evals:
        if eval_set.name == "test" and not ft.evaluate_test:
            continue
        scores = score(exp, params, task, data, eval_set, ft, buckets, out_dir)
        if eval_set.name == "dev":
            final.update(scores)
        else:  # a labelled test set (the Shakespeare task's plays) is scored too
            final.update({f"{eval_set.name}_{k}": v for k, v in scores.items()})
    return final


def score(exp, params, task, data, eval_set, ft, buckets, out_dir=None) -> dict[str, float]:
    """The task's metrics on `eval_set` (if labelled), writing its prediction files to out_dir
    (process 0); stops on a NaN metric. With `ft.pack` a packable task's examples are packed
    several to a row, as in training (`inference.batches.run_on_mesh`), else batched by length
    (`predict_split`)."""
    if ft.pack and task.packable:  # as training packs: several examples a row
        predict = exp.predict_fn()
        logits = batches.run_on_mesh(
            exp.mesh,
            lambda p, batch: predict(p, batch).logits,  # [R, S, ...], or [R, L, ...] a token
            params,
            eval_set.features,
            ft.eval_batch_size,
            "finetune.eval_batch_size",
            max_segments=ft.max_segments,
            per_token="label_weights" in eval_set.features,
        )
        outputs = {"logits": logits}
    else:
        outputs = predict_split(exp, params, eval_set, ft.eval_batch_size, buckets)
    write_dir = out_dir if out_dir is not None and jax.process_index() == 0 else None
    if write_dir is not None:
        as_path(write_dir).mkdir(parents=True, exist_ok=True)
    result = task.score(data, eval_set, outputs, ft, write_dir)
    _require_finite(result, eval_set.name)
    return result
