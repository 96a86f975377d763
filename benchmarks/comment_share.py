"""The share of the package's lines that are docstrings or comments, and the modules with most.

    python benchmarks/comment_share.py [--top 15] [--root bert_jax]

Counts non-blank lines of every .py under --root: a line is prose when it lies in a docstring
(module, class or function) or starts with `#`. Prints the total share, then the --top modules
by prose lines, and the longest module docstrings.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys


def prose_lines(source: str) -> tuple[int, int, int]:
    """(non-blank lines, prose lines, the module docstring's lines) of one module's source."""
    lines = source.splitlines()
    prose = set()
    tree = ast.parse(source)
    module_doc = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    span = range(body[0].lineno, body[0].end_lineno + 1)
                    prose.update(span)
                    if isinstance(node, ast.Module):
                        module_doc = len(span)
    for i, line in enumerate(lines, 1):
        if line.strip().startswith("#"):
            prose.add(i)
    nonblank = {i for i, line in enumerate(lines, 1) if line.strip()}
    return len(nonblank), len(prose & nonblank), module_doc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="bert_jax")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    rows = []
    for folder, _, files in os.walk(args.root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    rows.append((path, *prose_lines(f.read())))
    total, prose = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{args.root}: {prose:,} of {total:,} non-blank lines are docstrings or comments "
          f"({prose / total:.1%}), {len(rows)} modules")  # fmt: skip
    print(f"\nmodules with most prose (top {args.top}):")
    for path, lines, p, _ in sorted(rows, key=lambda r: -r[2])[: args.top]:
        print(f"  {p:5d} of {lines:5d} ({p / lines:.0%})  {path}")
    print(f"\nlongest module docstrings (top {args.top}):")
    for path, _, _, doc in sorted(rows, key=lambda r: -r[3])[: args.top]:
        print(f"  {doc:5d}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
