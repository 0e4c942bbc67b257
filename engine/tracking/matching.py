"""Costs between tracks and detections, and the assignment that pairs them (scipy's Hungarian solver)."""

import math

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from utils.rotated import probiou


def box_iou(a, b):
    """IoU of each box of a (n, 4) with each of b (m, 4), xyxy: (n, m)."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clip(0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clip(0).prod(-1)
    return inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-9)


def probiou_matrix(a, b):
    """Probabilistic IoU (utils/rotated.probiou) of each oriented box of a (n, 5) with each of b (m, 5), xywhr:
    (n, m). Ultralytics' measure for oriented tracks: blind to how a rectangle is written (w, h and the angle, or h, w
    and the angle a quarter turn on), and kinder than the polygons' exact overlap to a thin box a few pixels off across
    its short side, which on the synthetic turning video (benchmarks/track_synthetic_obb.py) kept ByteTrack's
    low-score matches that the exact overlap lost (MOTA 0.886 -> 0.897, IDF1 0.815 -> 0.911 on seed 0)."""
    a, b = (torch.from_numpy(np.asarray(x, dtype=np.float64).reshape(-1, 5)) for x in (a, b))
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    return probiou(a[:, None], b[None]).numpy()


def same_turn(box, track):
    """The oriented box (xywhr) written as the track's box (xywhr) is: the same rectangle, turned by quarter turns
    with w and h swapped for each odd one, to the angle nearest the track's, and one quarter further where that
    leaves its sides in the other order than the track's. A detector reports a box's angle in [0, pi/2), so a turning
    object's angle wraps and its sides swap between frames; a track's filter must see its sides in one order. The
    nearest angle alone keeps them only while the object turns less than an eighth turn between two matches: one
    that turned more while hidden would hand the filter its long side as the short one (a lost track found again
    after the object turned 0.65 rad kept its old sides and came out a 16 x 18 box on a 40 x 18 object)."""
    x, y, w, h, r = box
    step = math.pi / 2
    quarters = round((track[4] - r) / step)
    if quarters % 2:
        w, h = h, w
    if (w - h) * (track[2] - track[3]) < 0:
        quarters += 1 if track[4] > r + quarters * step else -1
        w, h = h, w
    return np.array([x, y, w, h, r + quarters * step])


def iou_cost(track_boxes, det_boxes, det_scores=None, iou=box_iou):
    """1 - IoU; with `det_scores` (fuse_score) 1 - IoU x score, so a confident detection wins a tie."""
    sim = iou(track_boxes, det_boxes)
    if det_scores is not None and sim.size:
        sim = sim * np.asarray(det_scores)[None]
    return 1 - sim


def assign(cost, thresh):
    """(matches (k, 2) of (row, col), unmatched rows, unmatched cols): the least total cost pairing, pairs above
    `thresh` dropped."""
    n, m = cost.shape
    if not n or not m:
        return np.empty((0, 2), int), list(range(n)), list(range(m))
    rows, cols = linear_sum_assignment(cost)
    keep = cost[rows, cols] <= thresh
    matches = np.stack([rows[keep], cols[keep]], 1)
    return matches, sorted(set(range(n)) - set(matches[:, 0])), sorted(set(range(m)) - set(matches[:, 1]))
