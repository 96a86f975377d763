"""RoBERTa's FULL-SENTENCES rows: whole sentences read contiguously across documents with a
separator between them, built into shards with a byte-level BPE vocabulary and masked anew by the
input pipeline."""

import random

import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.pretrain.data import build, pipeline, sources
from bert_jax.pretrain.data.examples import (
    PretrainingOptions,
    VocabInfo,
    create_full_sentence_instances,
    create_shard_instances,
)
from tests.pretrain.conftest import EXCERPT

CLS, SEP, PAD, MASK = 0, 2, 1, 99
VOCAB = VocabInfo(100, CLS, SEP, PAD, MASK, np.zeros(100, bool))
OPTIONS = PretrainingOptions(
    max_seq_length=12,
    max_predictions_per_seq=3,
    next_sentence_prediction=False,
    static_masking=False,
    full_sentences=True,
    dupe_factor=1,
)


def _sentence(start, n):
    return list(range(start, start + n))


def test_rows_take_whole_sentences_across_documents():
    documents = [
        [_sentence(10, 4), _sentence(20, 3)],  # 7 tokens
        [_sentence(30, 2)],  # fits after a separator: 7 + 1 + 2 = 10 = L - 2
        [_sentence(40, 5), _sentence(50, 15)],  # 15 > 10: cut into rows of 10 and 5
        [_sentence(70, 3)],
    ]
    rows = [i.tokens for i in create_full_sentence_instances(documents, OPTIONS, VOCAB, None)]
    assert rows == [
        [CLS, *_sentence(10, 4), *_sentence(20, 3), SEP, *_sentence(30, 2), SEP],
        [CLS, *_sentence(40, 5), SEP],  # the next sentence does not fit whole
        [CLS, *_sentence(50, 10), SEP],
        [CLS, *_sentence(60, 5), SEP, *_sentence(70, 3), SEP],
    ]
    assert all(len(r) <= OPTIONS.max_seq_length for r in rows)
    # Every text token appears once, in order.
    text = [t for r in rows for t in r if t not in (CLS, SEP)]
    assert text == [t for d in documents for s in d for t in s]


def test_shards_read_their_documents_in_new_orders_and_options_are_checked():
    rng = random.Random(0)
    documents = [[_sentence(10 * (d + 1), rng.randint(1, 6)) for _ in range(3)] for d in range(9)]
    options = PretrainingOptions(**{**OPTIONS.__dict__, "dupe_factor": 3})
    shards = [create_shard_instances(documents, options, VOCAB, s, 3) for s in range(3)]
    texts = [sorted(t for i in shard for t in i.tokens if t not in (CLS, SEP)) for shard in shards]
    everything = sorted([t for d in documents for s in d for t in s] * 3)
    assert sorted(t for shard in texts for t in shard) == everything
    assert all(i.segment_ids == [0] * len(i.tokens) for shard in shards for i in shard)
    with pytest.raises(ValueError, match="set next_sentence_prediction=False"):
        PretrainingOptions(full_sentences=True)
    # Builds made before the option existed keep their plan.
    assert "full_sentences" not in PretrainingOptions().to_dict()


def test_bpe_build_is_masked_by_the_pipeline(tmp_path):
    lines = [line for line in EXCERPT.read_text().splitlines() if line]
    tokenizer = tokenization.train_byte_level_bpe(lines, vocab_size=400)
    documents = list(sources.text_file_documents(str(EXCERPT), split_sentences=False))
    options = PretrainingOptions(
        max_seq_length=64,
        max_predictions_per_seq=12,
        next_sentence_prediction=False,
        static_masking=False,
        full_sentences=True,
        dupe_factor=1,
    )
    out = tmp_path / "build"
    metadata = build.build_pretraining_shards(
        documents, out, tokenizer, options, num_shards=2, num_workers=1, progress=False
    )
    assert {"vocab.json", "merges.txt", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert metadata["stats"]["mean_tokens"] > 0.7 * 64  # rows are filled with whole lines
    loader = pipeline.make_pretraining_loader(
        out, batch_size=4, seed=0, shard_index=0, shard_count=1, masked_lm_prob=0.15
    )
    batch = next(loader)
    ids, weights = batch["input_ids"], batch["masked_lm_weights"]
    assert (ids[:, 0] == tokenizer.cls_id).all()
    assert (ids == tokenizer.mask_id).any() and weights.sum() > 0
    rows = np.arange(len(ids))[:, None]
    masked = batch["masked_lm_ids"][weights > 0]
    assert not np.isin(masked, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id]).any()
    assert (ids[rows, batch["masked_lm_positions"]][weights > 0] != tokenizer.sep_id).all()
    # Rebuilding the same directory with the same tokenizer is recognised as finished.
    again = build.build_pretraining_shards(
        documents, out, tokenizer, options, num_shards=2, num_workers=1, progress=False
    )
    assert again == metadata
