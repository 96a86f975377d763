"""Pooling has one home (`bert_jax.models.pooling`): its names, its functions and how each maps to
sentence-transformers' Pooling module, read by training, inference and every export."""

import ast
import pathlib

import numpy as np
import pytest

from bert_jax.models import pooling

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "bert_jax"


def test_the_pooling_names_are_defined_once():
    """No module but models/pooling.py assigns a pooling name set (`POOLINGS`, `*_POOLINGS`)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if any(n == "POOLINGS" or n.endswith("_POOLINGS") for n in names):
                found.append(str(path.relative_to(PACKAGE)))
    assert found == ["models/pooling.py"] * len(found) and found, found


def test_pool_and_pool_segments_agree():
    """A text pooled alone and in a packed row gives the same vector, for each sentence pooling."""
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 7, 5)).astype(np.float32)  # two texts of 4 and 3 tokens
    mask = np.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0]], np.int32)
    packed = np.concatenate([hidden[0, :4], hidden[1, :3]])[None]  # [1, 7, 5]
    segments = np.array([[1, 1, 1, 1, 2, 2, 2]], np.int32)
    starts = np.array([[0, 4]], np.int32)
    for name in pooling.SENTENCE_POOLINGS:
        alone = np.asarray(pooling.pool(hidden, mask, name))
        together = np.asarray(pooling.pool_segments(packed, segments, starts, name))[0]
        np.testing.assert_allclose(together, alone, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pooling.pool(hidden, mask, "mean")[1], hidden[1, :3].mean(0), 1e-6)


@pytest.mark.parametrize("name", pooling.SENTENCE_POOLINGS)
def test_sentence_transformers_config_round_trip(name):
    config = pooling.st_pooling_config(name, hidden_size=32)
    assert config["word_embedding_dimension"] == 32
    assert pooling.st_pooling_modes(config) == [name]
    assert pooling.st_pooling_modes({"pooling_mode": name}) == [name]  # 6.x's format


def test_a_pooling_not_computed_is_named():
    with pytest.raises(ValueError, match=r"pooling must be one of \('mean', 'cls'\), got 'max'"):
        pooling.check_pooling("max")
    with pytest.raises(ValueError, match="got 'pooler'"):
        pooling.st_pooling_config("pooler", 32)
    pooling.check_pooling("pooler", pooling.POOLINGS)
