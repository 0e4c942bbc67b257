"""A synthetic video with known ids, from the project's shapes generator (data/synthetic.py): shapes that move
at constant speed, bounce off the borders, cross each other and pass behind a pillar that hides them whole, over one
of the generator's backgrounds. What tracking is scored against (tests, benchmarks/track_synthetic.py).

`render_video` gives the frames and, per frame, every object's id, class, full box (xyxy, occluded parts included,
as MOT ground truth is) and visible share. `detections` turns that truth into what a detector would give, seeded:
boxes jittered, confidence falling with the visible share (a half-hidden object scores under the first
association's 0.25, ByteTrack's second association's business), hidden objects missed, and false positives.
"""

import cv2
import numpy as np

from data.synthetic import CLASS_NAMES, background, contrasting_color, shape_polygon

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


def render_video(seed=0, n_frames=90, size=(240, 320), n_objects=5):
    """(frames: list of BGR uint8 (h, w, 3), truth: list per frame of (n, 7) arrays: id, cls, x1, y1, x2, y2,
    visible share)."""
    rng = np.random.default_rng(seed)
    h, w = size
    bg, base = background(rng, h, w)
    colours = [contrasting_color(rng, base) for _ in range(n_objects)]
    pillar_colour = contrasting_color(rng, base, min_dist=60)
    objs = _objects(rng, n_objects, h, w)
    x0, x1 = int(PILLAR[0] * w), int(PILLAR[1] * w)
    frames, truth = [], []
    for _ in range(n_frames):
        im, rows = bg.copy(), []
        seen = np.zeros((h, w), np.int32)  # which object a pixel shows (0: none)
        for k, o in enumerate(objs):
            poly = o["poly"] + o["pos"]
            pts = np.round(poly).astype(np.int32)
            cv2.fillPoly(im, [pts], colours[k], lineType=cv2.LINE_AA)
            cv2.fillPoly(seen, [pts], o["id"])
        im[:, x0:x1] = pillar_colour  # in front of everything
        seen[:, x0:x1] = 0
        for o in objs:
            poly = o["poly"] + o["pos"]
            area = max(cv2.contourArea(poly.astype(np.float32)), 1.0)
            box = np.r_[poly.min(0).clip(0, [w - 1, h - 1]), poly.max(0).clip(0, [w - 1, h - 1])]
            rows.append([o["id"], o["cls"], *box, min(1.0, (seen == o["id"]).sum() / area)])
        frames.append(im)
        truth.append(np.array(rows, dtype=np.float64))
        for o in objs:  # move, bouncing off the borders
            o["pos"] = o["pos"] + o["vel"]
            lo, hi = (o["poly"] + o["pos"]).min(0), (o["poly"] + o["pos"]).max(0)
            for a, limit in ((0, w), (1, h)):
                if lo[a] < 0 or hi[a] > limit - 1:
                    o["vel"][a] = -o["vel"][a]
    return frames, truth


def detections(truth, seed=0, false_rate=0.3, jitter=0.03, size=(240, 320)):
    """Per frame (n, 6) detections: x1, y1, x2, y2, conf, cls from the truth: an object under 30% visible is missed;
    the confidence is 0.9 x its visible share plus noise (under 0.25 below about a quarter to a half visible);
    `false_rate` false positives a frame on average, at 0.1-0.35."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for t in truth:
        rows = []
        for _, cls, x1, y1, x2, y2, vis in t:
            if vis < 0.3:
                continue
            s = np.array([x2 - x1, y2 - y1, x2 - x1, y2 - y1])
            box = np.array([x1, y1, x2, y2]) + rng.normal(0, jitter, 4) * s
            rows.append([*box, float(np.clip(0.9 * vis ** 1.5 + rng.normal(0, 0.03), 0.11, 0.99)), cls])
        for _ in range(rng.poisson(false_rate)):
            x, y = rng.uniform(0, size[1] - 40), rng.uniform(0, size[0] - 40)
            rows.append([x, y, x + rng.uniform(10, 40), y + rng.uniform(10, 40), rng.uniform(0.1, 0.35),
                         int(rng.integers(0, 3))])
        out.append(np.array(rows, dtype=np.float64).reshape(-1, 6))
    return out


def write_video(frames, path, fps=30):
    """The frames as an mp4 (what the predict scripts read as a video)."""
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    for f in frames:
        writer.write(f)
    writer.release()
    return path
