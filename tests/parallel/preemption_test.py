"""A preempted run resumes exactly: SIGTERM at chosen moments of a short run (while a batch is
read during a step, while an asynchronous save is in flight, right after a log step, after a
random delay), then a resume; every step's loss equals the uninterrupted run's.

In-process (one Experiment, so its steps compile once for every run): the signal reaches the
real `PreemptionWatcher` of `loop.Trainer`, the real grain pipeline and Orbax checkpointer of
`train.py`.
"""

import json
import os
import random
import signal
import threading

import pytest

from bert_jax.models.bert.config import BertConfig
from bert_jax.pretrain import inputs
from bert_jax.training import experiment, loop
from bert_jax.training.start import starting_state
from bert_jax.training.summaries import MetricWriter
from tests.common import load_config_file

STEPS, EVERY = 12, 4


def _config(build_dir: str):
    c = load_config_file("pretrain.py").get_config("size=tiny")
    # The sizes of conftest.TINY_DATA_OVERRIDES, with BERT's dropout on (the RNG resumes too).
    c.data.source, c.data.paths = "records", build_dir
    c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
    c.model.update(
        vocab_size=400,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=32,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    c.global_batch_size, c.optimizer.warmup_steps = 16, 2
    c.num_train_steps, c.log_every_steps, c.checkpoint_every_steps = STEPS, 1, EVERY
    c.export_hf_at_end = False
    return c


class _Batches:
    """The pipeline's iterator, raising SIGTERM when the loop asks for batch `at` (counted
    from 1): the previous step is then still running (dispatch is asynchronous)."""

    def __init__(self, it, at):
        self._it, self._at, self._n = it, at, 0

    def __iter__(self):
        return self

    def __next__(self):
        self._n += 1
        if self._n == self._at:
            signal.raise_signal(signal.SIGTERM)
        return next(self._it)

    def get_state(self):
        return self._it.get_state()

    def set_state(self, state):
        self._it.set_state(state)


@pytest.fixture(scope="module")
def harness(tiny_pretraining_build):
    """train(workdir, moment) -> the step the run stopped at. `moment`: None, ("batch", n),
    ("save", step), ("log", step) or ("timer", seconds)."""
    config = _config(tiny_pretraining_build)
    cfg = BertConfig(**config.model.to_dict())
    exp = experiment.Experiment.build(
        config, cfg, "BertForPreTraining", "pretraining", config.num_train_steps
    )
    signals = []
    # A late timer's signal lands here, not in pytest's default handler, once the loop's
    # watcher has put this one back.
    previous = signal.signal(signal.SIGTERM, lambda *_: signals.append("late"))

    def train(workdir: str, moment=None) -> int:
        data = inputs.pretraining_inputs(config, workdir, exp.mesh)
        ckpt = experiment.checkpointer(workdir, config)
        begun = starting_state(exp, ckpt, data.train)
        state, start = begun.state, begun.step
        writer = MetricWriter(workdir, STEPS, start, progress=False)
        kind, at = moment or (None, None)
        batches = _Batches(data.train, at if kind == "batch" else 0)
        if kind == "save":
            save = ckpt.save

            def save_then_signal(step, *args, **kwargs):
                started = save(step, *args, **kwargs)
                if step == at:  # the arrays are still being written in the background
                    signal.raise_signal(signal.SIGTERM)
                return started

            ckpt.save = save_then_signal
        if kind == "log":
            write = writer.write

            def write_then_signal(step, metrics):
                write(step, metrics)
                if step == at:
                    signal.raise_signal(signal.SIGTERM)

            writer.write = write_then_signal
        timer = None
        if kind == "timer":
            timer = threading.Timer(at, os.kill, (os.getpid(), signal.SIGTERM))
            timer.start()
        try:
            log_every, checkpoint_every = config.log_every_steps, config.checkpoint_every_steps
            hooks = [
                loop.LogMetrics(writer, every=(log_every, checkpoint_every), ckpt=ckpt),
                loop.SaveCheckpoint(ckpt, exp.checkpoint_meta(), checkpoint_every),
            ]
            trainer = loop.Trainer(exp, hooks, num_train_steps=STEPS, stop_sync_every=log_every)
            _, step, _ = trainer.run(state, start, batches)
            # The last save is complete when the loop hands the signals back: another SIGTERM
            # from here on (default handler: the process ends) loses nothing.
            assert str(step) in os.listdir(os.path.join(workdir, "checkpoints"))
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()
            ckpt.close()
            writer.close()
        return step

    yield train
    signal.signal(signal.SIGTERM, previous)


def _losses(workdir) -> list[tuple[int, float]]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


@pytest.fixture(scope="module")
def straight(harness, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("straight"))
    assert harness(workdir) == STEPS
    losses = _losses(workdir)
    assert [s for s, _ in losses] == list(range(1, STEPS + 1))
    return losses


def _interrupt_and_resume(harness, workdir, moment) -> int:
    stopped = harness(workdir, moment)
    assert stopped <= STEPS
    if stopped < STEPS:
        assert harness(workdir) == STEPS  # the resume
    return stopped


MOMENTS = [
    ("batch", 7),  # a step in flight, between checkpoints
    ("save", EVERY),  # the periodic save's arrays still being written
    ("log", 2 * EVERY + 1),  # right after a log step
]


@pytest.mark.parametrize("moment", MOMENTS, ids=lambda m: f"{m[0]}{m[1]}")
def test_sigterm_then_resume_equals_straight_run(harness, straight, tmp_path, moment):
    stopped = _interrupt_and_resume(harness, str(tmp_path), moment)
    assert stopped < STEPS, "the signal did not stop the run"
    # Every step once, loss for loss (the same compiled programs: exact).
    assert _losses(tmp_path) == straight


@pytest.mark.soak
def test_sigterm_at_20_random_moments(harness, straight, tmp_path):
    rng = random.Random(0)
    # A step of this model takes some 10-100 ms; the delays spread over a whole run.
    moments = [("timer", rng.uniform(0.0, 3.0)) for _ in range(12)]
    moments += [("batch", rng.randint(2, STEPS)) for _ in range(4)]
    moments += [("save", EVERY), ("save", 2 * EVERY)]
    moments += [("log", rng.randint(1, STEPS - 1)) for _ in range(2)]
    stops = []
    for i, moment in enumerate(moments):
        workdir = str(tmp_path / str(i))
        stops.append(_interrupt_and_resume(harness, workdir, moment))
        assert _losses(workdir) == straight, (moment, stops[-1])
    assert sum(s < STEPS for s in stops) >= 10, stops
