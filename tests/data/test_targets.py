"""The typed labels of a batch (data/targets.py): boxes that say their format, canvas and units, conversions checked
against hand-written math, and the records the loader, the criteria and the validator pass."""

import math

import pytest
import torch

from data.targets import BoundingBoxes, Targets

# a 100 x 200 (h x w) canvas: one box centred at (50, 25) px, 40 x 10 px; one at (150, 75), 20 x 30
CXCYWH_N = torch.tensor([[0.25, 0.25, 0.2, 0.1], [0.75, 0.75, 0.1, 0.3]])
XYXY_PX = torch.tensor([[30.0, 20, 70, 30], [140, 60, 160, 90]])


def boxes(data=CXCYWH_N, fmt="cxcywh", normalized=True):
    return BoundingBoxes(data.clone(), fmt, (100, 200), normalized)


def test_conversions_match_hand_math_both_ways():
    px = boxes().pixels().convert("xyxy")
    assert (px.format, px.normalized, px.canvas) == ("xyxy", False, (100, 200))
    torch.testing.assert_close(px.data, XYXY_PX)
    torch.testing.assert_close(boxes().convert("xyxy").pixels().data, XYXY_PX)
    back = BoundingBoxes(XYXY_PX.clone(), "xyxy", (100, 200), False).convert("cxcywh").normalize()
    torch.testing.assert_close(back.data, CXCYWH_N)
    assert boxes().pixels().pixels().data.equal(boxes().pixels().data)  # already in pixels: unchanged


def test_the_order_of_the_calls_is_the_order_of_the_arithmetic():
    """Scale then convert, or convert then scale: what the criteria and the metrics were pinned with. Each equals its
    own hand-written order bit for bit (values where the two orders round differently)."""
    g = torch.Generator().manual_seed(0)
    data = torch.rand(1000, 4, generator=g)
    b = BoundingBoxes(data, "cxcywh", (333, 517), True)
    gain = torch.tensor([517.0, 333, 517, 333])
    s = data * gain
    want_scaled_first = torch.cat((s[:, :2] - s[:, 2:] / 2, s[:, :2] + s[:, 2:] / 2), 1)
    c = torch.cat((data[:, :2] - data[:, 2:] / 2, data[:, :2] + data[:, 2:] / 2), 1)
    want_converted_first = c * gain
    assert b.pixels().convert("xyxy").data.equal(want_scaled_first)
    assert b.convert("xyxy").pixels().data.equal(want_converted_first)
    assert not want_scaled_first.equal(want_converted_first)  # the orders do differ: the pin means something


def test_rotated_boxes_scale_their_sides_not_their_angle():
    r = BoundingBoxes(torch.tensor([[0.5, 0.5, 0.2, 0.1, math.pi / 2]]), "cxcywhr", (100, 200), True)
    px = r.pixels()
    torch.testing.assert_close(px.data, torch.tensor([[100.0, 50, 40, 10, math.pi / 2]]))
    torch.testing.assert_close(px.normalize().data, r.data)
    with pytest.raises(ValueError, match="cxcywhr boxes do not convert to xyxy"):
        r.convert("xyxy")


def test_bad_records_are_refused():
    with pytest.raises(ValueError, match="format must be one of"):
        BoundingBoxes(CXCYWH_N, "xywhn", (1, 1), True)
    with pytest.raises(ValueError, match=r"cxcywhr boxes are \(N, 5\)"):
        BoundingBoxes(CXCYWH_N, "cxcywhr", (1, 1), True)
    with pytest.raises(ValueError, match="different formats, units or canvases"):
        BoundingBoxes.cat([boxes(), BoundingBoxes(CXCYWH_N, "cxcywh", (64, 64), True)])
    with pytest.raises(ValueError, match="pixel boxes move with their image"):
        boxes().pixels().on_canvas((64, 64))


def test_targets_from_rows_select_move_and_pin():
    rows = torch.tensor([[0, 1, 0.25, 0.25, 0.2, 0.1], [1, 0, 0.75, 0.75, 0.1, 0.3], [1, 2, 0.5, 0.5, 0.5, 0.5]])
    kpts = torch.rand(3, 2, 3)
    t = Targets.from_rows(rows, (100, 200), keypoints=kpts)
    assert t.image.dtype == torch.int64 and t.image.tolist() == [0, 1, 1] and t.cls.tolist() == [1, 0, 2]
    one = t.of_image(1)
    assert len(one) == 2 and one.keypoints.equal(kpts[1:]) and one.boxes.data.equal(rows[1:, 2:6])
    torch.testing.assert_close(t.keypoints_pixels()[..., :2], kpts[..., :2] * torch.tensor([200.0, 100]))
    moved = t.to("meta")
    assert all(x.is_meta for x in (moved.image, moved.cls, moved.boxes.data, moved.keypoints))
    assert moved.canvas == (100, 200) and moved.boxes.format == "cxcywh"
    resized = t.on_canvas((64, 128))
    assert resized.canvas == (64, 128) and resized.boxes.data.equal(t.boxes.data)
    rotated = Targets.from_rows(rows, (64, 64), angles=torch.tensor([0.1, 0.2, 0.3]))
    assert rotated.boxes.format == "cxcywhr" and rotated.boxes.data[:, 4].tolist() == pytest.approx([0.1, 0.2, 0.3])


def test_collate_keeps_each_sample_s_objects_in_order():
    a = {"cls": torch.tensor([2.0, 0.0]), "boxes": boxes()}
    b = {"cls": torch.zeros(0), "boxes": boxes(torch.zeros(0, 4))}
    c = {"cls": torch.tensor([1.0]), "boxes": boxes(CXCYWH_N[:1])}
    t = Targets.collate([a, b, c])
    assert t.image.tolist() == [0, 0, 2] and t.cls.tolist() == [2, 0, 1] and t.keypoints is None
    assert t.boxes.data.equal(torch.cat((CXCYWH_N, CXCYWH_N[:1]))) and t.canvas == (100, 200)


def test_the_loader_pins_the_record_whole():
    """DataLoader(pin_memory=True) calls a batch value's own pin_memory; on a machine without a GPU pinning is not
    available, so the call itself is what is checked."""
    t = Targets.from_rows(torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.2]]), (8, 8))
    calls = []
    original = torch.Tensor.pin_memory
    try:
        torch.Tensor.pin_memory = lambda self, *a: calls.append(tuple(self.shape)) or self
        pinned = t.pin_memory()
    finally:
        torch.Tensor.pin_memory = original
    assert sorted(calls) == [(1,), (1,), (1, 4)] and isinstance(pinned, Targets)
