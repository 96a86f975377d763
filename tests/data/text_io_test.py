"""Text datasets: truncating sentence pairs, featurizing them, and reading files' text encoding
(the readers' layouts and bad rows are tested per task in tests/finetune/glue_test.py)."""

import numpy as np
import pytest

from bert_jax.data import sentence_features, text_io

NLI2 = ("entailment", "not_entailment")  # RTE's labels


def test_truncated_pair_lengths_equal_popping_the_longer_text():
    def popped(len_a, len_b, max_tokens):
        while len_a + len_b > max_tokens:
            if len_a > len_b:
                len_a -= 1
            else:
                len_b -= 1
        return len_a, len_b

    for len_a in range(0, 14):
        for len_b in range(0, 14):
            for max_tokens in range(0, 20):
                assert sentence_features.truncated_pair_lengths(len_a, len_b, max_tokens) == popped(
                    len_a, len_b, max_tokens
                ), (len_a, len_b, max_tokens)


def test_featurize_pairs_layout_and_truncation(bert_tokenizer):
    tokenizer = bert_tokenizer
    task = text_io.TextDataset("rte", ("sentence1", "sentence2"), 2, ("accuracy",), NLI2)
    long_text = " ".join(["word"] * 40)
    examples = [
        text_io.TextExample("0", ("A cat sat.", "A dog ran far."), 0),
        text_io.TextExample("1", (long_text, "short one"), 1),
    ]
    features, stats = sentence_features.featurize(examples, tokenizer, task, max_seq_length=16)
    assert {k: (v.shape, v.dtype) for k, v in features.items()} == {
        "input_ids": ((2, 16), np.int32),
        "token_type_ids": ((2, 16), np.int32),
        "attention_mask": ((2, 16), np.int32),
        "labels": ((2,), np.int32),
        "example_weights": ((2,), np.float32),
    }
    a, b = tokenizer.encode("A cat sat."), tokenizer.encode("A dog ran far.")
    row = [tokenizer.cls_id, *a, tokenizer.sep_id, *b, tokenizer.sep_id]
    np.testing.assert_array_equal(features["input_ids"][0, : len(row)], row)
    assert np.all(features["input_ids"][0, len(row) :] == tokenizer.pad_id)
    np.testing.assert_array_equal(
        features["token_type_ids"][0, : len(row)], [0] * (len(a) + 2) + [1] * (len(b) + 1)
    )
    assert features["attention_mask"][0].sum() == len(row)
    # The long first text is cut, the short second one kept whole.
    second = tokenizer.encode("short one")
    assert features["attention_mask"][1].sum() == 16
    np.testing.assert_array_equal(
        features["input_ids"][1, 16 - len(second) - 1 :], [*second, tokenizer.sep_id]
    )
    assert (stats.examples, stats.truncated, stats.longest) == (2, 1, 40 + len(second) + 3)
    np.testing.assert_array_equal(features["labels"], [0, 1])
    np.testing.assert_array_equal(features["example_weights"], [1.0, 1.0])


def test_text_encoding(tmp_path):
    binary = text_io.TextDataset("b", ("text",), 2, ("accuracy", "f1"), ("0", "1"))
    (tmp_path / "bom.csv").write_bytes("\ufefftext,label\ncafé,1\n".encode())
    assert text_io.read_records(tmp_path / "bom.csv", binary) == [
        text_io.TextExample("0", ("café",), 1)
    ]
    (tmp_path / "latin1.csv").write_bytes("text,label\ncafé,1\n".encode("latin-1"))
    with pytest.raises(
        ValueError, match=r"latin1.csv is not UTF-8 text \(invalid byte at offset 14\)"
    ):
        text_io.read_records(tmp_path / "latin1.csv", binary)
