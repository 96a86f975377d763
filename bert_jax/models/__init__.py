"""The models: every family's encoder and task heads, and what they are built from.

A family is one folder, its rows in its `__init__.py`; only the registry (`families.py`) imports a
family's folder, and the shared modules name no family (`tests/layering_test.py` checks the
imports). The map of this package: docs/architecture.md.

Dimension legend (every module here names array axes by these letters):
  B batch            L sequence length     E hidden size (hidden_size)
  M embedding size (ELECTRA's embedding_size, where it differs from E)
  H attention (query) heads                K key/value heads (grouped-query attention)
  D head size (E / H)                      F intermediate size
  V vocabulary (V' the embedding table's rows, padded: `padded_vocab_size`)
  P predictions per sequence (masked positions)
  S sequences packed in one row            C choices (multiple choice)   N labels
  R relative positions (a family's buckets or table rows)
"""
