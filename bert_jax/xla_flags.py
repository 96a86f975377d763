"""The XLA options this project sets, per platform, in one place, and where they come from.

(This branch holds the GPU section only; the CPU and TPU sections, and `apply()`, which adds the
flags to XLA_FLAGS / LIBTPU_INIT_ARGS before JAX starts a backend, are written beside it. GPU
flags go into XLA_FLAGS, which the CUDA plugin's compiler reads as the CPU's does: a GPU option
is ignored by XLA:CPU, so they need no platform test.)

Every flag is kept only with a measurement that shows it helps and leaves results exact.
"""

from __future__ import annotations

# --------------------------------------------------------------------------------------------
# GPU (XLA:GPU through JAX's CUDA plugin, jaxlib 0.10.2): applied to XLA_FLAGS.
#
# Empty: no GPU was available to time a flag on, and a deviceless compile cannot (it is not
# autotuned: benchmarks/RESULTS_gpu.md, section 6). The candidates below are those the JAX GPU
# performance guide (docs.jax.dev, "GPU performance tips") and NVIDIA's JAX-Toolbox ("Tips for
# High-Performance LLMs with JAX and XLA", the flags baked into its JAX image) give for H100s;
# each goes into `GPU` once `benchmarks/pretrain_step.py` measures it faster on a card, with the
# figures in RESULTS_gpu.md. The latency-hiding scheduler and the collective options matter only
# where a step has collectives (gpu=h100x8: the data-parallel gradient all-reduce); one card's
# step has none.
# --------------------------------------------------------------------------------------------
GPU: dict[str, str] = {}

GPU_CANDIDATES: dict[str, str] = {
    # Overlap collectives with compute (JAX's guide; NVIDIA's JAX image sets it by default).
    "xla_gpu_enable_latency_hiding_scheduler": "true",
    # Run the collectives on a stream of their own, ahead of compute (NVIDIA's guide).
    "xla_gpu_enable_highest_priority_async_stream": "true",
    # Let XLA pick Triton's GEMM for any matmul it supports (JAX's guide); the autotuner on a
    # real card then times it against cuBLAS.
    "xla_gpu_triton_gemm_any": "true",
    # Gradient all-reduces combined into fewer, larger ones (NVIDIA's guide; 8 cards, data
    # parallel: BERT-large's 1.3 GB of float32 gradients in 1 GiB buckets).
    "xla_gpu_all_reduce_combine_threshold_bytes": str(2**30),
}
