"""Oriented-box data: the DOTA-style label format, the synthetic `obb` set, and xywhr targets through letterbox,
mosaic, affine warps and flips."""

import math

import cv2
import numpy as np
import pytest
import torch

from data.detect_dataset import YOLODataset
from data.label_formats import BadLine, OBBLabels, get_format
from data.synthetic import generate_dataset
from utils.rotated import canonical, polygon_iou, xywhr_to_corners


@pytest.fixture(scope="module")
def obb_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("obb")
    generate_dataset(root, task="obb", n_train=12, n_val=4, seed=0, min_side=96, max_side=160)
    return root


def test_parse_reads_four_corners():
    box, corners, clipped = OBBLabels().parse(np.array([0.2, 0.1, 0.6, 0.3, 0.5, 0.5, 0.1, 0.3]))
    np.testing.assert_allclose(box, [0.35, 0.3, 0.5, 0.4], atol=1e-6)  # the corners' axis-aligned box
    np.testing.assert_allclose(corners, [[0.2, 0.1], [0.6, 0.3], [0.5, 0.5], [0.1, 0.3]], atol=1e-6)
    assert not clipped and get_format("obb").name == "obb"


@pytest.mark.parametrize("values,why", [
    ([0.5, 0.5, 0.4, 0.2], "5 values, expected 9"),
    ([0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4], "zero-area polygon"),
    ([0.1, 0.1, 1.5, 0.1, 1.5, 0.5, 2.1, 0.5], "centred outside the image"),
    ([823, 90, 900, 95, 898, 140, 821, 135], r"centred outside the image \(860, 115\): corners are normalised"),
])
def test_parse_refuses_bad_lines(values, why):
    with pytest.raises(BadLine, match=why):
        OBBLabels().parse(np.array(values, float))


def test_a_box_cut_by_the_tile_edge_is_kept_clipped():
    """DOTA's tiles cut the objects on their borders: DOTA8's corners reach 1.06 (3 of its 4 training images). Such a
    box is kept, its corners clipped to the image and the line counted as clipped; only its centre must be inside."""
    box, corners, clipped = OBBLabels().parse(np.array([0.9, 0.4, 1.06, 0.45, 1.0, 0.6, 0.84, 0.55]))
    assert clipped and corners.max() == 1.0 and corners.min() == 0.4
    np.testing.assert_allclose(box, [0.92, 0.5, 0.16, 0.2], atol=1e-6)  # the clipped corners' bounds
    assert not OBBLabels().parse(np.array([0.2, 0.1, 0.6, 0.3, 0.5, 0.5, 0.1, 0.3]))[2]


def test_synthetic_obb_labels_are_rectangles(obb_set):
    """Each label's corners, in pixels, make a rectangle (equal diagonals, opposite sides equal) where no corner
    was clipped to the image."""
    lines = []
    for f in sorted((obb_set / "labels" / "train").glob("*.txt")):
        h, w = cv2.imread(str(obb_set / "images" / "train" / f"{f.stem}.jpg")).shape[:2]
        lines += [(ln.split(), (w, h)) for ln in f.read_text().splitlines()]
    assert len(lines) > 20 and all(len(v) == 9 for v, _ in lines)
    assert {int(v[0]) for v, _ in lines} == {0, 1, 2}
    for v, size in lines:
        c = np.array(v[1:], float).reshape(4, 2)
        if ((c == 0) | (c == 1)).any():
            continue
        c *= size
        sides = np.linalg.norm(np.roll(c, -1, 0) - c, axis=1)
        diagonals = np.linalg.norm(c[:2] - c[2:], axis=1)
        assert abs(sides[0] - sides[2]) < 0.01 * sides.max() and abs(sides[1] - sides[3]) < 0.01 * sides.max()
        assert abs(diagonals[0] - diagonals[1]) < 0.01 * sides.max()


def rboxes_pixels(sample):
    boxes = sample["boxes"]
    assert boxes.format == "cxcywhr" and boxes.canvas == tuple(sample["img"].shape[1:]) and boxes.normalized
    rb = boxes.data.clone()
    h, w = sample["img"].shape[1:]
    rb[:, [0, 2]] *= w
    rb[:, [1, 3]] *= h
    return rb


def test_letterboxed_samples_carry_the_label_rectangles(obb_set):
    """Without augmentation a sample's xywhr is its label's rectangle, letterboxed: corners within a pixel."""
    ds = YOLODataset(str(obb_set / "images" / "val"), imgsz=96, task="obb")
    for i in range(len(ds)):
        s = ds[i]
        rb = rboxes_pixels(s)
        torch.testing.assert_close(canonical(rb.double()).float(), rb)  # w >= h, r in [-pi/4, 3pi/4)
        lb = ds.labels[i]
        (h0, w0), ((gh, gw), (px, py)) = s["shape"]
        corners = [np.asarray(seg) * (w0 * gw, h0 * gh) + (px, py) for seg in lb["segments"]]
        iou = polygon_iou(xywhr_to_corners(rb.double()), torch.tensor(np.stack(corners), dtype=torch.float64))
        assert iou.diagonal().min() > 0.9


def test_augmented_batches_hold_xywhr_targets(obb_set):
    """Mosaic, affine and flips: every target is a canonical xywhr box inside the image, whose w and h are the
    rotated box's own sides (w >= h)."""
    hyp = {"degrees": 30.0, "translate": 0.1, "scale": 0.5, "shear": 0.0, "mosaic": 1.0, "fliplr": 0.5,
           "flipud": 0.5}
    ds = YOLODataset(str(obb_set / "images" / "train"), imgsz=96, augment=True, hyp=hyp, task="obb")
    batch = ds.collate_fn([ds[i] for i in range(len(ds))])
    assert batch["targets"].boxes.format == "cxcywhr"
    targets = batch["targets"]
    t = torch.cat((targets.image[:, None].float(), targets.cls[:, None], targets.boxes.data), 1)
    a = t[:, 6]
    assert len(t) > 10 and "angles" not in batch
    assert (t[:, 4] >= t[:, 5]).all()  # normalised by one square side (96 x 96), so w >= h holds there too
    assert ((a >= -math.pi / 4) & (a < 3 * math.pi / 4)).all() and a.std() > 0.1
    assert ((t[:, 2:4] >= 0) & (t[:, 2:4] <= 1)).all()  # centres inside: the rectangles of the visible parts
