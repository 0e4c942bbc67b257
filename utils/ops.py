"""Box, segment and mask operations, IoU variants and non-maximum suppression.

Boxes are `xyxy` (corners) or `xywh` (centre, size); a trailing `n` means normalised to image width/height.
Every function accepts torch tensors; the box conversions also accept numpy arrays.
"""

import math
import time
from dataclasses import dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from utils.log import LOGGER
from utils.rotated import rotated_nms
from utils.versions import torchvision_nms


def _clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else np.copy(x)


def xywh2xyxy(x):
    y = _clone(x)
    half = x[..., 2:4] / 2  # both axes in one operation: NMS and the labels convert every image's boxes
    y[..., 0:2] = x[..., 0:2] - half
    y[..., 2:4] = x[..., 0:2] + half
    return y


def xyxy2xywh(x):
    y = _clone(x)
    y[..., 0] = (x[..., 0] + x[..., 2]) / 2
    y[..., 1] = (x[..., 1] + x[..., 3]) / 2
    y[..., 2] = x[..., 2] - x[..., 0]
    y[..., 3] = x[..., 3] - x[..., 1]
    return y


def xywhn2xyxy(x, w=640, h=640, padw=0, padh=0):
    """Normalised xywh -> pixel xyxy, shifted by a letterbox/mosaic offset."""
    y = _clone(x)
    y[..., 0] = w * (x[..., 0] - x[..., 2] / 2) + padw
    y[..., 1] = h * (x[..., 1] - x[..., 3] / 2) + padh
    y[..., 2] = w * (x[..., 0] + x[..., 2] / 2) + padw
    y[..., 3] = h * (x[..., 1] + x[..., 3] / 2) + padh
    return y


def xyxy2xywhn(x, w=640, h=640, clip=False, eps=0.0):
    """Pixel xyxy -> normalised xywh, optionally clipped to the image first."""
    if clip:
        x = _clone(x)
        clip_boxes(x, (h - eps, w - eps))
    y = _clone(x)
    y[..., 0] = ((x[..., 0] + x[..., 2]) / 2) / w
    y[..., 1] = ((x[..., 1] + x[..., 3]) / 2) / h
    y[..., 2] = (x[..., 2] - x[..., 0]) / w
    y[..., 3] = (x[..., 3] - x[..., 1]) / h
    return y


def xyn2xy(x, w=640, h=640, padw=0, padh=0):
    """Normalised polygon points (n, 2) -> pixels."""
    y = _clone(x)
    y[..., 0] = w * x[..., 0] + padw
    y[..., 1] = h * x[..., 1] + padh
    return y


def segment2box(segment, width=640, height=640):
    """One polygon (n, 2) in pixels -> xyxy box of its points inside the image (zeros if none are)."""
    x, y = segment.T
    inside = (x >= 0) & (y >= 0) & (x <= width) & (y <= height)
    x, y = x[inside], y[inside]
    if not len(x):
        return np.zeros(4, dtype=segment.dtype)
    return np.array([x.min(), y.min(), x.max(), y.max()], dtype=segment.dtype)


def resample_segments(segments, n=1000):
    """Resample each closed polygon to n points by linear interpolation along its outline."""
    out = []
    for s in segments:
        s = np.concatenate((s, s[:1]), axis=0)
        x = np.linspace(0, len(s) - 1, n)
        xp = np.arange(len(s))
        out.append(np.stack([np.interp(x, xp, s[:, i]) for i in range(2)], 1).astype(np.float32))
    return out


def clip_boxes(boxes, shape):
    """Clip xyxy boxes in place to an image of shape (h, w)."""
    if isinstance(boxes, torch.Tensor):
        boxes[..., 0:4:2].clamp_(0, shape[1])
        boxes[..., 1:4:2].clamp_(0, shape[0])
    else:
        boxes[..., [0, 2]] = boxes[..., [0, 2]].clip(0, shape[1])
        boxes[..., [1, 3]] = boxes[..., [1, 3]].clip(0, shape[0])
    return boxes


def clip_coords(coords, shape):
    """Clip (n, 2) points in place to an image of shape (h, w)."""
    if isinstance(coords, torch.Tensor):
        coords[..., 0].clamp_(0, shape[1])
        coords[..., 1].clamp_(0, shape[0])
    else:
        coords[..., 0] = coords[..., 0].clip(0, shape[1])
        coords[..., 1] = coords[..., 1].clip(0, shape[0])
    return coords


def _gains_pad(img1_shape, img0_shape, ratio_pad):
    """((x gain, y gain), (x pad, y pad)) of a letterbox: one gain when computed from the shapes, else the dataset's
    own per-axis ratios (h / h0, w / w0): the resized sides were rounded to whole pixels, so they differ slightly,
    and one gain for both axes would misplace x by up to half a resized pixel times the inverse gain."""
    if ratio_pad is None:
        gain = min(img1_shape[0] / img0_shape[0], img1_shape[1] / img0_shape[1])
        pad = ((img1_shape[1] - img0_shape[1] * gain) / 2, (img1_shape[0] - img0_shape[0] * gain) / 2)
        return (gain, gain), pad
    (gain_y, gain_x), pad = ratio_pad
    return (gain_x, gain_y), pad


def scale_boxes(img1_shape, boxes, img0_shape, ratio_pad=None):
    """Map xyxy boxes from a letterboxed image (img1_shape) back to the original (img0_shape), in place."""
    (gx, gy), pad = _gains_pad(img1_shape, img0_shape, ratio_pad)
    boxes[..., 0:4:2] -= pad[0]  # views, not index lists: the same arithmetic without copies (a validation does
    boxes[..., 1:4:2] -= pad[1]  # this twice an image)
    boxes[..., 0:4:2] /= gx
    boxes[..., 1:4:2] /= gy
    return clip_boxes(boxes, img0_shape)


def scale_coords(img1_shape, coords, img0_shape, ratio_pad=None, normalize=False):
    """Map (n, 2) points from a letterboxed image back to the original, in place."""
    (gx, gy), pad = _gains_pad(img1_shape, img0_shape, ratio_pad)
    coords[..., 0] -= pad[0]
    coords[..., 1] -= pad[1]
    coords[..., 0] /= gx
    coords[..., 1] /= gy
    clip_coords(coords, img0_shape)
    if normalize:
        coords[..., 0] /= img0_shape[1]
        coords[..., 1] /= img0_shape[0]
    return coords


def box_iou(box1, box2, eps=1e-7):
    """Pairwise IoU of xyxy boxes: (N, 4) x (M, 4) -> (N, M)."""
    (a1, a2), (b1, b2) = box1.unsqueeze(1).chunk(2, 2), box2.unsqueeze(0).chunk(2, 2)
    inter = (torch.min(a2, b2) - torch.max(a1, b1)).clamp(0).prod(2)
    return inter / ((a2 - a1).prod(2) + (b2 - b1).prod(2) - inter + eps)


def bbox_iou(box1, box2, xywh=True, GIoU=False, DIoU=False, CIoU=False, eps=1e-7):
    """Element-wise (broadcast) IoU / GIoU / DIoU / CIoU of boxes (..., 4)."""
    if xywh:
        (x1, y1, w1, h1), (x2, y2, w2, h2) = box1.chunk(4, -1), box2.chunk(4, -1)
        b1_x1, b1_x2, b1_y1, b1_y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
        b2_x1, b2_x2, b2_y1, b2_y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    else:
        b1_x1, b1_y1, b1_x2, b1_y2 = box1.chunk(4, -1)
        b2_x1, b2_y1, b2_x2, b2_y2 = box2.chunk(4, -1)
        w1, h1 = b1_x2 - b1_x1, (b1_y2 - b1_y1).clamp(eps)
        w2, h2 = b2_x2 - b2_x1, (b2_y2 - b2_y1).clamp(eps)
    inter = (b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp(0) * (
        b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)
    ).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    if not (GIoU or DIoU or CIoU):
        return iou
    cw = b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)  # enclosing box
    ch = b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)
    if CIoU or DIoU:
        c2 = cw.pow(2) + ch.pow(2) + eps  # squared diagonal of the enclosing box
        rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2).pow(2) + (b2_y1 + b2_y2 - b1_y1 - b1_y2).pow(2)) / 4
        if CIoU:
            v = (4 / math.pi**2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).pow(2)
            with torch.no_grad():
                alpha = v / (v - iou + (1 + eps))
            return iou - (rho2 / c2 + v * alpha)
        return iou - rho2 / c2
    c_area = cw * ch + eps
    return iou - (c_area - union) / c_area


def make_anchors(feats, strides, offset=0.5):
    """Anchor-free grid: cell centres (A, 2) in grid units and their strides (A, 1), levels concatenated, in the
    maps' dtype. The ranges are built in the default dtype and cast: the ONNX exporter has no fp16 `arange`
    (`export.py --half`), and half + offset would round twice where one rounding suffices."""
    points, stride_list = [], []
    dtype, device = feats[0].dtype, feats[0].device
    for f, s in zip(feats, strides):
        h, w = f.shape[2:]
        sx = (torch.arange(w, device=device) + offset).to(dtype)
        sy = (torch.arange(h, device=device) + offset).to(dtype)
        sy, sx = torch.meshgrid(sy, sx, indexing="ij")
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_list.append(torch.full((h * w, 1), float(s), dtype=dtype, device=device))
    return torch.cat(points), torch.cat(stride_list)


def dist2bbox(distance, anchor_points, xywh=True, dim=-1):
    """(left, top, right, bottom) distances from anchor points -> boxes."""
    lt, rb = distance.chunk(2, dim)
    x1y1, x2y2 = anchor_points - lt, anchor_points + rb
    if xywh:
        return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)
    return torch.cat((x1y1, x2y2), dim)


def bbox2dist(anchor_points, bbox, reg_max):
    """xyxy boxes -> (left, top, right, bottom) distances, clamped just below reg_max for DFL."""
    x1y1, x2y2 = bbox.chunk(2, -1)
    return torch.cat((anchor_points - x1y1, x2y2 - anchor_points), -1).clamp_(0, reg_max - 0.01)


# The columns of an NMS row (n, 6 + extra), what every consumer of detections reads by name: the box (xyxy input
# pixels, or an oriented box's xywh), its confidence and class, then what the layout adds (mask coefficients,
# keypoints; an oriented box's angle last)
BOX, CONF, CLS = slice(0, 4), 4, 5
SCORED = slice(0, 6)  # box, confidence and class


@dataclass(frozen=True)
class OutputLayout:
    """What a detection head's decoded eval output holds; each head declares it (`head.output_layout`).

    Every anchor's row is, in order: the box as xywh input pixels, an objectness column if `objectness`, `nc` class
    scores, `nm` mask coefficients, then `kpt_shape` = (K, ndim) keypoints as K x ndim values (x, y in input pixels,
    and a visibility probability when ndim is 3), then with `angle` the box's rotation in radians (an oriented box,
    xywhr: utils/rotated.py). `channels_last`: rows are (B, anchors, C) (v5/v7) rather than
    (B, C, anchors) (v8). The eval output is either the prediction tensor alone or a tuple starting with it; `proto` is
    the index path of the mask prototypes in that tuple (empty when the head has none). `train` holds the index paths
    of what the head returns in train mode, which its criterion takes: one path, or one per item of a tuple.
    """

    nc: int
    nm: int = 0
    objectness: bool = False
    channels_last: bool = True
    proto: tuple = ()
    train: tuple = ((1,),)
    kpt_shape: tuple = ()
    angle: bool = False

    def __post_init__(self):
        # lists after a JSON round trip (export metadata)
        object.__setattr__(self, "proto", tuple(self.proto))
        object.__setattr__(self, "train", tuple(tuple(path) for path in self.train))
        object.__setattr__(self, "kpt_shape", tuple(self.kpt_shape))

    @property
    def cls(self):
        """Slice of the class-score columns."""
        start = 5 if self.objectness else 4
        return slice(start, start + self.nc)

    @property
    def mask(self):
        """Slice of the mask-coefficient columns."""
        return slice(self.cls.stop, self.cls.stop + self.nm)

    @property
    def nk(self):
        """Keypoint values per row (K x ndim), 0 without keypoints."""
        return math.prod(self.kpt_shape) if self.kpt_shape else 0

    @property
    def kpts(self):
        """Slice of the keypoint columns."""
        return slice(self.mask.stop, self.mask.stop + self.nk)

    @property
    def width(self):
        """Columns of a prediction row."""
        return self.kpts.stop + self.angle

    def det_keypoints(self, det):
        """Keypoints (n, K, ndim) of NMS output rows (n, 6 + nm + nk), for a layout with keypoints."""
        start = 6 + self.nm
        return det[:, start : start + self.nk].reshape(len(det), *self.kpt_shape)

    def rows(self, prediction):
        """The prediction tensor as (B, anchors, C) rows."""
        return prediction if self.channels_last else prediction.transpose(1, 2)

    def train_output(self, output):
        """The train-mode output (what the criterion takes), from the eval output."""
        parts = [_item(output, path) for path in self.train]
        return parts[0] if len(parts) == 1 else tuple(parts)

    def split(self, output):
        """(prediction tensor, prototypes or None) from the eval output, or from the prediction tensor alone."""
        if isinstance(output, torch.Tensor):
            return output, None
        return output[0], _item(output, self.proto) if self.proto else None


def _item(output, path):
    """The item at index `path` of nested tuples."""
    for i in path:
        output = output[i]
    return output


def non_max_suppression(
    prediction,
    conf_thres=0.25,
    iou_thres=0.45,
    classes=None,
    agnostic=False,
    multi_label=False,
    max_det=300,
    *,
    layout,
    max_nms=30000,
    max_wh=7680,
    time_limit=None,
):
    """NMS for every head: returns per image a tensor (n, 6 + nm + nk) = xyxy, conf, cls, mask coefficients,
    keypoints (the layout's columns after the class scores, carried as they are). An oriented-box layout's rows are
    (n, 7) = xywh, conf, cls, angle: the box stays xywhr, and boxes overlap by probabilistic IoU (`rotated_nms`).

    `prediction` is a head's eval output (or its prediction tensor) and `layout` the head's `OutputLayout`. The
    confidence is the class score, times the objectness where the head has one. Boxes are offset by class (max_wh)
    so one batched NMS call is class-aware.
    """
    prediction = layout.rows(layout.split(prediction)[0])
    bs, nc, extra = prediction.shape[0], layout.nc, slice(layout.cls.stop, layout.width)
    if prediction.shape[-1] != layout.width:
        raise ValueError(f"prediction rows have {prediction.shape[-1]} columns, the layout {layout} says "
                         f"{layout.width}")
    multi_label &= nc > 1
    t0 = time.time()
    width = 6 + layout.width - layout.cls.stop
    output = [torch.zeros((0, width), device=prediction.device, dtype=prediction.dtype) for _ in range(bs)]
    passing = _passing(prediction, layout, conf_thres)
    for xi, x in enumerate(prediction):
        x = x[passing[xi]]
        if not x.shape[0]:
            continue
        scores = x[:, layout.cls] * x[:, 4:5] if layout.objectness else x[:, layout.cls]
        box = x[:, :4] if layout.angle else xywh2xyxy(x[:, :4])
        mask = x[:, extra]  # mask coefficients and keypoints
        if multi_label:
            i, j = (scores > conf_thres).nonzero(as_tuple=False).T
            x = torch.cat((box[i], scores[i, j, None], j[:, None].float(), mask[i]), 1)
        else:
            conf, j = scores.max(1, keepdim=True)
            x = torch.cat((box, conf, j.float(), mask), 1)[conf.view(-1) > conf_thres]
        if classes is not None:
            x = x[(x[:, 5:6] == torch.tensor(classes, device=x.device)).any(1)]
        if not x.shape[0]:
            continue
        x = x[x[:, 4].argsort(descending=True)[:max_nms]]
        output[xi] = x[_kept(x, x[:, 5:6] * (0 if agnostic else max_wh), iou_thres, max_det, layout.angle)]
        if time_limit is not None and time.time() - t0 > time_limit:
            LOGGER.warning(
                f"NMS time limit {time_limit:.2f}s exceeded: images after {xi + 1} of {bs} get no detections"
            )
            break  # a safety valve for untrained models that emit thousands of boxes
    return output


def _passing(rows, layout, conf_thres):
    """bool (B, anchors): the rows NMS may keep, picked for the whole batch before any per-row work (at val's conf
    0.001 a few hundred of a v8 head's 8400 anchors pass, and its channels-first rows are strided: the work of each
    image on all of them was 5 ms on a CPU). Objectness over the threshold where the head has one, else a class score
    over it; a row with a NaN score (whose max is NaN) passes, and the per-row steps decide on it as before."""
    if layout.objectness:
        return rows[..., 4] > conf_thres
    best = rows[..., layout.cls].amax(-1)
    return (best > conf_thres) | best.isnan()


def _kept(rows, offsets, iou_thres, n, rotated):
    """The rows NMS keeps (sorted by score): boxes moved by their class's offset so that classes never overlap; an
    oriented box (`rotated`: xywh, then its angle in the last column) is moved by its centre."""
    if rotated:
        boxes = torch.cat((rows[:, :2] + offsets, rows[:, 2:4], rows[:, -1:]), 1)
        return first_kept(boxes, rows[:, 4], iou_thres, n, rotated_nms)
    return first_kept(rows[:, :4] + offsets, rows[:, 4], iou_thres, n)


def first_kept(boxes, scores, iou_thres, n, nms=None):
    """`nms(boxes, scores, iou_thres)[:n]` (torchvision's by default) for boxes sorted by descending score, without
    running NMS over boxes that cannot change those n.

    Greedy NMS decides each box from the boxes before it alone, and torchvision's stable sort leaves sorted boxes in
    their order (ties included), so NMS over the first m boxes keeps exactly the whole set's kept boxes that lie
    among them: once it keeps n, they are the answer. (The rotated rule, `rotated_nms`, also decides each box from
    the boxes before it, and its work and memory grow with the square of the boxes passed.) The work grows with
    boxes x kept boxes, and on a weak model at validation's conf 0.001 thousands of boxes survive NMS while only
    max_det are used (yolov5n after 3 epochs on the shapes benchmark: 5200 boxes, 3900 kept, 300 used); this was
    half of validation's time on a CPU. On CUDA the NMS is a parallel kernel and the whole set is passed, as before.
    """
    nms = nms or torchvision_nms()
    if boxes.device.type != "cpu":
        return nms(boxes, scores, iou_thres)[:n]
    m = 2 * n
    while True:
        keep = nms(boxes[:m], scores[:m], iou_thres)
        if len(keep) >= n or m >= len(boxes):
            return keep[:n]
        m *= 2


def crop_mask(masks, boxes):
    """Zero mask pixels outside each box: masks (n, h, w), boxes (n, 4) xyxy in mask pixels."""
    _, h, w = masks.shape
    x1, y1, x2, y2 = torch.chunk(boxes[:, :, None], 4, 1)
    r = torch.arange(w, device=masks.device, dtype=x1.dtype)[None, None, :]
    c = torch.arange(h, device=masks.device, dtype=x1.dtype)[None, :, None]
    return masks * ((r >= x1) * (r < x2) * (c >= y1) * (c < y2))


def process_mask(protos, masks_in, bboxes, shape, upsample=False):
    """Binary instance masks from prototypes (nm, mh, mw) and coefficients (n, nm), cropped to xyxy boxes given in
    input-image pixels `shape` (h, w); returned at proto resolution, or at `shape` with upsample=True. Upsampled, the
    logits are resized first and cropped at `shape`: a crop at proto resolution would move every box edge to the
    proto grid (4 px at stride 4), which costs shapes whose sides are their box's (rectangles) most of their mask
    mAP at high IoU thresholds."""
    c, mh, mw = protos.shape
    ih, iw = shape
    if not len(masks_in):
        return torch.zeros((0, *(shape if upsample else (mh, mw))), dtype=torch.bool, device=protos.device)
    masks = (masks_in @ protos.float().view(c, -1)).view(-1, mh, mw)
    if upsample:
        masks = crop_mask(F.interpolate(masks[None], shape, mode="bilinear", align_corners=False)[0], bboxes)
    else:
        scaled = bboxes.clone()
        scaled[:, [0, 2]] *= mw / iw
        scaled[:, [1, 3]] *= mh / ih
        masks = crop_mask(masks, scaled)
    return masks.gt_(0.0)  # logit > 0 is sigmoid > 0.5, at either resolution


def scale_masks(masks, shape, ratio_pad=None):
    """Masks (n, h, w) of a letterboxed image -> masks at the original image shape (h0, w0), padding removed."""
    mh, mw = masks.shape[1:]
    if ratio_pad is None:
        gain = min(mh / shape[0], mw / shape[1])
        pad_w, pad_h = (mw - shape[1] * gain) / 2, (mh - shape[0] * gain) / 2
    else:
        pad_w, pad_h = ratio_pad[1]
    top, left = int(round(pad_h - 0.1)), int(round(pad_w - 0.1))
    bottom, right = int(round(mh - pad_h + 0.1)), int(round(mw - pad_w + 0.1))
    # at least a row and a column: letterbox keeps one of an image a pixel thin, whose side rounds to 0 here
    masks = masks[:, top : max(bottom, top + 1), left : max(right, left + 1)]
    if not masks.shape[0]:
        return torch.zeros((0, *shape), dtype=masks.dtype, device=masks.device)
    return F.interpolate(masks[None].float(), shape, mode="bilinear", align_corners=False)[0]


def masks2segments(masks):
    """Binary masks (n, h, w) -> the largest outer contour of each as an (m, 2) float32 pixel polygon."""
    segments = []
    for m in masks.int().cpu().numpy().astype("uint8"):
        contours = cv2.findContours(m, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)[0]
        if contours:
            c = max(contours, key=len).reshape(-1, 2)
        else:
            c = np.zeros((0, 2))
        segments.append(c.astype(np.float32))
    return segments
