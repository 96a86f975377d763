"""Checkpoints in and out: one module per on-disk format, every path through `etils.epath` (a
local path or a URL such as gs://...); the modules: docs/architecture.md.

`pretrained.load` is the one loader; `bert_jax.convert` is the command over them and re-exports
the functions users call.
"""
