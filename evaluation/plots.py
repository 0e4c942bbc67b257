"""Drawing on images with OpenCV: palette, box/mask annotation and batch mosaics. Images handed to the Annotator are
BGR uint8, as cv2 reads and writes them. Charts (curves, histograms, confusion matrices) are in evaluation/charts.py."""

import math
from pathlib import Path

import cv2
import numpy as np
import torch

from utils.imageio import printable, write_image
from utils.ops import xywh2xyxy
from utils.rotated import xywhr_to_corners

_HEX = (
    "FF3838", "FF9D97", "FF701F", "FFB21D", "CFD231", "48F90A", "92CC17", "3DDB86", "1A9334", "00D4BB",
    "2C99A8", "00C2FF", "344593", "6473FF", "0018EC", "8438FF", "520085", "CB38FF", "FF95C8", "FF37C7",
)  # fmt: skip
_PALETTE = tuple(tuple(int(h[k : k + 2], 16) for k in (0, 2, 4)) for h in _HEX)  # RGB
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def colors(i, bgr=False):
    """Colour i of a 20-colour palette as an (r, g, b) tuple, or (b, g, r) with bgr=True."""
    r, g, b = _PALETTE[int(i) % len(_PALETTE)]
    return (b, g, r) if bgr else (r, g, b)


def _numpy(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class Annotator:
    """Draws boxes, labels, masks and text on a BGR uint8 image."""

    def __init__(self, im, line_width=None):
        self.im = np.ascontiguousarray(im)  # cv2 draws in place and needs contiguous memory
        self.lw = line_width or max(round(sum(self.im.shape[:2]) / 2 * 0.003), 2)
        self.tf = max(self.lw - 1, 1)  # text thickness
        self.fs = self.lw / 3  # text scale

    def box_label(self, box, label="", color=(128, 128, 128), txt_color=(255, 255, 255)):
        p1, p2 = (int(box[0]), int(box[1])), (int(box[2]), int(box[3]))
        cv2.rectangle(self.im, p1, p2, color, thickness=self.lw, lineType=cv2.LINE_AA)
        self._label(p1, label, color, txt_color)

    def polygon_label(self, corners, label="", color=(128, 128, 128), txt_color=(255, 255, 255)):
        """An oriented box's outline (corners (4, 2) in pixels), labelled at its top-most corner."""
        pts = np.round(_numpy(corners)).astype(np.int32)
        cv2.polylines(self.im, [pts], True, color, thickness=self.lw, lineType=cv2.LINE_AA)
        self._label(tuple(int(v) for v in pts[pts[:, 1].argmin()]), label, color, txt_color)

    def _label(self, p1, label, color, txt_color):
        """`label` on a filled box of `color` whose bottom-left is p1, or below p1 where it would leave the image."""
        if not label:
            return
        label = printable(label)
        w, h = cv2.getTextSize(label, _FONT, self.fs, self.tf)[0]
        above = p1[1] - h - 3 >= 0  # put the label above the box when it fits in the image
        corner = (p1[0] + w, p1[1] - h - 3) if above else (p1[0] + w, p1[1] + h + 3)
        cv2.rectangle(self.im, p1, corner, color, -1, cv2.LINE_AA)
        org = (p1[0], p1[1] - 2) if above else (p1[0], p1[1] + h + 2)
        cv2.putText(self.im, label, org, _FONT, self.fs, txt_color, self.tf, cv2.LINE_AA)

    def masks(self, masks, colors, alpha=0.5):
        """Blend binary masks (n, h, w) at image size with their BGR colours."""
        masks = _numpy(masks)
        if not len(masks):
            return
        im = self.im.astype(np.float32)
        for m, c in zip(masks, colors):
            on = (m > 0.5)[..., None]
            im = np.where(on, im * (1 - alpha) + np.asarray(c, dtype=np.float32) * alpha, im)
        self.im = im.round().clip(0, 255).astype(np.uint8)

    def keypoints(self, kpts, skeleton=None, conf=0.5, radius=None):
        """One instance's keypoints (K, 2 or 3) in image pixels as dots (each its own colour), and the `skeleton`
        pairs as lines between them; a keypoint whose third value (visibility or its probability) is below `conf` is
        not drawn, nor its lines."""
        kpts = _numpy(kpts)
        seen = kpts[:, 2] >= conf if kpts.shape[1] == 3 else np.ones(len(kpts), dtype=bool)
        seen &= (kpts[:, 0] > 0) | (kpts[:, 1] > 0)
        xy = np.round(kpts[:, :2]).astype(int)
        for i, j in skeleton or ():
            if seen[i] and seen[j]:
                cv2.line(self.im, tuple(xy[i]), tuple(xy[j]), colors(i + 3, bgr=True), max(self.lw // 2, 1),
                         cv2.LINE_AA)
        r = radius or max(self.lw, 2)
        for k in np.flatnonzero(seen):
            cv2.circle(self.im, tuple(xy[k]), r, colors(k, bgr=True), -1, cv2.LINE_AA)

    def text(self, xy, text, txt_color=(255, 255, 255)):
        """Text whose top-left corner is at xy; each '\\n' starts a new line (cv2 draws none itself)."""
        x, y = int(xy[0]), int(xy[1])
        for line in map(printable, str(text).split("\n")):
            (_, h), base = cv2.getTextSize(line or " ", _FONT, self.fs, self.tf)
            y += h
            cv2.putText(self.im, line, (x, y), _FONT, self.fs, txt_color, self.tf, cv2.LINE_AA)
            y += base + self.tf

    def result(self):
        return self.im


def _to_uint8_hwc(images):
    images = _numpy(images)
    if images.dtype != np.uint8:
        images = (images * 255).round().clip(0, 255).astype(np.uint8)  # float images are in [0, 1]
    return images.transpose(0, 2, 3, 1)


def _name(names, c):
    if isinstance(names, dict):
        return str(names.get(c, c))
    return str(names[c]) if names is not None and 0 <= c < len(names) else str(c)


def _image_masks(masks, i, target_rows, overlap):
    """Binary masks (k, h, w) of image i, from overlap masks (B, h, w) or per-target masks (N, h, w)."""
    if overlap:
        ids = np.arange(1, len(target_rows) + 1).reshape(-1, 1, 1)
        return masks[i][None] == ids
    return masks[target_rows] > 0.5


def _draw_keypoints(ann, kpts, keep, origin, size, scale):
    """Keypoints (n, K, 3) of one tile's kept rows, normalised (<= 1.1) or in pixels, drawn at the tile's origin."""
    kpts = kpts[keep].astype(np.float32).copy()
    if not len(kpts):
        return
    xy = kpts[..., :2]
    xy *= np.asarray(size, np.float32) if xy.max() <= 1.1 else scale
    xy += np.asarray(origin, np.float32)
    for k in kpts:
        ann.keypoints(k)


def plot_images(images, targets, paths=None, fname="images.jpg", names=None, masks=None, max_size=1920,
                max_subplots=16, overlap=True, keypoints=None, angles=None):  # fmt: skip
    """Save a mosaic JPEG of a batch with its boxes (and masks, or keypoints (N, K, 3) in `targets` order,
    normalised or in pixels as the boxes are).

    images: (B, 3, H, W) RGB, uint8 or float in [0, 1]. targets: (N, 6) [batch_idx, cls, cx, cy, w, h], boxes
    normalised (0..1) or in pixels; (N, 7) adds a confidence column (predictions, shown when >= 0.25).
    masks: with `overlap`, one map per image (B, h, w) whose value k marks the image's k-th target (a batch's
    `overlap` says which it holds); else one per target (N, h, w). angles: (N,) radians, oriented boxes (an OBB
    batch's `angles`): each target's w and h are then its own sides, turned by its angle (utils/rotated.py), and it
    is drawn as its outline. Returns the saved path.
    """
    ims = _to_uint8_hwc(images[:max_subplots])  # only the drawn images leave the GPU and are converted
    targets = _numpy(targets)
    targets = targets.reshape(-1, targets.shape[-1]) if targets.size else np.zeros((0, 6), dtype=np.float32)
    masks = None if masks is None else _numpy(masks)
    keypoints = None if keypoints is None else _numpy(keypoints)
    angles = None if angles is None else _numpy(angles).reshape(-1)
    bs, h, w = ims.shape[0], ims.shape[1], ims.shape[2]
    ns = math.ceil(bs**0.5)
    scale = min(1.0, max_size / (ns * max(h, w)))
    h, w = math.ceil(h * scale), math.ceil(w * scale)
    mosaic = np.full((math.ceil(bs / ns) * h, ns * w, 3), 255, dtype=np.uint8)
    for i, im in enumerate(ims):
        x0, y0 = w * (i % ns), h * (i // ns)
        mosaic[y0 : y0 + h, x0 : x0 + w] = cv2.resize(im, (w, h))[..., ::-1]
    ann = Annotator(mosaic, line_width=max(round(min(h, w) / 160), 1))
    for i in range(bs):
        x0, y0 = w * (i % ns), h * (i // ns)
        cv2.rectangle(ann.im, (x0, y0), (x0 + w - 1, y0 + h - 1), (255, 255, 255), 2)
        if paths is not None:
            ann.text((x0 + 4, y0 + 4), Path(paths[i]).name[:40], txt_color=(220, 220, 220))
        rows = np.nonzero(targets[:, 0] == i)[0]
        t = targets[rows]
        show = t[:, 6] >= 0.25 if t.shape[1] > 6 else np.ones(len(t), dtype=bool)
        if masks is not None and len(rows):
            tile = _image_masks(masks, i, rows, overlap).astype(np.uint8)
            tile = np.stack([cv2.resize(m, (w, h), interpolation=cv2.INTER_NEAREST) for m in tile])
            sub = Annotator(ann.im[y0 : y0 + h, x0 : x0 + w])
            sub.masks(tile[show], [colors(c, bgr=True) for c in t[show, 1]])
            ann.im[y0 : y0 + h, x0 : x0 + w] = sub.result()
        if keypoints is not None:
            _draw_keypoints(ann, keypoints[rows], show, (x0, y0), (w, h), scale)
        xywh = t[:, 2:6].astype(np.float32)
        if len(xywh) and xywh2xyxy(xywh).max() <= 1.1:  # normalised coordinates
            xywh *= np.array([w, h, w, h], dtype=np.float32)
        elif scale < 1:
            xywh *= scale
        xywh[:, :2] += np.array([x0, y0], dtype=np.float32)
        _draw_boxes(ann, t[show], xywh[show], None if angles is None else angles[rows][show], names)
    write_image(fname, ann.result())
    return Path(fname)


def _draw_boxes(ann, t, xywh, angles, names):
    """plot_images' rows `t` at `xywh` (mosaic pixels): upright boxes, or oriented ones' outlines with `angles`."""
    corners = None
    if angles is not None:
        corners = xywhr_to_corners(torch.from_numpy(np.c_[xywh, angles]).double()).numpy()
    for k, row in enumerate(t):
        c = int(row[1])
        label = _name(names, c) if t.shape[1] <= 6 else f"{_name(names, c)} {row[6]:.1f}"
        if corners is None:
            ann.box_label(xywh2xyxy(xywh[k : k + 1])[0], label, colors(c, bgr=True))
        else:
            ann.polygon_label(corners[k], label, colors(c, bgr=True))


def save_one_box(xyxy, im, file, gain=1.02, pad=10):
    """Save the crop of box xyxy from BGR image im, enlarged by `gain` and `pad` pixels, as `file` (file2.jpg, ...
    when taken); returns the path."""
    x1, y1, x2, y2 = (float(v) for v in xyxy)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    w, h = (x2 - x1) * gain + pad, (y2 - y1) * gain + pad
    h0, w0 = im.shape[:2]
    x1, x2 = int(np.clip(cx - w / 2, 0, w0)), int(np.clip(cx + w / 2, 0, w0))
    y1, y2 = int(np.clip(cy - h / 2, 0, h0)), int(np.clip(cy + h / 2, 0, h0))
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    n, path = 2, file
    while path.exists():
        path, n = file.with_name(f"{file.stem}{n}{file.suffix}"), n + 1
    write_image(path, im[y1:y2, x1:x2])
    return path
