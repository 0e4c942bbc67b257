"""Per-task label formats of YOLODataset: how the geometry of one label line is read, and what a sample and a
batch carry besides class and box.

A task gives the dataset its format (`YOLODataset(..., task=SegmentLabels(overlap=False))`, or a name in
FORMATS), and the dataset and the label checker never test which task they serve. A new task is one new class, as
`PoseLabels`: it reads `cx cy w h` plus K keypoints in `parse` (returning the keypoints as the line's extra, stored
under its `extra_key`), adds them to the sample in `add_to_sample` (the batch's `Targets` collect them,
data/targets.py); its keypoints travel through the augmentations in data/augment.py as `Instances.keypoints`, and a
left-right flip renames them by the format's `flip_idx`.
"""

import cv2
import numpy as np
import torch

from data.augment import polygons_to_masks
from data.targets import BoundingBoxes
from utils.ops import xyxy2xywhn
from utils.rotated import corners_to_xywhr

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


def _zero_area_reason(polygon):
    """Why the signed area of a polygon (k, 2) is (near) zero: its points lie on one line, or its outline crosses
    itself so that loops going round in opposite directions cancel (a bow-tie)."""
    d = polygon - polygon[0]
    far = d[np.argmax((d**2).sum(1))]  # the point farthest from the first: with it, the line the points would lie on
    # on that line, every point's triangle with the first and the farthest point has no area (the cross product is
    # twice that area)
    if np.abs(far[0] * d[:, 1] - far[1] * d[:, 0]).max() < MIN_AREA * 2:
        return "zero-area polygon (its points lie on one line)"
    return "polygon of zero net area (its outline crosses itself, so the areas of its loops cancel)"


def parse_polygon(xy):
    """`x1 y1 x2 y2 ...` normalised (>= 3 points) -> (box xywhn (4,), polygon (k, 2) float32, clipped?)."""
    if len(xy) < 6 or len(xy) % 2:
        raise BadLine(f"a polygon needs >= 3 x y pairs, got {len(xy)} coordinates")
    clipped = _check_range(xy)
    polygon = np.clip(xy.reshape(-1, 2), 0, 1)
    x, y = polygon.T
    if abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) < MIN_AREA * 2:  # shoelace: twice the area
        raise BadLine(_zero_area_reason(polygon))
    (x1, y1), (x2, y2) = polygon.min(0), polygon.max(0)
    return _xyxy_to_box(x1, y1, x2, y2), polygon.astype(np.float32), clipped


def _inside(v, tol):
    """Whether every value lies in [0, 1] within `tol`, and which (per-value) need clipping."""
    return (v >= -tol).all() and (v <= 1 + tol).all(), (v < 0) | (v > 1)


def plain_boxes(v):
    """Boxes `cx cy w h` (n, 4) float64 -> (their xywhn float32, which were clipped) as parse_box gives them (the
    same float64 operations, so bit-identical); None where parse_box refuses any (it then says why, line by line)."""
    ok, outside = _inside(v, COORD_TOL)
    cx, cy, w, h = v.T
    corners = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    x1, y1, x2, y2 = np.clip(corners, 0, 1)
    if not (ok and (w > 0).all() and (h > 0).all() and (x2 > x1).all() and (y2 > y1).all()):
        return None
    clipped = outside.any(1) | ((corners < 0) | (corners > 1)).any(0)
    return np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], 1).astype(np.float32), clipped


def plain_polygons(coords, widths, tol=COORD_TOL):
    """Polygons given as rows of `widths` (even, >= 6) coordinates concatenated in `coords` (float64) -> (boxes
    xywhn float32 (n, 4), outlines [(k, 2) float32], which were clipped) as parse_polygon gives them; None where it
    refuses any (it then names it). The area here sums in another order than parse_polygon's, so a polygon within
    twice the threshold is left to it."""
    ok, outside = _inside(coords, tol)
    if not ok:
        return None
    points = np.clip(coords, 0, 1).reshape(-1, 2)
    ends = np.cumsum(widths // 2)
    starts = ends - widths // 2
    following = np.arange(1, len(points) + 1)
    following[ends - 1] = starts  # each polygon's last point closes on its first
    x, y = points.T
    twice_area = np.add.reduceat(x * y[following] - y * x[following], starts)
    (x1, y1), (x2, y2) = np.minimum.reduceat(points, starts).T, np.maximum.reduceat(points, starts).T
    if (np.abs(twice_area) < MIN_AREA * 4).any() or (x2 <= x1).any() or (y2 <= y1).any():
        return None
    boxes = np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], 1).astype(np.float32)
    clipped = np.logical_or.reduceat(outside, 2 * starts)
    return boxes, np.split(points.astype(np.float32), starts[1:]), clipped


class DetectLabels:
    """Lines `cls cx cy w h` (a box) or `cls x1 y1 x2 y2 ...` (a polygon of >= 3 points; its box is used)."""

    name = "detect"
    extra_key = "segments"  # where a label record keeps the per-instance extras `parse` returns
    line_format = "box-or-polygon"  # formats that parse lines alike share the label cache
    flip_idx = None  # the keypoint order after a left-right flip (pose)
    coco_prefixes = ("instances",)  # the COCO files (<prefix>_<split>.json) that hold this format's labels

    def line(self, box, polygon, keypoints):
        """The values after the class of this format's line for an object given as geometry (data/annotations:
        box xywhn, outline (k, 2) normalised or None, keypoints (K, 3) normalised or None): its box, the annotated one
        (COCO's `bbox`, what its evaluation scores)."""
        return box

    def parse(self, xy):
        """Coordinates of one line (float64, after the class) -> (box xywhn, extra or None, clipped?)."""
        if len(xy) == 4:
            box, clipped = parse_box(xy)
            return box, None, clipped
        if len(xy) < 6 or len(xy) % 2:
            raise BadLine(f"{len(xy) + 1} values, expected 5 (cls cx cy w h) or cls + >= 3 x y pairs")
        return parse_polygon(xy)

    def parse_plain(self, coords, widths):
        """The lines of a whole label file at once (data/labels._plain_rows): their coordinates after the class,
        concatenated (float64), and how many each line has -> (boxes xywhn float32 (n, 4), extras, which were
        clipped), equal to what `parse` gives line by line; None where `parse` would refuse any line, which is then
        read line by line and named."""
        boxed = widths == 4
        if boxed.all():
            found = plain_boxes(coords.reshape(-1, 4))
            return None if found is None else (found[0], [None] * len(widths), found[1])
        if not (boxed | ((widths >= 6) & (widths % 2 == 0))).all():
            return None
        per_value = np.repeat(boxed, widths)
        boxes, clipped = np.empty((len(widths), 4), np.float32), np.empty(len(widths), bool)
        extras = [None] * len(widths)
        if boxed.any():
            found = plain_boxes(coords[per_value].reshape(-1, 4))
            if found is None:
                return None
            boxes[boxed], clipped[boxed] = found
        if not boxed.all():
            found = plain_polygons(coords[~per_value], widths[~boxed])
            if found is None:
                return None
            boxes[~boxed], clipped[~boxed] = found[0], found[2]
            for i, outline in zip(np.flatnonzero(~boxed), found[1]):
                extras[i] = outline
        return boxes, extras, clipped

    extra_width = 2  # values per row of one instance's extra: polygon points (x, y)

    def finish_packed(self, packed):
        """The LabelStore fields this format makes of a packed scan (data/label_store.pack_records). Here:
        an image keeps its outlines only when every one of its instances has one (they then give better boxes under
        random perspective); the others have none."""
        counts = np.diff(packed["inst"])
        has = packed["has_extra"]
        outlined = np.bincount(np.repeat(np.arange(len(counts)), counts), weights=has, minlength=len(counts))
        keep_image = (outlined == counts) & (counts > 0)
        keep = np.repeat(keep_image, counts) & has
        lengths = np.where(keep, np.diff(packed["extra_ends"]), 0)
        return {"has_segments": keep_image, "seg_ends": _offsets(lengths),
                "points": packed["extra"][np.repeat(keep, np.diff(packed["extra_ends"]))]}

    def add_to_sample(self, sample, inst, shape):
        """Add this task's targets to `sample` for the augmented Instances `inst` of an image of `shape` (h, w);
        returns the Instances in the order those targets follow."""
        return inst

    def boxes(self, inst, shape):
        """The boxes of the augmented Instances `inst` on the sample's canvas `shape` (h, w), as the batch's targets
        carry them: upright cxcywh, normalised (clipped to the image)."""
        h, w = shape
        xywhn = xyxy2xywhn(inst.boxes, w, h, clip=True, eps=1e-3).astype(np.float32)
        return BoundingBoxes(torch.from_numpy(xywhn), "cxcywh", shape, normalized=True)

    def collate(self, batch, out):
        """Add this task's batch entries to the collated dict `out`."""


class SegmentLabels(DetectLabels):
    """Detection lines, each instance with an outline (a box-only line gets its rectangle); samples carry masks at
    1/mask_ratio resolution, as one overlap map per image (overlap=True) or one mask per instance."""

    name = "segment"

    def __init__(self, overlap=True, mask_ratio=4):
        self.overlap, self.mask_ratio = overlap, mask_ratio

    def line(self, box, polygon, keypoints):
        """Its outline where it has one, else its box (its mask is then the box)."""
        return box if polygon is None else np.asarray(polygon).reshape(-1)

    def finish_packed(self, packed):
        """Every image has outlines: an instance without one gets its box's rectangle."""
        has = packed["has_extra"]
        lengths = np.where(has, np.diff(packed["extra_ends"]), 4)
        points = np.empty((lengths.sum(), 2), np.float32)
        own = np.repeat(has, lengths)
        points[own] = packed["extra"]
        points[~own] = _box_polygons(packed["bboxes"][~has]).reshape(-1, 2)
        return {"has_segments": np.ones(len(packed["inst"]) - 1, bool), "seg_ends": _offsets(lengths),
                "points": points}

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


def _box_polygons(boxes):
    """(n, 4, 2) the rectangles of normalised xywh boxes (n, 4) float32 as polygons: the masks of labels that have
    no outline."""
    cx, cy, w, h = boxes.T
    x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    return np.stack([np.stack([x1, y1], 1), np.stack([x2, y1], 1), np.stack([x2, y2], 1), np.stack([x1, y2], 1)],
                    1).astype(np.float32)


def _offsets(lengths):
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


class PoseLabels(DetectLabels):
    """Lines `cls cx cy w h` + K keypoints of `ndim` values each: x y normalised, and with ndim 3 a visibility (COCO's
    0: not labelled, 1: labelled but hidden, 2: visible). kpt_shape (K, ndim) and flip_idx come from the dataset
    YAML. A record keeps `keypoints` (n, K, 3) normalised; ndim-2 keypoints are all labelled (visibility 2), an
    unlabelled keypoint's coordinates are not read (COCO writes 0 0 0). Samples and batches carry `keypoints`
    (n, K, 3), x y normalised to the sample's image, visibility 0 where augmentation moved a keypoint outside it."""

    name = "pose"
    extra_key = "keypoints"
    coco_prefixes = ("person_keypoints",)

    def __init__(self, kpt_shape=(17, 3), flip_idx=None):
        self.kpt_shape, self.flip_idx = tuple(kpt_shape), None if flip_idx is None else tuple(flip_idx)
        self.line_format = f"box-keypoints-{self.kpt_shape[0]}x{self.kpt_shape[1]}"

    def parse(self, xy):
        k, ndim = self.kpt_shape
        if len(xy) != 4 + k * ndim:
            raise BadLine(f"{len(xy) + 1} values, expected {5 + k * ndim} (cls cx cy w h + {k} keypoints of {ndim} "
                          "values)")
        box, clipped = parse_box(xy[:4])
        kpts = xy[4:].reshape(k, ndim)
        visible = kpts[:, 2] if ndim == 3 else np.full(k, 2.0)
        if not np.isin(visible, (0, 1, 2)).all():
            raise BadLine(f"keypoint visibility must be 0, 1 or 2, got {visible[~np.isin(visible, (0, 1, 2))][0]:g}")
        labelled = visible > 0
        if labelled.any():
            try:
                clipped = _check_range(kpts[labelled, :2]) or clipped
            except BadLine as e:
                raise BadLine(f"keypoint {e}") from None
        out = np.zeros((k, 3), np.float32)
        out[labelled, :2] = np.clip(kpts[labelled, :2], 0, 1)
        out[:, 2] = visible
        return box, out, clipped

    def parse_plain(self, coords, widths):
        """As DetectLabels': every line a box and K keypoints (`parse`'s checks on all lines at once)."""
        k, ndim = self.kpt_shape
        if not (widths == 4 + k * ndim).all():
            return None
        v = coords.reshape(len(widths), -1)
        found = plain_boxes(v[:, :4])
        kpts = v[:, 4:].reshape(len(widths), k, ndim)
        visible = kpts[..., 2] if ndim == 3 else np.full((len(widths), k), 2.0)
        labelled = visible > 0
        ok, outside = _inside(kpts[labelled, :2], COORD_TOL)
        if found is None or not ok or not np.isin(visible, (0, 1, 2)).all():
            return None
        out = np.zeros((len(widths), k, 3), np.float32)
        out[labelled, :2] = np.clip(kpts[labelled, :2], 0, 1)
        out[..., 2] = visible
        clipped = np.zeros((len(widths), k), bool)
        clipped[labelled] = outside.any(1)
        return found[0], list(out), found[1] | clipped.any(1)

    def line(self, box, polygon, keypoints):
        """Its box and keypoints, of the dataset's kpt_shape."""
        k, ndim = self.kpt_shape
        if keypoints is None or len(keypoints) != k:
            raise BadLine(f"{0 if keypoints is None else len(keypoints)} keypoints; the dataset's kpt_shape has {k}")
        return [*box, *np.asarray(keypoints)[:, :ndim].reshape(-1)]

    extra_width = 3  # x, y, visibility of each keypoint

    def finish_packed(self, packed):
        """No outlines; the keypoints (M, K, 3)."""
        m = len(packed["cls"])
        return {"has_segments": np.zeros(len(packed["inst"]) - 1, bool), "seg_ends": np.zeros(m + 1, np.int64),
                "points": np.zeros((0, 2), np.float32),
                "keypoints": packed["extra"].reshape(m, self.kpt_shape[0], 3)}

    def add_to_sample(self, sample, inst, shape):
        h, w = shape
        kpts = inst.keypoints.astype(np.float32).copy()
        kpts[..., 0] /= w
        kpts[..., 1] /= h
        sample["keypoints"] = torch.from_numpy(kpts)
        return inst


class OBBLabels(DetectLabels):
    """Oriented boxes, DOTA's YOLO form (Ultralytics' OBB labels): lines `cls x1 y1 x2 y2 x3 y3 x4 y4`, the four
    corners normalised, in either turning direction. The corners are the instance's outline, so the augmentations
    carry them as they carry polygons (data/augment.py: resampled, warped, clipped); the box the detection layer sees
    is their axis-aligned bounding box. Samples and batches carry cxcywhr boxes (`boxes`): the minimum-area rectangle
    of the augmented outline, canonical (utils/rotated.py)."""

    name = "obb"
    line_format = "corners-4"

    def parse(self, xy):
        """Corners may lie past the image's edge: a DOTA tile cuts the objects on its border (its split keeps an
        object 70 % inside), so DOTA8 reaches 1.06. The box's centre must lie inside the image (as in Ultralytics,
        whose check reads the corners' bounding box); the corners are clipped to it and the line counted as clipped.
        Pixel coordinates, DOTA's own labelTxt, put the centre far outside and are refused."""
        if len(xy) != 8:
            raise BadLine(f"{len(xy) + 1} values, expected 9 (cls x1 y1 x2 y2 x3 y3 x4 y4)")
        centre = (xy.reshape(-1, 2).min(0) + xy.reshape(-1, 2).max(0)) / 2
        if centre.min() < -COORD_TOL or centre.max() > 1 + COORD_TOL:
            raise BadLine(f"an oriented box centred outside the image ({centre[0]:.3g}, {centre[1]:.3g}): corners "
                          "are normalised to [0, 1] (pixel coordinates divided by the image's width and height)")
        box, polygon, _ = parse_polygon(np.clip(xy, 0, 1))
        return box, polygon, bool(xy.min() < 0 or xy.max() > 1)

    def parse_plain(self, coords, widths):
        """As DetectLabels': four corners inside the image are a polygon whose centre is inside it (corners
        outside, which DOTA's tiles have, are read line by line)."""
        return plain_polygons(coords, widths, tol=0) if (widths == 8).all() else None

    def line(self, box, polygon, keypoints):
        """The corners of the outline's minimum-area rectangle, else of the box."""
        if polygon is None:
            cx, cy, w, h = box
            return [cx - w / 2, cy - h / 2, cx + w / 2, cy - h / 2, cx + w / 2, cy + h / 2, cx - w / 2, cy + h / 2]
        corners = cv2.boxPoints(cv2.minAreaRect(np.asarray(polygon, np.float32).reshape(-1, 2)))
        return np.clip(corners, 0, 1).reshape(-1).tolist()

    finish_packed = SegmentLabels.finish_packed  # every instance has its outline, the four corners

    def boxes(self, inst, shape):
        """cxcywhr boxes: the minimum-area rectangle of each augmented outline's part inside the image (the
        augmentations leave outlines unclipped; the part inside is what is seen), xywh normalised, the angle in
        radians."""
        h, w = shape
        rboxes = np.zeros((len(inst), 5), np.float32)
        for i, outline in enumerate(inst.segments or ()):
            rboxes[i] = corners_to_xywhr(np.clip(outline, 0, (w, h))[None])[0]
        rboxes[:, [0, 2]] /= w
        rboxes[:, [1, 3]] /= h
        return BoundingBoxes(torch.from_numpy(rboxes), "cxcywhr", shape, normalized=True)


# by name: the formats a name alone configures (pose needs its dataset's kpt_shape and flip_idx: pass the object)
FORMATS = {"detect": DetectLabels, "segment": SegmentLabels, "obb": OBBLabels}


def get_format(task):
    """A LabelFormat instance from an instance or a registered name."""
    if not isinstance(task, str):
        return task
    if task not in FORMATS:
        raise ValueError(f"task must be one of {sorted(FORMATS)} or a label format object, got {task!r}")
    return FORMATS[task]()
