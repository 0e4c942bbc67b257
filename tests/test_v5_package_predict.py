"""A checkpoint the yolov5 package saved (its whole fp16 `DetectionModel` pickled, tests/models/fixtures/
make_v5_detect_defaults.py: seeded weights, opt.imgsz 640) predicts at defaults what yolov5's own detect.py gives at
its defaults (imgsz 640, conf 0.25, IoU 0.45) on data/images: the same number of boxes, confidences and classes, and
the same corners to 1e-4 once mapped back to the image as detect.py maps them.

That last step is the one difference, measured: detect.py's scale_boxes takes the letterbox's gain and pad from the
two shapes (gain min(640 / h0, w / w0), pad (w - w0 * gain) / 2), where the pixels were placed with rounded sides
and a whole-pixel pad; ours maps back through where they were placed (evaluation/fields.Letterbox.placed, what
Ultralytics does), so on the padded axis our corners differ from detect.py's by up to 0.4 px on these images."""

import json

import pytest
import torch

from evaluation.fields import Letterbox
from utils.files import ROOT
from yolo import YOLO

FIXTURES = ROOT / "tests" / "models" / "fixtures"
PEER = json.loads((FIXTURES / "yolov5-detect-defaults.json").read_text())["images"]
IMAGES = ROOT / "data" / "images"
TIE = 1e-6  # confidences this close are a float-rounding tie: NMS may keep either box of such a pair


def input_shape(h0, w0, size=640, stride=32):
    """detect.py's letterbox at its defaults (auto): the long side `size`, the other rounded up to the stride."""
    r = size / max(h0, w0)
    return [int(-(-round(s * r) // stride) * stride) for s in (h0, w0)]


def as_detect_maps_back(rows, h0, w0):
    """Our rows (image pixels) carried back to the input through where the letterbox put them, then to the image
    as detect.py's scale_boxes does; a corner we clipped to the image's edge stays (clipping is not undone)."""
    h, w = input_shape(h0, w0)
    (rh, rw), (px, py) = Letterbox.placed((h, w), (h0, w0)).ratio_pad
    gain = min(h / h0, w / w0)
    out = rows.clone()
    out[:, [0, 2]] = ((rows[:, [0, 2]] * rw + px - (w - w0 * gain) / 2) / gain).clamp(0, w0)
    out[:, [1, 3]] = ((rows[:, [1, 3]] * rh + py - (h - h0 * gain) / 2) / gain).clamp(0, h0)
    edge = (rows[:, :4] == 0) | (rows[:, :4] == torch.tensor([w0, h0, w0, h0], dtype=rows.dtype))
    out[:, :4] = torch.where(edge, rows[:, :4], out[:, :4])
    return out


@pytest.fixture(scope="module")
def results():
    return YOLO(FIXTURES / "yolov5-package-seeded.pt").predict(str(IMAGES), verbose=False)


def test_a_yolov5_package_checkpoint_gives_detect_py_boxes_at_defaults(results):
    assert [r.path.split("/")[-1] for r in results] == sorted(PEER)
    compared = 0
    for r in results:
        theirs = torch.tensor(PEER[r.path.split("/")[-1]])
        ours = r.boxes.data
        assert len(ours) == len(theirs) > 0
        # confidences and classes, sorted: equal but for float rounding
        torch.testing.assert_close(ours[:, 4].sort().values, theirs[:, 4].sort().values, atol=TIE, rtol=0)
        assert sorted(ours[:, 5].tolist()) == sorted(theirs[:, 5].tolist())
        mapped = as_detect_maps_back(ours, *r.orig_shape)
        for row in theirs:
            if (mapped - row).abs().max(1).values.min() <= 1e-4:
                compared += 1
            else:  # NMS kept the other box of a near-tie: one of ours differs from it by float rounding alone
                assert ((ours[:, 4] - row[4]).abs() <= TIE).any(), (r.path, row)
    assert compared >= 51  # of 52: shapes3 keeps one box of a pair 3e-8 apart in confidence, detect.py the other


def test_without_the_mapping_the_corners_differ_on_the_padded_axis_only(results):
    """Direct comparison, for the record: the unpadded axis agrees to 1e-4, the padded one within half a pixel."""
    for r in results[:1]:  # shapes1: 334 x 467, padded left and right
        theirs = torch.tensor(PEER[r.path.split("/")[-1]])
        ours = r.boxes.data
        torch.testing.assert_close(ours[:, [1, 3]], theirs[:, [1, 3]], atol=1e-4, rtol=0)
        gap = (ours[:, [0, 2]] - theirs[:, [0, 2]]).abs().max()
        assert 1e-3 < gap < 0.5
