"""The import graph stays one-way: config <- model <- train_lib <- train.py; leaves stay leaves."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bert_jax"

# Modules that must never import the model or the training library.
LEAVES = (
    "config",
    "losses",
    "optimizer",
    "sharding",
    "checkpointing",
    "flops",
    "data",
    "writers",
    "preemption",
    "metrics",
)
# What each top-level module may import from bert_jax (data/* may import only data/*).
ALLOWED = {
    "config": set(),
    "losses": set(),
    "optimizer": set(),
    "sharding": {"config"},
    "checkpointing": {"config"},
    "flops": {"config"},
    "model": {"config", "attention"},
    "attention": {"config"},
    "convert": {"config", "model"},  # + orbax for its own format
    "writers": set(),
    "preemption": set(),
    "metrics": set(),
    "inputs": {"config", "data", "sharding"},
    "train_lib": {"config", "model", "losses", "optimizer", "sharding", "flops", "checkpointing"},
    "trainer": {
        "attention",
        "config",
        "model",
        "convert",
        "train_lib",
        "optimizer",
        "sharding",
        "flops",
        "checkpointing",
        "preemption",
        "writers",
    },
    "finetune": {
        "config",
        "model",
        "convert",
        "trainer",
        "metrics",
        "sharding",
        "writers",
        "data",
    },
    "inference": {"config", "model", "convert", "data"},
    "aot": {"flops", "sharding", "data"},  # takes a trainer.Experiment, never imports it
    "__init__": {"config", "model", "convert", "losses"},
}


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return ".".join(rel.parts)


def internal_imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import inside bert_jax
                base = module_name(path).split(".")[: -node.level]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            if name == "train" or name.startswith("train."):
                found.add("<train.py>")
            elif name.startswith("bert_jax."):
                found.add(name[len("bert_jax.") :])
    return found


def test_import_graph():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = module_name(path)
        top = mod.split(".")[0]
        imports = internal_imports(path)
        if "<train.py>" in imports:
            problems.append(f"{mod} imports train.py")
        tops = {i.split(".")[0] for i in imports} - {"<train.py>"}
        if top == "data":
            outside = {i for i in imports if not i.startswith("data")} - {"<train.py>"}
            if outside:
                problems.append(f"{mod} (a data leaf) imports {sorted(outside)}")
            continue
        if top not in ALLOWED:
            problems.append(f"{mod}: no layering rule; add one to tests/layering_test.py")
            continue
        extra = tops - ALLOWED[top] - {top}
        if extra:
            problems.append(f"{mod} may not import {sorted(extra)}")
        upward = tops & {"model", "train_lib", "convert"}
        if top in LEAVES and upward:
            problems.append(f"{mod} is a leaf but imports {sorted(upward)}")
    assert not problems, "\n".join(problems)


def test_nothing_imports_train_py():
    for path in list(PACKAGE.rglob("*.py")) + list((ROOT / "tests").rglob("*.py")):
        if path.name == "layering_test.py":
            continue
        assert "<train.py>" not in internal_imports(path), path


def test_core_library_imports_neither_torch_nor_tensorflow():
    modules = sorted(
        "bert_jax." + module_name(p).removesuffix(".__init__")
        for p in PACKAGE.rglob("*.py")
        if p.name != "__main__.py"
    )
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules if m != "bert_jax.__init__")
        + "bad = sorted(m for m in ('torch', 'tensorflow', 'transformers') if m in sys.modules)\n"
        + "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
