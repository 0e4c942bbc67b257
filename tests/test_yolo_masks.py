"""`Results.masks` against what Ultralytics 8.4's predict says of the same checkpoint and image
(tests/models/fixtures/make_seg_masks.py: a narrow YOLOv8-seg saved by Ultralytics, data/images/shapes1.jpg, a
portrait 334 x 467 image that the letterbox pads; only the values are committed).

The contract (docs/api.md): `masks.data` is (n, h, w) uint8 0 / 1 at the original image's size, which Ultralytics
gives with retina_masks=True (its default gives them at the letterboxed input's size: 320 x 256 here); `xy` is
each outline in the image's pixels, `xyn` the same over (w, h)."""

import json

import numpy as np
import pytest
import torch

from utils.files import ROOT
from yolo import YOLO

FIXTURES = ROOT / "tests" / "models" / "fixtures"
PEER = json.loads((FIXTURES / "ultralytics-seg-masks.json").read_text())
RETINA, DEFAULT = PEER["retina_masks"], PEER["default"]


@pytest.fixture(scope="module")
def result():
    return YOLO(FIXTURES / "ultralytics-seg-tiny.pt").predict(str(ROOT / "data" / "images" / PEER["image"]),
                                                             verbose=False, **PEER["predict"])[0]


def with_masks(r):
    """The boxes whose mask holds a pixel: those Ultralytics keeps (it drops a box whose mask came out empty)."""
    keep = r.masks.data.amax((1, 2)) > 0
    assert not keep[len(RETINA["sums"]):].any() and keep[: len(RETINA["sums"])].all()
    return r[keep]


def test_masks_are_uint8_at_the_images_size_as_ultralytics_retina_masks(result):
    h, w = RETINA["orig_shape"]
    assert RETINA["shape"][1:] == [h, w] and RETINA["dtype"] == "uint8" and DEFAULT["dtype"] == "uint8"
    assert DEFAULT["shape"][1:] == [320, 256]  # Ultralytics' default: the input's size, not the image's
    data = result.masks.data
    assert data.dtype == torch.uint8 and tuple(data.shape[1:]) == (h, w) and set(data.unique().tolist()) <= {0, 1}
    assert result.masks.numpy().data.dtype == np.uint8


def test_the_masks_boxes_and_outlines_agree_with_ultralytics(result):
    r = with_masks(result)
    torch.testing.assert_close(r.boxes.data, torch.tensor(RETINA["boxes"]), atol=1e-4, rtol=1e-6)
    h, w = RETINA["orig_shape"]
    ours = r.masks.data.long().sum((1, 2))
    # the same masks up to a row or column at a box edge (upsampled at the input size, then to the image's, where
    # Ultralytics upsamples the prototypes straight to the image's size)
    assert (ours - torch.tensor(RETINA["sums"])).abs().max() <= max(h, w)
    for mine, theirs in zip(r.masks.xy, RETINA["xy"]):
        assert mine.dtype == np.float32 and mine.shape == np.asarray(theirs).shape
        assert np.abs(mine - np.asarray(theirs, dtype=np.float32)).max() <= 1
    for xy, xyn in zip(r.masks.xy, r.masks.xyn):
        np.testing.assert_allclose(xyn, xy / np.array([w, h], dtype=np.float32))


def test_a_view_indexed_keeps_the_masks_rows(result):
    one = result.masks[1]
    assert one.data.shape == (1, *result.orig_shape) and torch.equal(one.data[0], result.masks.data[1])
    assert len(list(result.masks)) == len(result.boxes)
