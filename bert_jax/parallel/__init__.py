"""Spreading a run over devices and hosts: the layer between the models and a run.

`sharding` (meshes, logical axis rules, host <-> global batches), `multihost` (barriers with
timeouts), `preemption` (a stop agreed across processes), `compile_cache` (XLA's persistent
compilation cache) and `aot` (compiling a step for a TPU slice or NVIDIA cards this machine does
not have, from `bert_jax.hardware`'s facts). Imports the leaves (and may import `models`), never
`training`: aot takes an Experiment and the step's model FLOPs as arguments.
"""
