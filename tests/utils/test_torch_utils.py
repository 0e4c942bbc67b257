"""Precision and layout choices: which CPUs count as native bf16, what --amp resolves to, the CPU memory format."""

import pytest
import torch

from utils.errors import BadOption
from utils.torch_utils import amp_settings, cpu_bf16_native, inference_bf16, memory_format

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("flags,native", [
    ("fpu sse avx2 avx512f avx512bw", False),  # AVX512 without BF16: bf16 is emulated
    ("fpu avx512f avx512_bf16 avx512_vnni", True),  # Cooper Lake, Zen 4
    ("fpu avx512f amx_bf16 amx_tile amx_int8", True),  # Sapphire Rapids
    ("fpu avx512f avx512_bf16x", False),  # a longer flag that merely starts with the name
])
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, flags, native):
    f = tmp_path / "cpuinfo"
    f.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert cpu_bf16_native(str(f)) is native


def test_no_cpuinfo_means_no_native_bf16(tmp_path):
    assert cpu_bf16_native(str(tmp_path / "missing")) is False


def test_amp_settings():
    assert amp_settings(CPU, "auto") == ((True, torch.bfloat16) if cpu_bf16_native() else (False, torch.float32))
    assert amp_settings(CUDA, "auto") == (True, torch.float16)
    assert amp_settings(CPU, "bf16") == (True, torch.bfloat16)
    assert amp_settings(CUDA, "off") == (False, torch.float32)
    with pytest.raises(BadOption, match="--amp fp16 needs CUDA"):
        amp_settings(CPU, "fp16")


def test_inference_bf16_follows_the_option_and_the_cpu():
    assert inference_bf16(CPU, "bf16") and inference_bf16(CUDA, "bf16")
    assert not inference_bf16(CPU, "off") and not inference_bf16(CUDA, "auto")
    assert inference_bf16(CPU, "auto") == cpu_bf16_native()


def test_memory_format_is_channels_last_on_cpu_only():
    assert memory_format(CPU) == torch.channels_last
    assert memory_format(CUDA) == torch.contiguous_format


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_only_on_cpus_with_native_bf16(monkeypatch, native):
    import utils.torch_utils as tu

    monkeypatch.setattr(tu, "cpu_bf16_native", lambda: native)
    assert amp_settings(CPU, "auto") == ((True, torch.bfloat16) if native else (False, torch.float32))
    assert inference_bf16(CPU, "auto") is native
    assert amp_settings(CUDA, "auto") == (True, torch.float16) and not inference_bf16(CUDA, "auto")
