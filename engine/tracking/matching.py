"""Costs between tracks and detections, and the assignment that pairs them (scipy's Hungarian solver)."""

import numpy as np
from scipy.optimize import linear_sum_assignment


def box_iou(a, b):
    """IoU of each box of a (n, 4) with each of b (m, 4), xyxy: (n, m)."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clip(0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clip(0).prod(-1)
    return inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-9)


def iou_cost(track_boxes, det_boxes, det_scores=None):
    """1 - IoU; with `det_scores` (fuse_score) 1 - IoU x score, so a confident detection wins a tie."""
    sim = box_iou(track_boxes, det_boxes)
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
