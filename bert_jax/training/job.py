"""Jobs: what `train.py` runs (`config.job`), as records in one registry.

    job = get(config.job)                                        # train.py
    job.run(config, workdir, mode="train")                       # or "shardings"
    job.run(config, None, mode="compile", topology="v5e:4x4")    # check, then compile

A job is one folder: `bert_jax/<job>/run.py` declares `JOB = job.register(job.Job(...))`
(its names, its config block, its check, its run and its compile-for-topology entry) and this
module finds every such folder (a subpackage of `bert_jax` with a `run` module), so a new job
edits nothing here or in `train.py`. A job outside bert_jax registers itself the same way in its
own module, and its config file imports that module (`tests/training/toy_job/`): the config file
is then all `train.py` needs. What the jobs share lives below them in `training/`: the seed
runner (`seed_run`), the settings and results files (`settings`), the exports (`export`) and
the compile report (`compile_report`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

import bert_jax

# A job's run: (config, workdir, mode="train" | "shardings") -> its results.
TrainFn = Callable[..., Any]
# A job's compile entry: (config, topology, *, num_slices, hlo_out) -> the exit status.
CompileFn = Callable[..., int]


@dataclasses.dataclass(frozen=True)
class Job:
    """One job as the registry holds it.

    Attributes:
      names: the `config.job` values it runs ("embed"; pretraining has three: "pretraining",
        "mlm", "rtd", each training the objective of its name).
      block: the key of its own config block ("embed", "finetune"; None: none).
      check: (config, reads_data) -> refuses, before anything is read or built, settings that
        could only fail later (`reads_data` False: --mode=compile, which reads no data).
      train_and_evaluate: (config, workdir, mode=...) -> trains (mode "train") or prints the
        parameter shardings (mode "shardings"); its results.
      compile: (config, topology, *, num_slices, hlo_out) -> compiles the job's step for a TPU
        slice or GPUs without data and prints the report (`training.compile_report`); the exit
        status (1: does not fit).
      recipes: the module of the job's shipped configs whose `fit_hint(config, topology)` names
        the recipes that fit where a compiled step does not ("": none).
      minima: its own counts the shared check refuses below their least value ({dotted key:
        least}: {"finetune.num_epochs": 1}; `experiment.check_experiment_config`).
      bookkeeping: its own config fields that change no seed's results (dotted names: a field
        or a block), beside `settings.BOOKKEEPING`: a rerun may change them and still reuse the
        finished seeds. None (the default): its block's seed list ("embed.seeds", the text jobs'
        `seeds`), so a rerun may add seeds and keep the finished ones.
    """

    names: tuple[str, ...]
    block: str | None
    check: Callable[[Any, bool], Any]
    train_and_evaluate: TrainFn
    compile: CompileFn
    recipes: str = ""
    minima: Mapping[str, int] = dataclasses.field(default_factory=dict, hash=False)
    bookkeeping: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.bookkeeping is None:
            seeds = (f"{self.block}.seeds",) if self.block else ()
            object.__setattr__(self, "bookkeeping", seeds)

    @property
    def name(self) -> str:
        """The job's first name (the one its docs use)."""
        return self.names[0]

    def run(
        self,
        config,
        workdir: str | None,
        *,
        mode: str = "train",
        topology: str | None = None,
        num_slices: int = 1,
        hlo_out: str | None = None,
    ) -> Any:
        """Trains (mode "train"), prints the shardings ("shardings"), or, mode "compile", checks
        the settings (no data read) and compiles for `topology` (else `config.topology`),
        returning the exit status: the one path every job's `--mode=compile` takes."""
        if mode == "compile":
            self.check(config, reads_data=False)
            topology = topology or config.topology
            return self.compile(config, topology, num_slices=num_slices, hlo_out=hlo_out)
        return self.train_and_evaluate(config, workdir, mode=mode)


_JOBS: dict[str, Job] = {}
_discovered = False


def register(job: Job) -> Job:
    """Adds `job` under each of its names (a module registering twice is one job) and returns
    it. Raises ValueError where another job holds one of the names."""
    for name in job.names:
        held = _JOBS.get(name)
        if held is not None and held.train_and_evaluate is not job.train_and_evaluate:
            raise ValueError(f"two jobs register config.job={name!r}")
    _JOBS.update(dict.fromkeys(job.names, job))
    return job


def _discover() -> None:
    """Imports every job folder's `run` module (a subpackage of `bert_jax` holding run.py), each
    of which registers its job; once."""
    global _discovered
    if _discovered:
        return
    for path in bert_jax.__path__:
        for info in sorted(pkgutil.iter_modules([path]), key=lambda m: m.name):
            if info.ispkg and os.path.isfile(os.path.join(path, info.name, "run.py")):
                importlib.import_module(f"{bert_jax.__name__}.{info.name}.run")
    _discovered = True


def known() -> list[str]:
    """Every job name `train.py` runs, sorted."""
    _discover()
    return sorted(_JOBS)


def declared(config) -> Job | None:
    """The job `config.job` names; None where the config names none or no such job is known
    (`get` refuses it, naming the known ones)."""
    _discover()
    return _JOBS.get(config.get("job"))


def get(name: str) -> Job:
    """The job `config.job` names.

    Raises:
      ValueError: no job of that name, naming the known ones and how a job is added.
    """
    _discover()
    job = _JOBS.get(name)
    if job is None:
        raise ValueError(
            f"config.job={name!r}: no such job; known jobs: {', '.join(known())} (a job "
            "outside bert_jax registers itself in a module its config file imports: "
            "docs/architecture.md, 'Adding a job')"
        )
    return job
