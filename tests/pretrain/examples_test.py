"""Example creation: equality with google-research/bert's output, and the recipe's statistics."""

import random

import numpy as np
import pytest

from bert_jax.pretrain.data import example_proto, features, records, sources
from bert_jax.pretrain.data.examples import (
    PretrainingOptions,
    VocabInfo,
    create_hashed_shard_instances,
    create_instances_from_document,
    create_shard_instances,
    document_key,
    truncate_seq_pair,
)
from tests.pretrain.conftest import EXCERPT, TESTDATA
from tests.pretrain.masking_stats import check_masking_statistics, check_whole_words

# Outputs of google-research/bert's create_pretraining_data.py (commit eedf571, run with
# tensorflow.compat.v1) on shakespeare_excerpt.txt with the bert-base-uncased vocab.txt:
ORIGINAL_RUNS = {
    # --max_seq_length=64 --max_predictions_per_seq=10 --dupe_factor=2 --random_seed=12345
    "original_seed12345_len64.tfrecord": PretrainingOptions(
        max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, random_seed=12345
    ),
    # --do_whole_word_mask --max_seq_length=48 --max_predictions_per_seq=7 --masked_lm_prob=0.2
    # --short_seq_prob=0.5 --dupe_factor=2 --random_seed=7
    "original_wwm_seed7_len48.tfrecord": PretrainingOptions(
        max_seq_length=48,
        max_predictions_per_seq=7,
        masked_lm_prob=0.2,
        short_seq_prob=0.5,
        whole_word_mask=True,
        dupe_factor=2,
        random_seed=7,
    ),
}

SYNTHETIC_V = 1000


def synthetic_vocab(continuation: bool = True) -> VocabInfo:
    """Ids 0 [PAD], 2 [CLS], 3 [SEP], 4 [MASK]; with `continuation`, ids >= 600 are "##" pieces."""
    table = np.zeros(SYNTHETIC_V, bool)
    if continuation:
        table[600:] = True
    return VocabInfo(SYNTHETIC_V, cls_id=2, sep_id=3, pad_id=0, mask_id=4, continuation=table)


def synthetic_documents(num_docs, num_sentences, seed=0, min_len=5, max_len=25):
    rng = np.random.default_rng(seed)
    return [
        [
            rng.integers(10, SYNTHETIC_V, int(n)).tolist()
            for n in rng.integers(min_len, max_len, num_sentences)
        ]
        for _ in range(num_docs)
    ]


@pytest.mark.parametrize("fixture", sorted(ORIGINAL_RUNS))
def test_equal_to_google_research_bert_output(fixture, bert_tokenizer):
    options = ORIGINAL_RUNS[fixture]
    documents = list(sources.text_file_documents(str(EXCERPT), split_sentences=False))
    tokenized = [bert_tokenizer.encode_batch(d) for d in documents]
    instances = create_shard_instances(tokenized, options, VocabInfo.from_tokenizer(bert_tokenizer))
    ours = [
        features.instance_to_example(i, options.max_seq_length, options.max_predictions_per_seq)
        for i in instances
    ]
    theirs = records.read_all(str(TESTDATA / fixture))
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        decoded_a, decoded_b = example_proto.decode_example(a), example_proto.decode_example(b)
        assert decoded_a.keys() == decoded_b.keys()
        for name in decoded_b:
            np.testing.assert_array_equal(decoded_a[name], decoded_b[name], err_msg=f"{k} {name}")


@pytest.mark.parametrize("whole_word", [False, True])
def test_static_masking_statistics(whole_word):
    vocab = synthetic_vocab(continuation=whole_word)
    documents = synthetic_documents(150, 20)
    options = PretrainingOptions(
        max_seq_length=128, dupe_factor=1, whole_word_mask=whole_word, static_masking=False
    )
    masked = create_shard_instances(
        documents, PretrainingOptions(**{**options.to_dict(), "static_masking": True}), vocab
    )
    originals = []  # Each instance's tokens before masking: put the labels back.
    for inst in masked:
        tokens = list(inst.tokens)
        for p, label in zip(inst.masked_lm_positions, inst.masked_lm_ids):
            tokens[p] = label
        originals.append(tokens)
    assert len(masked) > 500
    check_masking_statistics(
        originals,
        [i.tokens for i in masked],
        [i.masked_lm_positions for i in masked],
        vocab,
        0.15,
        20,
    )
    if whole_word:
        check_whole_words(originals, [i.masked_lm_positions for i in masked], vocab)


def test_next_sentence_is_random_half_the_time():
    vocab = synthetic_vocab()
    documents = synthetic_documents(1500, 12, seed=1)
    options = PretrainingOptions(max_seq_length=128, short_seq_prob=0.0, static_masking=False)
    rng = random.Random(3)
    first_random, labels = [], []
    for d in range(len(documents)):
        instances = create_instances_from_document(documents, d, options, vocab, rng)
        first_random.append(instances[0].is_random_next)  # The first chunk has >= 2 sentences.
        labels.extend(i.is_random_next for i in instances)
    n = len(first_random)
    assert abs(np.mean(first_random) - 0.5) < 4 * np.sqrt(0.25 / n)
    # Overall slightly above 1/2: a chunk of one sentence always takes a random B (as the original).
    assert 0.5 <= np.mean(labels) < 0.6


def test_random_next_segment_comes_from_another_document_and_actual_next_follows():
    vocab = synthetic_vocab(continuation=False)
    # Document d holds tokens 10 + d*100 + j, so every token names its document and place.
    documents = [[[10 + d * 100 + j] * 3 for j in range(40)] for d in range(8)]
    options = PretrainingOptions(max_seq_length=32, static_masking=False, short_seq_prob=0.0)
    rng = random.Random(0)
    for d in range(len(documents)):
        for inst in create_instances_from_document(documents, d, options, vocab, rng):
            sep = inst.tokens.index(3)
            a, b = inst.tokens[1:sep], inst.tokens[sep + 1 : -1]
            doc_of = lambda t: (t - 10) // 100
            assert {doc_of(t) for t in a} == {d}
            if inst.is_random_next:
                assert {doc_of(t) for t in b} != {d}
            else:
                assert {doc_of(t) for t in b} == {d} and min(b) > max(a)
            assert inst.segment_ids == [0] * (sep + 1) + [1] * (len(b) + 1)


def test_short_seq_prob_gives_random_target_lengths_per_document():
    vocab = synthetic_vocab(continuation=False)
    max_seq_length = 34
    max_num_tokens = max_seq_length - 2  # MLM-only: [CLS] A [SEP].
    # One-token sentences: a chunk closes exactly at the document's target length.
    documents = [[[20 + j] for j in range(max_num_tokens)] for _ in range(4000)]
    options = PretrainingOptions(
        max_seq_length=max_seq_length,
        short_seq_prob=0.1,
        next_sentence_prediction=False,
        static_masking=False,
    )
    rng = random.Random(5)
    targets = np.array(
        [
            len(create_instances_from_document(documents, d, options, vocab, rng)[0].tokens) - 2
            for d in range(len(documents))
        ]
    )
    short = targets[targets < max_num_tokens]
    # P(target < max) = 0.1 * (1 - 1 / (max - 1)); short targets are uniform on [2, max - 1].
    expected = 0.1 * (1 - 1 / (max_num_tokens - 1))
    n = len(targets)
    assert abs(len(short) / n - expected) < 4 * np.sqrt(expected * (1 - expected) / n)
    assert short.min() >= 2
    assert abs(short.mean() - (2 + max_num_tokens - 1) / 2) < 2.5
    assert len(np.unique(short)) > 20


def test_truncate_seq_pair_cuts_the_longer_from_both_ends():
    rng = random.Random(0)
    fronts = backs = 0
    for _ in range(200):
        a, b = list(range(10)), list(range(100, 103))
        truncate_seq_pair(a, b, 8, rng)
        assert len(a) + len(b) == 8 and b == [100, 101, 102]
        fronts += a[0] != 0
        backs += a[-1] != 9
    assert fronts > 50 and backs > 50


def test_mlm_only_examples_are_single_segments():
    vocab = synthetic_vocab()
    documents = synthetic_documents(40, 15)
    options = PretrainingOptions(max_seq_length=64, next_sentence_prediction=False, dupe_factor=1)
    instances = create_shard_instances(documents, options, vocab)
    assert instances
    for inst in instances:
        assert inst.tokens[0] == 2 and inst.tokens[-1] == 3 and inst.tokens.count(3) == 1
        assert set(inst.segment_ids) == {0} and not inst.is_random_next
        assert len(inst.tokens) <= 64 and inst.masked_lm_positions


def test_seeded_and_bit_exactly_reproducible():
    vocab = synthetic_vocab()
    documents = synthetic_documents(30, 10)
    options = PretrainingOptions(max_seq_length=64, dupe_factor=2, whole_word_mask=True)
    run = lambda o, s=0, n=1: create_shard_instances(documents, o, vocab, s, n)
    assert run(options) == run(options)
    assert run(options) != run(PretrainingOptions(**{**options.to_dict(), "random_seed": 1}))
    shards = [run(options, s, 3) for s in range(3)]
    assert shards[1] == run(options, 1, 3)
    assert all(shards) and shards[0] != shards[1]


def test_hashed_shard_depends_on_its_documents_not_their_order_and_stays_inside():
    vocab = synthetic_vocab(continuation=False)
    # Document d holds tokens 10 + d*100 + j, so every token names its document.
    documents = [[[10 + d * 100 + j] * 3 for j in range(20)] for d in range(24)]
    options = PretrainingOptions(max_seq_length=32, dupe_factor=2)
    shards = [[d for d in documents if document_key(d) % 3 == s] for s in range(3)]
    assert all(shards) and sum(map(len, shards)) == len(documents)
    run = lambda docs, s=1: create_hashed_shard_instances(docs, options, vocab, s, 3)
    instances = run(shards[1])
    assert instances == run(list(reversed(shards[1])))  # Any delivery order, the same records.
    assert instances != run(shards[1], s=2)  # Each shard its own seed.
    unmasked = PretrainingOptions(max_seq_length=32, dupe_factor=2, static_masking=False)
    instances = create_hashed_shard_instances(shards[1], unmasked, vocab, 1, 3)
    own = {(t - 10) // 100 for d in shards[1] for t in d[0]}
    for inst in instances:
        text = [t for t in inst.tokens if t >= 10]
        assert {(t - 10) // 100 for t in text} <= own  # Random B segments from the shard.
    assert sum(i.is_random_next for i in instances) > len(instances) / 4
    assert document_key([[1, 2], [3]]) != document_key([[1], [2, 3]])
    assert create_hashed_shard_instances([], options, vocab, 0, 3) == []


def test_options_are_validated():
    with pytest.raises(ValueError, match="max_seq_length"):
        PretrainingOptions(max_seq_length=4)
    with pytest.raises(ValueError, match="masked_lm_prob"):
        PretrainingOptions(masked_lm_prob=1.5)
    with pytest.raises(ValueError, match="dupe_factor"):
        PretrainingOptions(dupe_factor=0)
    PretrainingOptions(max_seq_length=4, next_sentence_prediction=False)
