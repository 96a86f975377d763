"""Faults at named points of a train.py run (or of `python -m bert_jax.inference`'s bulk job),
for the tests that need one: the job's code carries no test hooks, so this program installs them
from outside and then runs the command.

    cmd = faults.command(train_cmd(...))     # [python, "-c", PROGRAM, ".../train.py", flags...]
    subprocess.run(cmd, env={**env(), faults.FAULT_ENV: "process=1,at=step:3"})

`BERT_JAX_FAULT_INJECT="process=1,at=step:3"` makes process 1 raise `InjectedFault` at that point
(`multihost.guard` then ends every process, "process 1 failed: InjectedFault: ..."). The points:

    data_build   the default corpus's build, after the shared-directory check (before process 0
                 builds and the others wait for it)
    step:<k>     after step k, before its hooks' periodic work (metrics, evaluation, saves):
                 the `observe` of an extra last Trainer hook
    export       the end of pretraining, before the export's barrier
    shard:<k>    bulk inference: after the process's k-th output shard is written

With `sleep=<seconds>` the process sleeps there instead of raising (to kill it, or signal it,
while the others wait); with `signal=TERM` (or INT) it sends itself that signal there (a signal at
a known step, whatever the speed).
"""

from __future__ import annotations

import os
import signal
import time

import jax
from absl import logging

FAULT_ENV = "BERT_JAX_FAULT_INJECT"

# Run as `python -c PROGRAM <train.py> <flags>` (or `-m <module> <flags>`) from the repository
# root: the hooks, then the command.
PROGRAM = """
import runpy, sys
from tests import faults
faults.install()
sys.argv = sys.argv[1:]
if sys.argv[0] == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def command(cmd: list[str]) -> list[str]:
    """`cmd` ([python, train.py, flags...] or [python, -m, module, flags...]) with the fault hooks
    installed before it runs."""
    return [cmd[0], "-c", PROGRAM, *cmd[1:]]


class InjectedFault(RuntimeError):
    """Raised where `BERT_JAX_FAULT_INJECT` asks for it."""


def inject_fault(point: str) -> None:
    """Raises InjectedFault (or sleeps, or signals itself) at `point` where `FAULT_ENV` asks for
    it on this process; a no-op otherwise (module docstring)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    fields = dict(item.split("=", 1) for item in spec.split(","))
    if fields.get("at") != point or int(fields.get("process", 0)) != jax.process_index():
        return
    if "signal" in fields:  # as if the signal came from outside at this point (a known step)
        signum = signal.Signals["SIG" + fields["signal"].upper().removeprefix("SIG")]
        logging.warning("%s: sending %s to itself at %s", FAULT_ENV, signum.name, point)
        os.kill(os.getpid(), signum)
        return
    if "sleep" in fields:
        logging.warning("%s: sleeping %s s at %s", FAULT_ENV, fields["sleep"], point)
        logging.flush()
        time.sleep(float(fields["sleep"]))
        return
    raise InjectedFault(f"{FAULT_ENV}: a fault injected at {point}")


def install() -> None:
    """Puts `inject_fault` at each point (module docstring) of this process's run."""
    from bert_jax.inference import bulk
    from bert_jax.parallel import multihost
    from bert_jax.pretrain import inputs
    from bert_jax.training import loop

    class FaultAfterStep(loop.Hook):
        def observe(self, info: loop.StepInfo) -> None:
            inject_fault(f"step:{info.step}")

    trainer_init = loop.Trainer.__init__

    def with_fault_hook(self, exp, hooks, **kwargs):
        trainer_init(self, exp, [*hooks, FaultAfterStep()], **kwargs)

    loop.Trainer.__init__ = with_fault_hook

    require_shared_directory = inputs.require_shared_directory

    def require_then_fault(directory: str) -> None:
        require_shared_directory(directory)
        inject_fault("data_build")

    inputs.require_shared_directory = require_then_fault

    barrier = multihost.barrier

    def fault_then_barrier(name: str, **kwargs) -> None:
        if name == "export":
            inject_fault("export")
        barrier(name, **kwargs)

    multihost.barrier = fault_then_barrier

    write_shard, written = bulk._write_shard, [0]

    def write_then_fault(*args, **kwargs):
        out = write_shard(*args, **kwargs)
        written[0] += 1
        inject_fault(f"shard:{written[0]}")
        return out

    bulk._write_shard = write_then_fault
