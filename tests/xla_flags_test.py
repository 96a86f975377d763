"""The project's XLA flags (bert_jax/xla_flags.py): per CPU family, never over the user's."""

from bert_jax import hardware, xla_flags

AMD = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
SAPPHIRE_RAPIDS = (
    "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
    "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
)
SKYLAKE = "vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f avx512bw\n"
HASWELL = "vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd bf16\nCPU implementer\t: 0x41\n"


def test_cpu_family_from_cpuinfo():
    assert hardware.cpu_family(AMD) == "amd"
    assert hardware.cpu_family(SAPPHIRE_RAPIDS) == "intel_amx"
    assert hardware.cpu_family(SKYLAKE) == "intel_avx512"
    assert hardware.cpu_family(HASWELL) == "intel"
    assert hardware.cpu_family(GRAVITON) == "arm"
    assert hardware.cpu_family("processor\t: 0\n") == "other"
    assert set(xla_flags.CPU_BY_FAMILY) <= set(hardware.CPU_FAMILIES)


def test_merged_adds_flags_and_keeps_the_users():
    flags = {"xla_cpu_a": "true", "xla_cpu_b": "512"}
    assert xla_flags.merged("", flags) == "--xla_cpu_a=true --xla_cpu_b=512"
    assert xla_flags.merged(" --xla_cpu_a=false ", flags) == "--xla_cpu_a=false --xla_cpu_b=512"
    assert xla_flags.merged("--xla_cpu_b 256 --other=1", {"xla_cpu_c": "x"}) == (
        "--xla_cpu_b 256 --other=1 --xla_cpu_c=x"
    )


def test_apply_sets_the_families_flags_only_on_that_family(monkeypatch):
    monkeypatch.setattr(xla_flags, "CPU_BY_FAMILY", {"intel_amx": {"xla_cpu_a": "true"}})
    monkeypatch.setattr(xla_flags, "TPU", {"xla_tpu_b": "false"})
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}
    changed = xla_flags.apply(env, cpuinfo=SAPPHIRE_RAPIDS)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/d --xla_cpu_a=true"
    assert env["LIBTPU_INIT_ARGS"] == "--xla_tpu_b=false"
    assert changed == {k: env[k] for k in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}
    assert xla_flags.apply(env, cpuinfo=SAPPHIRE_RAPIDS) == {}  # applied once, not twice
    env = {}
    xla_flags.apply(env, cpuinfo=AMD)
    assert "XLA_FLAGS" not in env and env["LIBTPU_INIT_ARGS"] == "--xla_tpu_b=false"
    env = {"XLA_FLAGS": "--xla_cpu_a=false"}  # the user's value wins
    xla_flags.apply(env, cpuinfo=SAPPHIRE_RAPIDS)
    assert env["XLA_FLAGS"] == "--xla_cpu_a=false"
    env = {xla_flags.DISABLE_VARIABLE: "0"}
    assert xla_flags.apply(env, cpuinfo=SAPPHIRE_RAPIDS) == {} and len(env) == 1
    assert xla_flags.cpu_flags(None) == {}  # no /proc/cpuinfo: none


def test_import_bert_jax_applied_this_machines_flags():
    """`import bert_jax` applied them before any backend started (this test process's)."""
    import os

    if os.environ.get(xla_flags.DISABLE_VARIABLE) == "0":
        return
    want = xla_flags.cpu_flags(hardware.read_cpuinfo())
    assert (
        xla_flags.merged(os.environ.get("XLA_FLAGS", ""), want)
        == os.environ.get("XLA_FLAGS", "").strip()
    )


def test_inference_options_are_the_cpu_familys_and_never_over_the_users(monkeypatch):
    monkeypatch.setattr(xla_flags, "CPU_INFERENCE_BY_FAMILY", {"intel_amx": {"xla_cpu_a": ""}})
    assert xla_flags.inference_options("cpu", {}, SAPPHIRE_RAPIDS) == {"xla_cpu_a": ""}
    assert xla_flags.inference_options("cpu", {}, AMD) == {}
    assert xla_flags.inference_options("gpu", {}, SAPPHIRE_RAPIDS) == {}
    assert xla_flags.inference_options("cpu", {"XLA_FLAGS": "--xla_cpu_a=x"}, SAPPHIRE_RAPIDS) == {}
    off = {xla_flags.DISABLE_VARIABLE: "0"}
    assert xla_flags.inference_options("cpu", off, SAPPHIRE_RAPIDS) == {}
    assert set(xla_flags.CPU_INFERENCE_BY_FAMILY) <= set(hardware.CPU_FAMILIES)


def test_inference_steps_compile_with_this_machines_options(monkeypatch):
    """`inference.batches.tuned` gives the step its options (a program of its own, compiled with
    them) and the step itself where there are none."""
    import jax
    import jax.numpy as jnp

    from bert_jax.inference import batches

    @jax.jit
    def step(x):
        return jnp.tanh(x) @ x

    monkeypatch.setattr(xla_flags, "CPU_INFERENCE_BY_FAMILY", {})
    assert batches.tuned(step, ()) is step
    family = hardware.cpu_family(hardware.read_cpuinfo() or "")
    options = {"xla_cpu_experimental_ynn_fusion_type": ""}
    monkeypatch.setattr(xla_flags, "CPU_INFERENCE_BY_FAMILY", {family: options})
    tuned = batches.tuned(step, ())
    assert tuned is not step and tuned is batches.tuned(step, ())  # one per step and options
    x = jnp.ones((64, 64))
    assert "__ynn_fusion" in step.lower(x).compile().as_text()  # XLA's default
    assert "__ynn_fusion" not in tuned.lower(x).compile().as_text()
    assert float(jnp.abs(tuned(x) - step(x)).max()) < 1e-6


IMPORT_CHANGES = """
import json, os, jax
env, options = dict(os.environ), dict(jax.config.values)
import bert_jax
print(json.dumps({
    "env": sorted(k for k in {*env, *os.environ} if env.get(k) != os.environ.get(k)),
    "options": sorted(k for k, v in jax.config.values.items() if options.get(k) != v),
    "doc": bert_jax.__doc__,
}))
"""


def test_import_bert_jax_sets_only_what_its_docstring_names(tmp_path):
    """`import bert_jax` in a user's environment (no JAX_PLATFORMS, a fresh HOME) changes no
    environment variable and no JAX option but those bert_jax/__init__.py documents."""
    import json
    import subprocess
    import sys

    from tests.commands_test import clean_env

    env = clean_env(tmp_path)
    env.pop(xla_flags.DISABLE_VARIABLE, None)
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_CHANGES], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    documented_env, documented_options = {"XLA_FLAGS", "LIBTPU_INIT_ARGS"}, {"jax_platforms"}
    assert set(seen["env"]) <= documented_env, seen["env"]
    assert set(seen["options"]) <= documented_options, seen["options"]
    for name in documented_env | documented_options:
        assert f"`{name}`" in seen["doc"], f"bert_jax's docstring does not name {name}"
