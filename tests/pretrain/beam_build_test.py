"""The Beam build: on the DirectRunner it writes what the local hash-partitioned build writes."""

import os
import subprocess
import sys

import pytest

from bert_jax.pretrain.data import (
    build,
    build_dir,
    create_pretraining_data,
    default_corpus,
    records,
    sources,
)
from bert_jax.pretrain.data.examples import PretrainingOptions
from tests.pretrain.conftest import write_corpus

pytest.importorskip("apache_beam", reason="needs apache-beam (the beam extra)")
from bert_jax.pretrain.data import beam_build  # noqa: E402  (after the skip)

NSP_STATIC = PretrainingOptions(max_seq_length=48, max_predictions_per_seq=7, dupe_factor=2)
DIRECT = ["--runner=DirectRunner", "--direct_num_workers=1"]


@pytest.fixture(scope="module")
def plays(tmp_path_factory):
    """Seven plays, 120 sentences each, one sentence a line, in two files ending in blank lines."""
    documents = [d[:120] for d in default_corpus.default_corpus_documents()[:7]]
    directory = tmp_path_factory.mktemp("plays")
    paths = []
    for k, part in enumerate((documents[:4], documents[4:])):
        paths.append(write_corpus(directory / f"plays{k}.txt", part))
        with open(paths[-1], "a", encoding="utf-8") as f:
            f.write("\n")  # A final blank line: each file ends its last document either way.
    return [str(p) for p in paths]


@pytest.fixture(scope="module")
def tokenizer():
    return default_corpus.default_corpus_tokenizer()


def shard_records(out_dir, metadata):
    return [records.read_all(os.path.join(out_dir, s["path"])) for s in metadata["shards"]]


def local_hash_build(paths, out_dir, tokenizer, source, num_shards):
    """The local build of `paths` with partition="hash", its corpus named as `source` names it."""
    stats = sources.SourceStats()
    return build.build_pretraining_shards(
        lambda: sources.text_file_documents(paths, split_sentences=False, stats=stats),
        out_dir,
        tokenizer,
        NSP_STATIC,
        num_shards=num_shards,
        num_workers=1,
        progress=False,
        partition="hash",
        source_id=source.source_id(),
        source_stats=stats,
    )


def test_direct_runner_equals_local_build_nsp_static_masking(tmp_path, plays, tokenizer):
    source = beam_build.TextFiles(tuple(plays), split_sentences=False)
    ours = beam_build.build_pretraining_shards_beam(
        source, tmp_path / "beam", tokenizer, NSP_STATIC, num_shards=3, pipeline_args=DIRECT
    )
    local = local_hash_build(plays, tmp_path / "local", tokenizer, source, num_shards=3)
    assert ours == local  # Plan, shards, counts, corpus and source statistics.
    assert sorted(os.listdir(tmp_path / "beam")) == sorted(os.listdir(tmp_path / "local"))
    beam_records = shard_records(tmp_path / "beam", ours)
    assert beam_records == shard_records(tmp_path / "local", local)
    assert all(beam_records) and ours["num_records"] == sum(map(len, beam_records))
    assert ours["corpus"]["documents"] == 7 and ours["source"]["files"] == 2
    assert 0.3 < ours["stats"]["random_next_fraction"] < 0.8


def test_cli_direct_runner_equals_local_cli_mlm_only_dynamic_masking(tmp_path, plays):
    common = [
        f"--input_file={','.join(plays)}",
        f"--vocab_file={default_corpus.DEFAULT_CORPUS_VOCAB}",
        "--do_lower_case=true",
        "--no-split_sentences",
        "--no-next_sentence_prediction",
        "--masking=dynamic",
        "--max_seq_length=40",
        "--dupe_factor=1",
        "--num_shards=4",
        "--format=tfrecord",
        "--no_progress",
    ]
    beam_argv = [*common, f"--output_dir={tmp_path / 'beam'}", *DIRECT]
    local_argv = [*common, f"--output_dir={tmp_path / 'local'}", "--partition=hash"]
    assert create_pretraining_data.main(beam_argv) == 0
    assert create_pretraining_data.main([*local_argv, "--num_workers=1"]) == 0
    ours, local = (
        build_dir.read_metadata(tmp_path / "beam"),
        build_dir.read_metadata(tmp_path / "local"),
    )
    # The corpus is named differently (its file listing; the local build hashes its text).
    assert ours["plan"].pop("corpus").startswith("files:")
    local["plan"].pop("corpus")
    assert ours == local
    assert shard_records(tmp_path / "beam", ours) == shard_records(tmp_path / "local", local)
    assert ours["stats"]["random_next_fraction"] == 0 and ours["stats"]["mean_predictions"] == 0
    assert ours["shards"][0]["path"] == "pretrain-00000-of-00004.tfrecord"


def test_undecodable_file_is_counted_and_skipped(tmp_path, plays, tokenizer):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\x00\x01binary\n" * 5 + b"no final newline")
    source = beam_build.TextFiles((*plays, str(bad)), split_sentences=False)
    metadata = beam_build.build_pretraining_shards_beam(
        source, tmp_path / "out", tokenizer, NSP_STATIC, num_shards=2, pipeline_args=DIRECT
    )
    assert metadata["source"]["skipped_files"] == 1
    assert metadata["source"]["skipped_lines"] == 6
    assert metadata["source"]["files"] == 3 and metadata["corpus"]["documents"] == 7
    # The local build stops at the same file with an error naming it.
    with pytest.raises(ValueError, match="bad.txt looks like a binary file"):
        list(sources.text_file_documents([*plays, str(bad)]))


def test_finished_build_reruns_as_a_no_op(tmp_path, plays, tokenizer, monkeypatch):
    source = beam_build.TextFiles((plays[1],), split_sentences=False)
    out = tmp_path / "out"
    args = dict(num_shards=2, pipeline_args=DIRECT)
    first = beam_build.build_pretraining_shards_beam(source, out, tokenizer, NSP_STATIC, **args)
    stamps = {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)}

    def no_pipeline(*args, **kwargs):
        raise AssertionError("a finished build must not run a pipeline")

    monkeypatch.setattr(beam_build.beam, "Pipeline", no_pipeline)
    again = beam_build.build_pretraining_shards_beam(source, out, tokenizer, NSP_STATIC, **args)
    assert again == first
    assert {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)} == stamps
    # Other settings in the same directory are refused, naming the difference.
    with pytest.raises(build_dir.OutputDirectoryError, match="num_shards: 2 -> 3"):
        beam_build.build_pretraining_shards_beam(
            source, out, tokenizer, NSP_STATIC, num_shards=3, pipeline_args=DIRECT
        )


def test_url_output_writes_each_file_whole_and_equals_the_local_build(
    tmp_path, plays, tokenizer, monkeypatch
):
    # The object-store path (shards written locally and copied, JSON written directly, no
    # renames), taken here on a local directory.
    monkeypatch.setattr(build, "is_url", lambda path: True)
    source = beam_build.TextFiles((plays[0],), split_sentences=False)
    ours = beam_build.build_pretraining_shards_beam(
        source, tmp_path / "url", tokenizer, NSP_STATIC, num_shards=2, pipeline_args=DIRECT
    )
    monkeypatch.undo()
    local = local_hash_build(plays[:1], tmp_path / "local", tokenizer, source, num_shards=2)
    assert ours == local
    assert shard_records(tmp_path / "url", ours) == shard_records(tmp_path / "local", local)
    assert not any(".tmp-" in n for n in os.listdir(tmp_path / "url"))


def test_bad_arguments_name_the_problem(tmp_path, tokenizer, capsys):
    with pytest.raises(FileNotFoundError, match="no file matches"):
        beam_build.TextFiles((str(tmp_path / "none*.txt"),)).source_id()
    with pytest.raises(ValueError, match="the local build writes to a local directory"):
        build.build_pretraining_shards([["a b."]], "gs://bucket/out", tokenizer)
    argv = ["--default_corpus", f"--output_dir={tmp_path}/o", "--runner=DirectRunner"]
    assert create_pretraining_data.main([*argv, "--partition=shuffled"]) == 1
    assert "drop --partition=shuffled" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # Unknown flags go to Beam only with --runner.
        create_pretraining_data.main(["--default_corpus", f"--output_dir={tmp_path}/p", "--x=1"])


def test_apache_beam_is_imported_only_by_the_beam_build():
    code = (
        "import sys\n"
        "import bert_jax.pretrain.data.create_pretraining_data\n"
        "import bert_jax.pretrain.data.train_wordpiece\n"
        "assert 'apache_beam' not in sys.modules\n"
        "sys.modules['apache_beam'] = None\n"
        "try:\n"
        "    import bert_jax.pretrain.data.beam_build\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "pip install 'bert-jax[beam]'" in result.stdout


def test_parquet_rows_on_a_bucket_build_the_records_of_the_same_text_files(
    tmp_path, plays, tokenizer, fake_bucket
):
    from tests.conftest import BUCKET
    from tests.data import hf_files

    root, _ = fake_bucket
    documents = [d[:120] for d in default_corpus.default_corpus_documents()[:7]]
    for k, part in enumerate((documents[:4], documents[4:])):
        rows = ["\n\n".join(d) for d in part]  # Blank lines inside a row separate nothing.
        hf_files.write_parquet({"text": rows}, root / f"corpus/{k}.parquet", row_group_size=3)
    source = beam_build.TableFiles((f"{BUCKET}/corpus/*.parquet",), "text", split_sentences=False)
    ours = beam_build.build_pretraining_shards_beam(
        source, tmp_path / "beam", tokenizer, NSP_STATIC, num_shards=3, pipeline_args=DIRECT
    )
    text = beam_build.TextFiles(tuple(plays), split_sentences=False)
    local = local_hash_build(plays, tmp_path / "local", tokenizer, text, num_shards=3)
    beam_records = shard_records(tmp_path / "beam", ours)
    assert all(beam_records) and beam_records == shard_records(tmp_path / "local", local)
    assert ours["corpus"] == local["corpus"]
    assert ours["source"]["rows"] == 7 and ours["source"]["files"] == 2
    with pytest.raises(ValueError, match="0.parquet is a table, not text: read tables with"):
        beam_build.TextFiles((str(root / "corpus/0.parquet"),)).source_id()
