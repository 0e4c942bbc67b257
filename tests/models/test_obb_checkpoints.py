"""Oriented-box checkpoints the official package's trainer wrote (fixtures/make_obb_checkpoint.py): the trainer's
own checkpoint dict (optimizer state, `ema`, the model's `args` as an IterableSimpleNamespace) for a yolov8-obb, and
the optimizer-stripped final form (a released yolo11n-obb.pt's) for a yolo11-obb. Each must load through the safe
loader as our OBBModel and give what Ultralytics itself gave: the decoded eval output, and predict's rotated boxes."""

import math
import sys
import types

import cv2
import pytest
import torch
from models_testutil import assert_close_per_channel
from test_parity import FIXTURES

from evaluation.fields import Letterbox
from models.checkpoints import attempt_load, load_checkpoint, load_model
from models.yolo import OBBModel
from utils.rotated import canonical, polygon_iou, xywhr_to_corners

REF = FIXTURES / "ultralytics-obb-tiny.out.pt"
NAMES = ("v8", "11")


@pytest.fixture(scope="module")
def ref():
    return torch.load(REF, weights_only=True)


@pytest.mark.parametrize("name", NAMES)
def test_official_obb_checkpoint_decodes_as_ultralytics(name, ref):
    r = ref[name]
    for fuse in (False, True):
        model = attempt_load(FIXTURES / f"ultralytics-obb-tiny-{name}.pt", fuse=fuse)
        assert type(model) is OBBModel and model.nc == 2 and model.names == {0: "a", 1: "b"}
        assert model.output_layout.angle
        with torch.no_grad():
            y = model(r["x"].float() / 255)[0]
        assert y.shape == r["y"].shape == (1, 4 + 2 + 1, 252)
        assert_close_per_channel(y, r["y"])


def test_the_fixtures_are_the_two_forms_and_give_their_run():
    """The trainer's dict (optimizer state, `ema` the model) and the stripped one (`model`, no optimizer); each names
    the run's image size in `train_args`."""
    trainer, stripped = (load_checkpoint(FIXTURES / f"ultralytics-obb-tiny-{n}.pt") for n in NAMES)
    assert trainer["model"] is None and trainer["ema"] is not None and trainer["optimizer"]["state"]
    assert stripped["ema"] is None and stripped["optimizer"] is None and stripped["epoch"] == -1
    assert type(vars(trainer["ema"])["args"]).__name__ == "IterableSimpleNamespace"  # stripped: a dict
    for name in NAMES:
        assert load_model(FIXTURES / f"ultralytics-obb-tiny-{name}.pt", fuse=False)[1] == {"imgsz": 128}


def _same_boxes(ours, theirs, gains):
    """Ours and Ultralytics' predict rows (xywhr, conf, cls), in their order: the same confidences and classes, the
    same centres, and the same rectangles. Ultralytics 8.4 keeps the head's angle in [-pi/4, 3pi/4) and divides w by
    the letterbox's x gain and h by its y gain; ours reports the angle in [0, pi/2) (8.3's regularised form) and
    divides both sides by the mean gain (a rotated side runs along neither axis), so sides agree to the two gains'
    difference and the angles modulo the w/h swap (`canonical` puts both in one form)."""
    assert len(ours["conf"]) == len(theirs["conf"]) > 0
    torch.testing.assert_close(ours["conf"], theirs["conf"], rtol=0, atol=1e-4)
    assert torch.equal(ours["cls"], theirs["cls"])
    a, b = ours["xywhr"].double(), theirs["xywhr"].double()
    torch.testing.assert_close(a[:, :2], b[:, :2], rtol=0, atol=2e-3)
    ca, cb = canonical(a), canonical(b)
    side_rtol = abs(gains[0] / gains[1] - 1) + 1e-4
    assert ((ca[:, 2:4] - cb[:, 2:4]).abs() <= side_rtol * cb[:, 2:4]).all()
    turn = torch.remainder(ca[:, 4] - cb[:, 4] + math.pi / 2, math.pi) - math.pi / 2
    assert (turn.abs() < 1e-3).all()
    iou = polygon_iou(xywhr_to_corners(a), xywhr_to_corners(b)).diagonal()
    assert (iou > 0.99).all(), iou.min()


@pytest.mark.parametrize("name", NAMES)
def test_official_obb_checkpoint_predicts_ultralytics_boxes(name, ref, tmp_path):
    from yolo import YOLO

    r = ref[name]
    image = tmp_path / "im.png"
    cv2.imwrite(str(image), r["image"].numpy())
    res = YOLO(str(FIXTURES / f"ultralytics-obb-tiny-{name}.pt")).predict(str(image), imgsz=128, conf=0.25,
                                                                          iou=0.7, device="cpu")[0]
    assert res.boxes is None
    ours = {"xywhr": res.obb.xywhr, "conf": res.obb.conf, "cls": res.obb.cls}
    fit = Letterbox.placed((77, 128), tuple(r["image"].shape))  # 96 x 160 into 128: 77 x 128 resized
    (gy, gx), _ = fit.ratio_pad
    _same_boxes(ours, r["predict"], (gx, gy))
    rows = res.summary()  # Ultralytics' form for oriented boxes: the four corners x1, y1 ... x4, y4
    corners = [[[row["box"][f"x{j}"], row["box"][f"y{j}"]] for j in range(1, 5)] for row in rows]
    torch.testing.assert_close(torch.tensor(corners), res.obb.xyxyxyxy.cpu(), rtol=0, atol=1e-4)
    assert [row["confidence"] for row in rows] == [round(v, 5) for v in res.obb.conf.tolist()]


def test_the_comparison_can_fail(ref):
    """A box turned by 2 degrees, or sides 1 % larger, is another answer."""
    theirs = ref["v8"]["predict"]
    for change in ((4, math.radians(2)), (2, 0.01 * theirs["xywhr"][0, 2].item())):
        ours = {k: v.clone() for k, v in theirs.items()}
        ours["xywhr"][0, change[0]] += change[1]
        with pytest.raises(AssertionError):
            _same_boxes(ours, theirs, (0.8, 77 / 96))


def test_an_official_class_is_called_only_with_no_arguments(tmp_path, monkeypatch):
    """What the safe loader now admits for Ultralytics' trainer files, `IterableSimpleNamespace()`, builds the empty
    stand-in; the same class called with an argument (a payload's shape) is still refused before torch reads it."""
    from untrusted_corpus import constructor_call

    from models.checkpoints.safe import Stub, UnsafeCheckpoint

    module = types.ModuleType("ultralytics.utils")
    namespace = type("IterableSimpleNamespace", (), {"__module__": "ultralytics.utils"})
    module.IterableSimpleNamespace = namespace
    monkeypatch.setitem(sys.modules, "ultralytics", types.ModuleType("ultralytics"))
    monkeypatch.setitem(sys.modules, "ultralytics.utils", module)
    made = load_checkpoint(constructor_call(tmp_path / "ok.pt", namespace))["w"]
    assert isinstance(made, Stub) and type(made).official_path == "ultralytics.utils.IterableSimpleNamespace"
    with pytest.raises(UnsafeCheckpoint, match=r"calls ultralytics.utils.IterableSimpleNamespace with arguments"):
        load_checkpoint(constructor_call(tmp_path / "bad.pt", namespace, 10**9))
