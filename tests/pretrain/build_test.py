"""Shard building: parallel, resumable, idempotent, and never clobbering other data."""

import os

import pytest

from bert_jax.pretrain.data import build, build_dir, default_corpus, records, sources
from bert_jax.pretrain.data.examples import PretrainingOptions
from tests.pretrain.conftest import EXCERPT

OPTIONS = PretrainingOptions(max_seq_length=48, max_predictions_per_seq=8, dupe_factor=2)


def excerpt_documents():
    return list(sources.text_file_documents(str(EXCERPT), split_sentences=False))


def shard_bytes(out_dir, metadata):
    return [records.read_all(os.path.join(out_dir, s["path"])) for s in metadata["shards"]]


def test_build_writes_shards_and_metadata(tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    metadata = build.build_pretraining_shards(
        excerpt_documents(),
        out,
        tiny_tokenizer,
        OPTIONS,
        num_shards=3,
        num_workers=1,
        progress=False,
    )
    names = sorted(os.listdir(out))
    assert names == [
        "build.json",
        "metadata.json",
        "pretrain-00000-of-00003.array_record",
        "pretrain-00001-of-00003.array_record",
        "pretrain-00002-of-00003.array_record",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    counts = [records.count_records(out / s["path"]) for s in metadata["shards"]]
    assert counts == [s["num_records"] for s in metadata["shards"]]
    assert metadata["num_records"] == sum(counts) > 100
    assert metadata["tokenizer"]["vocab_size"] == tiny_tokenizer.vocab_size
    assert metadata["corpus"]["documents"] == 8
    # Above 1/2: many verse sentences fill a 45-token chunk alone, and a one-sentence chunk always
    # takes a random B (as in the original).
    assert 0.5 < metadata["stats"]["random_next_fraction"] < 0.9
    assert build_dir.read_metadata(out) == metadata


def test_rerun_is_idempotent_and_reads_nothing(tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    args = dict(num_shards=2, num_workers=1, progress=False, source_id="excerpt-v1")
    first = build.build_pretraining_shards(excerpt_documents, out, tiny_tokenizer, OPTIONS, **args)
    stamps = {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)}

    def must_not_read():
        raise AssertionError("a finished build must not read its corpus again")

    again = build.build_pretraining_shards(must_not_read, out, tiny_tokenizer, OPTIONS, **args)
    assert again == first
    assert {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)} == stamps


def test_interrupted_build_resumes_reusing_finished_shards(tmp_path, tiny_tokenizer, monkeypatch):
    out = tmp_path / "out"
    args = dict(num_shards=3, num_workers=1, progress=False)
    real_write_shard = build._write_shard

    def crash_on_shard_2(corpus, out_dir, index, *rest):
        if index == 2:
            # Leave what a killed writer leaves: a partial file under a temporary name.
            (out / ".pretrain-00002-of-00003.array_record.tmp-4242").write_bytes(b"partial")
            raise KeyboardInterrupt
        return real_write_shard(corpus, out_dir, index, *rest)

    monkeypatch.setattr(build, "_write_shard", crash_on_shard_2)
    with pytest.raises(KeyboardInterrupt):
        build.build_pretraining_shards(excerpt_documents(), out, tiny_tokenizer, OPTIONS, **args)
    assert not (out / "metadata.json").exists()
    assert not (out / "pretrain-00002-of-00003.array_record").exists()
    finished = {n: os.stat(out / n).st_ino for n in os.listdir(out) if n.startswith("pretrain-")}
    assert len(finished) == 2

    monkeypatch.setattr(build, "_write_shard", real_write_shard)
    resumed = build.build_pretraining_shards(
        excerpt_documents(), out, tiny_tokenizer, OPTIONS, **args
    )
    for name, inode in finished.items():
        assert os.stat(out / name).st_ino == inode  # Reused, not rewritten.
    assert not [n for n in os.listdir(out) if n.startswith(".")]
    fresh = build.build_pretraining_shards(
        excerpt_documents(), tmp_path / "fresh", tiny_tokenizer, OPTIONS, **args
    )
    assert shard_bytes(out, resumed) == shard_bytes(tmp_path / "fresh", fresh)


def test_parallel_build_equals_serial_build(tmp_path, tiny_tokenizer):
    kwargs = dict(num_shards=2, record_format="tfrecord", progress=False)
    serial = build.build_pretraining_shards(
        excerpt_documents(), tmp_path / "serial", tiny_tokenizer, OPTIONS, num_workers=1, **kwargs
    )
    parallel = build.build_pretraining_shards(
        excerpt_documents(), tmp_path / "parallel", tiny_tokenizer, OPTIONS, num_workers=2, **kwargs
    )
    assert shard_bytes(tmp_path / "serial", serial) == shard_bytes(tmp_path / "parallel", parallel)
    assert not (tmp_path / "parallel" / ".build-tmp").exists()


def test_refuses_a_directory_holding_other_data(tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(
        build_dir.OutputDirectoryError, match=r"already holds other data \(notes.txt\)"
    ):
        build.build_pretraining_shards(
            excerpt_documents(), out, tiny_tokenizer, OPTIONS, progress=False
        )
    assert os.listdir(out) == ["notes.txt"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(build_dir.OutputDirectoryError, match="not a directory"):
        build.build_pretraining_shards(
            excerpt_documents(), afile, tiny_tokenizer, OPTIONS, progress=False
        )


def test_refuses_a_build_with_other_settings_or_tokenizer(tmp_path, tiny_tokenizer, bert_tokenizer):
    out = tmp_path / "out"
    args = dict(num_shards=2, num_workers=1, progress=False)
    build.build_pretraining_shards(excerpt_documents(), out, tiny_tokenizer, OPTIONS, **args)
    longer = PretrainingOptions(max_seq_length=64, max_predictions_per_seq=8, dupe_factor=2)
    with pytest.raises(
        build_dir.OutputDirectoryError, match="'max_seq_length': 48.*'max_seq_length': 64"
    ):
        build.build_pretraining_shards(excerpt_documents(), out, tiny_tokenizer, longer, **args)
    with pytest.raises(build_dir.OutputDirectoryError, match="different tokenizer"):
        build.build_pretraining_shards(excerpt_documents(), out, bert_tokenizer, OPTIONS, **args)
    with pytest.raises(build_dir.OutputDirectoryError, match="num_shards: 2 -> 3"):
        build.build_pretraining_shards(
            excerpt_documents(), out, tiny_tokenizer, OPTIONS, num_shards=3, progress=False
        )


def test_bad_corpora_get_clear_errors_or_counts(tmp_path, tiny_tokenizer):
    args = dict(num_workers=1, progress=False)
    one_doc = [["A single document.", "With two sentences."]]
    with pytest.raises(ValueError, match="has 1 document"):
        build.build_pretraining_shards(
            one_doc, tmp_path / "a", tiny_tokenizer, OPTIONS, num_shards=1, **args
        )
    with pytest.raises(ValueError, match="no text"):
        build.build_pretraining_shards(
            [[""], []], tmp_path / "b", tiny_tokenizer, OPTIONS, num_shards=1, **args
        )
    with pytest.raises(ValueError, match="num_shards=3 exceeds the 2 documents"):
        build.build_pretraining_shards(
            [["One."], ["Two.", "Three."]],
            tmp_path / "c",
            tiny_tokenizer,
            OPTIONS,
            num_shards=3,
            **args,
        )
    docs = [["Only one sentence."], ["Two", "sentences."], ["\x00\x01"], ["Another lone one."]]
    metadata = build.build_pretraining_shards(
        docs, tmp_path / "d", tiny_tokenizer, OPTIONS, num_shards=1, **args
    )
    assert metadata["corpus"]["one_sentence_documents"] == 2
    assert metadata["corpus"]["empty_sentences"] == 1 and metadata["corpus"]["empty_documents"] == 1
    mlm_only = PretrainingOptions(max_seq_length=48, next_sentence_prediction=False, dupe_factor=1)
    metadata = build.build_pretraining_shards(
        one_doc, tmp_path / "e", tiny_tokenizer, mlm_only, num_shards=1, **args
    )
    assert metadata["num_records"] >= 1


@pytest.mark.slow
def test_default_corpus_build_for_the_main_job(tmp_path, monkeypatch):
    out = tmp_path / "shakespeare"
    options = PretrainingOptions(dupe_factor=1, static_masking=False)
    metadata = build.build_default_corpus_shards(
        out, options=options, num_shards=2, num_workers=1, progress=False
    )
    assert metadata["num_records"] > 9000
    assert metadata["corpus"]["documents"] == 38
    assert metadata["tokenizer"]["vocab_size"] == default_corpus.DEFAULT_CORPUS_VOCAB_SIZE
    assert metadata["source"]["files"] == 38 and metadata["source"]["replaced_utf8_sequences"] == 0
    monkeypatch.setattr(
        default_corpus, "default_corpus_documents", None
    )  # A rerun must not need it.
    assert (
        build.build_default_corpus_shards(out, options=options, num_shards=2, progress=False)
        == metadata
    )


def test_refuses_to_overwrite_a_foreign_vocab_txt(tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    out.mkdir()
    (out / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nmine\n")
    with pytest.raises(build_dir.OutputDirectoryError, match="vocab.txt is not the vocabulary"):
        build.build_pretraining_shards(
            excerpt_documents(), out, tiny_tokenizer, OPTIONS, progress=False
        )
    assert (out / "vocab.txt").read_text().endswith("mine\n")
    # The tokenizer's own vocab.txt (e.g. saved there by default_corpus_tokenizer) is reused.
    (out / "vocab.txt").unlink()
    tiny_tokenizer.save(out)
    build.build_pretraining_shards(
        excerpt_documents(),
        out,
        tiny_tokenizer,
        OPTIONS,
        num_shards=1,
        num_workers=1,
        progress=False,
    )
    assert (out / "metadata.json").exists()
