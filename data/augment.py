"""Image + label augmentations for detection, segmentation and pose: letterbox, random perspective, HSV, flips, mixup,
and the polygon -> mask rasterisation. Labels travel as `Instances` in pixel coordinates of the image they go with;
a keypoint that a transform moves outside the image keeps its place but becomes not visible (visibility 0).

Every random draw comes from an explicit numpy Generator (`SampleRNG`: one per sample, from seed, epoch and index).
"""

import functools
import math
import random
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from utils.ops import resample_segments, segment2box

PAD_VALUE = 114

# The hyp keys detection/segmentation augmentation reads (engine/hyp.py checks files against them): the values each
# can take (a crop or zoom scale of 1 leaves nothing of the image, a shear of 90 degrees is infinite), and for a hyp
# dict that leaves one out, YOLOv5's hyp.scratch-low.yaml value
HYP_KEYS = {
    "hsv_h": "[0, 1]", "hsv_s": "[0, 1]", "hsv_v": "[0, 1]", "degrees": "[0, 180]", "translate": "[0, 1]",
    "scale": "[0, 1)", "shear": "[0, 90)", "perspective": "[0, inf)", "flipud": "[0, 1]", "fliplr": "[0, 1]",
    "mosaic": "[0, 1]", "mixup": "[0, 1]", "copy_paste": "[0, 1]",
}
HYP_DEFAULTS = {
    "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4, "degrees": 0.0, "translate": 0.1, "scale": 0.5, "shear": 0.0,
    "perspective": 0.0, "flipud": 0.0, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.0, "copy_paste": 0.0,
}
COPY_PASTE_MAX_IOA = 0.30  # a pasted copy may hide at most this fraction of any box already in the image


class SampleRNG:
    """The augmentation RNG: a numpy Generator per sample, derived from (seed, epoch, dataset index).

    A sample's augmentation therefore does not depend on which process or DataLoader worker draws it, nor on what
    that worker drew before, so a run resumed at any batch of any epoch repeats the draws of an uninterrupted one,
    with any number of workers, and there is no generator state to save. The trainer calls `set_epoch` before each
    epoch's workers start (they receive a copy of the dataset, epoch included).
    """

    def __init__(self, seed=0):
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __call__(self, index):
        return np.random.default_rng([self.seed, self.epoch, int(index)])


@dataclass
class Instances:
    """Labels of one image: cls (n,), boxes (n, 4) xyxy pixels, segments: n polygons (k, 2) pixels or None,
    keypoints: (n, K, 3) x, y pixels and visibility (0: not labelled or not visible), or None."""

    cls: np.ndarray
    boxes: np.ndarray
    segments: list = None
    keypoints: np.ndarray = None

    def __len__(self):
        return len(self.cls)

    def select(self, keep):
        keep = np.asarray(keep)
        idx = np.flatnonzero(keep) if keep.dtype == bool else keep
        segs = None if self.segments is None else [self.segments[i] for i in idx]
        kpts = None if self.keypoints is None else self.keypoints[idx]
        return Instances(self.cls[idx], self.boxes[idx], segs, kpts)

    @staticmethod
    def concat(parts):
        segs = None if any(p.segments is None for p in parts) else [s for p in parts for s in p.segments]
        kpts = None if not parts or any(p.keypoints is None for p in parts) else \
            np.concatenate([p.keypoints for p in parts])
        cls = np.concatenate([p.cls for p in parts]) if parts else np.zeros(0, np.float32)
        boxes = np.concatenate([p.boxes for p in parts]) if parts else np.zeros((0, 4), np.float32)
        return Instances(cls, boxes, segs, kpts)

    def flip(self, width=None, height=None, flip_idx=None):
        """Mirror left-right (width given) or up-down (height given), in place. A left-right mirror also renames the
        keypoints by `flip_idx` (a left eye becomes the right one), which the dataset gives."""
        ax, size = (0, width) if width is not None else (1, height)
        self.boxes[:, [ax, ax + 2]] = size - self.boxes[:, [ax + 2, ax]]
        if self.segments is not None:
            for s in self.segments:
                s[:, ax] = size - s[:, ax]
        if self.keypoints is not None:
            self.keypoints[..., ax] = size - self.keypoints[..., ax]
            if width is not None and flip_idx is not None:
                self.keypoints = np.ascontiguousarray(self.keypoints[:, list(flip_idx)])

    def clip(self, width, height):
        """Boxes clipped to the image; keypoints outside it become not visible and are clipped too."""
        self.boxes[:, [0, 2]] = self.boxes[:, [0, 2]].clip(0, width)
        self.boxes[:, [1, 3]] = self.boxes[:, [1, 3]].clip(0, height)
        if self.keypoints is not None:
            x, y = self.keypoints[..., 0], self.keypoints[..., 1]
            self.keypoints[..., 2][(x < 0) | (x > width) | (y < 0) | (y > height)] = 0
            np.clip(x, 0, width, out=x)
            np.clip(y, 0, height, out=y)


def chw_rgb(im):
    """A BGR HWC uint8 image as a contiguous RGB CHW array: OpenCV's split of the planes is several times faster
    than numpy's strided transpose copy (and much faster again from a contiguous image than from a view)."""
    return np.stack(cv2.split(im)[::-1])


def letterbox(im, new_shape=(640, 640), color=(PAD_VALUE,) * 3, auto=True, scaleup=True, stride=32):
    """Resize keeping the aspect ratio, then pad to `new_shape` (h, w) or, with auto, to the next multiple of stride.

    Returns (image, (ratio_w, ratio_h), (pad_w, pad_h)) where pad is the padding on the left/top side.
    """
    shape = im.shape[:2]
    new_shape = (int(new_shape), int(new_shape)) if np.isscalar(new_shape) else tuple(int(x) for x in new_shape)
    r = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    if not scaleup:  # only shrink: better val mAP, as upscaling small images adds nothing
        r = min(r, 1.0)
    new_unpad = max(1, int(round(shape[1] * r))), max(1, int(round(shape[0] * r)))  # a 1 x 2000 image keeps a row
    dw, dh = new_shape[1] - new_unpad[0], new_shape[0] - new_unpad[1]
    if auto:  # minimum rectangle: pad only up to the stride
        dw, dh = dw % stride, dh % stride
    dw, dh = dw / 2, dh / 2
    if shape[::-1] != new_unpad:
        im = cv2.resize(im, new_unpad, interpolation=cv2.INTER_LINEAR)
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    im = cv2.copyMakeBorder(im, top, bottom, left, right, cv2.BORDER_CONSTANT, value=color)
    return im, (new_unpad[0] / shape[1], new_unpad[1] / shape[0]), (dw, dh)


class Canvas:
    """A mosaic picture not drawn until needed: images pasted at pixel offsets onto a (h, w) ground of PAD_VALUE.

    `draw` paints a window of it. `random_perspective`, when its draw only scales and shifts (no rotation, shear or
    perspective: the default of every family), paints just the window its warp reads, plus two pixels of margin for
    the interpolation; everything outside is never read, or ground, which the warp's border value equals. The
    pixels are those of the whole picture warped (tested); with rotation or shear, OpenCV's single-precision source
    coordinates would differ by the window's offset, and a few pixels by one grey level, so those draws paint it
    whole."""

    def __init__(self, h, w, pieces):
        self.shape, self.pieces = (h, w, 3), pieces  # pieces: (image, x offset, y offset), any offset

    def draw(self, x1=0, y1=0, x2=None, y2=None):
        x2, y2 = self.shape[1] if x2 is None else x2, self.shape[0] if y2 is None else y2
        out = np.full((y2 - y1, x2 - x1, 3), PAD_VALUE, np.uint8)
        for img, ox, oy in self.pieces:
            h, w = img.shape[:2]
            a1, b1, a2, b2 = max(ox, x1), max(oy, y1), min(ox + w, x2), min(oy + h, y2)
            if a2 > a1 and b2 > b1:
                out[b1 - y1 : b2 - y1, a1 - x1 : a2 - x1] = img[b1 - oy : b2 - oy, a1 - ox : a2 - ox]
        return out


def _pixels(img):
    """An array, or a Canvas drawn whole."""
    return img.draw() if isinstance(img, Canvas) else img


def _warp_affine(img, A, size, fill):
    """cv2.warpAffine of an array or of a Canvas, of which only the window the warp reads is drawn when A only scales
    and shifts (see Canvas)."""
    if not isinstance(img, Canvas) or A[0, 1] or A[1, 0]:
        return cv2.warpAffine(_pixels(img), A, dsize=size, borderValue=fill)
    w, h = size
    src = cv2.invertAffineTransform(A) @ np.array([[0, w, 0, w], [0, 0, h, h], [1, 1, 1, 1]], np.float64)
    x1, y1 = (max(int(math.floor(v)) - 2, 0) for v in src.min(1))
    x2, y2 = (min(int(math.ceil(v)) + 3, n) for v, n in zip(src.max(1), (img.shape[1], img.shape[0])))
    if x2 <= x1 or y2 <= y1:  # the whole output lies off the canvas
        return np.full((h, w, 3), fill, np.uint8)
    A = A.copy()
    A[:, 2] += A[:, :2] @ (x1, y1)
    return cv2.warpAffine(img.draw(x1, y1, x2, y2), A, dsize=size, borderValue=fill)


def _affine_matrix(in_shape, out_shape, degrees, translate, scale, shear, perspective, rng):
    """3x3 homography: centre, perspective, rotate+scale, shear, translate. Returns (M, scale drawn)."""
    C = np.eye(3)
    C[0, 2], C[1, 2] = -in_shape[1] / 2, -in_shape[0] / 2
    P = np.eye(3)
    P[2, 0], P[2, 1] = rng.uniform(-perspective, perspective, 2)
    R = np.eye(3)
    s = rng.uniform(1 - scale, 1 + scale)
    R[:2] = cv2.getRotationMatrix2D(center=(0, 0), angle=rng.uniform(-degrees, degrees), scale=s)
    S = np.eye(3)
    S[0, 1], S[1, 0] = (math.tan(a * math.pi / 180) for a in rng.uniform(-shear, shear, 2))
    T = np.eye(3)
    T[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_shape[1]
    T[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_shape[0]
    return T @ S @ R @ P @ C, s


def _transform_points(xy, M, perspective):
    xy1 = np.concatenate([xy, np.ones((len(xy), 1))], 1) @ M.T
    return xy1[:, :2] / xy1[:, 2:3] if perspective else xy1[:, :2]


def box_candidates(box1, box2, wh_thr=2, ar_thr=100, area_thr=0.1, eps=1e-16):
    """Keep boxes (xyxy, (n, 4)) that stay > wh_thr px, keep > area_thr of their area and are not too thin."""
    w1, h1 = box1[:, 2] - box1[:, 0], box1[:, 3] - box1[:, 1]
    w2, h2 = box2[:, 2] - box2[:, 0], box2[:, 3] - box2[:, 1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def random_perspective(img, inst, degrees=0.0, translate=0.1, scale=0.5, shear=0.0, perspective=0.0,
                       border=(0, 0), rng=None):
    """Warp the image and its labels by a random homography; output size = input size + 2 * border (h, w).

    Polygons (when present) are resampled to 1000 points and warped, and each box is re-derived from its
    warped polygon, which fits far better than warping box corners. Keypoints (when present) are warped, and those
    that land outside the output become not visible. Boxes that end up too small are dropped.
    """
    rng = rng or np.random.default_rng()
    out_shape = (img.shape[0] + 2 * border[0], img.shape[1] + 2 * border[1])
    M, s = _affine_matrix(img.shape, out_shape, degrees, translate, scale, shear, perspective, rng)
    if border[0] or border[1] or (M != np.eye(3)).any():
        size, fill = (out_shape[1], out_shape[0]), (PAD_VALUE,) * 3
        if perspective:
            img = cv2.warpPerspective(_pixels(img), M, dsize=size, borderValue=fill)
        else:
            img = _warp_affine(img, M[:2], size, fill)
    img = _pixels(img)
    if not len(inst):
        return img, inst
    h, w = out_shape
    if inst.segments is not None:
        segments = [_transform_points(p, M, perspective).astype(np.float32) for p in resample_segments(inst.segments)]
        boxes = np.stack([segment2box(p, w, h) for p in segments]).astype(np.float32)
    else:
        x1, y1, x2, y2 = inst.boxes.T
        corners = np.stack([x1, y1, x2, y1, x2, y2, x1, y2], 1).reshape(-1, 2)
        xy = _transform_points(corners, M, perspective).reshape(-1, 4, 2)
        boxes = np.concatenate([xy.min(1), xy.max(1)], 1).astype(np.float32)
        segments = None
    keypoints = None
    if inst.keypoints is not None:
        xy = _transform_points(inst.keypoints[..., :2].reshape(-1, 2), M, perspective).reshape(len(inst), -1, 2)
        keypoints = np.concatenate([xy, inst.keypoints[..., 2:]], -1).astype(np.float32)
    out = Instances(inst.cls.copy(), boxes, segments, keypoints)
    out.clip(w, h)
    keep = box_candidates(inst.boxes * s, out.boxes, area_thr=0.01 if segments is not None else 0.10)
    return img, out.select(keep)


def hsv_gains(hgain, sgain, vgain, rng):
    """One sample's hue/saturation/value gains, each uniform in 1 +- its hyp; None when all three hyps are 0."""
    if not (hgain or sgain or vgain):
        return None
    return rng.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1


def augment_hsv(img, hgain=0.5, sgain=0.5, vgain=0.5, rng=None):
    """Random hue/saturation/value gains on a BGR uint8 image, in place (lookup tables: fast)."""
    r = hsv_gains(hgain, sgain, vgain, rng or np.random.default_rng())
    if r is not None:
        apply_hsv(img, r)
    return img


def hsv_tables(r):
    """The three lookup tables (3, 256) uint8 of gains r on OpenCV's 8-bit HSV planes: the hue gain multiplies the
    hue angle (mod 360 degrees; OpenCV's hue spans 0..179), the other two scale and clip, as the official loaders."""
    x = np.arange(256, dtype=np.float64)
    return np.stack([(x * r[0]) % 180, np.clip(x * r[1], 0, 255), np.clip(x * r[2], 0, 255)]).astype(np.uint8)


def apply_hsv(img, r):
    """Gains r (hue, saturation, value) on a BGR uint8 image, in place."""
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
    # a table per plane: OpenCV's LUT runs slower on three interleaved channels than split, three LUTs and merge
    planes = [cv2.LUT(plane, lut) for plane, lut in zip(cv2.split(hsv), hsv_tables(r))]
    cv2.cvtColor(cv2.merge(planes, dst=hsv), cv2.COLOR_HSV2BGR, dst=img)
    return img


# images per pass of apply_hsv_batch: 0.7 GB of temporaries at 640 px, where a batch of 256 whole would take 11 GB
HSV_CHUNK = 16
# OpenCV's 8-bit BGR->HSV divides by tables of 255 / v and 30 / (max - min) in 12-bit fixed point
_HSV_SHIFT = 12
# its HSV->BGR: for each sextant of the hue, which of (v, v(1-s), v(1-s f), v(1-s(1-f))) is red, green and blue
_HSV_SECTORS = ((0, 3, 1), (2, 0, 1), (1, 0, 3), (1, 2, 0), (3, 1, 0), (0, 1, 2))


@functools.lru_cache(maxsize=None)
def _hsv_constants(device):
    """OpenCV's division tables and the sextants' channel order, copied to `device` once: a copy from pageable
    memory to a GPU at every step would wait for the work queued before it."""
    i = np.arange(1, 256)
    div = np.rint(np.stack([(255 << _HSV_SHIFT) / i, (180 << _HSV_SHIFT) / (6.0 * i)]))
    div = torch.from_numpy(np.concatenate([np.zeros((2, 1)), div], 1)).to(device, torch.int32)
    return div, torch.tensor(_HSV_SECTORS, device=device)


def apply_hsv_batch(img, tables):
    """`apply_hsv` on the device: a float RGB batch (B, 3, H, W) of 8-bit values over 255 and each image's
    `hsv_tables` (B, 3, 256) uint8 on the same device. OpenCV's own 8-bit arithmetic in torch (its fixed-point HSV,
    the tables, its float inverse truncated as its vector path does), so the pixels are the ones the loader would
    have made, none more than one grey level apart (tested). How many are one level apart depends on the loader's CPU
    and the image width: OpenCV's AVX paths fuse a multiply and a subtraction, and it rounds the pixels of a row that
    do not fill a vector; with OpenCV on SSE4 only they are all equal. The training loader leaves the colour to this
    when the batch goes to a GPU, where it costs little next to the step and frees a third of a worker's time.
    Its temporaries take about nine times the images they work on, so it works HSV_CHUNK images at a time."""
    out = torch.empty_like(img)
    for i in range(0, len(img), HSV_CHUNK):
        out[i : i + HSV_CHUNK] = _hsv_chunk(img[i : i + HSV_CHUNK], tables[i : i + HSV_CHUNK])
    return out


def _hsv_chunk(img, tables):
    n = len(img)
    div, sectors = _hsv_constants(img.device)
    x = (img * 255).round_().to(torch.int32)
    r, g, b = x.unbind(1)
    v = x.amax(1)
    d = v - x.amin(1)
    half = 1 << (_HSV_SHIFT - 1)
    hue = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * d, r - g + 4 * d))
    hue = (hue * div[1][d] + half) >> _HSV_SHIFT
    planes = torch.stack([torch.where(hue < 0, hue + 180, hue), (d * div[0][v] + half) >> _HSV_SHIFT, v], 1)
    hue, sat, val = torch.gather(tables.float(), 2, planes.view(n, 3, -1).long()).view_as(img).unbind(1)
    hue = hue * np.float32(6 / 180)
    hue = torch.where(hue >= 6, hue - 6, hue)  # a table's hue of 180 (a hue gain a hair below 0), as OpenCV wraps it
    sat, val = sat * np.float32(1 / 255), val * np.float32(1 / 255)
    sector = hue.floor()
    f = hue - sector
    tab = torch.stack([val, val * (1 - sat), val * (1 - sat * f), val * (1 - sat * (1 - f))], 1)
    pick = sectors[sector.long()].permute(0, 3, 1, 2)  # (B, 3, H, W): which of tab is red, green, blue
    return torch.gather(tab, 1, pick).mul_(255).floor_().div_(255).to(img.dtype)


def mixup(img1, inst1, img2, inst2, rng):
    """Blend two same-size images with a Beta(32, 32) weight (close to 0.5) and keep both label sets."""
    r = rng.beta(32.0, 32.0)
    img = (img1.astype(np.float32) * r + img2.astype(np.float32) * (1 - r)).astype(np.uint8)
    return img, Instances.concat([inst1, inst2])


def _ioa(box, boxes, eps=1e-7):
    """Intersection of one xyxy box with each of `boxes` (n, 4), over the area of each of `boxes`."""
    iw = (np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0])).clip(0)
    ih = (np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1])).clip(0)
    return iw * ih / ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) + eps)


def copy_paste(img, inst, p, rng):
    """Segment copy-paste within one image (Ghiasi et al. 2021, in YOLOv5's same-image form): a random fraction p
    of the instances is mirrored left-right and pasted, pixels and outline, wherever the copy hides less than 30 %
    of every box already there. Needs outlines (`inst.segments`); changes `img` in place (a Canvas is drawn first, when
    p is set and the image has outlines); returns (img, inst)."""
    n = len(inst)
    if not p or not n or inst.segments is None:
        return img, inst
    img = _pixels(img)
    w = img.shape[1]
    paste = np.zeros(img.shape[:2], np.uint8)
    cls, boxes, segs = list(inst.cls), list(inst.boxes), list(inst.segments)
    for j in rng.choice(n, size=round(p * n), replace=False):
        x1, y1, x2, y2 = inst.boxes[j]
        mirrored = np.array([w - x2, y1, w - x1, y2], np.float32)
        if (_ioa(mirrored, np.stack(boxes)) < COPY_PASTE_MAX_IOA).all():
            seg = inst.segments[j].copy()
            seg[:, 0] = w - seg[:, 0]
            cls.append(inst.cls[j])
            boxes.append(mirrored)
            segs.append(seg)
            cv2.fillPoly(paste, [np.round(inst.segments[j]).astype(np.int32)], 1)
    where = paste[:, ::-1].astype(bool)  # the instances' pixels land where their mirrored copies are
    img[where] = img[:, ::-1][where]
    return img, Instances(np.array(cls, dtype=inst.cls.dtype), np.stack(boxes).astype(np.float32), segs)


def polygon_mask(polygon, shape, ratio=1):
    """Rasterise one polygon (k, 2) given in image pixels into a uint8 0/1 mask of `shape` // ratio.

    Filled at full resolution, then each ratio x ratio block becomes 1 when at least half of it is covered;
    filling at the reduced size directly would inflate small shapes by the polygon's boundary pixels.
    """
    full = np.zeros(shape[:2], np.uint8)
    pts = np.round(np.asarray(polygon, np.float64) * 16).astype(np.int32)  # 4 fractional bits
    cv2.fillPoly(full, [pts], 255, lineType=cv2.LINE_8, shift=4)
    if ratio == 1:
        return (full > 0).astype(np.uint8)
    h, w = shape[0] // ratio, shape[1] // ratio
    small = cv2.resize(full[: h * ratio, : w * ratio], (w, h), interpolation=cv2.INTER_AREA)
    return (small >= 128).astype(np.uint8)


def polygons_to_masks(polygons, shape, ratio=4, overlap=True):
    """Instance masks at 1/ratio of the image `shape` (h, w).

    overlap=False: (n, h/r, w/r) float32, one mask per polygon, order unchanged.
    overlap=True: one (h/r, w/r) map with value k+1 for the k-th instance of `order`, where `order` sorts the
    polygons from the largest area to the smallest and smaller instances are painted on top (they would vanish
    otherwise). Returns (masks, order); reorder the labels with `order` so that value k+1 means label k.
    """
    h, w = shape[0] // ratio, shape[1] // ratio
    masks = [polygon_mask(p, shape, ratio) for p in polygons]
    if not overlap:
        stack = np.stack(masks).astype(np.float32) if masks else np.zeros((0, h, w), np.float32)
        return stack, np.arange(len(masks))
    areas = np.array([m.sum() for m in masks], dtype=np.int64)
    order = np.argsort(-areas, kind="stable")
    out = np.zeros((h, w), np.uint8 if len(masks) < 255 else np.int32)
    for k, i in enumerate(order):
        out[masks[i] > 0] = k + 1
    return out, order


def multi_scale(img, size, stride, key):
    """--multi-scale: `img` (a batch) resized so its long side is a multiple of the stride (at least 32) drawn in
    [0.5, 1.5] x `size` by a generator seeded with `key` (the run's seed and the global batch number: every rank
    draws the same size). Labels are normalised, so they stay."""
    gs = max(stride, 32)
    lo, hi = max(math.ceil(size * 0.5 / gs), 1), max(math.floor(size * 1.5 / gs), 1)
    size = random.Random(key).randint(lo, hi) * gs
    sf = size / max(img.shape[2:])
    if sf == 1:
        return img
    shape = [math.ceil(x * sf / gs) * gs for x in img.shape[2:]]
    return torch.nn.functional.interpolate(img, size=shape, mode="bilinear", align_corners=False)
