"""The bert-jax-create-pretraining-data and bert-jax-train-wordpiece commands."""

import pathlib
import shlex
import signal
import subprocess
import sys
import time

import numpy as np

from bert_jax import tokenization
from bert_jax.pretrain.data import (
    build_dir,
    create_pretraining_data,
    example_proto,
    pipeline,
    records,
    train_wordpiece,
)
from tests.pretrain.conftest import EXCERPT, TESTDATA


def test_create_pretraining_data(tmp_path, bert_vocab_dir, capsys):
    out = tmp_path / "out"
    argv = [
        f"--input_file={EXCERPT}",
        f"--vocab_file={bert_vocab_dir}",
        f"--output_dir={out}",
        "--max_seq_length=48",
        "--max_predictions_per_seq=7",
        "--dupe_factor=1",
        "--do_whole_word_mask",
        "--no-split_sentences",
        "--num_shards=2",
        "--format=tfrecord",
        "--num_workers=1",
        "--no_progress",
    ]
    assert create_pretraining_data.main(argv) == 0
    metadata = build_dir.read_metadata(out)
    assert metadata["record_format"] == "tfrecord" and len(metadata["shards"]) == 2
    assert metadata["options"]["whole_word_mask"] is True
    assert metadata["tokenizer"]["vocab_size"] == 30522
    assert "wrote" in capsys.readouterr().out
    assert create_pretraining_data.main(argv) == 0  # Idempotent.
    info = pipeline.load_data_info(out)
    assert (info.max_seq_length, info.max_predictions_per_seq, info.static_masks) == (48, 7, True)


def test_create_pretraining_data_mlm_only_dynamic(tmp_path, bert_vocab_dir):
    out = tmp_path / "out"
    argv = [
        f"--input_file={EXCERPT}",
        f"--vocab_file={bert_vocab_dir}/vocab.txt",
        f"--output_dir={out}",
        "--max_seq_length=32",
        "--no-next_sentence_prediction",
        "--masking=dynamic",
        "--num_shards=1",
        "--no_progress",
    ]
    assert create_pretraining_data.main(argv) == 0
    info = pipeline.load_data_info(out)
    assert not info.next_sentence_prediction and not info.static_masks


def test_create_pretraining_data_errors(tmp_path, bert_vocab_dir, capsys):
    (tmp_path / "keep.txt").write_text("precious")
    base = [f"--input_file={EXCERPT}", f"--vocab_file={bert_vocab_dir}", "--no_progress"]
    assert create_pretraining_data.main([*base, f"--output_dir={tmp_path}"]) == 1
    assert "already holds other data (keep.txt)" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "precious"
    missing = [f"--input_file={tmp_path}/*.md", f"--vocab_file={bert_vocab_dir}"]
    assert create_pretraining_data.main([*missing, f"--output_dir={tmp_path}/o"]) == 1
    assert "matches nothing" in capsys.readouterr().err
    no_vocab = [f"--input_file={EXCERPT}", f"--output_dir={tmp_path}/p"]
    assert create_pretraining_data.main(no_vocab) == 1
    assert "--vocab_file is required" in capsys.readouterr().err
    own_vocab = ["--default_corpus", "--original_tokenizer", f"--output_dir={tmp_path}/q"]
    assert create_pretraining_data.main(own_vocab) == 1
    assert "--original_tokenizer needs a --vocab_file" in capsys.readouterr().err


def test_train_wordpiece(tmp_path, capsys):
    argv = [
        f"--input_file={EXCERPT}",
        f"--output_dir={tmp_path}",
        "--vocab_size=300",
        "--min_frequency=1",
    ]
    assert train_wordpiece.main(argv) == 0
    vocab = (tmp_path / "vocab.txt").read_text().splitlines()
    assert len(vocab) == 300 and vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (tmp_path / "tokenizer.json").exists()
    assert train_wordpiece.main(argv) == 1  # Never overwrites a vocabulary.
    assert "already holds vocab.txt, tokenizer.json" in capsys.readouterr().err
    # RoBERTa's kind: its files, its ids, read back by the loader.
    bpe = [f"--input_file={EXCERPT}", f"--output_dir={tmp_path / 'bpe'}", "--kind=bpe"]
    assert train_wordpiece.main([*bpe, "--vocab_size=400"]) == 0
    tok = tokenization.load_tokenizer(tmp_path / "bpe" / "vocab.json")
    assert (tok.vocab_size, tok.cls_id, tok.pad_id, tok.mask_id) == (400, 0, 1, 399)
    assert train_wordpiece.main([*bpe, "--vocab_size=400"]) == 1
    assert "already holds tokenizer.json, vocab.json, merges.txt" in capsys.readouterr().err
    # XLM-R's kind: a tokenizer.json in fairseq's ids.
    unigram = [f"--input_file={EXCERPT}", f"--output_dir={tmp_path / 'unigram'}", "--kind=unigram"]
    assert train_wordpiece.main([*unigram, "--vocab_size=300"]) == 0
    tok = tokenization.load_tokenizer(tmp_path / "unigram")
    assert tok.kind == "unigram" and (tok.vocab_size, tok.cls_id, tok.pad_id) == (300, 0, 1)
    assert tok.mask_id == 299


def test_train_wordpiece_on_a_seeded_document_sample(tmp_path, caplog):
    argv = ["--default_corpus", "--vocab_size=200", "--sample_documents=3", "--sample_seed=5"]
    assert train_wordpiece.main([*argv, f"--output_dir={tmp_path / 'a'}"]) == 0
    assert "training on a sample of 3 documents" in caplog.text
    vocab = (tmp_path / "a" / "vocab.txt").read_text().splitlines()
    assert len(vocab) == 200 and vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_commands_run_as_modules():
    for module in ("create_pretraining_data", "train_wordpiece"):
        result = subprocess.run(
            [sys.executable, "-m", f"bert_jax.pretrain.data.{module}", "--help"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "--output_dir" in result.stdout


def test_ctrl_c_while_tokenizing_stops_the_build_with_130(tmp_path):
    """Ctrl-C while the default corpus is tokenized (JAX's gc callback swallowed it in 4 tries of
    4 and the build ran to its end with status 0): status 130 within seconds, nothing finished."""
    out = tmp_path / "build"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bert_jax.pretrain.data.create_pretraining_data",
         "--default_corpus", f"--output_dir={out}", "--no_progress", "--num_shards=2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen = []
    for line in proc.stderr:  # the vocabulary is written: tokenizing begins
        seen.append(line)
        if "WordPiece vocabulary" in line:
            break
    else:
        raise AssertionError("".join(seen)[-3000:])
    proc.send_signal(signal.SIGINT)
    start = time.time()
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert time.time() - start < 30 and "stopped: interrupted (SIGINT)" in err
    assert "wrote" not in stdout and "Exception ignored" not in err


def _documented_original_command() -> list[str]:
    """The one-line command docs/data.md gives for google-research/bert's exact records."""
    docs = (pathlib.Path(__file__).parents[2] / "docs" / "data.md").read_text()
    lines = [
        line
        for line in docs.splitlines()
        if line.startswith("bert-jax-create-pretraining-data ") and "--original_tokenizer" in line
    ]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[1:]


def test_documented_command_writes_the_originals_records(tmp_path, bert_vocab_dir):
    # The excerpt split inside its second and fifth documents, into files that end with text:
    # the original reads them as the one file it wrote original_seed12345_len64.tfrecord from.
    lines = EXCERPT.read_text().splitlines(keepends=True)
    starts = [0] + [i + 1 for i, line in enumerate(lines) if not line.strip()]
    cuts = [starts[1] + 7, starts[4] + 3]
    parts = [lines[: cuts[0]], lines[cuts[0] : cuts[1]], lines[cuts[1] :]]
    assert all(part[-1].strip() for part in parts[:2])  # Each ends with text.
    paths = []
    for k, part in enumerate(parts):
        paths.append(tmp_path / f"part{k}.txt")
        paths[-1].write_text("".join(part))
    replace = {
        "--input_file": ",".join(map(str, paths)),
        "--vocab_file": f"{bert_vocab_dir}/vocab.txt",
        "--output_dir": str(tmp_path / "out"),
        # The fixture's own flags: --max_seq_length=64 --max_predictions_per_seq=10
        # --dupe_factor=2 (--random_seed=12345 is the command's).
        "--max_seq_length": "64",
        "--max_predictions_per_seq": "10",
        "--dupe_factor": "2",
    }
    argv = []
    for arg in _documented_original_command():
        name = arg.split("=", 1)[0]
        argv.append(f"{name}={replace.pop(name)}" if name in replace else arg)
    assert not replace, replace  # Every flag replaced was in the documented command.
    argv += ["--num_workers=1", "--no_progress"]
    assert create_pretraining_data.main(argv) == 0
    ours = records.read_all(str(tmp_path / "out" / "pretrain-00000-of-00001.tfrecord"))
    theirs = records.read_all(str(TESTDATA / "original_seed12345_len64.tfrecord"))
    assert len(ours) == len(theirs) == 140
    for k, (a, b) in enumerate(zip(ours, theirs)):  # The same features; their order may differ.
        decoded_a, decoded_b = example_proto.decode_example(a), example_proto.decode_example(b)
        assert decoded_a.keys() == decoded_b.keys()
        for name in decoded_b:
            np.testing.assert_array_equal(decoded_a[name], decoded_b[name], err_msg=f"{k} {name}")
    # Ending each file's last document at the file's end (the default) gives other records.
    argv = [a for a in argv if a != "--no-file_ends_document"]
    argv = [
        f"--output_dir={tmp_path / 'split'}" if a.startswith("--output_dir") else a for a in argv
    ]
    assert create_pretraining_data.main(argv) == 0
    assert records.read_all(str(tmp_path / "split" / "pretrain-00000-of-00001.tfrecord")) != ours


def test_parquet_rows_build_the_records_of_the_same_text_files(tmp_path, capsys):
    """--input_file='corpus/*.parquet' --text_column=text: one document a row (blank lines in a
    row separate nothing), the records of the text files holding the same documents."""
    from bert_jax.pretrain.data import default_corpus
    from tests.data import hf_files
    from tests.pretrain.conftest import write_corpus

    documents = [d[:40] for d in default_corpus.default_corpus_documents()[:5]]
    write_corpus(tmp_path / "plays.txt", documents)
    rows = ["\n\n".join(d[:3]) + "\n" + "\n".join(d[3:]) for d in documents]
    hf_files.write_parquet({"text": rows[:3]}, tmp_path / "corpus/a.parquet", row_group_size=2)
    hf_files.save_to_disk({"text": rows[3:] + [None]}, str(tmp_path / "corpus/saved"))
    common = [
        f"--vocab_file={default_corpus.DEFAULT_CORPUS_VOCAB}",
        "--do_lower_case=true",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--dupe_factor=1",
        "--num_shards=2",
        "--num_workers=1",
        "--no_progress",
    ]
    table_argv = [f"--input_file={tmp_path}/corpus", "--text_column=text"]
    assert create_pretraining_data.main([*table_argv, f"--output_dir={tmp_path}/t", *common]) == 0
    text_argv = [f"--input_file={tmp_path}/plays.txt", f"--output_dir={tmp_path}/x"]
    assert create_pretraining_data.main([*text_argv, *common]) == 0
    got, want = (build_dir.read_metadata(tmp_path / d) for d in ("t", "x"))
    assert got["source"]["rows"] == 6 and got["source"]["empty_rows"] == 1
    assert got["corpus"] == want["corpus"]
    assert got["num_records"] > 0 and len(got["shards"]) == 2
    # Tables without --text_column are refused naming it; the vocabulary trainer reads them too.
    parquet_argv = [f"--input_file={tmp_path}/corpus/a.parquet", f"--output_dir={tmp_path}/p"]
    assert create_pretraining_data.main([*parquet_argv, *common]) == 1
    assert "is a table, not text: pass text_column= (--text_column)" in capsys.readouterr().err
    vocab_argv = [*table_argv, f"--output_dir={tmp_path}/v", "--vocab_size=200"]
    assert train_wordpiece.main(vocab_argv) == 0
    assert len((tmp_path / "v" / "vocab.txt").read_text().splitlines()) == 200
    for a, b in zip(got["shards"], want["shards"]):
        assert records.read_all(tmp_path / "t" / a["path"]) == records.read_all(
            tmp_path / "x" / b["path"]
        )
