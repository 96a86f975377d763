"""The models: every family's encoder and task heads, and what they are built from.

A family is one folder, its rows in its `__init__.py`; only the registry (`families.py`) imports a
family's folder, and the shared modules name no family (`tests/layering_test.py` checks the
imports). The map of this package: docs/architecture.md.
"""
