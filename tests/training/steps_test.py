"""Train steps: sharded equals single-device, accumulation is exact, overfitting works."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import batch_layout, losses
from bert_jax.models.bert import model as M
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import get_model_class
from bert_jax.parallel import sharding
from bert_jax.training import experiment, loop, objectives, optimizer, steps
from bert_jax.training.objective import summarize

CFG = BertConfig(
    vocab_size=101,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
)


def pretraining_batch(cfg, batch=16, length=12, predictions=3, seed=0):
    """A random batch of `batch_layout.PRETRAINING_BATCH`'s keys, shapes and dtypes."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, cfg.vocab_size, size=(batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    for b in range(batch):
        mask[b, length - rng.integers(0, 4) :] = 0
    ids[mask == 0] = 0
    # Distinct positions per row (as the masking makes them): one target per position.
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, 8), predictions, replace=False) for _ in range(batch)]),
        axis=1,
    )
    weights = np.ones((batch, predictions))
    weights[::3, -1] = 0.0
    values = dict(
        input_ids=ids,
        token_type_ids=(np.arange(length) > length // 2)[None].repeat(batch, 0),
        attention_mask=mask,
        masked_lm_positions=positions,
        masked_lm_ids=rng.integers(5, cfg.vocab_size, size=(batch, predictions)),
        masked_lm_weights=weights,
        next_sentence_labels=rng.integers(0, 2, size=batch),
    )
    spec = batch_layout.pretraining_shapes(False, B=batch, L=length, P=predictions)
    assert {k: v.shape for k, v in values.items()} == {k: shape for k, (shape, _) in spec.items()}
    return {k: values[k].astype(dtype) for k, (_, dtype) in spec.items()}


def setup(cfg=CFG, runtime=None, lr=1e-3):
    model = M.BertForPreTraining(cfg, runtime or RuntimeConfig())
    schedule = optimizer.make_schedule("linear", lr, 2, 100)
    tx = optimizer.make_optimizer("adamw", schedule)
    init = functools.partial(steps.init_train_state, model=model, tx=tx)
    return model, tx, schedule, init


@functools.lru_cache
def single_device_reference(num_steps=2):
    """State and metrics after `num_steps` unsharded steps on `pretraining_batch(CFG)`."""
    batch = pretraining_batch(CFG)
    model, tx, schedule, init = setup()
    state = jax.jit(lambda r: nn.unbox(init(r)))(jax.random.PRNGKey(0))
    step = experiment.compile_train_step(
        model, tx, objectives.get_objective("pretraining"), schedule=schedule
    )
    history = []
    for _ in range(num_steps):
        state, metrics = step(state, batch)
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


def test_mesh_fallback_to_a_reshape_is_a_warning_that_names_the_reason(caplog, monkeypatch):
    with caplog.at_level("WARNING"):
        mesh = sharding.make_mesh({"data": 2, "fsdp": 4})  # all devices: jax.make_mesh
        assert "plain reshape" not in caplog.text and mesh.devices.shape == (2, 4, 1)
        mesh = sharding.make_mesh({"data": 2, "fsdp": 2}, jax.devices()[4:])
        assert "4 of the 8 devices were given" in caplog.text and "plain reshape" in caplog.text
        assert list(mesh.devices.flat) == jax.devices()[4:]
        caplog.clear()

        def refuse(*args, **kwargs):
            raise ValueError("no layout for this shape")

        monkeypatch.setattr(jax, "make_mesh", refuse)
        sharding.make_mesh({"data": 4, "tensor": 2})
        assert "cannot lay out {'data': 4, 'fsdp': 1, 'tensor': 2}: no layout" in caplog.text
    # One slice of CPU devices: a data axis across 2 slices is a configuration error.
    with pytest.raises(ValueError, match="mesh.dcn_data=2 but the 8 devices come from 1 slice"):
        sharding.make_mesh({"data": 8, "dcn_data": 2})
    with pytest.raises(ValueError, match="unknown mesh axes \\['dcn'\\]"):
        sharding.make_mesh({"data": 8, "dcn": 2})


# (2, 2, 2) shards every axis at once and (1, 1, 8) the tensor axis alone; the data and fsdp
# axes alone are e2e (about 10 s each on 2 cores).
@pytest.mark.parametrize(
    "mesh_shape",
    [
        pytest.param((8, 1, 1), marks=pytest.mark.e2e),
        (2, 2, 2),
        pytest.param((1, 8, 1), marks=pytest.mark.e2e),
        (1, 1, 8),
    ],
)
def test_sharded_step_equals_single_device(mesh_shape):
    """With dropout on: the partitionable PRNG draws the same masks whatever the sharding."""
    assert jax.device_count() == 8
    batch = pretraining_batch(CFG)
    ref_state, ref_metrics = single_device_reference()

    model, tx, schedule, init = setup()
    mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)))
    rules = list(sharding.DEFAULT_RULES)
    abstract = jax.eval_shape(init, jax.random.PRNGKey(0))
    state_sh = sharding.logical_shardings(abstract, mesh, rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=state_sh)(jax.random.PRNGKey(0))
        step = experiment.compile_train_step(
            model,
            tx,
            objectives.get_objective("pretraining"),
            state_shardings=state_sh,
            batch_shardings=sharding.batch_shardings(batch, mesh),
            metrics_sharding=sharding.replicated(mesh),
            schedule=schedule,
        )
        gbatch = sharding.global_batch_from_local(batch, mesh)
        for ref in ref_metrics:
            state, metrics = step(state, gbatch)
            metrics = jax.device_get(metrics)
            for k in ref:
                np.testing.assert_allclose(metrics[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=k)
    # Parameters really are sharded as the rules say (where the sizes divide).
    q = state.params["bert"]["encoder"]["layer_0"]["attention"]["self"]["query"]["kernel"]
    # [E=32, H=4, D=8]: embed over fsdp, heads over tensor; 4 heads do not split 8 ways.
    expected = {
        (8, 1, 1): (32, 4, 8),
        (2, 2, 2): (16, 2, 8),
        (1, 8, 1): (4, 4, 8),
        (1, 1, 8): (32, 4, 8),
    }[mesh_shape]
    assert q.sharding.shard_shape(q.shape) == expected
    for a, b in zip(
        jax.tree_util.tree_leaves(jax.device_get(state.params)),
        jax.tree_util.tree_leaves(ref_state.params),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_gradient_accumulation_equals_one_big_batch():
    cfg = CFG.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model, tx, schedule, init = setup(cfg)
    state = jax.jit(lambda r: nn.unbox(init(r)))(jax.random.PRNGKey(1))
    batch = pretraining_batch(cfg, batch=16)
    objective = objectives.get_objective("pretraining")
    grads = {}
    for k in (1, 4):
        loss, g, sums = jax.jit(
            functools.partial(
                steps.loss_and_grads, model=model, objective=objective, num_microbatches=k
            )
        )(state.params, batch, jax.random.PRNGKey(0))
        grads[k] = (loss, g, sums)
    np.testing.assert_allclose(grads[1][0], grads[4][0], rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(grads[1][1]), jax.tree_util.tree_leaves(grads[4][1])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    for key in grads[1][2]:
        np.testing.assert_allclose(grads[1][2][key], grads[4][2][key], rtol=1e-5, err_msg=key)
    with pytest.raises(ValueError, match="does not split into 3"):
        steps.loss_and_grads(
            state.params, batch, None, model=model, objective=objective, num_microbatches=3
        )


def test_overfitting_a_fixed_batch_drives_the_loss_near_zero():
    cfg = CFG.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = M.BertForPreTraining(cfg)
    tx = optimizer.make_optimizer("adamw", 3e-3, weight_decay=0.0)
    state = jax.jit(lambda r: nn.unbox(steps.init_train_state(r, model=model, tx=tx)))(
        jax.random.PRNGKey(0)
    )
    batch = pretraining_batch(cfg, batch=8)
    step = experiment.compile_train_step(model, tx, objectives.get_objective("pretraining"))
    first = None
    for _ in range(300):
        state, metrics = step(state, batch)
        first = first if first is not None else float(metrics["loss"])
        assert np.isfinite(float(metrics["grad_norm"]))
    last = jax.device_get(metrics)
    summary = summarize(last)
    assert first > 4.0 and float(last["loss"]) < 0.05, (first, float(last["loss"]))
    assert summary["mlm_accuracy"] == 1.0 and summary["nsp_accuracy"] == 1.0
    assert summary["nsp_auc"] == 1.0  # every random pair scores above every real one
    assert step._cache_size() == 1  # compiled once: no retracing


def test_dropout_is_folded_with_the_step():
    model, tx, schedule, init = setup()
    state = jax.jit(lambda r: nn.unbox(init(r)))(jax.random.PRNGKey(0))
    batch = pretraining_batch(CFG)
    objective = objectives.get_objective("pretraining")
    step = experiment.compile_train_step(
        model, tx, objective, donate=False
    )  # `state` is used 3 times
    _, m1 = step(state, batch)
    _, m1b = step(state, batch)
    _, m2 = step(state.replace(step=state.step + 1), batch)
    assert float(m1["loss"]) == float(m1b["loss"])
    assert float(m1["loss"]) != float(m2["loss"])


def test_eval_step_and_summaries():
    model, tx, _, init = setup()
    state = jax.jit(lambda r: nn.unbox(init(r)))(jax.random.PRNGKey(0))
    batch = pretraining_batch(CFG)
    out = jax.device_get(
        jax.jit(
            functools.partial(
                steps.eval_step, model=model, objective=objectives.get_objective("pretraining")
            )
        )(state.params, batch)
    )
    assert out["mlm_count"] == batch["masked_lm_weights"].sum()
    assert out["nsp_count"] == 16
    summary = summarize(out)
    np.testing.assert_allclose(summary["mlm_loss"] + summary["nsp_loss"], out["loss"], rtol=1e-5)
    assert 0 <= summary["mlm_accuracy"] <= 1
    assert out["nsp_score_hist"].shape == (2, losses.NSP_SCORE_BINS)
    assert out["nsp_score_hist"].sum() == 16 and 0 <= summary["nsp_auc"] <= 1
    with pytest.raises(ValueError, match="unknown objective"):
        objectives.get_objective("translation")


def test_eval_step_in_micro_batches_sums_what_one_batch_does():
    """The evaluation takes the train step's micro-batches (so it fits where training does);
    its sums and loss equal the whole batch's."""
    model, _, _, init = setup()
    params = jax.jit(lambda r: nn.unbox(init(r)))(jax.random.PRNGKey(0)).params
    batch = pretraining_batch(CFG)
    objective = objectives.get_objective("pretraining")
    whole, parts = (
        jax.device_get(
            jax.jit(
                functools.partial(
                    steps.eval_step, model=model, objective=objective, num_microbatches=k
                )
            )(params, batch)
        )
        for k in (1, 4)
    )
    assert whole.keys() == parts.keys()
    for key in whole:
        np.testing.assert_allclose(parts[key], whole[key], rtol=2e-5, atol=1e-5, err_msg=key)


@pytest.mark.parametrize(
    "objective, head",
    [
        ("classification", "BertForSequenceClassification"),
        ("regression", "BertForSequenceClassification"),
        ("token_classification", "BertForTokenClassification"),
        ("question_answering", "BertForQuestionAnswering"),
        ("mlm", "BertForMaskedLM"),
    ],
)
def test_every_objective_trains(objective, head):
    cfg = CFG.replace(num_labels=1 if objective == "regression" else 3)
    model = get_model_class(head)(cfg)
    tx = optimizer.make_optimizer("adamw", 3e-3, weight_decay=0.0)
    state = jax.jit(lambda r: nn.unbox(steps.init_train_state(r, model=model, tx=tx)))(
        jax.random.PRNGKey(0)
    )
    rng = np.random.default_rng(0)
    base = pretraining_batch(cfg, batch=8)
    batch = {k: base[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    batch["example_weights"] = np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32)
    if objective == "classification":
        batch["labels"] = rng.integers(0, 3, 8).astype(np.int32)
    elif objective == "regression":
        batch["labels"] = rng.normal(size=8).astype(np.float32)
    elif objective == "token_classification":
        batch["labels"] = rng.integers(0, 3, (8, 12)).astype(np.int32)
        batch["label_weights"] = base["attention_mask"].astype(np.float32)
    elif objective == "question_answering":
        batch["start_positions"] = rng.integers(0, 6, 8).astype(np.int32)
        batch["end_positions"] = batch["start_positions"] + 2
    else:
        batch = base
    step = experiment.compile_train_step(model, tx, objectives.get_objective(objective))
    losses = []
    for _ in range(40):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses


def test_nsp_auc_from_binned_scores_matches_the_exact_auc():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 4000)
    # Log-odds of "random next" that carry a little signal, as the tiny model's do (AUC ~0.6).
    logits = np.stack([np.zeros(4000), 0.2 + 0.25 * labels + rng.normal(0, 1, 4000)], axis=1)
    weights = (rng.random(4000) < 0.9).astype(np.float32)  # packed rows' empty slots weigh 0
    hist = np.asarray(losses.score_histogram(jnp.asarray(logits), jnp.asarray(labels), weights))
    assert hist.sum() == weights.sum()
    kept = weights > 0
    exact = roc_auc_score(labels[kept], logits[kept, 1])
    # Added over two halves, as batches are, and from the bins: within 0.002 of the exact AUC.
    halves = [
        losses.score_histogram(jnp.asarray(logits[s]), jnp.asarray(labels[s]), weights[s])
        for s in (slice(0, 2000), slice(2000, None))
    ]
    summed = loop.reduce_metrics([{"nsp_score_hist": h} for h in halves])
    assert abs(summed["nsp_auc"] - exact) < 0.002 and 0.55 < exact < 0.65
    # A classifier that ignores its input scores 0.5; a perfect one 1; one class alone: no AUC.
    flat = np.zeros((2, losses.NSP_SCORE_BINS))
    flat[:, 100] = [30, 70]
    assert losses.auc_from_histogram(flat) == 0.5
    flat[1] = np.roll(flat[1], 5)
    assert losses.auc_from_histogram(flat) == 1.0
    flat[0] = 0
    assert losses.auc_from_histogram(flat) is None
    assert "nsp_auc" not in summarize({"nsp_score_hist": flat})
