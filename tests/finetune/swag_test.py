"""SWAG-format multiple choice: reading and [N, C, L] features."""

import numpy as np
import pytest

from bert_jax.data import batching
from bert_jax.finetune import swag
from tests.finetune.conftest import TESTDATA


def test_read_swag():
    examples = swag.read_swag(TESTDATA / "swag_tiny.csv")
    assert len(examples) == 3
    assert examples[0] == swag.MultipleChoiceExample(
        "5011",
        "A woman pours batter into a pan.",
        "She",
        (
            "flips the pancake with a spatula.",
            "paints the fence, slowly.",
            "drives the car away.",
            "reads a book to the dog.",
        ),
        0,
    )
    assert examples[1].endings[2] == 'bakes a "large" cake.'
    assert [e.label for e in examples] == [0, 1, 2]
    test = swag.read_swag(TESTDATA / "swag_tiny_test.csv")
    assert test[0].label is None and test[0].guid == "6001"
    with pytest.raises(
        ValueError, match=r"swag_tiny_test.csv: the header lacks the column\(s\) \['label'\]"
    ):
        swag.read_swag(TESTDATA / "swag_tiny_test.csv", labelled=True)


def test_featurize_multiple_choice(tokenizer):
    examples = swag.read_swag(TESTDATA / "swag_tiny.csv")
    features, stats = swag.featurize(examples, tokenizer, max_seq_length=24)
    assert {k: (v.shape, v.dtype) for k, v in features.items()} == {
        "input_ids": ((3, 4, 24), np.int32),
        "token_type_ids": ((3, 4, 24), np.int32),
        "attention_mask": ((3, 4, 24), np.int32),
        "labels": ((3,), np.int32),
        "example_weights": ((3,), np.float32),
    }
    assert stats.examples == 12 and stats.truncated == 0
    for i, example in enumerate(examples):
        context = tokenizer.encode(example.context)
        for k, ending in enumerate(example.endings):
            second = tokenizer.encode(f"{example.start} {ending}")
            row = [tokenizer.cls_id, *context, tokenizer.sep_id, *second, tokenizer.sep_id]
            np.testing.assert_array_equal(features["input_ids"][i, k, : len(row)], row)
            np.testing.assert_array_equal(
                features["token_type_ids"][i, k, : len(row)],
                [0] * (len(context) + 2) + [1] * (len(second) + 1),
            )
            assert features["attention_mask"][i, k].sum() == len(row)
    np.testing.assert_array_equal(features["labels"], [0, 1, 2])
    # Truncation is counted per choice row.
    _, stats = swag.featurize(examples, tokenizer, max_seq_length=12)
    assert stats.truncated == 12
    # Unlabelled files give label -1; batches keep the [B, C, L] layout.
    test = swag.read_swag(TESTDATA / "swag_tiny_test.csv")
    features, _ = swag.featurize(test, tokenizer, max_seq_length=24)
    assert features["labels"].tolist() == [-1]
    (batch,) = batching.batches(features, 2, bucket_boundaries=(16, 24))
    assert batch["input_ids"].shape == (2, 4, 16)
    assert batch["example_weights"].tolist() == [1.0, 0.0]


def test_bad_swag_input(tmp_path):
    header = "sent1,sent2,ending0,ending1,label\n"
    path = tmp_path / "bad.csv"
    path.write_text(header + "A.,B,c.,d.,1\nA.,B,c.,d.,2\n")
    with pytest.raises(ValueError, match=r"bad.csv:3: label: '2' is not a choice index in 0..1"):
        swag.read_swag(path)
    path.write_text(header + "A.,B,c.,d.\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: 4 field\(s\), but the header has 5"):
        swag.read_swag(path)
    path.write_text("sent1,sent2,ending0,label\nA.,B,c.,0\n")
    with pytest.raises(ValueError, match="needs columns ending0, ending1"):
        swag.read_swag(path)
    path.write_text("")
    with pytest.raises(ValueError, match="bad.csv is empty"):
        swag.read_swag(path)
    path.write_text(header)
    with pytest.raises(ValueError, match="bad.csv has no examples"):
        swag.read_swag(path)
