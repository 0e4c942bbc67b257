"""YOLOv7 models: layouts, parameter counts (training and re-parameterised), fuse equivalence, OTA loss name."""

import copy

import pytest
import torch
import torch.nn as nn
from models_testutil import (
    PARITY,
    key_shapes,
    model_key_shapes,
    randomise_bn,
    randomise_implicit,
)

from models.common import MP, SP, SPPCSPC, RepConv
from models.heads import IDetect
from models.yolo import BaseModel, DetectionModel, parse_model, yaml_model_load

# training form, and after fuse(): RepConv -> one conv, implicit layers folded, BatchNorm folded.
# Official: yolov7 with a plain Detect is 37,620,125 (+2,557 implicit parameters of IDetect); deploy 36.9M.
PARAMS = {
    "yolov7-tiny.yaml": (6_228_762, 6_219_709),
    "yolov7.yaml": (37_622_682, 36_905_341),
    "yolov7x.yaml": (71_347_394, 71_311_741),
}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def models():
    """Real (initialised) yolov7-tiny and yolov7; yolov7x is only counted, on the meta device (71M parameters)."""
    torch.manual_seed(0)
    return {cfg: DetectionModel(cfg) for cfg in ("yolov7-tiny.yaml", "yolov7.yaml")}


@pytest.mark.parametrize("cfg", list(PARAMS))
def test_parameter_counts_training_and_fused(cfg):
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        layers, _ = parse_model(yaml_model_load(cfg), 3)
        assert n_params(layers) == PARAMS[cfg][0]
        BaseModel.fuse(layers)
        assert n_params(layers) == PARAMS[cfg][1]


def test_built_model_counts(models):
    assert {c: n_params(m) for c, m in models.items()} == {c: PARAMS[c][0] for c in models}


@pytest.mark.skipif(not PARITY.is_dir(), reason=f"parity fixtures not found at {PARITY}")
def test_tiny_keys_equal_official(models):
    assert model_key_shapes(models["yolov7-tiny.yaml"]) == key_shapes(PARITY / "yolov7-tiny_nc80.keys.txt")


def test_structure(models):
    tiny, v7 = models["yolov7-tiny.yaml"], models["yolov7.yaml"]
    with torch.device("meta"):
        v7x = parse_model(yaml_model_load("yolov7x.yaml"), 3)[0]
    assert len(tiny.model) == 78 and len(v7.model) == 106 and len(v7x) == 122
    assert isinstance(tiny.model[0].act, nn.LeakyReLU) and tiny.model[0].act.negative_slope == 0.1
    assert isinstance(v7.model[0].act, nn.SiLU)
    assert isinstance(tiny.model[8], MP) and isinstance(tiny.model[31], SP)
    assert isinstance(v7.model[51], SPPCSPC) and all(isinstance(v7.model[i], RepConv) for i in (102, 103, 104))
    assert isinstance(v7x[59], SPPCSPC) and isinstance(v7x[-1], IDetect)
    for m in models.values():
        head = m.model[-1]
        assert isinstance(head, IDetect) and head.default_loss == "ota"
        assert torch.equal(m.stride, torch.tensor([8.0, 16.0, 32.0]))
        torch.testing.assert_close(head.anchor_grid.view(3, 3, 2), head.anchors * m.stride.view(-1, 1, 1))
    assert tiny.default_hyp == "hyp.v7-tiny.yaml" and v7.default_hyp == "hyp.v7.yaml"
    assert yaml_model_load("yolov7x.yaml")["hyp"] == "hyp.v7.yaml"


@pytest.mark.parametrize("cfg", ["yolov7-tiny.yaml", "yolov7.yaml"])
def test_forward_layouts(models, cfg):
    m = models[cfg]
    x = torch.rand(1, 3, 64, 64)
    feats = m.train()(x)
    assert [tuple(f.shape) for f in feats] == [(1, 3, 8, 8, 85), (1, 3, 4, 4, 85), (1, 3, 2, 2, 85)]
    with torch.no_grad():
        y, raw = m.eval()(x)
    assert y.shape == (1, 252, 85) and torch.isfinite(y).all()


@pytest.mark.parametrize("cfg", ["yolov7-tiny.yaml", "yolov7.yaml"])
def test_fuse_keeps_eval_outputs(models, cfg):
    m = randomise_implicit(randomise_bn(copy.deepcopy(models[cfg]))).eval()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        ref = m(x)[0]
        m.fuse()
        out = m(x)[0]
    assert n_params(m) < PARAMS[cfg][0]
    assert not any(isinstance(x, (nn.BatchNorm2d,)) for x in m.modules())
    assert all(hasattr(r, "rbr_reparam") for r in m.modules() if isinstance(r, RepConv))
    scale = ref.abs().max()
    torch.testing.assert_close(out / scale, ref / scale, atol=1e-4, rtol=0)
