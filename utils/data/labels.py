"""Verifying YOLO-format images and label files, and the `.cache` file that saves doing it twice.

A label line is `cls cx cy w h` (a box) or `cls x1 y1 x2 y2 ...` (a polygon of >= 3 points), normalised to
[0, 1]. Bad lines are dropped one by one and counted, so one typo does not cost a whole image's labels.
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from utils.data.image_files import files_hash, suffix
from utils.data.label_cache import load_cache, save_cache
from utils.loggers import LOGGER

CACHE_VERSION = "yolo-labels-1"
COORD_TOL = 0.01  # coordinates this far outside [0, 1] are clipped (rounding in exporters), further is an error
MAX_WARNINGS = 20  # per-file warnings printed per scan; the rest are only counted
STAT_KEYS = ("images", "backgrounds", "corrupt", "bad_lines", "bad_class", "duplicates")


def read_image(path):
    """BGR uint8 image (EXIF orientation applied by OpenCV), or None if it cannot be decoded."""
    try:
        return cv2.imread(str(path), cv2.IMREAD_COLOR)
    except cv2.error:
        return None


def verify_image(path):
    """(h, w) of a readable image, or raise ValueError saying what is wrong."""
    if not os.path.isfile(path):
        raise ValueError("image file missing")
    im = read_image(path)
    if im is None:
        raise ValueError("image cannot be decoded")
    h, w = im.shape[:2]
    if h < 10 or w < 10:
        raise ValueError(f"image size {w}x{h} is under 10 pixels")
    return h, w


def _jpeg_truncated(path):
    if suffix(path) not in ("jpg", "jpeg"):
        return False
    with open(path, "rb") as f:
        f.seek(-2, 2)
        return f.read() != b"\xff\xd9"


class _BadLine(Exception):
    def __init__(self, why, bad_class=False):
        super().__init__(why)
        self.bad_class = bad_class


def _parse_line(values, nc):
    """One label line -> (cls, box xywhn (4,), polygon (k, 2) or None); raises _BadLine saying why."""
    n = len(values)
    if n != 5 and (n < 7 or n % 2 == 0):
        raise _BadLine(f"{n} values, expected 5 (cls cx cy w h) or cls + >= 3 xy pairs")
    try:
        v = np.array([float(x) for x in values], dtype=np.float64)
    except ValueError:
        raise _BadLine("non-numeric value") from None
    if not np.isfinite(v).all():
        raise _BadLine("non-finite value")
    if v[0] < 0 or v[0] != math.floor(v[0]):
        raise _BadLine(f"class {values[0]} is not a non-negative integer")
    if nc is not None and v[0] >= nc:
        raise _BadLine(f"class {int(v[0])} >= nc {nc}", bad_class=True)
    xy = v[1:]
    if xy.min() < -COORD_TOL or xy.max() > 1 + COORD_TOL:
        raise _BadLine(f"coordinates outside [0, 1] ({xy.min():.3g}..{xy.max():.3g})")
    if n == 5:
        cx, cy, w, h = xy
        if w <= 0 or h <= 0:
            raise _BadLine("box width or height <= 0")
        x1, y1, x2, y2 = np.clip([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 0, 1)
        polygon = None
    else:
        polygon = np.clip(xy.reshape(-1, 2), 0, 1)
        (x1, y1), (x2, y2) = polygon.min(0), polygon.max(0)
    if x2 <= x1 or y2 <= y1:
        raise _BadLine("zero-area box inside the image")
    box = np.array([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], dtype=np.float32)
    return int(v[0]), box, None if polygon is None else polygon.astype(np.float32)


def _parse_labels(lb_file, nc):
    """Parse one label file -> (cls, boxes, segments, counts, problems)."""
    classes, boxes, segments, problems, seen = [], [], [], [], set()
    counts = {"bad_lines": 0, "bad_class": 0, "duplicates": 0}
    text = Path(lb_file).read_text(errors="replace") if os.path.isfile(lb_file) else ""
    for i, line in enumerate(text.splitlines(), 1):
        values = line.split()
        if not values:
            continue
        try:
            c, box, poly = _parse_line(values, nc)
        except _BadLine as e:
            counts["bad_class" if e.bad_class else "bad_lines"] += 1
            problems.append(f"line {i}: {e}")
            continue
        key = (c, *np.round(box, 6).tolist(), None if poly is None else np.round(poly, 6).tobytes())
        if key in seen:
            counts["duplicates"] += 1
            problems.append(f"line {i}: duplicate row removed")
            continue
        seen.add(key)
        classes.append(c)
        boxes.append(box)
        segments.append(poly)
    cls = np.array(classes, dtype=np.float32).reshape(-1, 1)
    return cls, np.array(boxes, dtype=np.float32).reshape(-1, 4), segments, counts, problems


def verify_image_label(im_file, lb_file, nc=None):
    """Check one image and its label file. Returns a record dict; `record['msg']` is '' or one warning line."""
    rec = {"im_file": im_file, "shape": None, "corrupt": 0, "bad_lines": 0, "bad_class": 0, "duplicates": 0, "msg": ""}
    try:
        rec["shape"] = verify_image(im_file)
    except (ValueError, OSError) as e:
        rec.update(corrupt=1, msg=f"{im_file}: skipped, {e}")
        return rec
    try:
        cls, boxes, segments, counts, problems = _parse_labels(lb_file, nc)
    except OSError as e:
        rec.update(corrupt=1, msg=f"{lb_file}: skipped, label file unreadable ({e})")
        return rec
    if _jpeg_truncated(im_file):
        problems.insert(0, "truncated JPEG (decoded as far as possible)")
    rec.update(counts, cls=cls, bboxes=boxes, segments=segments)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; ... {len(problems) - 5} more" if len(problems) > 5 else "")
        rec["msg"] = f"{lb_file}: {shown}"
    return rec


def _build(im_files, label_files, nc, workers):
    if len(im_files) >= 64 and workers > 1:
        with ThreadPoolExecutor(workers) as pool:  # OpenCV decodes outside the GIL
            records = list(pool.map(verify_image_label, im_files, label_files, [nc] * len(im_files)))
    else:
        records = [verify_image_label(f, lb, nc) for f, lb in zip(im_files, label_files)]
    stats = {k: 0 for k in STAT_KEYS}
    labels, msgs = [], []
    for r in records:
        for k in ("corrupt", "bad_lines", "bad_class", "duplicates"):
            stats[k] += r[k]
        if r["msg"]:
            msgs.append(r["msg"])
        if r["corrupt"]:
            continue
        stats["images"] += 1
        stats["backgrounds"] += len(r["cls"]) == 0
        labels.append({k: r[k] for k in ("im_file", "shape", "cls", "bboxes", "segments")})
    return labels, stats, msgs


def cache_labels(im_files, label_files, cache_path, nc=None, prefix="", workers=8):
    """Load the label cache or rebuild it; log one summary line plus warnings. Returns (labels, stats).

    `labels` is one dict per readable image: im_file, shape (h, w), cls (n, 1), bboxes (n, 4) xywhn and
    segments (list of n polygons (k, 2) normalised, None for box-only lines).
    """
    hash_ = files_hash(list(im_files) + list(label_files), extra=f"{CACHE_VERSION} nc={nc}")
    cache = load_cache(cache_path, hash_, prefix)
    cached = cache is not None
    if not cached:
        labels, stats, msgs = _build(im_files, label_files, nc, min(workers, os.cpu_count() or 1))
        cache = {"version": CACHE_VERSION, "hash": hash_, "labels": labels, "stats": stats, "msgs": msgs}
        save_cache(cache_path, cache, hash_, prefix)
    s = cache["stats"]
    where = Path(cache_path).with_suffix("")
    LOGGER.info(
        f"{prefix}Scanning {where}... {s['images']} images, {s['backgrounds']} backgrounds, {s['corrupt']} corrupt, "
        f"{s['bad_lines'] + s['bad_class']} bad label lines, {s['duplicates']} duplicates" + (" (cached)" if cached else "")
    )
    for m in cache["msgs"][:MAX_WARNINGS]:
        LOGGER.warning(f"{prefix}WARNING: {m}")
    if len(cache["msgs"]) > MAX_WARNINGS:
        LOGGER.warning(f"{prefix}WARNING: ... and {len(cache['msgs']) - MAX_WARNINGS} more files with problems")
    return cache["labels"], dict(s, cached=cached)
