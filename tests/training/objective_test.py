"""The objective protocol (`bert_jax.training.objective`): every objective declares its loss and
metrics, its example batch and whether its rows couple; the steps split a batch by that
declaration alone (no objective class named in `training/steps.py`)."""

import ast
import dataclasses
import pathlib
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.family import Role
from bert_jax.training import contrastive, objectives, reranking, steps
from bert_jax.training.objective import CoupledObjective, Objective

STEPS = pathlib.Path(steps.__file__)


def every_objective():
    made = [
        contrastive.contrastive_objective("mean"),
        contrastive.contrastive_objective("cls", packed_shape=(3, 2)),
        *(reranking.rerank_objective(loss) for loss in reranking.RERANK_LOSSES),
    ]
    return [*objectives.OBJECTIVES.values(), *made]


@pytest.mark.parametrize("objective", every_objective(), ids=lambda o: o.name)
def test_every_objective_declares_the_protocol(objective):
    assert isinstance(objective, Objective)
    assert objective.couples_rows is (objective.name == "contrastive")
    assert objective.anchors_apart is False  # only an inference-free model's (inference_free_test)
    if objective.couples_rows:
        assert isinstance(objective, CoupledObjective)
    sizes = dict(B=3, L=7, P=2, C=4, T=2, G=4, R=6, S=4)
    batch = objective.example_batch(**sizes)
    assert batch["input_ids"].dtype == jnp.int32 and batch["input_ids"].shape[-1] == 7


def test_the_steps_name_no_objective_class():
    """No `isinstance` in steps.py: an objective's declaration decides, not its class."""
    calls = [
        node
        for node in ast.walk(ast.parse(STEPS.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
    ]
    assert not calls, [ast.unparse(c) for c in calls]


class Scale(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x * self.param("w", nn.initializers.ones, (1,))


@dataclasses.dataclass(frozen=True)
class SquaredTotal:
    """A toy objective whose rows couple: the square of the batch's total, which no sum of
    per-micro-batch losses gives."""

    couples_rows: ClassVar[bool] = True
    anchors_apart: ClassVar[bool] = False
    name: ClassVar[str] = "squared_total"
    role: ClassVar[Role] = Role.ENCODER
    build_model: ClassVar[None] = None

    def row_outputs(self, model, params, batch, rng, deterministic):
        return model.apply({"params": params}, batch["x"])  # [rows, 1]

    def batch_sums(self, outputs, batch):
        return {"toy_loss_sum": jnp.sum(outputs) ** 2}

    def sums(self, model, params, batch, rng, deterministic):
        return self.batch_sums(self.row_outputs(model, params, batch, rng, deterministic), batch)

    def counts(self, batch):
        return {"toy_count": jnp.float32(1.0)}

    def loss(self, sums, counts):
        return sums["toy_loss_sum"] / counts["toy_count"]

    def example_batch(self, **sizes):
        return {"x": jax.ShapeDtypeStruct((sizes["B"], 1), jnp.float32)}

    def at_step(self, step):
        return self


def test_a_coupled_objective_of_any_class_is_split_as_gradcache_chunks():
    objective, model = SquaredTotal(), Scale()
    assert isinstance(objective, CoupledObjective)
    batch = {"x": jnp.arange(1.0, 7.0)[:, None]}  # (21 w)^2: loss 441, d/dw 882
    params = model.init(jax.random.PRNGKey(0), batch["x"])["params"]
    rng = jax.random.PRNGKey(1)
    for k in (1, 2, 3):
        loss, grads, _ = steps.loss_and_grads(
            params, batch, rng, model=model, objective=objective, num_microbatches=k
        )
        np.testing.assert_allclose(float(loss), 441.0, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(grads["w"]), [882.0], rtol=1e-6)
        out = steps.eval_step(params, batch, model=model, objective=objective, num_microbatches=k)
        np.testing.assert_allclose(float(out["loss"]), 441.0, rtol=1e-6)
