"""Oriented (rotated) boxes: `xywhr` (centre, width, height, angle in radians, counter-clockwise in image axes, i.e.
clockwise as seen on screen where y points down) and their four corners.

Conventions are Ultralytics' OBB ones, so that its labels, weights and numbers carry over:
- A label's corners become `xywhr` in canonical form (`corners_to_xywhr`): w is the longer side and r lies in
  [-pi/4, 3pi/4), the range of the OBB head's angle ((sigmoid - 0.25) * pi).
- Predictions are reported regularised (`regularize`): r in [0, pi/2), w and h swapped where that turned the box.
- The loss, the assigner and NMS compare boxes by probabilistic IoU (`probiou`: 1 - the Hellinger distance between
  the boxes' Gaussians, Llerena et al. 2021, "Gaussian Bounding Boxes and Probabilistic Intersection-over-Union"):
  smooth, cheap, and blind to the angle of a square, which is what a square's angle deserves.
- The metric matches by exact polygon IoU (`polygon_iou`), as DOTA's evaluation does.
"""

import math

import cv2
import numpy as np
import torch


def xywhr_to_corners(x):
    """(..., 5) xywhr -> (..., 4, 2) corners: centre + w/2 * u + h/2 * v with u = (cos r, sin r), v = (-sin r, cos r),
    in the order (+u+v, +u-v, -u-v, -u+v), one orientation for every box."""
    ctr, w, h, r = x[..., :2], x[..., 2:3], x[..., 3:4], x[..., 4:5]
    cos, sin = torch.cos(r), torch.sin(r)
    u = torch.cat((w / 2 * cos, w / 2 * sin), -1)
    v = torch.cat((-h / 2 * sin, h / 2 * cos), -1)
    return torch.stack((ctr + u + v, ctr + u - v, ctr - u - v, ctr - u + v), -2)


def canonical(x):
    """xywhr with w >= h and r in [-pi/4, 3pi/4): the same rectangle, the form labels are trained on."""
    x = x.clone()
    swap = x[..., 2] < x[..., 3]
    x[..., 2], x[..., 3] = torch.where(swap, x[..., 3], x[..., 2]), torch.where(swap, x[..., 2], x[..., 3])
    r = torch.where(swap, x[..., 4] + math.pi / 2, x[..., 4])
    x[..., 4] = torch.remainder(r + math.pi / 4, math.pi) - math.pi / 4
    return x


def regularize(x):
    """xywhr with r in [0, pi/2), w and h swapped where r mod pi was in [pi/2, pi): how predictions are reported."""
    swap = torch.remainder(x[..., 4], math.pi) >= math.pi / 2
    w = torch.where(swap, x[..., 3], x[..., 2])
    h = torch.where(swap, x[..., 2], x[..., 3])
    return torch.stack((x[..., 0], x[..., 1], w, h, torch.remainder(x[..., 4], math.pi / 2)), -1)


def corners_to_xywhr(corners):
    """(N, 4, 2) or (N, 8) corners (any quadrilateral: an augmented box is its minimum-area rectangle) -> (N, 5)
    canonical xywhr, numpy float32 in, numpy out."""
    pts = np.asarray(corners, dtype=np.float32).reshape(len(corners), -1, 2)
    out = np.zeros((len(pts), 5), dtype=np.float32)
    for i, p in enumerate(pts):
        (cx, cy), (w, h), deg = cv2.minAreaRect(p)
        out[i] = cx, cy, w, h, math.radians(deg)
    return canonical(torch.from_numpy(out)).numpy()


def dist_to_rbox(dist, angle, anchors, dim=-1):
    """Distances (l, t, r, b) along the box's own axes from an anchor point, and its angle -> xywh: the centre is the
    anchor moved by the rotated offset ((r - l) / 2, (b - t) / 2), the size l + r by t + b."""
    lt, rb = dist.split(2, dim=dim)
    off_x, off_y = ((rb - lt) / 2).split(1, dim=dim)
    cos, sin = torch.cos(angle), torch.sin(angle)
    xy = torch.cat((off_x * cos - off_y * sin, off_x * sin + off_y * cos), dim) + anchors
    return torch.cat((xy, lt + rb), dim)


def rbox_to_dist(xywh, angle, anchors, reg_max, dim=-1):
    """The inverse of `dist_to_rbox`, each distance clamped to [0, reg_max - 0.01] as DFL targets are."""
    xy, wh = xywh.split(2, dim=dim)
    off_x, off_y = (xy - anchors).split(1, dim=dim)
    cos, sin = torch.cos(angle), torch.sin(angle)
    along = torch.cat((off_x * cos + off_y * sin, -off_x * sin + off_y * cos), dim)  # the offset in box axes
    return torch.cat((wh / 2 - along, wh / 2 + along), dim).clamp_(0, reg_max - 0.01)


def _covariance(x, floor=0.0):
    """The Gaussian of each box (uniform over it: variances w^2/12, h^2/12, rotated by r) as (a, b, c) of [[a, c],
    [c, b]]. `floor` (px^2) keeps the gradient of sub-pixel boxes bounded."""
    var_w, var_h = x[..., 2] ** 2 / 12 + floor, x[..., 3] ** 2 / 12 + floor
    cos, sin = torch.cos(x[..., 4]), torch.sin(x[..., 4])
    return var_w * cos**2 + var_h * sin**2, var_w * sin**2 + var_h * cos**2, (var_w - var_h) * cos * sin


def probiou(b1, b2, eps=1e-7, floor=0.0):
    """Probabilistic IoU of xywhr boxes, broadcast over the leading dimensions: 1 - sqrt(1 - exp(-B)), B the
    Bhattacharyya distance of the two Gaussians (clamped to [eps, 100] as Ultralytics does, so equal boxes give
    ~1 - 3e-4, not 1). For pairs: `probiou(a[:, None], b[None])`."""
    a1, bb1, c1 = _covariance(b1, floor)
    a2, bb2, c2 = _covariance(b2, floor)
    dx, dy = b1[..., 0] - b2[..., 0], b1[..., 1] - b2[..., 1]
    a, b, c = a1 + a2, bb1 + bb2, c1 + c2
    det = a * b - c**2
    # (1/8) d^T S^-1 d with S = (S1 + S2) / 2, written out for the 2x2 inverse
    t1 = (a * dy**2 + b * dx**2) / (det + eps) * 0.25
    t2 = -(c * dx * dy) / (det + eps) * 0.5
    dets = (a1 * bb1 - c1**2).clamp(min=0) * (a2 * bb2 - c2**2).clamp(min=0)
    t3 = 0.5 * torch.log(det / (4 * dets.sqrt() + eps) + eps)
    bd = (t1 + t2 + t3).clamp(eps, 100.0)
    return 1 - (1 - torch.exp(-bd) + eps).sqrt()


PAIRS_PER_BLOCK = 1 << 22  # rotated_nms's overlaps at a time: probiou's dozen temporaries stay near 200 MB


def rotated_nms(boxes, scores, iou_thres):
    """Indices of the boxes (xywhr) kept, by descending score: a box goes when a higher-scoring box overlaps it by
    probiou > iou_thres, whether or not that box was kept itself (Ultralytics' rule for OBB, "fast NMS": no loop over
    the kept boxes, and a box is never kept beside a stronger one it overlaps).

    The overlaps of every pair are computed a block of rows at a time: the whole matrix at once was killed for
    memory (23 GB) at validation of an untrained DOTA8 model at conf 1e-4 (30000 boxes: 3.6 GB a temporary)."""
    order = scores.argsort(descending=True, stable=True)  # ties keep their order, as torchvision's NMS
    b = boxes[order]
    n = len(b)
    rows = max(1, PAIRS_PER_BLOCK // max(n, 1))
    later = torch.arange(n, device=b.device)
    dropped = torch.zeros(n, dtype=torch.bool, device=b.device)
    for i in range(0, n, rows):
        iou = probiou(b[i : i + rows, None], b[None])
        dropped |= ((iou > iou_thres) & (later[None] > later[i : i + rows, None])).any(0)
    return order[~dropped]


def _cross(a, b):
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points, poly, eps):
    """(..., P) whether each of the points (..., P, 2) lies in the convex polygon (..., 4, 2) (edge included)."""
    edges = poly.roll(-1, -2) - poly  # (..., 4, 2)
    orient = torch.sign(_cross(edges[..., 0, :], edges[..., 1, :]))[..., None, None]  # +1 or -1 per polygon
    rel = points[..., :, None, :] - poly[..., None, :, :]  # (..., P, 4, 2)
    return (_cross(edges[..., None, :, :], rel) * orient >= -eps).all(-1)


def _edge_crossings(p1, p2):
    """Where the edges of quadrilaterals p1 and p2 (..., 4, 2) cross: points (..., 16, 2) and which exist."""
    s1, s2 = p1.roll(-1, -2) - p1, p2.roll(-1, -2) - p2
    a, r = p1[..., :, None, :], s1[..., :, None, :]
    b, s = p2[..., None, :, :], s2[..., None, :, :]
    denom = _cross(r, s)
    ok = denom.abs() > 1e-12
    safe = torch.where(ok, denom, torch.ones_like(denom))
    t, u = _cross(b - a, s) / safe, _cross(b - a, r) / safe
    ok &= (t >= 0) & (t <= 1) & (u >= 0) & (u <= 1)
    pts = a + t[..., None] * r
    return pts.flatten(-3, -2), ok.flatten(-2)


def _area(poly):
    """Shoelace area of polygons (..., P, 2)."""
    return 0.5 * _cross(poly, poly.roll(-1, -2)).sum(-1).abs()


def polygon_iou(c1, c2, eps=1e-9):
    """Exact IoU of every pair of convex quadrilaterals: c1 (N, 4, 2), c2 (M, 4, 2) -> (N, M), in float64.

    Their intersection is convex, and its vertices are the corners of each inside the other plus the crossings of
    their edges; sorted by angle around their mean, the shoelace formula gives its area."""
    p1 = c1.double()[:, None].expand(-1, len(c2), -1, -1)
    p2 = c2.double()[None].expand(len(c1), -1, -1, -1)
    scale = max(float(p1.abs().max()) if p1.numel() else 1.0, 1.0)
    tol = 1e-9 * scale**2
    cross, cross_ok = _edge_crossings(p1, p2)
    pts = torch.cat((p1, p2, cross), -2)  # (N, M, 24, 2)
    ok = torch.cat((_inside(p1, p2, tol), _inside(p2, p1, tol), cross_ok), -1)
    n = ok.sum(-1, keepdim=True).clamp(min=1)
    centre = (pts * ok[..., None]).sum(-2) / n
    angle = torch.atan2(pts[..., 1] - centre[..., None, 1], pts[..., 0] - centre[..., None, 0])
    order = torch.where(ok, angle, torch.full_like(angle, 10.0)).argsort(-1)  # points that do not exist go last
    pts = pts.gather(-2, order[..., None].expand(-1, -1, -1, 2))
    ok = ok.gather(-1, order)
    pts = torch.where(ok[..., None], pts, pts[..., :1, :])  # ...and repeat the first: edges of length 0
    inter = torch.where(ok.sum(-1) >= 3, _area(pts), torch.zeros_like(pts[..., 0, 0]))
    union = _area(c1.double())[:, None] + _area(c2.double())[None] - inter
    return inter / (union + eps)
