"""Parity with the official implementations: state_dict layouts and eval outputs on fixed inputs.

Fixtures: /work/shared/reference/parity (see its README) and, for pose, tests/models/fixtures (its builder script says
how it was made). Weights are fp16-exact, so loading is exact.
"""

from pathlib import Path

import pytest
import torch
from models_testutil import PARITY, assert_close_per_channel, float_state, key_shapes, model_key_shapes
from parity_weights import fingerprint, seeded_state

from models.yolo import ClassificationModel, DetectionModel, PoseModel, SegmentationModel

CASES = {
    "yolov5n_nc80": (DetectionModel, "yolov5n.yaml"),
    "yolov8n_nc80": (DetectionModel, "yolov8n.yaml"),
    "yolov8n-seg_nc80": (SegmentationModel, "yolov8n-seg.yaml"),
    "yolov8n-cls_nc80": (ClassificationModel, "yolov8n-cls.yaml"),
}


def outputs(name, out):
    """The fixture's `raw` entries from our eval output."""
    if name.endswith("-cls_nc80"):
        return {"probs": out}
    if name.endswith("-seg_nc80"):
        return {"y": out[0], "proto": out[1][2]}
    return {"y": out[0]}


@pytest.fixture(scope="module")
def inputs():
    return torch.load(PARITY / "inputs.pt")


@pytest.mark.skipif(not PARITY.is_dir(), reason=f"parity fixtures not found at {PARITY}")
@pytest.mark.parametrize("name", list(CASES))
def test_parity(name, inputs):
    cls, cfg = CASES[name]
    model = cls(cfg, nc=80).eval()
    assert model_key_shapes(model) == key_shapes(PARITY / f"{name}.keys.txt")
    model.load_state_dict(float_state(PARITY / f"{name}.state.pt"), strict=True)
    ref = torch.load(PARITY / f"{name}.out.pt", weights_only=True)
    for key in ("x320", "x256x320"):
        with torch.no_grad():
            got = outputs(name, model(inputs[key]))
        for k, expected in ref[key]["raw"].items():
            if k not in got:
                continue  # `logits` of the classifier: our eval output is the probabilities
            scale = expected.abs().max()
            torch.testing.assert_close(got[k] / scale, expected / scale, atol=1e-4, rtol=0, msg=f"{name} {key} {k}")



FIXTURES = Path(__file__).resolve().parent / "fixtures"
# fixtures built here from Ultralytics (fixtures/make_parity.py): name -> (our class, our cfg)
LOCAL_CASES = {"yolov8n-pose_nc80": (PoseModel, "yolov8n-pose.yaml"),
               "yolov5nu_nc80": (DetectionModel, "yolov5nu.yaml")}


@pytest.mark.skipif(not (PARITY / "inputs.pt").is_file(), reason=f"parity inputs not found at {PARITY}")
@pytest.mark.parametrize("name", list(LOCAL_CASES))
def test_local_parity(name, inputs):
    """Ultralytics' yolov8n-pose, and its YOLOv5u (`yolov5n.yaml` there, `yolov5nu.yaml` here): the same keys, and the
    same decoded boxes, class scores (and keypoints: x, y in pixels, visibility) within 1e-4 of each channel's largest
    value."""
    cls, cfg = LOCAL_CASES[name]
    model = cls(cfg, nc=80).eval()
    assert model_key_shapes(model) == key_shapes(FIXTURES / f"{name}.keys.txt")
    ref = torch.load(FIXTURES / f"{name}.out.pt", weights_only=True)
    state = seeded_state(model.state_dict())
    assert fingerprint(state) == ref["fingerprint"]  # the same weights as the official model ran with
    model.load_state_dict(state, strict=True)
    expected = ref["x256x320"]["raw"]["y"]
    with torch.no_grad():
        y = model(inputs["x256x320"][: len(expected)])[0]
    assert_close_per_channel(y, expected)
