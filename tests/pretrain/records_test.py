"""TFRecord framing (against TensorFlow), ArrayRecord files and the random-access data sources."""

import pickle

import numpy as np
import pytest

from bert_jax.pretrain.data import records

PAYLOADS = [b"", b"a", b"hello world" * 50, bytes(range(256)) * 3]


def _write(path, payloads, record_format):
    writer = records.open_writer(path, record_format)
    for p in payloads:
        writer.write(p)
    writer.close()
    return str(path)


def test_masked_crc32c_known_value():
    # CRC-32C("123456789") = 0xE3069283; masking rotates right by 15 and adds 0xa282ead8.
    crc = 0xE3069283
    expected = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert records.masked_crc32c(b"123456789") == expected


@pytest.mark.parametrize("record_format", records.RECORD_FORMATS)
def test_roundtrip_and_random_access(tmp_path, record_format):
    path = _write(tmp_path / f"x.{record_format}", PAYLOADS, record_format)
    assert records.detect_format(path) == record_format
    assert records.count_records(path) == len(PAYLOADS)
    assert records.read_all(path) == PAYLOADS
    source = records.open_data_source([path])
    assert len(source) == len(PAYLOADS)
    assert source[2] == PAYLOADS[2]
    assert list(source.__getitems__([3, 0, 2])) == [PAYLOADS[3], PAYLOADS[0], PAYLOADS[2]]
    clone = pickle.loads(pickle.dumps(source))  # As grain ships it to worker processes.
    assert clone[3] == PAYLOADS[3]


def test_tfrecord_source_spans_files(tmp_path):
    a = _write(tmp_path / "a.tfrecord", [b"0", b"1"], "tfrecord")
    b = _write(tmp_path / "b.tfrecord", [b"2", b"3", b"4"], "tfrecord")
    source = records.TFRecordDataSource([a, b])
    assert [source[i] for i in range(5)] == [b"0", b"1", b"2", b"3", b"4"]
    with pytest.raises(IndexError):
        source[5]


def test_tfrecord_corruption_and_truncation_are_reported(tmp_path):
    path = tmp_path / "x.tfrecord"
    _write(path, PAYLOADS, "tfrecord")
    data = bytearray(path.read_bytes())
    truncated = tmp_path / "t.tfrecord"
    truncated.write_bytes(bytes(data[:-3]))
    with pytest.raises(records.RecordFileError, match="truncated"):
        records.count_records(str(truncated))
    data[-10] ^= 0xFF  # Flip a byte inside the last record's data.
    corrupt = tmp_path / "c.tfrecord"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(records.RecordFileError, match="record 3 fails its data checksum"):
        list(records.iter_tfrecord(str(corrupt)))
    with pytest.raises(records.RecordFileError, match="checksum"):
        records.TFRecordDataSource([str(corrupt)])[3]
    gz = tmp_path / "g.tfrecord"
    gz.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 20)
    with pytest.raises(records.RecordFileError, match="gzip"):
        records.count_records(str(gz))


def test_detect_format_by_content_and_mixed_formats(tmp_path):
    tf_path = _write(tmp_path / "shard-0", [b"x"], "tfrecord")
    ar_path = _write(tmp_path / "shard-1", [b"y"], "array_record")
    assert records.detect_format(tf_path) == "tfrecord"
    assert records.detect_format(ar_path) == "array_record"
    text = tmp_path / "notes.bin"
    text.write_bytes(b"just some text, not records\n" * 4)
    with pytest.raises(records.RecordFileError, match="neither a TFRecord nor an ArrayRecord"):
        records.detect_format(str(text))
    with pytest.raises(records.RecordFileError, match="mix formats"):
        records.open_data_source([tf_path, ar_path])


def test_expand_paths(tmp_path):
    for name in ("b.tfrecord", "a.tfrecord"):
        _write(tmp_path / name, [b"z"], "tfrecord")
    assert records.expand_paths(str(tmp_path / "*.tfrecord")) == [
        str(tmp_path / "a.tfrecord"),
        str(tmp_path / "b.tfrecord"),
    ]
    with pytest.raises(FileNotFoundError, match="matches nothing"):
        records.expand_paths(str(tmp_path / "*.array_record"))


@pytest.mark.tf
def test_tfrecord_bytes_equal_tensorflow_writer_and_cross_reading(tmp_path):
    tf = pytest.importorskip("tensorflow")
    theirs = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for p in PAYLOADS:
            writer.write(p)
    ours = _write(tmp_path / "ours.tfrecord", PAYLOADS, "tfrecord")
    assert theirs.read_bytes() == (tmp_path / "ours.tfrecord").read_bytes()
    assert records.read_all(str(theirs)) == PAYLOADS
    read_by_tf = [r.numpy() for r in tf.data.TFRecordDataset(ours)]
    assert read_by_tf == PAYLOADS


def test_many_records_random_order(tmp_path):
    rng = np.random.default_rng(0)
    payloads = [rng.bytes(int(n)) for n in rng.integers(0, 3000, 300)]
    for record_format in records.RECORD_FORMATS:
        path = _write(tmp_path / f"m.{record_format}", payloads, record_format)
        source = records.open_data_source([path])
        order = rng.permutation(len(payloads)).tolist()
        assert list(source.__getitems__(order)) == [payloads[i] for i in order]
