"""Helpers shared by the model tests (a unique module name: pytest puts this folder on sys.path)."""

from pathlib import Path

import torch
import torch.nn as nn

from models.checkpoints import model_to_ckpt

NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}
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


def save_checkpoint(cfg, cls, path, seed=0):
    """Our checkpoint of a model with BatchNorm / implicit layers away from their defaults (so fusing matters)."""
    torch.manual_seed(seed)
    model = randomise_implicit(randomise_bn(cls(cfg, nc=3), seed), seed)
    model.names = dict(NAMES)
    torch.save({"model": model_to_ckpt(model)}, path)
    return path


def assert_close_per_channel(out, ref, rtol=1e-4):
    """|out - ref| <= rtol x the largest |ref| of the same channel, with channels along dim 1 and along the last dim
    (the heads put their channels in one or the other)."""
    assert out.shape == ref.shape
    for axis in {1, ref.ndim - 1}:
        dims = [d for d in range(ref.ndim) if d != axis]
        err = (out - ref).abs().amax(dim=dims)
        scale = ref.abs().amax(dim=dims)
        assert (err <= rtol * scale + 1e-7).all(), f"axis {axis}: worst {(err / (scale + 1e-12)).max():.3g}"


@torch.no_grad()
def seeded_params(module, seed=0, scale=0.5):
    """Every parameter of `module` drawn N(0, scale), so that a formula's every term matters."""
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


@torch.no_grad()
def inference_outputs(model, x):
    """What inference reads of `model(x)` (a `.pt` model or an InferenceBackend): (prediction, prototypes) as its
    layout splits them, without the prototypes where there are none; a classifier's (scores,)."""
    out = model(x)
    layout = getattr(model, "output_layout", None)
    if layout is None:
        return (out,)
    return tuple(y for y in layout.split(out) if y is not None)


def assert_same_inference_outputs(model, ref_model, x, rtol=1e-4):
    """`model` gives `ref_model`'s prediction (and prototypes), each to `rtol` of its channel's largest value."""
    out, ref = inference_outputs(model, x), inference_outputs(ref_model, x)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        assert_close_per_channel(o, r, rtol)
