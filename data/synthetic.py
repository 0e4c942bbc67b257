"""Synthetic 'shapes' datasets: the project's embedded default data, generated deterministically from a seed.

Each image has a textured, noisy background and 1-8 filled shapes (circle, rectangle, triangle) in colours that
contrast with it. Every shape is drawn as the exact polygon that is written to its label, in label order, so a
later shape lies on top of an earlier one; placements that would hide more than 40% of an earlier shape are
rejected so that every labelled object stays mostly visible.

Layouts written (YOLO format, coordinates normalised to the image size):
    detect:   images/{train,val}/*.jpg + labels/{train,val}/*.txt with `cls cx cy w h`
    segment:  the same, labels `cls x1 y1 x2 y2 ...` (the shape's outline)
    pose:     rectangles only (class 0), labels `0 cx cy w h` + 4 corner keypoints `x y v`, in the rectangle's own
              order before its rotation (top-left, top-right, bottom-right, bottom-left: a left-right mirror swaps
              0 <-> 1 and 2 <-> 3, so flip_idx is [1, 0, 3, 2]); v is 2 where the corner is seen, 0 where a later shape
              covers it
    obb:      the detect images, labels `cls x1 y1 x2 y2 x3 y3 x4 y4` (DOTA's corners, Ultralytics' OBB labels): a
              rectangle's own corners (upright or turned up to 45 degrees), a triangle's minimum-area rectangle, a
              circle's axis-aligned square (a circle has no angle to learn); corners clipped to the image
    classify: {train,val}/<class>/*.jpg, one centred-ish shape per image

CLI:
    python -m data.synthetic --task detect --out ../datasets/shapes --n-train 256 --n-val 64 --seed 0
"""

import argparse
import math
import multiprocessing
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import cv2
import numpy as np

from utils.budget import SYNTHETIC_FILE_PIXELS
from utils.files import is_published, publish
from utils.tasks import TASKS

CLASS_NAMES = ("circle", "rectangle", "triangle")
POSE_CLASS = CLASS_NAMES.index("rectangle")  # the one shape with 4 named corners
POSE_FLIP_IDX = (1, 0, 3, 2)
SPLITS = ("train", "val")
MAX_HIDDEN = 0.4  # the largest share of an earlier shape's visible pixels a new shape may cover
_SHIFT = 4  # fillPoly fixed-point bits: vertices are drawn with 1/16 px precision
_JPEG = [cv2.IMWRITE_JPEG_QUALITY, 92]


@dataclass
class Shape:
    cls: int
    polygon: np.ndarray  # (k, 2) float32 pixel coordinates (x, y), the outline exactly as drawn
    color: tuple  # BGR


def shape_polygon(cls, radius, rng):
    """Outline of a shape of class `cls` centred on the origin, about `radius` pixels from centre to edge."""
    name = CLASS_NAMES[cls]
    if name == "circle":
        t = np.linspace(0, 2 * math.pi, 48, endpoint=False)
        return np.stack([np.cos(t), np.sin(t)], 1) * radius
    if name == "rectangle":
        aspect = rng.uniform(0.45, 1.0)
        w, h = radius, radius * aspect
        if rng.random() < 0.5:
            w, h = h, w
        corners = np.array([[-w, -h], [w, -h], [w, h], [-w, h]], dtype=np.float64)
        angle = 0.0 if rng.random() < 0.5 else rng.uniform(-math.pi / 4, math.pi / 4)
        return corners @ _rotation(angle).T
    # triangle: three vertices spread around the centre, jittered so that no angle gets degenerate
    t = rng.uniform(0, 2 * math.pi) + np.array([0.0, 2.0, 4.0]) * math.pi / 3 + rng.uniform(-0.4, 0.4, 3)
    r = radius * rng.uniform(0.8, 1.15, 3)
    return np.stack([np.cos(t) * r, np.sin(t) * r], 1)


def _rotation(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s], [s, c]])


def background(rng, height, width):
    """A smooth colour field plus a gradient, a few thin lines and pixel noise (BGR uint8)."""
    base = rng.uniform(40, 215, 3)
    coarse = rng.normal(0, 18, (int(rng.integers(2, 6)), int(rng.integers(2, 6)), 3)).astype(np.float32)
    field = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    ramp = np.linspace(-1, 1, width, dtype=np.float32)[None, :, None] * rng.uniform(-15, 15, 3).astype(np.float32)
    img = base.astype(np.float32) + field + ramp
    for _ in range(int(rng.integers(0, 5))):
        p1 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        p2 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        cv2.line(img, p1, p2, (base + rng.uniform(-30, 30, 3)).tolist(), 1, cv2.LINE_AA)
    img += rng.normal(0, rng.uniform(3, 8), (height, width, 1)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8), base


def contrasting_color(rng, base, min_dist=130.0):
    """A random BGR colour at least `min_dist` (Euclidean) from the background's base colour."""
    for _ in range(100):
        c = rng.uniform(0, 255, 3)
        if np.linalg.norm(c - base) >= min_dist:
            return tuple(int(v) for v in c)
    return tuple(int(v) for v in 255 - base)


def _fill(canvas, polygon, value, line_type=cv2.LINE_AA):
    pts = np.round(polygon * (1 << _SHIFT)).astype(np.int32)
    cv2.fillPoly(canvas, [pts], value, lineType=line_type, shift=_SHIFT)


def _place(rng, cls, height, width, radius):
    """Outline of class `cls` translated to a random spot fully inside the image, or None if it cannot fit."""
    poly = shape_polygon(cls, radius, rng)
    lo, hi = poly.min(0), poly.max(0)
    span_x, span_y = (width - 1) - (hi[0] - lo[0]), (height - 1) - (hi[1] - lo[1])
    if span_x <= 0 or span_y <= 0:
        return None
    offset = np.array([rng.uniform(0, span_x), rng.uniform(0, span_y)]) - lo
    return (poly + offset).astype(np.float32)


def render_image(rng, height, width, max_objects=8, size_range=(0.06, 0.22), classes=None):
    """Draw one detection/segmentation image of shapes of `classes` (default: all); returns (image BGR, background
    BGR, list[Shape])."""
    img, base = background(rng, height, width)
    bg = img.copy()
    owner = np.zeros((height, width), np.int32)  # 1-based index of the shape visible at each pixel
    visible = []  # visible pixel count per shape
    shapes = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            cls = int(rng.integers(len(CLASS_NAMES))) if classes is None else int(rng.choice(classes))
            radius = max(6.0, rng.uniform(*size_range) * min(height, width))
            poly = _place(rng, cls, height, width, radius)
            if poly is None:
                continue
            cover = np.zeros((height, width), np.uint8)
            _fill(cover, poly, 1, cv2.LINE_8)
            hidden = np.bincount(owner[cover > 0], minlength=len(shapes) + 1)[1:]
            if all(hidden[i] <= MAX_HIDDEN * visible[i] for i in range(len(shapes))):
                break
        else:
            continue
        for i in range(len(shapes)):
            visible[i] -= hidden[i]
        shapes.append(Shape(cls, poly, contrasting_color(rng, base)))
        owner[cover > 0] = len(shapes)
        visible.append(int(cover.sum()))
        _fill(img, poly, shapes[-1].color)
    return img, bg, shapes


def render_classification_image(rng, cls, size):
    """One square image of side `size` with a single shape of class `cls` near the centre."""
    img, base = background(rng, size, size)
    radius = size * rng.uniform(0.22, 0.36)
    poly = shape_polygon(cls, radius, rng) + size / 2 + rng.uniform(-0.08, 0.08, 2) * size
    _fill(img, poly.astype(np.float32), contrasting_color(rng, base))
    return img


def corner_visibility(shapes, height, width, inset=0.15):
    """Per shape, 2 for each polygon vertex that is seen and 0 for one a later shape covers. A vertex is judged a
    little inside its own shape (`inset` of the way to the centre): the exact corner pixel is shared with the
    background by anti-aliasing."""
    owner = np.zeros((height, width), np.int32)
    for i, s in enumerate(shapes, 1):
        _fill(owner, s.polygon, i, cv2.LINE_8)
    out = []
    for i, s in enumerate(shapes, 1):
        probe = s.polygon + inset * (s.polygon.mean(0) - s.polygon)
        x = np.clip(np.round(probe[:, 0]).astype(int), 0, width - 1)
        y = np.clip(np.round(probe[:, 1]).astype(int), 0, height - 1)
        out.append(np.where(owner[y, x] == i, 2, 0))
    return out


def _pose_lines(shapes, height, width):
    scale = np.array([width, height], np.float32)
    lines = []
    for s, vis in zip(shapes, corner_visibility(shapes, height, width)):
        pts = np.clip(s.polygon / scale, 0, 1)
        (x1, y1), (x2, y2) = pts.min(0), pts.max(0)
        kpts = " ".join(f"{x:.6f} {y:.6f} {v}" for (x, y), v in zip(pts, vis))
        lines.append(f"0 {(x1 + x2) / 2:.6f} {(y1 + y2) / 2:.6f} {x2 - x1:.6f} {y2 - y1:.6f} {kpts}")
    return lines


def _obb_lines(shapes, height, width):
    scale = np.array([width, height], np.float32)
    lines = []
    for s in shapes:
        if CLASS_NAMES[s.cls] == "circle":
            (x1, y1), (x2, y2) = s.polygon.min(0), s.polygon.max(0)
            corners = np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]])
        else:
            corners = cv2.boxPoints(cv2.minAreaRect(s.polygon))
        pts = np.clip(corners / scale, 0, 1)
        lines.append(f"{s.cls} " + " ".join(f"{v:.6f}" for v in pts.reshape(-1)))
    return lines


def _label_lines(shapes, height, width, task):
    if task == "pose":
        return _pose_lines(shapes, height, width)
    if task == "obb":
        return _obb_lines(shapes, height, width)
    scale = np.array([width, height], np.float32)
    lines = []
    for s in shapes:
        pts = np.clip(s.polygon / scale, 0, 1)
        if task == "segment":
            lines.append(f"{s.cls} " + " ".join(f"{v:.6f}" for v in pts.reshape(-1)))
        else:
            (x1, y1), (x2, y2) = pts.min(0), pts.max(0)
            lines.append(f"{s.cls} {(x1 + x2) / 2:.6f} {(y1 + y2) / 2:.6f} {x2 - x1:.6f} {y2 - y1:.6f}")
    return lines


def image_rng(seed, split, index, cls=None):
    """The generator used for one image, so that any single image can be re-rendered on its own."""
    key = [seed, SPLITS.index(split), index] if cls is None else [seed, SPLITS.index(split), cls, index]
    return np.random.default_rng(key)


def render_sample(seed, split, index, min_side=256, max_side=480, max_objects=8, task="detect"):
    """Image `index` of a split exactly as generate_dataset draws it: (image, background, list[Shape])."""
    rng = image_rng(seed, split, index)
    h, w = (int(v) for v in rng.integers(min_side, max_side + 1, 2))
    return render_image(rng, h, w, max_objects, classes=(POSE_CLASS,) if task == "pose" else None)


def _write_detection_sample(root, split, i, seed, task, min_side, max_side, max_objects):
    img, _, shapes = render_sample(seed, split, i, min_side, max_side, max_objects, task)
    h, w = img.shape[:2]
    cv2.imwrite(str(root / "images" / split / f"{i:05d}.jpg"), img, _JPEG)
    text = "\n".join(_label_lines(shapes, h, w, task)) + "\n"
    (root / "labels" / split / f"{i:05d}.txt").write_text(text)


# a spawned worker imports the project first (seconds; 12 s on a loaded 2-core CPU): each must have this many images
IMAGES_PER_WORKER = 50


def _write_detection_split(root, split, n, seed, task, min_side, max_side, max_objects, workers=1):
    """Every image draws from its own generator (image_rng), so a pool of processes writes the same bytes as one."""
    (root / "images" / split).mkdir(parents=True)
    (root / "labels" / split).mkdir(parents=True)
    write = partial(_write_detection_sample, root, split, seed=seed, task=task, min_side=min_side,
                    max_side=max_side, max_objects=max_objects)
    workers = min(workers, n // IMAGES_PER_WORKER)
    if workers <= 1:
        for i in range(n):
            write(i)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in pool.imap_unordered(write, range(n), chunksize=8):
            pass


def _write_classification_split(root, split, n_per_class, seed, min_side, max_side):
    for cls, name in enumerate(CLASS_NAMES):
        folder = root / split / name
        folder.mkdir(parents=True)
        for i in range(n_per_class):
            rng = image_rng(seed, split, i, cls)
            img = render_classification_image(rng, cls, int(rng.integers(min_side, max_side + 1)))
            cv2.imwrite(str(folder / f"{i:05d}.jpg"), img, _JPEG)


def sides(task, min_side=None, max_side=None):
    """The (smallest, largest) image side generate_dataset draws for `task`: the given ones, else its defaults."""
    default_sides = (96, 128) if task == "classify" else (256, 480)
    return min_side or default_sides[0], max_side or default_sides[1]


def dataset_pixels(task="detect", n_train=256, n_val=64, seed=0, min_side=None, max_side=None, max_objects=8):
    """What a generate_dataset call costs, in pixels' worth (utils/budget.MAX_SYNTHETIC_PIXELS): each image the
    square of its largest side plus SYNTHETIC_FILE_PIXELS (writing its files), three images a count for classify
    (one per class); the time of each grows with its shapes too, which MAX_SYNTHETIC_OBJECTS bounds."""
    per_count = len(CLASS_NAMES) if task == "classify" else 1
    return (n_train + n_val) * per_count * (sides(task, min_side, max_side)[1] ** 2 + SYNTHETIC_FILE_PIXELS)


def generate_dataset(out, task="detect", n_train=256, n_val=64, seed=0, min_side=None, max_side=None, max_objects=8,
                     workers=1):
    """Write a shapes dataset to `out` and return its Path.

    Counts are images per split (detect/segment) or images per class and split (classify). Side lengths default
    to 256-480 px (96-128 px for classify). The data is written to a temporary sibling folder and published with one
    rename (utils.files.publish), so an interrupted run never leaves a half-written dataset at `out`, and processes
    on several machines generating the same folder at once end with one copy. An existing non-empty `out` is an
    error when this call starts; one that another process publishes while this call runs is used as it is.
    `workers` > 1 draws detection/segmentation images in that many processes, with the same result.
    """
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task '{task}', expected one of {TASKS}")
    out = Path(out)
    if is_published(out):
        raise FileExistsError(f"{out} already exists and is not empty; not overwriting it")
    min_side, max_side = sides(task, min_side, max_side)
    if not 16 <= min_side <= max_side:
        raise ValueError(f"need 16 <= min_side <= max_side, got {min_side}, {max_side}")

    def build(tmp):
        for split, n in zip(SPLITS, (n_train, n_val)):
            if task == "classify":
                _write_classification_split(tmp, split, n, seed, min_side, max_side)
            else:
                _write_detection_split(tmp, split, n, seed, task, min_side, max_side, max_objects, workers)

    publish(out, build)
    return out


def parse_opt(argv=None):
    p = argparse.ArgumentParser(description="Generate a synthetic shapes dataset")
    p.add_argument("--task", choices=TASKS, default="detect")
    p.add_argument("--out", required=True, help="dataset folder to create")
    p.add_argument("--n-train", type=int, default=None, help="train images (per class for classify)")
    p.add_argument("--n-val", type=int, default=None, help="val images (per class for classify)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-side", type=int, default=None, help="smallest image side in pixels")
    p.add_argument("--max-side", type=int, default=None, help="largest image side in pixels")
    p.add_argument("--workers", type=int, default=1, help="processes drawing images (detect/segment)")
    return p.parse_args(argv)


def main(argv=None):
    opt = parse_opt(argv)
    counts = (50, 20) if opt.task == "classify" else (256, 64)
    n_train = counts[0] if opt.n_train is None else opt.n_train
    n_val = counts[1] if opt.n_val is None else opt.n_val
    out = generate_dataset(opt.out, opt.task, n_train, n_val, opt.seed, opt.min_side, opt.max_side,
                           workers=opt.workers)
    print(f"wrote {opt.task} shapes dataset to {out}")


if __name__ == "__main__":
    main()
