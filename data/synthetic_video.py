"""A synthetic video with known ids, from the project's shapes generator (data/synthetic.py): shapes that move
at constant speed, bounce off the borders, cross each other and pass behind a pillar that hides them whole, over one
of the generator's backgrounds. What tracking is scored against (tests, benchmarks/track_synthetic.py).

`render_video` gives the frames and, per frame, every object's id, class, full box (xyxy, occluded parts included,
as MOT ground truth is) and visible share. `detections` turns that truth into what a detector would give, seeded:
boxes jittered, confidence falling with the visible share (a half-hidden object scores under the first
association's 0.25, ByteTrack's second association's business), hidden objects missed, and false positives.

With `spin` (radians a frame) the objects are rectangles that also turn, each at its own rate up to `spin`, and the
truth is their oriented box (xywhr), what an oriented-box (OBB) model would be scored against; its detections are an
OBB model's rows (xywh, conf, cls, angle) in the form it reports them (utils/rotated.regularize).
"""

import math

import cv2
import numpy as np
import torch

from data.synthetic import CLASS_NAMES, background, contrasting_color, shape_polygon
from utils.rotated import regularize

PILLAR = (0.45, 0.55)  # the occluding pillar's left and right edges, as shares of the width


def _objects(rng, n, h, w):
    """n shapes: class, outline about the origin, colour slot, start position and velocity (px per frame); the odd
    ones start on the right and move left, so paths cross."""
    objs = []
    for i in range(n):
        cls = int(rng.integers(0, len(CLASS_NAMES)))
        radius = rng.uniform(0.06, 0.1) * min(h, w)
        x = rng.uniform(0.05, 0.3) * w if i % 2 == 0 else rng.uniform(0.7, 0.95) * w
        y = rng.uniform(0.2, 0.8) * h
        speed = rng.uniform(2.0, 4.0) * (1 if i % 2 == 0 else -1)
        objs.append({"id": i + 1, "cls": cls, "poly": shape_polygon(cls, radius, rng), "pos": np.array([x, y]),
                     "vel": np.array([speed, rng.uniform(-1.0, 1.0)])})
    return objs


def _spinning(objs, rng, spin):
    """The objects as turning rectangles: the short side about the shape's radius, the long one 1.5-3 times it; an
    angle, and a turn a frame in [-spin, spin]."""
    for o in objs:
        short = np.abs(o["poly"]).max() * rng.uniform(0.8, 1.2)
        o["wh"] = np.array([short * rng.uniform(1.5, 3.0), short])
        o["angle"], o["spin"] = rng.uniform(0, math.pi), rng.uniform(-spin, spin)
        o["poly"] = np.array([[1, 1], [1, -1], [-1, -1], [-1, 1]]) * o["wh"] / 2
    return objs


def _outline(o):
    """The object's outline in the frame: its shape turned by its angle (if it turns) and moved to its position."""
    if "angle" not in o:
        return o["poly"] + o["pos"]
    c, s = math.cos(o["angle"]), math.sin(o["angle"])
    return o["poly"] @ np.array([[c, s], [-s, c]]) + o["pos"]


def render_video(seed=0, n_frames=90, size=(240, 320), n_objects=5, spin=None):
    """(frames: list of BGR uint8 (h, w, 3), truth: list per frame of (n, 7) arrays: id, cls, x1, y1, x2, y2,
    visible share; with `spin`, (n, 8): id, cls, x, y, w, h, angle, visible share)."""
    rng = np.random.default_rng(seed)
    h, w = size
    bg, base = background(rng, h, w)
    colours = [contrasting_color(rng, base) for _ in range(n_objects)]
    pillar_colour = contrasting_color(rng, base, min_dist=60)
    objs = _objects(rng, n_objects, h, w)
    if spin is not None:
        objs = _spinning(objs, rng, spin)
    x0, x1 = int(PILLAR[0] * w), int(PILLAR[1] * w)
    frames, truth = [], []
    for _ in range(n_frames):
        im, rows = bg.copy(), []
        seen = np.zeros((h, w), np.int32)  # which object a pixel shows (0: none)
        for k, o in enumerate(objs):
            poly = _outline(o)
            pts = np.round(poly).astype(np.int32)
            cv2.fillPoly(im, [pts], colours[k], lineType=cv2.LINE_AA)
            cv2.fillPoly(seen, [pts], o["id"])
        im[:, x0:x1] = pillar_colour  # in front of everything
        seen[:, x0:x1] = 0
        for o in objs:
            poly = _outline(o)
            area = max(cv2.contourArea(poly.astype(np.float32)), 1.0)
            box = np.r_[poly.min(0).clip(0, [w - 1, h - 1]), poly.max(0).clip(0, [w - 1, h - 1])]
            if "angle" in o:
                box = np.r_[o["pos"], o["wh"], o["angle"]]
            rows.append([o["id"], o["cls"], *box, min(1.0, (seen == o["id"]).sum() / area)])
        frames.append(im)
        truth.append(np.array(rows, dtype=np.float64))
        for o in objs:  # move (and turn), bouncing off the borders
            o["pos"] = o["pos"] + o["vel"]
            if "angle" in o:
                o["angle"] += o["spin"]
            lo, hi = _outline(o).min(0), _outline(o).max(0)
            for a, limit in ((0, w), (1, h)):
                if lo[a] < 0 or hi[a] > limit - 1:
                    o["vel"][a] = -o["vel"][a]
    return frames, truth


def detections(truth, seed=0, false_rate=0.3, jitter=0.03, size=(240, 320)):
    """Per frame (n, 6) detections: x1, y1, x2, y2, conf, cls from the truth: an object under 30% visible is missed;
    the confidence is 0.9 x its visible share plus noise (under 0.25 below about a quarter to a half visible);
    `false_rate` false positives a frame on average, at 0.1-0.35. Of a spinning video's truth, (n, 7) oriented rows
    x, y, w, h, conf, cls, angle: the centre and sides jittered by `jitter` of the sides, the angle by 0.03 rad."""
    rng = np.random.default_rng(seed + 1)
    rotated = bool(len(truth)) and truth[0].shape[1] == 8
    out = []
    for t in truth:
        rows = []
        for _, cls, *box, vis in t:
            if vis < 0.3:
                continue
            b = _jittered(box, rng, jitter)
            conf = float(np.clip(0.9 * vis ** 1.5 + rng.normal(0, 0.03), 0.11, 0.99))
            rows.append([*b[:4], conf, cls, *b[4:]])
        for _ in range(rng.poisson(false_rate)):
            x, y = rng.uniform(0, size[1] - 40), rng.uniform(0, size[0] - 40)
            w, h, conf, cls = rng.uniform(10, 40), rng.uniform(10, 40), rng.uniform(0.1, 0.35), int(rng.integers(0, 3))
            rows.append([x, y, x + w, y + h, conf, cls] if not rotated else
                        [x + w / 2, y + h / 2, w, h, conf, cls, rng.uniform(0, math.pi)])
        out.append(_reported(np.array(rows, dtype=np.float64).reshape(-1, 7 if rotated else 6)))
    return out


def _jittered(box, rng, jitter):
    """The true box (xyxy, or xywhr) moved by `jitter` of its sides (an oriented one's angle by 0.03 rad)."""
    if len(box) == 4:
        x1, y1, x2, y2 = box
        return np.array(box) + rng.normal(0, jitter, 4) * np.array([x2 - x1, y2 - y1, x2 - x1, y2 - y1])
    x, y, w, h, r = box
    return np.r_[np.array([x, y, w, h]) + rng.normal(0, jitter, 4) * np.array([w, h, w, h]), r + rng.normal(0, 0.03)]


def _reported(rows):
    """Oriented rows as an OBB model reports them: angle in [0, pi/2), w and h swapped where that turned the box."""
    if rows.shape[1] == 6 or not len(rows):
        return rows
    rb = regularize(torch.from_numpy(np.c_[rows[:, :4], rows[:, 6]])).numpy()
    return np.c_[rb[:, :4], rows[:, 4:6], rb[:, 4]]


def write_video(frames, path, fps=30):
    """The frames as an mp4 (what the predict scripts read as a video)."""
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    for f in frames:
        writer.write(f)
    writer.release()
    return path
