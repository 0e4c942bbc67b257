"""The dry run (utils/dry_run.py): shapes as the real operators make them, nothing allocated, costs counted, what it
cannot know refused; and the wall-clock guard."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from utils.dry_run import DataDependent, OverBudget, Unrunnable, dry_run, wall_clock_guard
from utils.files import ROOT

CASES = {
    "conv": lambda x: F.conv2d(x, torch.randn(8, 3, 3, 3), torch.randn(8), stride=2, padding=1),
    "conv dilated, grouped": lambda x: F.conv2d(x, torch.randn(6, 1, 3, 3), None, 1, 2, 2, groups=3),
    "conv transposed": lambda x: F.conv_transpose2d(x, torch.randn(3, 4, 2, 2), stride=2, output_padding=1),
    "max pool, ceil": lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
    "max pool with indices": lambda x: F.max_pool2d(x, 5, 1, 2, return_indices=True)[1].float(),
    "upsample x2": lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"),
    "upsample to a size": lambda x: F.interpolate(x, size=(7, 9), mode="nearest"),
    "cat, broadcast, softmax": lambda x: torch.softmax(torch.cat([x, x * 2 + 1], 1) - x.mean((2, 3), keepdim=True)
                                                       .repeat(1, 2, 1, 1), 1),
    "batch norm, eval": lambda x: F.batch_norm(x, torch.zeros(3), torch.ones(3)),
    "linear": lambda x: F.linear(x.flatten(1), torch.randn(5, x[0].numel())),
    "grid from the shape": lambda x: _grid(x) * x[:, :1].permute(0, 2, 3, 1),
}


def _grid(x):
    """An anchor grid made from the input's shape, as the heads make theirs (arange, meshgrid, stack, expand)."""
    ys, xs = torch.meshgrid(torch.arange(x.shape[2]), torch.arange(x.shape[3]), indexing="ij")
    return torch.stack((xs, ys), -1).expand(x.shape[0], -1, -1, -1)


@pytest.mark.parametrize("name", list(CASES))
def test_shapes_are_the_real_operators(name):
    """Every output's shape as the real computation makes it (the shortcuts of _meta_shortcut included)."""
    x = torch.randn(2, 3, 13, 17)
    _, out = dry_run(CASES[name], tuple(x.shape))
    assert out.device.type == "meta" and out.shape == CASES[name](x).shape


def test_costs_are_counted_and_a_budget_stops_the_run():
    w = torch.randn(8, 3, 3, 3)
    probe, _ = dry_run(lambda x: F.conv2d(x, w, stride=2, padding=1), (1, 3, 64, 64))
    assert probe.bytes == 8 * 32 * 32 * 4 and probe.work == 2 * 8 * 32 * 32 * 27  # output bytes, multiply-adds
    with pytest.raises(OverBudget, match="constants of more than 67108864 bytes"):  # whatever the input's size
        dry_run(lambda x: torch.full((40000, 40000), 1.0) + x[0, 0, 0, 0], (64, 3, 640, 640))
    with pytest.raises(OverBudget, match="activations of more than 50331648 bytes"):  # 4 KiB per input value
        dry_run(lambda x: x.repeat(1, 1, 100, 100), (1, 3, 64, 64))
    heavy = torch.zeros(1, 3, 1, 1).expand(4096, 3, 33, 33)  # 17 MB of output, 2.7e10 multiply-adds
    with pytest.raises(OverBudget, match="operations"):
        dry_run(lambda x: F.conv2d(x, heavy), (1, 3, 64, 64))


def test_what_cannot_be_known_from_the_shape_is_refused():
    with pytest.raises(DataDependent, match="values of the input"):
        dry_run(lambda x: torch.zeros(int(x.sum())), (1, 3, 8, 8))
    with pytest.raises(Unrunnable, match="convolution cannot run"):
        dry_run(lambda x: F.conv2d(x, torch.zeros(8, 4, 3, 3)), (1, 3, 8, 8))
    with pytest.raises(Unrunnable, match="cat cannot run"):
        dry_run(lambda x: torch.cat([x, x[:, :, :4]], 1), (1, 3, 8, 8))


class _Tiles(torch.nn.Module):
    def forward(self, x):
        return x.repeat(1, 1, 50, 50)[:, :, :8, :8] + torch.full([100, 100], 1.0)[:1, :1]


def test_a_torchscript_graph_runs_dry_and_its_refusal_keeps_its_type():
    """TorchScript's interpreter re-raises what an operator raised as its own error: the dry run's reason survives.
    Tiling the input 50 x 50 costs 2500x its size, beyond the budget; the 40 KB constant is counted as fixed."""
    with pytest.warns(FutureWarning):  # torch.jit.trace's deprecation notice
        # fresh traces: the first run of a graph is its profiling run; later runs may fold full() into a constant
        trace = [torch.jit.trace(_Tiles(), torch.zeros(1, 3, 8, 8), check_trace=False) for _ in range(2)]
    with pytest.raises(OverBudget, match="activations of more than 786432 bytes"):
        dry_run(trace[0], (1, 3, 8, 8))
    probe, out = dry_run(lambda x: trace[1](x[:, :, :1, :1].expand(1, 3, 8, 8)), (1, 3, 40, 40))
    assert out.shape == (1, 3, 8, 8) and probe.fixed >= 40000 and probe.bytes >= 3 * 400 * 400 * 4


def test_official_models_run_dry_without_sympy_or_dynamo():
    """torch writes many meta versions in Python, some importing sympy or torch._dynamo on first use (seconds of a
    script's start-up): the operators of the models of models/ must be met by the shortcuts (YOLOv7 is left out: its
    implicit layers' weight initialisation on the meta device imports torch._dynamo itself). In a fresh process."""
    code = (
        "import sys\n"
        "from models.yolo import check_cost, yaml_model_load\n"
        "for cfg in ('yolov5n.yaml', 'yolov5n-seg.yaml', 'yolov5n-cls.yaml', 'yolov8n.yaml', 'yolov8n-seg.yaml',"
        " 'yolov8n-pose.yaml', 'yolov8n-cls.yaml', 'yolov5nu.yaml', 'yolo11n-seg.yaml', 'yolov3-tiny.yaml',"
        " 'yolov5s-transformer.yaml', 'yolov8n-ghost.yaml', 'yolov5-bifpn.yaml'):\n"
        "    check_cost(yaml_model_load(cfg), 3)\n"
        "print(sorted(m for m in ('sympy', 'torch._dynamo') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]


def test_the_wall_clock_guard_ends_the_process_with_one_line():
    code = ("import time\nfrom utils.dry_run import wall_clock_guard\n"
            "with wall_clock_guard(0.5, 'a graph'):\n    time.sleep(60)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: a graph: still running after 0 s, far beyond what its dry run counted; stopped"], r.stderr
    with wall_clock_guard(30, "quick"):  # a block that ends in time leaves nothing behind
        pass
