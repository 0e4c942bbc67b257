"""utils/rotated.py against independent math: corners from a rotation matrix, the Bhattacharyya distance from numpy's
matrix algebra, polygon IoU from counting grid points inside each rectangle."""

import math

import numpy as np
import pytest
import torch

from utils.rotated import canonical, corners_to_xywhr, polygon_iou, probiou, regularize, rotated_nms, xywhr_to_corners


def random_boxes(n, seed=0, size=100.0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * size
    wh = torch.rand(n, 2, generator=g) * size / 3 + 2
    r = (torch.rand(n, 1, generator=g) - 0.5) * 2 * math.pi
    return torch.cat((xy, wh, r), 1).double()


def same_corner_sets(a, b, atol=1e-3):
    """Each corner of a has a corner of b within atol, box by box."""
    d = (a[:, :, None] - b[:, None]).norm(dim=-1)
    return bool((d.min(-1).values < atol).all())


def test_corners_match_a_rotation_matrix():
    boxes = random_boxes(20)
    got = xywhr_to_corners(boxes)
    for box, corners in zip(boxes.numpy(), got.numpy()):
        cx, cy, w, h, r = box
        rot = np.array([[math.cos(r), -math.sin(r)], [math.sin(r), math.cos(r)]])
        local = np.array([[w, h], [w, -h], [-w, -h], [-w, h]]) / 2
        np.testing.assert_allclose(corners, local @ rot.T + [cx, cy], atol=1e-9)


def test_canonical_and_regularized_are_the_same_rectangles():
    boxes = random_boxes(200, seed=1)
    for fn, low, high in ((canonical, -math.pi / 4, 3 * math.pi / 4), (regularize, 0, math.pi / 2)):
        out = fn(boxes)
        assert ((out[:, 4] >= low) & (out[:, 4] < high)).all()
        assert same_corner_sets(xywhr_to_corners(boxes), xywhr_to_corners(out), atol=1e-9)
    assert (canonical(boxes)[:, 2] >= canonical(boxes)[:, 3]).all()


def test_corners_to_xywhr_round_trip():
    boxes = canonical(random_boxes(50, seed=2)).float()
    got = torch.from_numpy(corners_to_xywhr(xywhr_to_corners(boxes).numpy()))
    assert same_corner_sets(xywhr_to_corners(got), xywhr_to_corners(boxes), atol=1e-3)
    assert ((got[:, 4] >= -math.pi / 4) & (got[:, 4] < 3 * math.pi / 4)).all() and (got[:, 2] >= got[:, 3]).all()


def bhattacharyya_probiou(b1, b2):
    """1 - Hellinger distance of the boxes' Gaussians, from the paper's definitions with numpy's linear algebra."""
    def gaussian(b):
        cx, cy, w, h, r = b
        rot = np.array([[math.cos(r), -math.sin(r)], [math.sin(r), math.cos(r)]])
        return np.array([cx, cy]), rot @ np.diag([w * w / 12, h * h / 12]) @ rot.T

    (m1, s1), (m2, s2) = gaussian(b1), gaussian(b2)
    s = (s1 + s2) / 2
    d = m1 - m2
    det = np.linalg.det
    bd = d @ np.linalg.inv(s) @ d / 8 + 0.5 * math.log(det(s) / math.sqrt(det(s1) * det(s2)))
    return 1 - math.sqrt(1 - math.exp(-bd))


def test_probiou_is_the_bhattacharyya_formula():
    a, b = random_boxes(30, seed=3, size=30), random_boxes(30, seed=4, size=30)
    got = probiou(a, b)
    want = torch.tensor([bhattacharyya_probiou(x.numpy(), y.numpy()) for x, y in zip(a, b)], dtype=got.dtype)
    far = want < 1e-6  # the clamp at B = 100 is Ultralytics', not the formula's
    torch.testing.assert_close(got[~far], want[~far], atol=2e-4, rtol=0)
    pair = probiou(a[:, None], b[None])
    assert pair.shape == (30, 30)
    torch.testing.assert_close(pair.diagonal(), got)
    assert probiou(a, a).min() > 0.999  # equal boxes: 1 up to the clamp
    square = torch.tensor([[10.0, 10, 4, 4, 0.0], [10.0, 10, 4, 4, 0.7]])
    assert probiou(square[0], square[1]) > 0.999  # a square's angle does not matter to a Gaussian


def raster_iou(b1, b2, n=600):
    """IoU of two xywhr boxes from an n x n grid of points over their joint bounding square."""
    c = torch.cat((xywhr_to_corners(b1), xywhr_to_corners(b2))).view(-1, 2)
    lo, hi = c.min(0).values, c.max(0).values
    side = float((hi - lo).max())
    t = (torch.arange(n, dtype=torch.float64) + 0.5) / n * side
    pts = torch.stack(torch.meshgrid(lo[0] + t, lo[1] + t, indexing="xy"), -1).view(-1, 2)

    def inside(b):
        cx, cy, w, h, r = b.tolist()
        d = pts - torch.tensor([cx, cy], dtype=torch.float64)
        u = d[:, 0] * math.cos(r) + d[:, 1] * math.sin(r)
        v = -d[:, 0] * math.sin(r) + d[:, 1] * math.cos(r)
        return (u.abs() <= w / 2) & (v.abs() <= h / 2)

    i1, i2 = inside(b1), inside(b2)
    return float((i1 & i2).sum() / (i1 | i2).sum())


def test_polygon_iou_matches_counted_area():
    a, b = random_boxes(6, seed=5, size=40), random_boxes(5, seed=6, size=40)
    got = polygon_iou(xywhr_to_corners(a), xywhr_to_corners(b))
    assert got.shape == (6, 5)
    want = torch.tensor([[raster_iou(x, y) for y in b] for x in a], dtype=torch.float64)
    assert (want > 0.05).sum() >= 3, "the case should hold overlapping pairs"
    torch.testing.assert_close(got, want, atol=0.01, rtol=0)


@pytest.mark.parametrize("case", ["identical", "nested", "disjoint", "touching", "cross"])
def test_polygon_iou_exact_cases(case):
    boxes = {"identical": ([5, 5, 4, 2, 0.3], [5, 5, 4, 2, 0.3], 1.0),
             "nested": ([5, 5, 4, 4, 0.0], [5, 5, 2, 2, 0.0], 0.25),
             "disjoint": ([0, 0, 2, 2, 0.5], [10, 10, 2, 2, 0.5], 0.0),
             "touching": ([0, 0, 2, 2, 0.0], [2, 0, 2, 2, 0.0], 0.0),
             # two 4 x 2 rectangles crossed at right angles: a 2 x 2 square in common
             "cross": ([0, 0, 4, 2, 0.0], [0, 0, 4, 2, math.pi / 2], 4 / 12)}
    a, b, want = boxes[case]
    got = polygon_iou(xywhr_to_corners(torch.tensor([a], dtype=torch.float64)),
                      xywhr_to_corners(torch.tensor([b], dtype=torch.float64)))
    assert float(got) == pytest.approx(want, abs=1e-9)


def test_rotated_nms_rule():
    """A suppresses B (same place, lower score); B overlaps C but A does not: fast NMS drops C with B (Ultralytics'
    OBB rule); D is alone."""
    boxes = torch.tensor([[10, 10, 8, 4, 0.2], [11.5, 10, 8, 4, 0.25], [13.5, 10, 8, 4, 0.25], [50, 50, 8, 4, 1.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    iou = probiou(boxes[:, None], boxes[None])
    assert iou[0, 1] > 0.5 and iou[1, 2] > 0.5 and iou[0, 2] < 0.5
    assert rotated_nms(boxes, scores, 0.5).tolist() == [0, 3]
    assert rotated_nms(boxes[[2, 3]], scores[[2, 3]], 0.5).tolist() == [0, 1]
    perm = torch.tensor([3, 1, 0, 2])
    assert perm[rotated_nms(boxes[perm], scores[perm], 0.5)].tolist() == [0, 3]


def test_non_max_suppression_keeps_xywhr_rows():
    """An oriented-box layout: rows come back as xywh, conf, cls, angle; overlap is rotated and class-aware."""
    from utils.ops import OutputLayout, non_max_suppression

    layout = OutputLayout(nc=2, objectness=False, channels_last=False, angle=True)
    boxes = torch.tensor([[10, 10, 8, 4, 0.2], [11.5, 10, 8, 4, 0.25], [11.5, 10, 8, 4, 0.25], [50, 50, 8, 4, 1.0]])
    cls = torch.tensor([[0.9, 0], [0.8, 0], [0, 0.7], [0.6, 0]])
    pred = torch.cat((boxes[:, :4], cls, boxes[:, 4:]), 1).T[None]  # (1, 4 + nc + 1, anchors)
    assert layout.width == 7
    (out,) = non_max_suppression(pred, 0.25, 0.5, layout=layout)
    torch.testing.assert_close(out[:, :4], boxes[[0, 2, 3], :4])
    torch.testing.assert_close(out[:, 6], boxes[[0, 2, 3], 4])
    assert out[:, 5].tolist() == [0, 1, 0]
    (agnostic,) = non_max_suppression(pred, 0.25, 0.5, agnostic=True, layout=layout)
    assert agnostic[:, 4].tolist() == pytest.approx([0.9, 0.6])
