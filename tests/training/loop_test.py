"""The Trainer and its hooks, on a stand-in Experiment whose step adds one to a counter: when each
hook runs, what the Timer counts, the data position a save records, a stop request, the data
running out, and LogMetrics' window."""

import json
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.parallel import sharding
from bert_jax.training import loop
from bert_jax.training.summaries import MetricWriter

ROWS, LENGTH = 2, 4


class _Experiment:
    """What the Trainer uses of an Experiment: a mesh, rules, the jitted train step, and the
    store of what the run compiled (`cached`)."""

    def __init__(self):
        self.mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
        self.rules = []
        self.store = {}
        self.step = jax.jit(
            lambda state, batch: (
                state + 1,
                {"loss": jnp.sum(batch["attention_mask"]) / (ROWS * LENGTH) + 0.0 * state},
            )
        )

    def train_step_fn(self, host_batch):
        return self.step

    def cached(self, key, build):
        if key not in self.store:
            self.store[key] = build()
        return self.store[key]


class _Batches:
    """Host batches with a position (get_state/set_state, as grain's iterators); batch i has
    i + 1 real tokens in its first row."""

    def __init__(self, n: int):
        self.n, self.i = n, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        mask = np.zeros((ROWS, LENGTH), np.int32)
        mask.flat[: self.i % (ROWS * LENGTH) + 1] = 1
        self.i += 1
        return {"input_ids": mask.copy(), "attention_mask": mask}

    def get_state(self):
        return {"i": self.i}

    def set_state(self, state):
        self.i = state["i"]


class _Record(loop.Hook):
    """Records the steps it ran at, whether the step had finished, and the steps observed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ran, self.observed, self.finished = [], [], []

    def observe(self, info):
        self.observed.append(info.step)

    def run(self, info):
        self.ran.append(info.step)
        self.finished.append(all(x.is_ready() for x in jax.tree_util.tree_leaves(info.metrics)))


def _run(hooks, steps=10, batches=None, **kwargs):
    trainer = loop.Trainer(_Experiment(), hooks, num_train_steps=steps, stop_sync_every=5, **kwargs)
    state, step, stopped = trainer.run(jnp.int32(0), 0, batches or _Batches(100))
    return trainer, int(state), step, stopped


def test_each_hook_runs_at_its_own_cadence_after_its_step_finished():
    every3, both, never, stop_only = (
        _Record(3),
        _Record((4, 6)),
        _Record(0, at_end=False),
        _Record(at_end=False, at_stop=True),
    )
    _, state, step, stopped = _run([every3, both, never, stop_only])
    assert (state, step, stopped) == (10, 10, False)
    assert every3.ran == [3, 6, 9, 10]  # and at the end
    assert both.ran == [4, 6, 8, 10]
    assert never.ran == [] and stop_only.ran == []
    assert every3.observed == list(range(1, 11))  # every hook sees every step
    assert all(every3.finished + both.finished)


def test_hooks_run_in_the_order_given():
    order = []

    class Named(loop.Hook):
        def __init__(self, name):
            super().__init__(2)
            self.name = name

        def run(self, info):
            order.append((info.step, self.name))

    _run([Named("log"), Named("eval"), Named("save")], steps=4)
    assert order == [(s, n) for s in (2, 4) for n in ("log", "eval", "save")]


def test_the_timer_leaves_out_the_compile_and_the_hooks_host_work():
    class Slow(loop.Hook):
        def run(self, info):
            time.sleep(0.5)

    start = time.perf_counter()
    trainer, *_ = _run([Slow(2)], steps=6)
    wall = time.perf_counter() - start
    timer = trainer.timer
    assert timer.compiles == 1 and timer.compile_s > 0
    assert timer.train_tokens == 0.0  # totals grow as windows close
    window = timer.window()
    # Tokens of the timed steps (the first, compiling, step is not timed): batches 1..5 have
    # 2..6 real tokens.
    assert timer.train_tokens == sum(range(2, 7))
    assert window["step_time_s"] == pytest.approx(timer.train_seconds / 5)
    # Wall time holds the compile, the training and three 0.5 s pauses: none of the pauses is
    # counted as training.
    assert timer.train_seconds <= wall - timer.compile_s - 3 * 0.5


def test_a_save_records_the_position_after_the_last_consumed_batch():
    saved = []

    class FakeCheckpointer:
        def save(self, step, state, data_iterator=None, meta=None):
            saved.append((step, int(state), data_iterator.get_state(), meta))

        def check(self):  # a failed background save would raise here
            pass

        def wait(self):
            pass

    hook = loop.SaveCheckpoint(FakeCheckpointer(), {"model": "M"}, every=3)
    _run([hook], steps=7)
    # The prefetcher reads two batches ahead; the saved position is the next step's batch.
    assert saved == [
        (3, 3, {"i": 3}, {"model": "M", "step": 3}),
        (6, 6, {"i": 6}, {"model": "M", "step": 6}),
        (7, 7, {"i": 7}, {"model": "M", "step": 7}),
    ]


def test_a_stop_request_ends_the_loop_after_a_step_whose_stop_hooks_run():
    class Signal(loop.Hook):
        def observe(self, info):
            if info.step == 3:
                signal.raise_signal(signal.SIGTERM)

    on_stop = _Record(0, at_end=True, at_stop=True)
    _, state, step, stopped = _run([Signal(), on_stop], steps=10)
    assert stopped and step == state == 4  # the request is seen at the next step's check
    assert on_stop.ran == [4]


def test_the_data_running_out_ends_the_run_at_the_last_full_step(caplog):
    on_end = _Record(0, at_end=True)
    _, state, step, stopped = _run([on_end], steps=10, batches=_Batches(4))
    assert (state, step, stopped) == (4, 4, False)
    assert on_end.ran == []  # the run did not reach its last step
    assert "ran out at step 4" in caplog.text


def test_log_metrics_writes_the_window_means_with_the_timers_throughput(tmp_path):
    writer = MetricWriter(str(tmp_path), 6, progress=False, curves=False)
    hook = loop.LogMetrics(writer, every=3)
    _run([hook], steps=6)
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [3, 6]
    # Step i's loss is (i + 1) / 8 real tokens: the mean over steps 1-3, then 4-6.
    assert lines[0]["train/loss"] == pytest.approx((1 + 2 + 3) / 3 / 8)
    assert lines[1]["train/loss"] == pytest.approx((4 + 5 + 6) / 3 / 8)
    assert lines[0]["train/compiles"] == 1 and "train/compile_s" in lines[0]
    assert "train/compile_s" not in lines[1]
    assert lines[1]["train/tokens_per_s"] > 0 and lines[1]["train/step_time_s"] > 0


def test_log_metrics_stops_on_a_non_finite_loss(tmp_path):
    writer = MetricWriter(str(tmp_path), 6, progress=False, curves=False)
    hook = loop.LogMetrics(writer, every=2)
    info = loop.StepInfo(2, None, {"loss": jnp.float32(np.nan)}, {}, False, False, loop.Timer())
    hook.observe(info)
    with pytest.raises(FloatingPointError, match="non-finite loss nan at step 2"):
        hook.run(info)
    writer.close()


class _Lengths(_Batches):
    """Batches of ROWS x (4, 8, 4, 8, 12, 4, ...) tokens: three shapes, each compiling once."""

    def __next__(self):
        batch = super().__next__()
        length = (4, 8, 4, 8, 12, 4)[(self.i - 1) % 6]
        return {k: np.pad(v, ((0, 0), (0, length - LENGTH))) for k, v in batch.items()}


def test_steps_of_new_batch_shapes_are_compiles_not_training_time(tmp_path):
    writer = MetricWriter(str(tmp_path), 12, progress=False, curves=False)
    trainer, *_ = _run([loop.LogMetrics(writer, every=6)], steps=12, batches=_Lengths(100))
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert trainer.timer.compiles == 3  # lengths 4, 8 and 12, each once
    assert lines[0]["train/compiles"] == 3 and "train/compiles" not in lines[1]
    # The 9 timed steps' real tokens: batches 0-11 have 1..8, 1..4 of them; the compiling
    # batches 0, 1 and 4 (1, 2 and 5 tokens) are left out.
    assert trainer.timer.train_tokens == sum(range(1, 9)) + sum(range(1, 5)) - (1 + 2 + 5)


def test_the_progress_bar_counts_finished_steps_not_dispatched_ones(tmp_path):
    """Steps slower than their dispatch: the bar never runs ahead of the finished steps, and
    reaches the end."""

    def slow(x):
        time.sleep(0.05)
        return x

    exp = _Experiment()
    step = exp.step
    exp.step = jax.jit(
        lambda state, batch: step(
            jax.pure_callback(slow, jax.ShapeDtypeStruct((), jnp.int32), state), batch
        )
    )
    writer = MetricWriter(str(tmp_path), 20, curves=False)
    seen = []  # (bar position, steps finished, steps dispatched) after each step's observe

    class Watch(loop.Hook):
        def observe(self, info):
            finished = sum(all(x.is_ready() for x in m.values()) for m in metrics)
            seen.append((writer._console._bar.n, finished, info.step))

    metrics = []

    class Keep(loop.Hook):
        def observe(self, info):
            metrics.append(info.metrics)

    trainer = loop.Trainer(
        exp,
        [Keep(), loop.LogMetrics(writer, every=10), Watch()],
        num_train_steps=20,
        stop_sync_every=20,
    )
    trainer.run(jnp.int32(0), 0, _Batches(100))
    assert all(bar <= finished for bar, finished, _ in seen)
    assert writer._console._bar.n == 20
    writer.close()


def test_evaluate_at_end_false_skips_the_last_step_even_when_periodic():
    hook = loop.Evaluate(lambda params, step: {}, None, 5, at_end=False)

    def info(step, last):
        return loop.StepInfo(step, None, {}, {}, last, False, loop.Timer())

    assert [hook.due(info(s, s == 10)) for s in (4, 5, 9, 10)] == [False, True, False, False]
    assert loop.Evaluate(lambda params, step: {}, None, 5).due(info(10, True))
