"""bert_jax.data modules are leaves: no model/training imports, no TensorFlow or torch at import."""

import ast
import pathlib
import subprocess
import sys

import bert_jax.data

DATA_DIR = pathlib.Path(bert_jax.data.__file__).parent
MODULES = sorted(p.stem for p in DATA_DIR.glob("*.py") if p.stem != "__init__")


def test_data_modules_import_only_bert_jax_data():
    for path in DATA_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("bert_jax"):
                    assert name.startswith("bert_jax.data"), f"{path.name} imports {name}"


def test_importing_everything_pulls_in_no_tensorflow_or_torch():
    code = (
        "import sys\n"
        + "".join(f"import bert_jax.data.{m}\n" for m in MODULES)
        + "heavy = [m for m in ('tensorflow', 'tensorflow_datasets', 'torch', 'transformers')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
