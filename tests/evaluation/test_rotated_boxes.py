"""Rotated-box matching and mAP (evaluation/metrics.process_rotated_batch, fields.RotatedBoxes) against independent
polygon math: IoU from counting grid points inside each rectangle, and hand-computed overlaps."""

import math

import numpy as np
import torch

from data.targets import Targets
from evaluation.fields import Letterbox, Predictions, RotatedBoxes, plotted_labels
from evaluation.metrics import DetMetrics, iou_vector, process_rotated_batch
from utils.rotated import xywhr_to_corners


def counted_iou(b1, b2, n=500):
    """IoU of two xywhr boxes (lists) from an n x n grid over their joint bounding square."""
    c = xywhr_to_corners(torch.tensor([b1, b2], dtype=torch.float64)).view(-1, 2)
    lo, side = c.min(0).values, float((c.max(0).values - c.min(0).values).max())
    t = (torch.arange(n, dtype=torch.float64) + 0.5) / n * side
    pts = torch.stack(torch.meshgrid(lo[0] + t, lo[1] + t, indexing="xy"), -1).view(-1, 2)

    def inside(b):
        cx, cy, w, h, r = b
        d = pts - torch.tensor([cx, cy], dtype=torch.float64)
        u, v = d[:, 0] * math.cos(r) + d[:, 1] * math.sin(r), -d[:, 0] * math.sin(r) + d[:, 1] * math.cos(r)
        return (u.abs() <= w / 2) & (v.abs() <= h / 2)

    i1, i2 = inside(b1), inside(b2)
    return float((i1 & i2).sum() / (i1 | i2).sum())


def rows(boxes, conf, cls):
    """NMS rows (n, 7): xywh, conf, cls, angle."""
    b = torch.tensor(boxes, dtype=torch.float32)
    return torch.cat((b[:, :4], torch.tensor(conf)[:, None], torch.tensor(cls, dtype=torch.float32)[:, None],
                      b[:, 4:]), 1)


def test_matching_follows_counted_polygon_iou():
    """Each prediction matches its label at exactly the thresholds below its counted IoU (none on the boundary)."""
    label = [50.0, 50, 40, 10, 0.3]
    preds = [[50, 50, 40, 10, 0.3], [50, 52, 40, 10, 0.3], [50, 50, 40, 10, 0.3 + math.pi / 2],
             [50, 50, 35, 10, 0.3 + math.pi], [80, 80, 10, 10, 0.0]]
    iouv = iou_vector()
    for p in preds:
        want = counted_iou(label, p)
        assert all(abs(want - t) > 0.01 for t in iouv.tolist())
        got = process_rotated_batch(rows([p], [0.9], [0])[:, :6], torch.tensor([p[4]]),
                                    torch.tensor([[0.0, *label]]), iouv)
        assert got[0].tolist() == (iouv < want).tolist(), (p, want)


def test_map_of_perfect_turned_and_misclassified_predictions():
    labels = torch.tensor([[0.0, 30, 30, 40, 10, 0.5], [1.0, 90, 60, 30, 12, -0.2]])
    iouv = iou_vector()

    def map50_95(preds):
        r = rows(preds, [0.9, 0.8][: len(preds)], [0, 1][: len(preds)])
        tp = process_rotated_batch(r[:, :6], r[:, -1], labels, iouv).numpy()
        m = DetMetrics(names={0: "a", 1: "b"})
        m.process(tp, r[:, 4].numpy(), r[:, 5].numpy(), labels[:, 0].numpy())
        return m.box.map

    assert map50_95(labels[:, 1:].tolist()) > 0.99
    turned = labels[:, 1:].clone()
    turned[:, 4] += math.pi / 2  # each long box across its label: IoU about 0.14 and 0.25, below every threshold
    assert map50_95(turned.tolist()) == 0
    flipped = labels[:, 1:].clone()
    flipped[:, 4] += math.pi  # the same rectangles
    assert map50_95(flipped.tolist()) > 0.99


def test_labels_and_predictions_go_back_to_the_original_image():
    """A 200 x 100 image letterboxed into 64 x 64 (gain 0.32, 16 px of pad above and below): the labels and the rows
    come back to the original pixels, and the predictor's corners are the original rectangle's."""
    original = torch.tensor([[120.0, 40, 60, 20, 0.4]])
    gain, pad = 0.32, (0, 16)
    xywh = original[:, :4] * gain
    xywh[:, 1] += pad[1]
    batch = {"img": torch.zeros(1, 3, 64, 64),
             "targets": Targets.from_rows(torch.cat((torch.tensor([[0.0, 2.0]]), xywh / 64), 1), (64, 64),
                                          original[:, 4]),
             "shapes": [((100, 200), ((gain, gain), pad))]}
    labels = RotatedBoxes.labels(batch, 0)
    torch.testing.assert_close(labels, torch.cat((torch.tensor([[2.0]]), original), 1))
    native = rows(torch.cat((xywh, original[:, 4:]), 1).tolist(), [0.7], [2])
    RotatedBoxes().scale(native, Letterbox.of_batch(batch, 0))
    np.testing.assert_allclose(RotatedBoxes.corners(native).numpy(), xywhr_to_corners(original).numpy(), atol=1e-4)


def test_decode_regularises_and_lines_are_corners():
    field = RotatedBoxes()
    r = rows([[10.0, 20, 4, 8, 2.0]], [0.5], [1])
    out = field.decode(Predictions(r), None).boxes
    assert 0 <= out[0, -1] < math.pi / 2 and out[0, 2] == 8 and out[0, 3] == 4
    d = (RotatedBoxes.corners(out)[0][:, None] - RotatedBoxes.corners(r)[0][None]).norm(dim=-1)
    assert d.min(1).values.max() < 1e-4  # the same rectangle
    cols = field.txt_columns(out, (40, 20))
    assert cols.shape == (1, 8) and (cols >= 0).all() and (cols <= 1).all()


def test_confusion_matrix_and_plotted_rows_read_the_rotated_geometry():
    """The first field tells the confusion matrix its overlap and the plots their rows: a long box and the same box
    turned a quarter share little (a background pair), the same box turned by pi is a match; each plotted row is
    the rotated box's own xywh, its angle going to plot_images beside it (predictions and labels alike)."""
    from evaluation.metrics import ConfusionMatrix

    field = RotatedBoxes()
    labels = torch.tensor([[0.0, 50, 50, 40, 10, 0.0]])
    cm = ConfusionMatrix(nc=1, iou=field.pair_iou)
    cm.process_batch(rows([[50, 50, 40, 10, math.pi / 2]], [0.9], [0]), labels)
    assert cm.matrix.tolist() == [[0, 1], [1, 0]]
    cm = ConfusionMatrix(nc=1, iou=field.pair_iou)
    cm.process_batch(rows([[50, 50, 40, 10, math.pi]], [0.9], [0]), labels)
    assert cm.matrix.tolist() == [[1, 0], [0, 0]]
    preds = [rows([[50, 50, 40, 10, math.pi / 2]], [0.9], [0])]
    torch.testing.assert_close(field.plotted(preds), torch.tensor([[0.0, 0, 50, 50, 40, 10, 0.9]]))
    torch.testing.assert_close(field.plot_kwargs([Predictions(boxes=p) for p in preds], {})["angles"],
                               torch.tensor([math.pi / 2]))
    targets = Targets.from_rows(torch.tensor([[0.0, 0, 0.5, 0.5, 0.4, 0.1]]), (64, 64), torch.tensor([math.pi / 2]))
    label_rows, angles = plotted_labels(targets)
    torch.testing.assert_close(label_rows, torch.tensor([[0.0, 0, 0.5, 0.5, 0.4, 0.1]]))
    torch.testing.assert_close(angles, torch.tensor([math.pi / 2]))
    assert plotted_labels(Targets.from_rows(torch.zeros(0, 6), (64, 64)))[1] is None  # upright: no angles
