"""Helpers shared by the model tests (a unique module name: pytest puts this folder on sys.path)."""

from pathlib import Path

import torch
import torch.nn as nn

PARITY = (Path(__file__).parents[2] / ".." / "shared" / "reference" / "parity").resolve()


def randomise_bn(module, seed=0):
    """Move BatchNorm statistics and affine parameters away from their defaults so folding errors show."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.weight.data = torch.rand(n, generator=g) + 0.5
            m.bias.data = torch.randn(n, generator=g)
            m.running_mean = torch.randn(n, generator=g)
            m.running_var = torch.rand(n, generator=g) + 0.5
    return module


def randomise_implicit(module, seed=0):
    """YOLOv7 implicit layers away from their 0 / 1 initial values."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if name.endswith("implicit"):
            centre = 1.0 if ".im." in name or name.startswith("im.") else 0.0
            p.data = torch.randn(p.shape, generator=g) * 0.5 + centre
    return module


def float_state(path):
    return {k: v.float() if v.is_floating_point() else v for k, v in torch.load(path).items()}


def key_shapes(path):
    """[(key, shape string)] from a NAME.keys.txt fixture."""
    rows = [line.split("\t") for line in Path(path).read_text().splitlines() if not line.startswith("#")]
    return [(r[0], r[1]) for r in rows]


def model_key_shapes(model):
    return [(k, str(list(v.shape))) for k, v in model.state_dict().items()]
