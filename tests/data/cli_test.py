"""The bert-jax-create-pretraining-data and bert-jax-train-wordpiece commands."""

import subprocess
import sys

from bert_jax.data import build, create_pretraining_data, pipeline, train_wordpiece
from tests.data.conftest import EXCERPT


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
    metadata = build.read_metadata(out)
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


def test_commands_run_as_modules():
    for module in ("create_pretraining_data", "train_wordpiece"):
        result = subprocess.run(
            [sys.executable, "-m", f"bert_jax.data.{module}", "--help"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "--output_dir" in result.stdout
