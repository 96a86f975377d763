"""bert_jax/hardware.py: the machine facts, read as the run-time config, the attention choice,
the loop and ahead-of-time compilation read them."""

import pytest

from bert_jax import hardware

# /proc/cpuinfo excerpts: an AMD EPYC (Zen 2/3: AVX2, no bfloat16 units), a Sapphire Rapids Xeon
# (AMX), a Zen 4 EPYC (AVX-512 BF16, no AMX) and two aarch64 cores, with and without BF16. Two
# processors each, as cpuinfo repeats them.
_EPYC_ZEN3 = "flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 sha_ni vaes vpclmulqdq\n"
_XEON_AMX = "flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n"
_EPYC_ZEN4 = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
_NEOVERSE_V1 = "Features\t: fp asimd sve i8mm bf16 svebf16\n"  # aarch64 BFMMLA
_NEOVERSE_N1 = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"
CPUINFO = {
    name: "".join(f"processor\t: {i}\nmodel name\t: {name}\n{flags}\n" for i in range(2))
    for name, flags in (
        ("zen3", _EPYC_ZEN3),
        ("amx", _XEON_AMX),
        ("zen4", _EPYC_ZEN4),
        ("neoverse_v1", _NEOVERSE_V1),
        ("neoverse_n1", _NEOVERSE_N1),
    )
}


def test_cpu_flags_reads_the_flags_lines_only():
    flags = hardware.cpu_flags(CPUINFO["amx"] + "bugs\t\t: amx_bf16_fake\n")
    assert {"amx_bf16", "avx512f", "fpu"} <= flags
    assert "amx_bf16_fake" not in flags and "model" not in flags
    assert hardware.cpu_flags("") == frozenset()


@pytest.mark.parametrize(
    "dtype, platform, cpu, warns",
    [
        ("bfloat16", "cpu", "zen3", True),  # no bfloat16 matrix units: emulated
        ("bfloat16", "cpu", "amx", False),
        ("bfloat16", "cpu", "zen4", False),
        ("bfloat16", "cpu", "neoverse_v1", False),
        ("bfloat16", "cpu", "neoverse_n1", True),
        ("float32", "cpu", "zen3", False),
        ("bfloat16", "tpu", "zen3", False),  # the host's CPU does not compute a TPU run
        ("bfloat16", "cpu", None, False),  # no /proc/cpuinfo (not Linux): no warning
    ],
)
def test_emulated_bfloat16_warning(dtype, platform, cpu, warns):
    message = hardware.emulated_bfloat16_warning(dtype, platform, CPUINFO.get(cpu))
    assert (message is not None) == warns
    if warns:
        assert "amx_bf16" in message and "avx512_bf16" in message and "float32" in message


@pytest.mark.parametrize(
    "capability, bfloat16, cudnn",
    [("7.0", False, False), ("7.5", False, False), ("8.0", True, True), ("8.6", True, True),
     ("9.0", True, True), ("10.0", True, True), ("12.1", True, True)],
)  # fmt: skip
def test_compute_capabilities_compare_as_versions(capability, bfloat16, cudnn):
    assert hardware.has_bfloat16_matrix_units(capability) is bfloat16
    assert hardware.has_cudnn_flash_attention(capability) is cudnn
    assert hardware.has_cudnn_flash_attention(None)  # unknown: taken as able


def test_a_malformed_compute_capability_is_named():
    with pytest.raises(ValueError, match="compute_capability='sm75': expected a version"):
        hardware.parse_capability("sm75")


def test_platforms_are_checked_and_gpu_means_cuda():
    assert hardware.check_platform("gpu") == "cuda"
    assert hardware.check_platform("tpu") == "tpu"
    with pytest.raises(ValueError, match="platform='metal': expected one of"):
        hardware.check_platform("metal")
    assert hardware.current_platform() == "cpu"  # the tests run on CPU devices
    assert hardware.compute_capability() is None


def test_every_card_has_its_compute_capabilitys_limits_and_is_found_by_its_name():
    for key, card in hardware.GPU_CARDS.items():
        assert card.sm_limits == hardware.SM_LIMITS[card.compute_capability], key
        assert hardware.gpu_card(key) is card
        assert hardware.gpu_card_of_kind(card.name) is card
        no_bf16 = not hardware.has_bfloat16_matrix_units(card.compute_capability)
        assert (card.bf16_tflops is None) == no_bf16, key
    with pytest.raises(ValueError, match="unknown GPU card 'k80'; known: h100"):
        hardware.gpu_card("k80")
    with pytest.raises(ValueError, match="no card data for GPU kind 'Tesla K80'"):
        hardware.gpu_card_of_kind("Tesla K80")
    with pytest.raises(ValueError, match="Tesla T4 .compute capability 7.5. has no bfloat16"):
        hardware.gpu_card("t4").peak_flops("bfloat16")
    assert hardware.gpu_card("t4").peak_flops("float16") == 65e12


def test_peaks_by_device_kind():
    assert hardware.peak_flops_per_device("TPU v5 lite") == 197e12
    assert hardware.peak_flops_per_device("NVIDIA H100 PCIe") == 756e12  # the longest name wins
    assert hardware.peak_flops_per_device("NVIDIA H100 80GB HBM3") == 989e12
    assert hardware.peak_flops_per_device("cpu") is None
    assert hardware.tpu_chip("TPU v4").hbm_bytes == 32 * hardware.GIB
    with pytest.raises(ValueError, match="no chip data for TPU kind 'TPU v9'"):
        hardware.tpu_chip("TPU v9")
