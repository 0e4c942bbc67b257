"""Per-task label formats of YOLODataset: how the geometry of one label line is read, and what a sample and a
batch carry besides class and box.

A task gives the dataset its format (`YOLODataset(..., task=SegmentLabels(overlap=False))`, or a name in
FORMATS), and the dataset and the label checker never test which task they serve. A new task is one new class:
a pose format would read `cx cy w h` plus k keypoints in `parse` (returning the keypoints as the line's extra,
stored under its `extra_key`), and add them to the sample in `add_to_sample`; its keypoints must then also
travel through the augmentations in utils/data/augment.py, as polygons do.
"""

import numpy as np
import torch

from utils.data.augment import polygons_to_masks

COORD_TOL = 0.01  # coordinates this far outside [0, 1] are clipped (rounding in exporters), further is an error
MIN_AREA = 1e-9  # normalised polygon area below which it has no inside (a pixel of a 10000 px image is 1e-8)


class BadLine(ValueError):
    """A label line that cannot be trusted; the message says why."""


def _check_range(xy):
    """Raise BadLine for coordinates outside [0, 1] beyond the tolerance; True if some need clipping."""
    lo, hi = xy.min(), xy.max()
    if lo < -COORD_TOL or hi > 1 + COORD_TOL:
        raise BadLine(f"coordinates outside [0, 1] ({lo:.3g}..{hi:.3g})")
    return lo < 0 or hi > 1


def _xyxy_to_box(x1, y1, x2, y2):
    if x2 <= x1 or y2 <= y1:
        raise BadLine("zero-area box inside the image")
    return np.array([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], dtype=np.float32)


def parse_box(xy):
    """`cx cy w h` normalised -> (box xywhn (4,) clipped to the image, clipped?)."""
    clipped = _check_range(xy)
    cx, cy, w, h = xy
    if w <= 0 or h <= 0:
        raise BadLine("box width or height <= 0")
    corners = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    clipped = clipped or corners.min() < 0 or corners.max() > 1
    return _xyxy_to_box(*np.clip(corners, 0, 1)), clipped


def parse_polygon(xy):
    """`x1 y1 x2 y2 ...` normalised (>= 3 points) -> (box xywhn (4,), polygon (k, 2) float32, clipped?)."""
    if len(xy) < 6 or len(xy) % 2:
        raise BadLine(f"a polygon needs >= 3 x y pairs, got {len(xy)} coordinates")
    clipped = _check_range(xy)
    polygon = np.clip(xy.reshape(-1, 2), 0, 1)
    x, y = polygon.T
    if abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) < MIN_AREA * 2:  # shoelace: twice the area
        raise BadLine("zero-area polygon (its points lie on one line)")
    (x1, y1), (x2, y2) = polygon.min(0), polygon.max(0)
    return _xyxy_to_box(x1, y1, x2, y2), polygon.astype(np.float32), clipped


class DetectLabels:
    """Lines `cls cx cy w h` (a box) or `cls x1 y1 x2 y2 ...` (a polygon of >= 3 points; its box is used)."""

    name = "detect"
    extra_key = "segments"  # where a label record keeps the per-instance extras `parse` returns
    line_format = "box-or-polygon"  # formats that parse lines alike share the label cache

    def parse(self, xy):
        """Coordinates of one line (float64, after the class) -> (box xywhn, extra or None, clipped?)."""
        if len(xy) == 4:
            box, clipped = parse_box(xy)
            return box, None, clipped
        if len(xy) < 6 or len(xy) % 2:
            raise BadLine(f"{len(xy) + 1} values, expected 5 (cls cx cy w h) or cls + >= 3 x y pairs")
        return parse_polygon(xy)

    def finish(self, lb):
        """Keep outlines only when every instance has one: they then give better boxes under random perspective."""
        segs = lb["segments"]
        return dict(lb, segments=None if not segs or any(s is None for s in segs) else segs)

    def add_to_sample(self, sample, inst, shape):
        """Add this task's targets to `sample` for the augmented Instances `inst` of an image of `shape` (h, w);
        returns the Instances in the order those targets follow."""
        return inst

    def collate(self, batch, out):
        """Add this task's batch entries to the collated dict `out`."""


class SegmentLabels(DetectLabels):
    """Detection lines, each instance with an outline (a box-only line gets its rectangle); samples carry masks at
    1/mask_ratio resolution, as one overlap map per image (overlap=True) or one mask per instance."""

    name = "segment"

    def __init__(self, overlap=True, mask_ratio=4):
        self.overlap, self.mask_ratio = overlap, mask_ratio

    def finish(self, lb):
        segs = [s if s is not None else _box_polygon(b) for s, b in zip(lb["segments"], lb["bboxes"])]
        return dict(lb, segments=segs)

    def add_to_sample(self, sample, inst, shape):
        masks, order = polygons_to_masks(inst.segments, shape, self.mask_ratio, self.overlap)
        sample["masks"] = torch.from_numpy(masks)
        return inst.select(order)

    def collate(self, batch, out):
        """`masks`, and how to read them: `overlap` and `mask_ratio` travel with the batch, so no consumer guesses
        them from shapes."""
        masks = [b["masks"] for b in batch]
        out["overlap"], out["mask_ratio"] = self.overlap, self.mask_ratio
        if self.overlap:  # one map per image; >= 255 instances in one image need int32
            dtype = torch.int32 if any(m.dtype == torch.int32 for m in masks) else torch.uint8
            out["masks"] = torch.stack([m.to(dtype) for m in masks])
        else:
            out["masks"] = torch.cat(masks, 0)


def _box_polygon(box):
    """The rectangle of a normalised xywh box as a polygon: the mask of a label that has no outline."""
    cx, cy, w, h = box
    x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    return np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float32)


FORMATS = {"detect": DetectLabels, "segment": SegmentLabels}


def get_format(task):
    """A LabelFormat instance from an instance or a registered name."""
    if not isinstance(task, str):
        return task
    if task not in FORMATS:
        raise ValueError(f"task must be one of {sorted(FORMATS)} or a label format object, got {task!r}")
    return FORMATS[task]()
