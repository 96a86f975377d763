"""Fine-tuning's evaluation (`bert_jax.finetune.evaluation.score`): with `finetune.pack` a
packable task's examples are scored packed several to a row, as training packs them, and the task
gets the logits the unpacked batches give, in feature order, on a mesh of several devices."""

import functools
from types import SimpleNamespace

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.finetune import evaluation
from bert_jax.models import families
from bert_jax.models.params import init_params
from bert_jax.parallel import sharding
from bert_jax.training import steps

N, L = 27, 20


def _outputs(head: str, token_level: bool, pack: bool) -> np.ndarray:
    """The logits `score` hands the task for N random rows of up to L tokens."""
    config = families.FAMILIES["bert"].config_class(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=L + 4, num_labels=3,
    )  # fmt: skip
    model = families.get_model_class(head)(config)
    params = nn.meta.unbox(init_params(model, jax.random.PRNGKey(0)))
    predict = jax.jit(functools.partial(steps.predict_step, model=model))
    exp = SimpleNamespace(
        mesh=sharding.make_mesh({"data": 4, "fsdp": 2, "tensor": 1}), predict_fn=lambda: predict
    )
    rng = np.random.default_rng(7)
    lengths = rng.integers(3, L + 1, size=N)
    mask = (np.arange(L) < lengths[:, None]).astype(np.int32)
    features = {
        "input_ids": (rng.integers(3, 99, size=(N, L)) * mask).astype(np.int32),
        "token_type_ids": np.zeros((N, L), np.int32),
        "attention_mask": mask,
        "example_weights": np.ones(N, np.float32),
        "labels": rng.integers(0, 3, size=(N, L) if token_level else N).astype(np.int32),
    }
    if token_level:
        features["label_weights"] = mask.astype(np.float32)
    seen = {}

    def task_score(data, eval_set, outputs, ft, write_dir):
        seen.update(outputs)
        return {"accuracy": 1.0}

    task = SimpleNamespace(packable=True, score=task_score)
    ft = SimpleNamespace(pack=pack, max_segments=4, eval_batch_size=16)
    eval_set = SimpleNamespace(name="dev", features=features)
    evaluation.score(exp, params, task, None, eval_set, ft, (8, 16, L))
    return seen["logits"], mask


@pytest.mark.parametrize(
    "head, token_level",
    [("BertForSequenceClassification", False), ("BertForTokenClassification", True)],
)
def test_packed_evaluation_gives_the_task_the_unpacked_logits(head, token_level):
    packed, mask = _outputs(head, token_level, pack=True)
    padded, _ = _outputs(head, token_level, pack=False)
    if token_level:  # [N, L, 3]: each example's tokens from position 0, compared where real
        assert packed.shape == (N, L, 3)
        real = mask[:, : padded.shape[1]].astype(bool)
        np.testing.assert_allclose(packed[:, : padded.shape[1]][real], padded[real], atol=1e-5)
    else:
        assert packed.shape == padded.shape == (N, 3)
        np.testing.assert_allclose(packed, padded, atol=1e-5)
