"""`bert_jax.batch_layout` is the one statement of every training batch: the data's batches and
the shapes `--mode=compile` lowers each job's step with are read from it."""

import numpy as np
import pytest

from bert_jax import batch_layout
from bert_jax.rerank import data as rerank_data
from bert_jax.retrieval import packing, pairs
from bert_jax.training import objectives


def assert_matches(batch, layout, **sizes):
    """`batch` (numpy) has exactly `layout`'s keys, dtypes and shapes for `sizes`."""
    assert sorted(batch) == sorted(layout)
    for key, (shape, dtype) in batch_layout.shapes(layout, **sizes).items():
        assert (batch[key].shape, batch[key].dtype) == (shape, dtype), key


def test_the_data_make_the_declared_batches(bert_tokenizer):
    texts = ["fair is foul", "and foul is fair", "hover through the fog", "the filthy air", "x"]
    read = pairs.Pairs(texts[:2], texts[2:4], [(texts[4],), (texts[0],)], "mem")
    features = pairs.featurize_pairs(read, bert_tokenizer, 9)
    layout = {**batch_layout.contrastive_layout(packed=False), **batch_layout.EXAMPLE_WEIGHTS}
    assert_matches(features, layout, B=2, T=3, L=9)

    packed = packing.pack_pairs(features, max_segments=5)
    rows = packed["input_ids"].shape[0]
    assert_matches(packed, batch_layout.contrastive_layout(packed=True), R=rows, S=5, L=9)
    apart = packing.pack_pairs(features, max_segments=5, anchors_apart=True)
    layout = batch_layout.contrastive_layout(packed=True, anchors_apart=True)
    assert_matches(apart, layout, B=2, R=apart["input_ids"].shape[0], S=5, L=9)

    rows_read = rerank_data.RerankRows(
        texts[:3], [(t,) for t in texts[2:5]], np.ones(3, np.float32), None, "mem"
    )
    groups = rerank_data.featurize(rows_read, bert_tokenizer, 11)
    assert_matches(groups, batch_layout.rerank_layout("bce", packed=False), B=3, G=1, L=11)


@pytest.mark.parametrize("name", sorted(batch_layout.FINETUNE_TARGETS))
def test_the_compile_batch_of_each_finetuning_objective(name):
    batch = objectives.example_batch(name, rows=3, length=7, num_choices=4)
    tokens = (3, 4, 7) if name == "multiple_choice" else (3, 7)
    assert batch["input_ids"].shape == tokens and batch["example_weights"].shape == (3,)
    assert set(batch) == set(batch_layout.finetune_layout(name))
    with pytest.raises(ValueError, match="no fine-tuning batch for objective 'mlm'"):
        batch_layout.finetune_layout("mlm")
