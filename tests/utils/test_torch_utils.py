"""Precision and layout choices: which CPUs count as native bf16, what --amp resolves to, the CPU memory format;
the EMA update."""

import math

import pytest
import torch

from data.targets import Targets
from utils.errors import BadOption
from utils.torch_utils import (
    ModelEMA,
    amp_settings,
    build_optimizer,
    cpu_bf16_native,
    inference_bf16,
    labels_to,
    memory_format,
    memory_used,
    peak_memory,
)

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


def test_inference_bf16_only_when_asked():
    """Predict runs a .pt in fp32 by default, as its exports run, so both give the same boxes (issue 46)."""
    assert inference_bf16(CPU, "bf16") and inference_bf16(CUDA, "bf16")
    assert not inference_bf16(CPU, "off") and not inference_bf16(CUDA, "auto") and not inference_bf16(CPU, "auto")
    # auto leaves an OpenVINO model to OpenVINO's own choice (None); off asks fp32 of it too
    assert inference_bf16(CPU, "auto") is None and inference_bf16(CPU, "off") is False


def test_memory_format_is_channels_last_on_cpu_only():
    assert memory_format(CPU) == torch.channels_last
    assert memory_format(CUDA) == torch.contiguous_format


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_only_on_cpus_with_native_bf16(monkeypatch, native):
    import utils.torch_utils as tu

    monkeypatch.setattr(tu, "cpu_bf16_native", lambda: native)
    assert amp_settings(CPU, "auto") == ((True, torch.bfloat16) if native else (False, torch.float32))
    assert not inference_bf16(CPU, "auto")  # training may take bf16; prediction only when asked
    assert amp_settings(CUDA, "auto") == (True, torch.float16) and not inference_bf16(CUDA, "auto")


def test_ema_update_is_the_per_tensor_formula():
    """The fused update gives the bits of lerp(v, w, 1 - d) per tensor, which is v * d + (1 - d) * w to float32
    rounding, and leaves frozen and integer tensors alone."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Conv2d(4, 2, 1))
    model[2].bias.requires_grad_(False)
    ema = ModelEMA(model, decay=0.9, tau=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
        model[1].running_mean.add_(1.0)
        model[1].num_batches_tracked.add_(5)
    before = {k: v.clone() for k, v in ema.ema.state_dict().items()}
    ema.update(model)
    d = 0.9 * (1 - math.exp(-1 / 3))
    for k, v in ema.ema.state_dict().items():
        if k in ("2.bias", "1.num_batches_tracked"):
            assert torch.equal(v, before[k])
        else:
            w = model.state_dict()[k]
            assert torch.equal(v, torch.lerp(before[k], w, 1 - d)), k
            exact = before[k].double() * d + w.double() * (1 - d)
            torch.testing.assert_close(v.double(), exact, rtol=2**-22, atol=2**-22 * exact.abs().max().item())


def test_memory_is_reported_in_gib(monkeypatch):
    """The progress bar's mem and the peaks in GiB (2**30 bytes, nvidia-smi's and the peers' unit), read from torch's
    CUDA allocator; a reset starts the peaks again after they are read."""
    gpu = torch.device("cuda", 0)
    resets = []
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 5 * 2**29)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: 7 * 2**29)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    assert memory_used(gpu) == 3.0
    assert peak_memory(gpu) == (2.5, 3.5) and not resets
    assert peak_memory(gpu, reset=True) == (2.5, 3.5) and resets == [gpu]
    assert peak_memory(torch.device("cpu"), reset=True) is None


def test_ema_keeps_its_tensor_pairs_and_follows_in_place_changes(monkeypatch):
    """The pairs are found once per model (not two state dicts per step); they stay right as the model's tensors
    change in place, as an optimizer step and a loaded checkpoint change them, and another model is paired anew."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    ema = ModelEMA(model, decay=0.5, tau=1e-9)  # d = 0.5 from the first update
    read = []  # the modules whose whole state dict was asked for
    state_dict = torch.nn.Module.state_dict
    monkeypatch.setattr(torch.nn.Module, "state_dict", lambda self, *a, **k: (read.append(self),
                                                                              state_dict(self, *a, **k))[1])

    def update_and_check(source):
        expected = {k: torch.lerp(v, state_dict(source)[k], 0.5) for k, v in state_dict(ema.ema).items()
                    if v.is_floating_point()}
        ema.update(source)
        assert all(torch.equal(state_dict(ema.ema)[k], v) for k, v in expected.items())

    for _ in range(3):
        with torch.no_grad():
            model[0].weight.add_(1.0)
            model[1].running_var.mul_(2.0)
        update_and_check(model)
    assert [m for m in read if m in (model, ema.ema)] == [model, ema.ema]  # at the first update only
    model.load_state_dict({k: v + 1 if v.is_floating_point() else v for k, v in state_dict(model).items()})
    update_and_check(model)
    other = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    update_and_check(other)
    assert [m for m in read if m in (model, other)] == [model, other]


def test_labels_to_moves_the_labels_it_is_asked_for_and_leaves_the_images():
    """The meta device shows which tensors moved: with no keys every tensor but the images and the colour tables, and
    the typed targets whole, with keys only those the batch holds; values that are not tensors stay as they are."""
    def batch():
        return {"img": torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "hsv": torch.zeros(2, 3, 256, dtype=torch.uint8),
                "targets": Targets.from_rows(torch.zeros(1, 6), (4, 4), keypoints=torch.zeros(1, 2, 3)),
                "masks": torch.zeros(2, 4, 4), "cls": torch.zeros(2), "paths": ["a", "b"]}

    moved = labels_to(batch(), "meta")
    assert {k for k, v in moved.items() if isinstance(v, torch.Tensor) and v.is_meta} == {"masks", "cls"}
    t = moved["targets"]
    assert all(v.is_meta for v in (t.image, t.cls, t.boxes.data, t.keypoints)) and t.boxes.canvas == (4, 4)
    assert moved["paths"] == ["a", "b"] and len(t) == 1
    some = labels_to(batch(), "meta", ("masks", "keypoints"))
    assert [k for k, v in some.items() if isinstance(v, torch.Tensor) and v.is_meta] == ["masks"]
    assert "keypoints" not in some


def test_new_tensors_get_three_groups_of_their_own_at_their_lr():
    from models.yolo import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=3)
    new = [f"model.22.cv3.{i}.2.{k}" for i in range(3) for k in ("weight", "bias")]
    assert len(new) == 6  # the class convolution's weight and bias at each of the three levels
    opt = build_optimizer(model, "AdamW", 1e-4, 0.9, 5e-4, new=new, new_lr=1e-3)
    groups = opt.param_groups
    assert [g["lr"] for g in groups] == [1e-4] * 3 + [1e-3] * 3
    assert [g["weight_decay"] for g in groups] == [0.0, 5e-4, 0.0, 0.0, 5e-4, 0.0]
    by_id = {id(p): n for n, p in model.named_parameters()}
    assert sorted(by_id[id(p)] for g in groups[3:] for p in g["params"]) == sorted(new)
    assert [len(g["params"]) for g in groups[3:]] == [0, 3, 3]  # biases in the bias group, as for the others
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in model.parameters())  # each once
    plain = build_optimizer(model, "AdamW", 1e-4, 0.9, 5e-4)
    assert [len(g["params"]) for g in plain.param_groups] == [len(g["params"]) + k for g, k in zip(groups, (0, 3, 3))]
    same = build_optimizer(model, "AdamW", 1e-4, 0.9, 5e-4, new=new, new_lr=1e-4)
    assert len(same.param_groups) == 3  # at the same lr, one set of groups: the file format of every earlier run
