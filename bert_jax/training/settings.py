"""A run's settings and results in its workdir (the fine-tuning and embedding jobs):
`settings.json`, what decides the results (`run_record`: the config but for its bookkeeping
fields, and the size and SHA-256 of every data file read), and `results.json`, every finished
seed's final metrics and their mean and std (`write_results`, rewritten as each seed finishes).

    results = run_seeds(config, workdir, run_record(config, data_files, task), seeds,
                        train_seed)   # train_seed(seed, seed_dir) -> final metrics

A rerun with the same settings and data skips the seeds results.json lists; one with other
settings or data is refused, naming each difference (`record_differences`), while the workdir
holds finished seeds or training checkpoints (else it starts afresh).

The pretraining job trains one run, resumed from its checkpoints: a rerun is compared with the
config.json the earlier run wrote (`check_resumed_run`), but for the fields a resumed run may
change (`RESUMABLE`).

    check_resumed_run(config, workdir)   # before anything is built or written
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from absl import logging
from etils import epath

from bert_jax.paths import as_path, write_text_whole
from bert_jax.training import job

# Config fields that change no seed's results: a rerun may change them and still reuse the
# finished seeds (prefixes of the dotted names). A job adds its own (`Job.bookkeeping`: its seed
# list).
BOOKKEEPING = (
    "seed",
    "log_every_steps",
    "checkpoint_every_steps",
    "max_checkpoints_to_keep",
    "async_checkpointing",
    "export_hf_at_end",
    "model_card",
    "topology",
)


@dataclasses.dataclass(frozen=True)
class SeedResult:
    """A finished seed as `run_seeds` records it: the metrics of the model it kept, and which
    model that is (results.json's `models`), e.g. {"model": "best by dev f1", "step": 30,
    "last_step": 45}. A job whose seeds keep their final model may return the metrics alone."""

    metrics: dict[str, float]
    model: dict[str, Any]


# The pretraining job's fields a resumed run may change (one run, continued from its checkpoints):
# BOOKKEEPING's cadences and exports (not `seed`: the checkpoint holds the run's random state, so
# a new seed would be silently ignored), `num_train_steps` (train on past the end), the held-out
# evaluation's cadence and size (no training step reads them), and the layout of the same steps on
# the devices (the mesh and sharding rules: a run saved on N devices or hosts resumes on M).
RESUMABLE = (
    *(b for b in BOOKKEEPING if b != "seed"),
    "num_train_steps",
    "eval_every_steps",
    "num_eval_steps",
    "mesh",
    "sharding_rules",
)


def run_record(config, data_files: Mapping[str, dict], task: str) -> dict[str, Any]:
    """What decides a run's results, as settings.json keeps it: the task, every config field
    but the `BOOKKEEPING` ones and those the job `config.job` declares (`Job.bookkeeping`)
    ({dotted name: JSON value}), and the data files read ({absolute path: {"bytes",
    "sha256"}}: `text_io.record_reads`)."""
    declared = job.declared(config)
    bookkeeping = BOOKKEEPING + (declared.bookkeeping if declared else ())
    fields = deciding_fields(json.loads(config.to_json_best_effort()), bookkeeping)
    return {"task": task, "config": fields, "data": dict(data_files)}


def deciding_fields(tree: Mapping[str, Any], bookkeeping: tuple[str, ...]) -> dict[str, Any]:
    """A config's fields as {dotted name: JSON value} (`tree`: the config as JSON), but for those
    under a name in `bookkeeping` (dotted names: a field or a block)."""
    return {
        k: v
        for k, v in _flat(tree).items()
        if not any(k == b or k.startswith(b + ".") for b in bookkeeping)
    }


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def record_differences(earlier: Mapping[str, Any], record: Mapping[str, Any]) -> list[str]:
    """How `record` (`run_record`) differs from an earlier run's (its settings.json): "field:
    old -> new" for config fields, "data file PATH: ..." for the files read."""
    if "config" not in earlier:
        return ["settings.json is missing (an older version wrote the results)"]
    old, new = earlier["config"], record["config"]
    absent = "(absent)"
    changes = [
        f"{k}: {old.get(k, absent)!r} -> {new.get(k, absent)!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k, absent) != new.get(k, absent)
    ]
    old, new = earlier.get("data", {}), record["data"]
    for path in sorted(set(old) | set(new)):
        if path not in new:
            changes.append(f"data file {path}: read before, not now")
        elif path not in old:
            changes.append(f"data file {path}: not read before")
        elif old[path] != new[path]:
            a, b = old[path]["bytes"], new[path]["bytes"]
            size = f"{a:,} -> {b:,} bytes" if a != b else f"same size ({a:,} bytes)"
            changes.append(f"data file {path}: its content changed, {size}")
    return changes


def start_results(workdir, record: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    """The results of this run so far: the finished seeds of an earlier run in `workdir`
    (results.json) when it had the same settings and data (`<workdir>/settings.json`, the
    `run_record` each run writes before training), else none.

    Raises:
      ValueError: the workdir holds finished seeds or training checkpoints of a run with other
        settings or data (or of a version that recorded none), naming every difference; nothing
        of it is overwritten.
    """
    results_path = as_path(workdir) / "results.json"
    settings_path = as_path(workdir) / "settings.json"
    earlier = json.loads(results_path.read_text()) if results_path.exists() else {}
    results = {"task": record["task"], "seeds": {}}
    if settings_path.exists() or earlier:
        settings = json.loads(settings_path.read_text()) if settings_path.exists() else {}
        changes = record_differences(settings, record)
        finished = sorted(earlier.get("seeds", {}), key=int)
        if not changes:
            results["seeds"] = earlier.get("seeds", {})
            if "models" in earlier:
                results["models"] = earlier["models"]
        elif finished or _checkpoint_dirs(workdir, seeds):
            checkpoints = _checkpoint_dirs(workdir, seeds)
            what = [f"finished seed(s) {', '.join(finished)} in {results_path}"] if finished else []
            what += [f"training checkpoints in {c}" for c in checkpoints]
            paths = [str(results_path)] * bool(finished) + checkpoints
            raise ValueError(
                f"{workdir} holds an earlier run ({'; '.join(what)}) with other settings, which "
                f"this run would take for its own: {'; '.join(changes)}. Use another --workdir, "
                f"or remove {' and '.join(paths)} to start afresh"
            )
        else:
            logging.warning("%s: an earlier run of other settings finished nothing", workdir)
    if jax.process_index() == 0:
        _write_json(settings_path, record)
    return results


def check_resumed_run(config, workdir, resumable: tuple[str, ...] = RESUMABLE) -> None:
    """Refuses a rerun that would resume a run of other settings (the pretraining job).

    The earlier run's settings are its `<workdir>/config.json` (every run writes it before its
    first step); they must equal this run's in every field but the `resumable` ones while the
    workdir holds the run's training checkpoints (which the run would resume, taking the new
    settings for its own). Without checkpoints the run starts afresh, as the other jobs do;
    without config.json nothing can be compared (the checkpoint's own check still refuses
    another model).

    Args:
      config: this run's experiment config.
      workdir: the run's directory (a URL stays one).
      resumable: dotted names of the fields (or blocks) a resumed run may change; the config's
        `resume_changes` (comma-separated dotted names) adds those a user changes on purpose,
        said on one W line.

    Raises:
      ValueError: the settings differ, naming each changed field with its earlier and new values
        and the ways out (another --workdir, or the earlier values as flags); nothing is written.
    """
    path = as_path(workdir) / "config.json"
    if not path.exists():
        return
    checkpoints = _checkpoint_dirs(workdir, [])
    try:
        earlier = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        if not checkpoints:
            return  # nothing to resume: the run starts afresh and writes its own
        raise ValueError(
            f"{path}, the settings of the run in {workdir}, is no JSON ({e}); use another "
            f"--workdir, or remove {checkpoints[0]} to start afresh"
        ) from None
    current = json.loads(config.to_json_best_effort())
    chosen = tuple(k.strip() for k in str(config.get("resume_changes", "")).split(",") if k.strip())
    base = (*resumable, "resume_changes")
    if chosen and checkpoints:
        taken = record_differences(
            {"config": deciding_fields(earlier, base)},
            {"config": deciding_fields(current, base), "data": {}},
        )
        if taken:
            logging.warning("resuming %s with changes on purpose: %s", workdir, "; ".join(taken))
    old = deciding_fields(earlier, (*base, *chosen))
    new = deciding_fields(current, (*base, *chosen))
    changes = record_differences({"config": old}, {"config": new, "data": {}})
    if not changes:
        return
    if not checkpoints:
        logging.warning("%s: an earlier run of other settings saved no checkpoint", workdir)
        return
    flags = [
        f"--config.{k}={_flag_value(old[k])}" for k in sorted(old) if k in new and old[k] != new[k]
    ]
    earlier_values = f", or rerun with the earlier values: {' '.join(flags)}" if flags else ""
    changed = sorted(k for k in new if k in old and old[k] != new[k])
    on_purpose = (  # not for the model's shapes: its checkpoint would not fit them
        f"; or, to resume it with these changes on purpose (a lower learning rate after a "
        f"non-finite loss, say), add --config.resume_changes={','.join(changed)}"
        if changed and not any(k.startswith("model.") for k in changed)
        else ""
    )
    raise ValueError(
        f"{workdir} holds a run (training checkpoints in {checkpoints[0]}) with other settings, "
        f"which this run would resume and take for its own: {'; '.join(changes)}. Use another "
        f"--workdir for a new run{earlier_values}{on_purpose}"
    )


def _flag_value(value) -> str:
    """A JSON config value as a `--config.<key>=` value the shell and ml_collections read back."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return shlex.quote(value)
    return shlex.quote(json.dumps(value)) if isinstance(value, (list, dict)) else repr(value)


def parse_seeds(value, name: str) -> list[int]:
    """The seeds of a job's `<name>` setting ("0", "0,1,2"; a whole number alone too).

    Raises:
      ValueError: no seed, a seed that is no whole number, or one given twice; naming `name`.
    """
    try:
        seeds = [int(s) for s in str(value).split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"{name}={value!r}: expected distinct whole numbers, e.g. '0' or '0,1,2'")
    return seeds


def run_seeds(
    config,
    workdir: str,
    record: dict[str, Any],
    seeds: list[int],
    train_seed: Callable[[int, epath.Path], dict[str, float] | SeedResult | None],
) -> dict[str, Any]:
    """Trains every seed an earlier run in `workdir` did not finish, and writes results.json.

    The seed loop of the jobs that train several seeds (fine-tuning, embeddings): the earlier
    run's results are taken where its settings equal `record` (`start_results`), each seed
    trains in `<workdir>/seed_<seed>` (in `workdir` itself when there is one seed) with
    `config.seed` set to it, and results.json is rewritten after each seed (a crash in a later
    one keeps it), then once more with the means announced.

    Args:
      config: the experiment config (its `seed` is set for each seed's run).
      workdir: the run's directory.
      record: this run's settings and data (`run_record`).
      seeds: the seeds, in training order.
      train_seed: (seed, its directory) -> its final metrics (or a `SeedResult`: the kept
        model's metrics and which model it is), or None when a signal stopped it.

    Returns:
      {"task", "seeds": {seed: metrics}, "mean", "std"} and, from `SeedResult`s, "models": {seed:
      which model the metrics describe}; the earlier run's seeds included; without the means
      where a signal stopped the run (rerun to resume).
    """
    results = start_results(workdir, record, seeds)
    for seed in seeds:
        if str(seed) in results["seeds"]:
            logging.info("seed %d finished in an earlier run (results.json): skipped", seed)
            continue
        seed_dir = as_path(workdir) / f"seed_{seed}" if len(seeds) > 1 else as_path(workdir)
        with config.unlocked():
            config.seed = seed
        final = train_seed(seed, seed_dir)
        if final is None:  # stopped by a signal: rerun to resume
            return results
        if isinstance(final, SeedResult):
            results.setdefault("models", {})[str(seed)] = final.model
            final = final.metrics
        results["seeds"][str(seed)] = final
        write_results(results, workdir, announce=False)
    write_results(results, workdir)
    return results


def _checkpoint_dirs(workdir, seeds: list[int]) -> list[str]:
    """The training-checkpoint directories in `workdir` a run of `seeds` would resume from."""
    dirs = [as_path(workdir)] + [as_path(workdir) / f"seed_{s}" for s in seeds]
    found = [d / "checkpoints" for d in dirs]  # experiment.checkpointer's directory
    return [str(c) for c in found if c.exists() and any(c.iterdir())]


def _write_json(path, value) -> None:
    """Writes `path` whole (a reader or a crash never sees half of it)."""
    path = as_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_whole(path, json.dumps(value, indent=2))


def write_results(results: dict[str, Any], workdir: str, announce: bool = True) -> None:
    """Adds every metric's mean and std over the finished seeds; writes results.json (whole:
    a reader or a crash never sees half of it) and, with `announce`, prints them."""
    per_seed = list(results["seeds"].values())
    if not per_seed:
        return
    keys = per_seed[0].keys()
    results["mean"] = {k: float(np.mean([r[k] for r in per_seed])) for k in keys}
    results["std"] = {k: float(np.std([r[k] for r in per_seed])) for k in keys}
    if jax.process_index() == 0:
        _write_json(as_path(workdir) / "results.json", results)
        for k in keys if announce else ():
            split = "" if k.startswith("test_") else "dev "
            print(
                f"{results['task']} {split}{k}: {results['mean'][k]:.4f} +- "
                f"{results['std'][k]:.4f} over {len(per_seed)} seed(s)"
            )
