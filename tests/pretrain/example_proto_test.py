"""tf.train.Example encoding/decoding without TensorFlow, checked against TensorFlow itself."""

import numpy as np
import pytest

from bert_jax.pretrain.data import example_proto as ep

FEATURES = {
    "input_ids": np.array([101, 7592, 30521, 0, 65535, 65536, 2**31 - 1], np.int64),
    "masked_lm_weights": np.array([1.0, 0.0, 0.5, -2.25], np.float32),
    "negatives": [-1, -(2**63), 2**63 - 1, 0, 127, 128, 16383, 16384],
    "names": [b"abc", b"", "\u00e9t\u00e9"],
    "empty": np.zeros(0, np.int64),
}


def test_roundtrip_all_kinds():
    decoded = ep.decode_example(ep.encode_example(FEATURES))
    np.testing.assert_array_equal(decoded["input_ids"], FEATURES["input_ids"])
    assert decoded["masked_lm_weights"].dtype == np.float32
    np.testing.assert_array_equal(decoded["masked_lm_weights"], FEATURES["masked_lm_weights"])
    np.testing.assert_array_equal(decoded["negatives"], FEATURES["negatives"])
    assert decoded["names"] == [b"abc", b"", "\u00e9t\u00e9".encode()]
    assert decoded["empty"].size == 0


def test_varints_roundtrip_random():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [rng.integers(-(2**63), 2**63 - 1, 500), rng.integers(0, 40000, 500), [0, 1, -1]]
    )
    packed = ep.encode_varints(values)
    np.testing.assert_array_equal(ep.decode_varints(np.frombuffer(packed, np.uint8)), values)


def test_fixed_batch_decode_and_length_errors():
    records = [
        ep.encode_example({"a": [i, i + 1, 300 * i], "w": np.full(2, i, np.float32)})
        for i in range(5)
    ]
    batch = ep.decode_fixed_batch(records, {"a": ("int64", 3), "w": ("float", 2)})
    assert batch["a"].shape == (5, 3) and batch["w"].shape == (5, 2)
    np.testing.assert_array_equal(batch["a"][:, 2], 300 * np.arange(5))
    bad = [*records[:3], ep.encode_example({"a": [1, 2], "w": [0.0, 0.0]})]
    with pytest.raises(ep.ExampleDecodeError, match="record 3 .* 'a' has 2 values, expected 3"):
        ep.decode_fixed_batch(bad, {"a": ("int64", 3), "w": ("float", 2)})
    with pytest.raises(ep.ExampleDecodeError, match="no feature 'b'"):
        ep.decode_fixed_batch(records, {"b": ("int64", 3)})
    with pytest.raises(ep.ExampleDecodeError, match="is a float_list, expected int64_list"):
        ep.decode_fixed_batch(records, {"w": ("int64", 2)})


def test_unpacked_encoding_is_read():
    # Int64List {value: 5, value: 300} unpacked (field 1, wire type 0 each), as some writers do.
    int64_list = b"\x08\x05\x08\xac\x02"
    feature = b"\x1a" + bytes([len(int64_list)]) + int64_list
    entry = b"\x0a\x01a" + b"\x12" + bytes([len(feature)]) + feature
    features = b"\x0a" + bytes([len(entry)]) + entry
    example = b"\x0a" + bytes([len(features)]) + features
    np.testing.assert_array_equal(ep.decode_example(example)["a"], [5, 300])
    batch = ep.decode_fixed_batch([example, ep.encode_example({"a": [7, 8]})], {"a": ("int64", 2)})
    np.testing.assert_array_equal(batch["a"], [[5, 300], [7, 8]])


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_truncated_record_raises_clear_error(cut):
    data = ep.encode_example(FEATURES)
    with pytest.raises(ep.ExampleDecodeError):
        ep.decode_example(data[:-cut])


def _tf_example(tf, features):
    def feature(values):
        values = list(values)
        if values and isinstance(values[0], (bytes, str)):
            values = [v.encode() if isinstance(v, str) else v for v in values]
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if values and isinstance(values[0], (float, np.floating)):
            return tf.train.Feature(float_list=tf.train.FloatList(value=values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    return tf.train.Example(
        features=tf.train.Features(feature={k: feature(v) for k, v in features.items()})
    )


@pytest.mark.tf
def test_bytes_equal_tensorflow_serialization():
    tf = pytest.importorskip("tensorflow")
    features = {k: FEATURES[k] for k in sorted(FEATURES) if k != "empty"}
    ours = ep.encode_example(features)
    theirs = _tf_example(tf, features)
    # Deterministic serialization writes map entries sorted by key, as we do for sorted input.
    assert ours == theirs.SerializeToString(deterministic=True)
    assert tf.train.Example.FromString(ours) == theirs
    decoded = ep.decode_example(theirs.SerializeToString())
    np.testing.assert_array_equal(decoded["negatives"], FEATURES["negatives"])


@pytest.mark.tf
def test_tensorflow_parses_our_pretraining_example():
    tf = pytest.importorskip("tensorflow")
    record = ep.encode_example(
        {"input_ids": np.arange(8) * 1000, "masked_lm_weights": np.array([1.0, 0.0], np.float32)}
    )
    parsed = tf.io.parse_single_example(
        record,
        {
            "input_ids": tf.io.FixedLenFeature([8], tf.int64),
            "masked_lm_weights": tf.io.FixedLenFeature([2], tf.float32),
        },
    )
    np.testing.assert_array_equal(parsed["input_ids"].numpy(), np.arange(8) * 1000)
    np.testing.assert_array_equal(parsed["masked_lm_weights"].numpy(), [1.0, 0.0])
