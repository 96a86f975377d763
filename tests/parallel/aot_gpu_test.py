"""Compiling the real train step for NVIDIA GPUs without one (`train.py --topology=gpu:CARD`).

Needs JAX's CUDA plugin, ptxas and cuDNN, which `make setup` installs into `.venv/cuda-compile`
(`bert_jax.parallel.aot.CUDA_COMPILE_DIR`). Each compile runs in its own process: loading the plugin
changes the process's JAX for good.
"""

import json
import os
import subprocess
import sys

import pytest

from bert_jax import hardware
from bert_jax.parallel import aot
from tests.common import COMPILE_SMALL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PLUGIN = aot.cuda_plugin_installed() or os.path.isdir(
    os.path.join(aot.CUDA_COMPILE_DIR, "jax_plugins", "xla_cuda12")
)
if not _PLUGIN:
    if os.environ.get("CI"):  # make setup installs it: CI must not skip these silently
        raise RuntimeError(f"JAX's CUDA plugin is not installed in {aot.CUDA_COMPILE_DIR}")
    pytest.skip("needs JAX's CUDA plugin (make setup installs it)", allow_module_level=True)


def compile_report(topology, *extra, env=None):
    cmd = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config=" + os.path.join(ROOT, "configs", "pretrain.py") + ":size=tiny",
        "--mode=compile",
        f"--topology={topology}",
        *COMPILE_SMALL,  # the tiny variant has no dropout, as the GPU recipes' attention
        *extra,
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    report = None
    if proc.stdout.strip():
        last = proc.stdout.strip().splitlines()[-1]
        report = json.loads(last) if last.startswith("{") else None
    return proc, report


# With -m e2e, for the default stage's time (about 12 s): the recorded T4 recipe below still
# compiles in float16 without cuDNN attention in the default stage (fine-tuning's step).
@pytest.mark.e2e
def test_t4_compiles_in_float16_without_cudnn_attention():
    """A card without bfloat16: dtype auto is float16 (loss-scaled), attention auto is xla."""
    proc, report = compile_report("gpu:t4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["platform"] == "gpu" and report["device_kind"] == "Tesla T4"
    assert report["compute_capability"] == "7.5" and report["devices"] == 1
    assert report["dtype"] == "float16"
    assert report["attention"] == "xla" and report["cudnn_attention_calls"] == 0
    assert report["fits"] is True
    # JAX's pool: 75% of the card unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise
    assert report["hbm_capacity_gib"] == pytest.approx(0.75 * hardware.GPU_CARDS["t4"].memory_gib)
    m = report["hbm_gib"]
    assert 0 < m["arguments"] < m["total"] < 1
    assert report["roofline"]["mfu_bound"] > 0  # unrolled (the tiny config): a roofline
    assert "memory total / capacity" in proc.stdout and "Tesla T4" in proc.stdout


@pytest.mark.full  # about 25 s of two GPU compiles (-m full); one card's: the tests beside it
def test_l4_and_h100x8_compile_in_bfloat16_with_cudnn_attention():
    """Packed rows (on the L4) reach cuDNN as the whole [B, 1, L, L] mask, forward and backward:
    the call and mask that `fused_xla` runs on a CPU, where packing gives the unpacked results
    (attention_test.py); rows of one sequence on the H100s."""
    proc, report = compile_report("gpu:l4", "--config.data.pack_sequences=True")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["device_kind"] == "NVIDIA L4" and report["dtype"] == "bfloat16"
    assert report["cudnn_attention_calls"] >= 2  # forward and backward calls, packed rows
    proc, report = compile_report("gpu:h100x8", "--config.mesh.data=-1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["devices"] == 8 and report["mesh"]["data"] == 8
    assert report["compute_capability"] == "9.0"
    assert report["cudnn_attention_calls"] > 0
    assert report["collectives"]["all-reduce"] > 0  # data parallelism's gradient sums


def test_cudnn_attention_is_refused_on_a_t4():
    proc, _ = compile_report(
        "gpu:t4", "--config.runtime.dtype=bfloat16", "--config.runtime.attention=cudnn"
    )
    assert proc.returncode != 0
    assert "needs a GPU of compute capability 8.0 or later" in proc.stderr
    assert "not 7.5" in proc.stderr


def test_the_pool_is_the_share_of_the_card_jax_is_told(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert aot._gpu_memory_fraction() == 0.75
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    assert aot._gpu_memory_fraction() == 0.5


# With -m e2e, for the suite's time (about 14 s): the share is read above, and a step that does
# not fit ends the same way on a TPU slice (tests/parallel/aot_test.py).
@pytest.mark.e2e
def test_a_step_over_the_memory_pool_does_not_fit():
    proc, report = compile_report("gpu:t4", env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.00001"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert report["fits"] is False
    assert "fits" in proc.stdout and "NO" in proc.stdout


def test_every_card_compiles_from_its_target_description():
    """Each card of the table gives compile-only devices of its name and compute capability, and
    XLA compiles a bfloat16 (or, below 8.0, float16) matmul and a fusion for it (ptxas: the
    plugin's CUDA 12 one, which still builds the V100's sm_70, not a CUDA 13 one on the PATH)."""
    code = """
import json, jax, jax.numpy as jnp
from bert_jax import hardware
from bert_jax.parallel import aot
out = {}
for name, card in hardware.GPU_CARDS.items():
    device = aot.gpu_devices(name)[0]
    dtype = jnp.bfloat16 if card.bf16_tflops else jnp.float16
    x = jax.ShapeDtypeStruct((256, 256), dtype, sharding=jax.sharding.SingleDeviceSharding(device))
    compiled = jax.jit(lambda a: jnp.tanh(a @ a) * 2).lower(x).compile()  # a fusion: ptxas
    out[name] = [device.device_kind, device.compute_capability, compiled.memory_analysis() is not None]
print(json.dumps(out))
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, card in hardware.GPU_CARDS.items():
        assert got[name] == [card.name, card.compute_capability, True], name


@pytest.mark.parametrize(
    "bad", ["gpu:k80", "gpu:h100x0", "gpu:", "gpu:t4x", "gpu:T4", "gpu:h100x-1", "h100", "gpu:rtx"]
)
def test_bad_gpu_topologies_name_the_cards(bad):
    with pytest.raises(ValueError, match="gpu:CARD or gpu:CARDxN.*h100, a100-80g"):
        aot.parse_gpu_topology(bad)
    assert aot.parse_gpu_topology("gpu:h100x8") == ("h100", 8)
    assert aot.parse_gpu_topology("gpu:a100-40g") == ("a100-40g", 1)
    assert aot.parse_gpu_topology("gpu:rtx4090") == ("rtx4090", 1)  # an x in the card's name
    assert aot.parse_gpu_topology("gpu:rtx4090x2") == ("rtx4090", 2)


def finetune_report(variant, topology, *extra):
    cmd = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config=" + os.path.join(ROOT, "configs", "finetune.py") + ":" + variant,
        "--mode=compile",
        f"--topology={topology}",
        *extra,
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return proc, json.loads(last) if last.startswith("{") else None


@pytest.mark.parametrize(
    "variant, topology, batch, dtype",
    [
        # -m e2e, for the default stage's time (about 16 s): the recorded T4 recipe below
        # compiles a preset's fine-tuning step without data or checkpoint in float16 too
        pytest.param("task=mrpc,model=tiny", "gpu:t4", [32, 128], "float16", marks=pytest.mark.e2e),
        # multiple choice on an H100 in bfloat16: -m full (the H100's bfloat16 pretraining step
        # compiles in benchmarks_test; fine-tuning's preset compiles: the T4 rows, e2e's above
        # and the recorded recipe's below)
        pytest.param(
            "task=swag,model=tiny", "gpu:h100", [32, 4, 128], "bfloat16", marks=pytest.mark.full
        ),
    ],
)
def test_finetuning_compiles_from_a_preset_without_data(variant, topology, batch, dtype):
    """No data_dir, no checkpoint: the task's head and batch are known, the preset gives the rest;
    BERT's attention dropout stays, so the training step runs xla attention (no cuDNN call)."""
    proc, report = finetune_report(variant, topology)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["task"] == variant.split(",")[0].split("=")[1]
    assert report["batch"] == batch and report["dtype"] == dtype
    assert report["fits"] is True and report["cudnn_attention_calls"] == 0
    assert report["model_flops_per_device"] > 0 and report["eval_hbm_gib"] > 0


def test_finetuning_compile_names_what_it_cannot_know():
    proc, _ = finetune_report("task=custom,model=tiny", "gpu:t4")
    assert proc.returncode != 0 and "takes its labels from its data" in proc.stderr
    proc, _ = finetune_report("task=mrpc", "gpu:t4")  # no init_from, no preset
    assert proc.returncode != 0 and "model=base" in proc.stderr


def test_a_one_gpu_recipe_compiles_as_recorded():
    """The recipe for BERT-base SQuAD on a T4 (one step of 32 rows) compiles today to the memory
    on record (benchmarks/results/gpu_recipes.jsonl), within 2%, and fits."""
    from benchmarks import gpu_recipes

    with open(gpu_recipes.OUT) as f:
        recorded = {r["name"]: r for r in map(json.loads, f)}["t4_base_squad1"]
    proc, report = finetune_report("task=squad1,model=base,gpu=t4", "gpu:t4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["num_microbatches"] == 1 and report["dtype"] == "float16"
    assert report["fits"] and report["hbm_gib"]["total"] == pytest.approx(
        recorded["hbm_gib"]["total"], rel=0.02
    )
