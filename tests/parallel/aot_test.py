"""Compiling the real train step for a TPU slice without one (`train.py --mode=compile`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.parallel import aot, sharding
from tests.common import COMPILE_SMALL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("libtpu", reason="needs the tpu extra (libtpu)")

# A small model and batch: the compile is what is tested, not its size.
SMALL = [
    *COMPILE_SMALL,
    "--config.mesh.data=1",
    "--config.mesh.fsdp=-1",
]


def compile_cmd(*extra, config="pretrain.py", variant=""):
    """train.py --mode=compile of configs/<config>'s size=tiny (and `variant`), with `extra`
    flags."""
    return [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config=" + os.path.join(ROOT, "configs", config) + ":size=tiny" + variant,
        "--mode=compile",
        *extra,
    ]


def compiled_report(*extra, config: str, variant: str = "") -> dict:
    """The JSON report of a successful `compile_cmd(*extra, config=config, variant=variant)`."""
    proc = run(compile_cmd(*extra, config=config, variant=variant))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_compile_tiny_train_step_for_v5e_2x2():
    proc = run(compile_cmd("--topology=v5e:2x2", *SMALL))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    assert report["topology"] == "v5e:2x2" and report["num_slices"] == 1
    assert report["device_kind"] == "TPU v5 lite"
    assert report["chips"] == 4 and report["devices"] == 4
    assert report["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert report["batch"] == [16, 32]
    # Compiled with the default XLA options (RuntimeConfig.compiler_options): libtpu accepts them.
    assert report["collective_matmul"] is False
    assert report["fits"] is True
    assert report["hbm_capacity_gib"] == 16.0
    m = report["hbm_gib"]
    assert 0 < m["arguments"] < m["total"] < 1
    assert m["total"] >= m["arguments"] + m["temporaries"]
    assert report["compile_s"] > 0 and report["eval_compile_s"] > 0
    assert report["eval_hbm_gib"] > 0
    # fsdp=4: the parameters are gathered before use and the gradients reduced across devices.
    assert report["collectives"]["all-gather"] > 0
    assert report["collectives"]["all-reduce"] + report["collectives"]["reduce-scatter"] > 0
    assert report["xla_flops_per_device"] > 0 and report["xla_bytes_per_device"] > 0
    # The tiny config is unrolled: XLA's FLOPs cover the model's (2 per multiply-add, x3 for
    # the backward pass) plus what the model count leaves out (softmax, LayerNorm, optimizer).
    ratio = report["xla_flops_per_device"] / report["model_flops_per_device"]
    assert 1.0 < ratio < 2.0, ratio
    r = report["roofline"]
    step_s = max(r["compute_s"], r["memory_s"])
    assert r["bound"] == ("memory" if r["memory_s"] > r["compute_s"] else "compute")
    expected = report["model_flops_per_device"] / 197e12 / step_s
    np.testing.assert_allclose(r["mfu_bound"], expected, rtol=1e-9)
    assert 0 < r["mfu_bound"] < 1
    assert "MFU bound (not measured)" in proc.stdout and "fits" in proc.stdout


@pytest.mark.e2e  # 18 s; the compile path itself: test_compile_tiny_train_step_for_v5e_2x2
@pytest.mark.parametrize("variant, rows", [("", 16), (",model=inference_free", 8)])
def test_compile_embedding_grad_cache_step_for_v5e_2x2(variant, rows):
    """The embedding job's GradCache step (2 chunks of packed rows, dropout on, bfloat16)
    compiled by libtpu, with no pairs file (--mode=compile reads no data). Its first pass, a
    forward with dropout and no gradient, crashed libtpu's compiler (segmentation fault) before
    the attention probabilities were formed behind an optimization barrier
    (`attention._softmax_attend`). An inference-free SPLADE model's step packs its documents
    only (its anchors beside the rows, [B, L])."""
    report = compiled_report(
        "--topology=v5e:2x2",
        "--config.model.vocab_size=400",
        "--config.num_microbatches=2",
        config="embed.py",
        variant=variant,
    )
    assert report["task"] == "embed" and report["num_microbatches"] == 2
    # Packed rows (embed.pack, the default): the step is lowered at its most rows, one text of
    # 32 tokens a row: 2 x 8 texts (of 8 pairs), or the 8 documents.
    assert report["dtype"] == "bfloat16" and report["batch"] == [rows, 32]
    assert report["fits"] is True and 0 < report["hbm_gib"]["total"] < 1


@pytest.mark.e2e  # 16 s; the compile path itself: test_compile_tiny_train_step_for_v5e_2x2
def test_compile_reranker_step_for_v5e_2x2():
    """The reranker job's step (listwise rows of 4 pairs, packed, bfloat16) compiled by libtpu
    with no rows file: lowered at the most rows packing can take, one pair a row."""
    report = compiled_report(
        "--topology=v5e:2x2",
        "--config.model.vocab_size=400",
        "--config.rerank.loss=listwise",
        config="rerank.py",
    )
    assert report["task"] == "rerank" and report["dtype"] == "bfloat16"
    assert report["batch"] == [8 * 4, 32]  # 8 rows of 4 pairs, 32 tokens (size=tiny)
    assert report["fits"] is True and 0 < report["hbm_gib"]["total"] < 1


def test_compile_reports_a_step_that_does_not_fit():
    # 2M x 2048 float32 embeddings with Adam's two moments: 48 GiB over 4 chips of 16 GiB.
    proc = run(
        compile_cmd(
            "--topology=v5e:2x2",
            *SMALL,
            "--config.model.vocab_size=2000000",
            "--config.model.hidden_size=2048",
            "--config.model.num_attention_heads=2",
        )
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["fits"] is False
    assert "RESOURCE_EXHAUSTED" in report["error"] or report["hbm_gib"]["total"] > 16


def test_bad_topologies_name_the_problem():
    with pytest.raises(ValueError, match="unknown TPU topology 'v9:2x2'"):
        aot.topology_devices("v9:2x2")
    with pytest.raises(ValueError, match="unknown TPU topology '4x4'"):
        aot.topology_devices("4x4")
    with pytest.raises(ValueError, match="libtpu rejects the topology 'v5e:3x3'"):
        aot.topology_devices("v5e:3x3")
    with pytest.raises(ValueError, match="num_slices must be 1 or more, got 0"):
        aot.topology_devices("v5e:2x2", num_slices=0)
    proc = run(compile_cmd(*SMALL))
    assert proc.returncode != 0 and "--mode=compile needs --topology" in proc.stderr


def _compact(devices) -> bool:
    """Whether TPU chips form a box of neighbours (no chip outside it, no gap inside)."""
    coords = np.array([d.coords for d in np.ravel(devices)])
    extent = coords.max(0) - coords.min(0) + 1
    return len({tuple(c) for c in coords}) == len(coords) == int(np.prod(extent))


@pytest.mark.parametrize(
    "topology, sizes, group",
    [
        # 64 chips in a 4x4x4 torus: every tensor group of 4 and every fsdp x tensor plane of 16
        # is a box of neighbouring chips.
        ("v4:4x4x4", {"data": 4, "fsdp": 4, "tensor": 4}, (2, 1)),
        ("v4:4x4x4", {"data": -1, "fsdp": 16, "tensor": 1}, (1,)),
        # 256 chips in a 16x16 torus: each fsdp group is a ring of 16 along one axis.
        ("v5e:16x16", {"data": 16, "fsdp": 16}, (1,)),
        ("v5e:16x16", {"data": 8, "fsdp": 8, "tensor": 4}, (2, 1)),
    ],
)
def test_mesh_follows_the_physical_topology(topology, sizes, group, caplog):
    # Shuffled: placing the devices by their coordinates, not their order, makes the boxes.
    devices = list(np.random.default_rng(0).permutation(aot.topology_devices(topology)))
    with caplog.at_level("WARNING"):
        mesh = sharding.make_mesh(sizes, devices)
    assert "plain reshape" not in caplog.text
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
    grid = mesh.devices
    for axis in group:  # the innermost axes, alone and together, hold neighbouring chips
        inner = grid.reshape(-1, *grid.shape[axis:]) if axis else grid[None]
        assert all(_compact(block) for block in inner), (topology, sizes, axis)


def test_multi_slice_mesh_puts_data_parallelism_across_slices():
    devices = aot.topology_devices("v5e:2x2", num_slices=2)
    assert len(devices) == 8
    mesh = sharding.make_mesh({"data": 2, "fsdp": 4}, devices)
    slices = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    # Each data index is one slice; fsdp runs inside it.
    assert (slices == np.arange(2)[:, None, None]).all()
    with pytest.raises(ValueError, match=r"data axis \(1\) must be a multiple of the number of"):
        sharding.make_mesh({"data": 1, "fsdp": 8}, devices)
    # 2 slices of v5e:4x4: the data axis spans them (mesh.dcn_data), fsdp and tensor fill a slice
    # with boxes of neighbouring chips.
    devices = list(np.random.default_rng(0).permutation(aot.topology_devices("v5e:4x4", 2)))
    for dcn_data in (-1, 2):
        sizes = {"data": 4, "fsdp": 4, "tensor": 2, "dcn_data": dcn_data}
        mesh = sharding.make_mesh(sizes, devices)
        slices = np.vectorize(lambda d: d.slice_index)(mesh.devices)
        assert (slices == np.repeat(np.arange(2), 2)[:, None, None]).all()
        assert all(_compact(mesh.devices[i]) for i in range(4))
        assert all(_compact(mesh.devices[i, j]) for i in range(4) for j in range(4))
    with pytest.raises(ValueError, match=r"mesh.dcn_data=4 but the 32 devices come from 2 slice"):
        sharding.make_mesh({"data": 4, "fsdp": 8, "dcn_data": 4}, devices)
    with pytest.raises(ValueError, match=r"mesh.dcn_data=2 but the 16 devices come from 1 slice"):
        sharding.make_mesh({"data": 2, "fsdp": 8, "dcn_data": 2}, aot.topology_devices("v5e:4x4"))


def test_count_collectives_counts_async_pairs_once():
    text = """
  %ag = f32[8]{0} all-gather-start(f32[2]{0} %p), dimensions={0}
  %agd = f32[8]{0} all-gather-done(%ag)
  %ar = f32[2]{0} all-reduce(f32[2]{0} %x), to_apply=%add
  %cp = f32[2]{0} collective-permute(f32[2]{0} %y), source_target_pairs={{0,1}}
"""
    counts = aot.count_collectives(text)
    assert counts == {
        "all-gather": 1,
        "all-reduce": 1,
        "reduce-scatter": 0,
        "collective-permute": 1,
        "all-to-all": 0,
    }
