"""Parity with Ultralytics' oriented-box models (fixtures/make_obb_parity.py): the same state_dict keys and shapes,
the same parameter counts, and the same decoded rows (xywh, class scores, angle) from the same seeded weights."""

import pytest
import torch
from models_testutil import PARITY, assert_close_per_channel, key_shapes, model_key_shapes
from parity_weights import fingerprint, seeded_state
from test_parity import FIXTURES

from models.yolo import OBBModel

CASES = {"yolov8n-obb_nc80": ("yolov8n-obb.yaml", 3228867), "yolo11n-obb_nc80": ("yolo11n-obb.yaml", 2695747)}


@pytest.mark.skipif(not (PARITY / "inputs.pt").is_file(), reason=f"parity inputs not found at {PARITY}")
@pytest.mark.parametrize("name", list(CASES))
def test_obb_parity(name):
    cfg, params = CASES[name]
    model = OBBModel(cfg, nc=80).eval()
    assert model_key_shapes(model) == key_shapes(FIXTURES / f"{name}.keys.txt")
    assert sum(p.numel() for p in model.parameters()) == params  # Ultralytics' summary line for the n scale
    ref = torch.load(FIXTURES / "obb_parity.out.pt", weights_only=True)[name]
    state = seeded_state(model.state_dict())
    assert fingerprint(state) == ref["fingerprint"]
    model.load_state_dict(state, strict=True)
    x = torch.load(PARITY / "inputs.pt", weights_only=True)["x256x320"][:1, :, :128, :128]
    with torch.no_grad():
        y = model(x)[0]
    assert y.shape == ref["y"].shape == (1, 4 + 80 + 1, 336)
    assert_close_per_channel(y, ref["y"])


def test_obb_s_scale_parameters():
    assert sum(p.numel() for p in OBBModel("yolov8s-obb.yaml").parameters()) == 11452739  # Ultralytics' summary
