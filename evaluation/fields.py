"""What a model predicts, one field object per kind: boxes, masks, keypoints of each object; a classifier's class
scores of the whole image (`ClassScores`).

The validator (`engine/tasks/boxes.BoxValidator`) and the predictor (`engine/tasks/boxes.BoxPredictor`) walk the
fields their task's record declares (engine/tasks), boxes first (the first field also reads each image's labels,
`labels`: cls and its geometry in original-image pixels, and gives what --save-crop/--save-csv and the log line say of
each image, `objects` and `summary`); each field does for one image what is particular to it:
- `decode`: completes the image's record with what its matching or drawing needs, on the device (masks: from the
  prototypes, at the input size);
- `scale`: brings its columns of the image's NMS rows back to original-image pixels (`Letterbox`: how the image was
  fitted to the input); `to_original`: the same for the predictor's record, its masks too;
- `match`: marks its predictions that match the labels at each IoU threshold (box IoU, mask IoU, OKS), bool (n, t) in
  the rows' order, which the validator keeps under the field's `key` and hands to the metrics' attribute `metric`
  (results.csv columns `(suffix)`, the header's `title`, curves `<curve>PR_curve.png`, pycocotools `iou_type`);
- `txt_columns` and `to_json`: its values in a val --save-txt line and a COCO result row; `label_values`: in a
  predict --save-txt line, which is the task's label format (`lines`);
- `plot_kwargs`: what `plot_images` draws of it in val_batch*_pred.jpg; `draw`: what the predictor draws of it.
"""

import dataclasses
from pathlib import Path
from typing import NamedTuple

import cv2
import torch

from evaluation.coco import box_to_coco_json, coco_keypoints, image_id_from_path, masks_to_rle
from evaluation.metrics import (
    instance_masks,
    keypoint_sigmas,
    labels_box_iou,
    labels_rotated_iou,
    process_batch,
    process_keypoint_batch,
    process_mask_batch,
    process_rotated_batch,
)
from evaluation.plots import colors
from utils import ops
from utils.ops import BOX, CLS, CONF, SCORED
from utils.rotated import regularize, xywhr_to_corners
from utils.torch_utils import labels_to

MAX_PLOTTED_PREDS = 30  # per image in val_batch*_pred.jpg: the most confident, enough to judge a tile


@dataclasses.dataclass(frozen=True)
class Predictions:
    """One image's predictions, from NMS (or the classifier) through validation and prediction. The predictor's
    record is in original-image pixels (the fields' `to_original`): its rows, and its masks at the image's size."""

    # (n, 6 + nm + nk) NMS rows: xyxy input pixels, conf, cls, every column after the class scores
    boxes: torch.Tensor | None = None
    proto: torch.Tensor | None = None  # segmentation: the image's prototypes (nm, H/4, W/4)
    masks: torch.Tensor | None = None  # after Masks.decode: (n, H, W) at the input size, in the rows' order
    probs: torch.Tensor | None = None  # classification: the class probabilities (nc,)

    @property
    def conf(self):
        """(n,) each row's confidence."""
        return self.boxes[:, CONF]

    @property
    def cls(self):
        """(n,) each row's class."""
        return self.boxes[:, CLS]

    @classmethod
    def of(cls, record):
        """A record, or the mapping of its fields (a record built by hand)."""
        return record if isinstance(record, cls) else cls(**record)


class Letterbox(NamedTuple):
    """How an image was fitted to the model's input: the input's (h, w), the original image's shape (h0, w0, ...)
    and the letterbox's (ratio, pad), which the ops compute from the two shapes where it is None (the predictor)."""

    input: tuple
    shape: tuple
    ratio_pad: tuple | None = None

    @classmethod
    def placed(cls, input, shape):
        """An image of `shape` letterboxed into `input` (h, w) by data/augment.letterbox, with the ratio and pad
        that placed it: the resized sides rounded to whole pixels, the pad's odd pixel at the bottom and right. The
        pad computed from the two shapes alone would be half a pixel off on the padded axis (yolov5's scale_boxes);
        this is where the pixels are, and what Ultralytics' predict maps back through."""
        h, w = input[:2]
        r = min(h / shape[0], w / shape[1])
        new_w, new_h = max(1, int(round(shape[1] * r))), max(1, int(round(shape[0] * r)))
        pad = (int(round((w - new_w) / 2 - 0.1)), int(round((h - new_h) / 2 - 0.1)))
        return cls(tuple(input[:2]), shape, ((new_h / shape[0], new_w / shape[1]), pad))

    @classmethod
    def of_batch(cls, batch, si):
        """Image si of a validation batch, whose `shapes` hold each image's original shape and (ratio, pad)."""
        return cls(batch["img"].shape[2:], *batch["shapes"][si])


def in_original_pixels(fields, rows, proto, fit):
    """An image's record as the predictors (engine/predictor.py, the `YOLO` API) give it: from its NMS rows in input
    pixels and its prototypes (or None), each field decodes (masks from the boxes still in input pixels), then brings
    its part back to the original image (`fit`: a `Letterbox`)."""
    image = Predictions(rows, proto=proto)
    for f in fields:
        image = f.decode(image, fit)
    for f in fields:
        image = f.to_original(image, fit)
    return image


def plotted_labels(targets):
    """A batch's targets (data/targets.Targets) as plot_images draws them: rows (N, 6) image, cls, cxcywh normalised
    (an oriented box's own sides), and the oriented boxes' angles (N,), or None for upright boxes."""
    boxes = targets.boxes
    rows = torch.cat((targets.image[:, None].to(targets.cls.dtype), targets.cls[:, None], boxes.data[:, :4]), 1)
    return rows, (boxes.data[:, 4] if boxes.format == "cxcywhr" else None)


def txt_lines(rows, values, conf=True, ids=None):
    """--save-txt lines: `cls` then each row's `values` (normalised; a row whose values are None has no line), then
    the confidence when `conf`, then the row's track id where `ids` (n,) are given, as Ultralytics writes them; rows
    (n, 6+) are NMS rows (utils/ops: CONF, CLS)."""
    tails = [f" {int(i)}" for i in ids] if ids is not None else [""] * len(rows)
    return [f"{int(c)} " + " ".join(f"{v:.6g}" for v in vals) + (f" {p:.6g}" if conf else "") + tail + "\n"
            for vals, p, c, tail in zip(values, rows[:, CONF].tolist(), rows[:, CLS].tolist(), tails)
            if vals is not None]


class Field:
    """What every field does; a field with nothing to add in a step keeps these."""

    key = metric = suffix = title = curve = iou_type = None

    def decode(self, image, fit):
        return image

    def scale(self, native, fit):
        """Its columns of `native` (an image's rows, fitted to the input as `fit` says) to original-image pixels, in
        place."""

    def to_original(self, image, fit):
        """The record with its part in original-image pixels (the rows scaled in place)."""
        self.scale(image.boxes, fit)
        return image

    def match(self, image, native, labels, batch, si, iouv):
        """bool (n, len(iouv)): prediction i matches a label of its class at threshold j; labels (m, 5) are the
        image's cls, xyxy in original-image pixels (`Boxes.labels`), m > 0."""
        raise NotImplementedError

    def txt_columns(self, native, shape):
        return native[:, :0]

    def label_values(self, values, image, shape):
        """Each row's values in a predict --save-txt line once this field has added its own (`txt_columns`) to
        `values`, those of the fields before it; `image` in original-image pixels, of `shape` (h, w)."""
        return [v + c for v, c in zip(values, self.txt_columns(image.boxes.float(), shape).tolist())]

    def lines(self, fields, image, shape, conf, ids=None):
        """(the first field) A predictor's --save-txt lines of one image, in the task's label format: cls, then what
        each of `fields` in turn puts in the line (`label_values`), then the confidence when `conf`, then the track
        id where `ids` (one a row) are given."""
        values = [[] for _ in range(len(image.boxes))]
        for f in fields:
            values = f.label_values(values, image, shape)
        return txt_lines(image.boxes, values, conf, ids)

    def draw(self, annotator, image, label):
        """Draw its part of `image` (original-image pixels); `label(cls, conf)` is the text beside an object."""

    def to_json(self, rows, image, native, batch, si):
        """COCO result rows of image si with this field's keys added; the first field makes the rows."""
        raise NotImplementedError

    def plot_kwargs(self, preds, batch):
        return {}

    def coco_kwargs(self, args):
        return {}


class Boxes(Field):
    """Axis-aligned boxes: columns 0-3 of the rows, xyxy; matched by IoU with the labels' boxes."""

    key, metric, suffix, title, curve, iou_type = "tp", "box", "B", "Box", "", "bbox"
    pair_iou = staticmethod(labels_box_iou)  # (labels, rows) -> (m, n) overlaps: what the confusion matrix matches by

    @staticmethod
    def plotted(boxes):
        """Per-image NMS rows (n, 6+) -> plot_images rows (N, 7): image, cls, xywh pixels, conf."""
        rows = [torch.cat((torch.full_like(p[:, :1], i), p[:, CLS, None], ops.xyxy2xywh(p[:, BOX]), p[:, CONF, None]),
                          1) for i, p in enumerate(boxes)]
        return torch.cat(rows).float() if rows else torch.zeros((0, 7))

    @staticmethod
    def labels(batch, si):
        """Labels of image si as (m, 5) cls, xyxy in original-image pixels."""
        t = batch["targets"].of_image(si)
        boxes = t.boxes.convert("xyxy").pixels().data
        shape, ratio_pad = batch["shapes"][si]
        ops.scale_boxes(t.canvas, boxes, shape, ratio_pad=ratio_pad)
        return torch.cat([t.cls[:, None], boxes], 1)

    def scale(self, native, fit):
        ops.scale_boxes(fit.input, native[:, :4], fit.shape, ratio_pad=fit.ratio_pad)

    @staticmethod
    def objects(image):
        """(xyxy, class, confidence) of each prediction, for --save-crop and --save-csv."""
        return [(xyxy, int(c), conf) for *xyxy, conf, c in image.boxes[:, SCORED].tolist()]

    def summary(self, image, names):
        """The log line's count of each class, in the order drawn."""
        counts = {}
        for c in reversed(image.cls.tolist()):
            counts[int(c)] = counts.get(int(c), 0) + 1
        return ", ".join(f"{n} {names[c]}" for c, n in counts.items()) or "(no detections)"

    def draw(self, annotator, image, label):
        """The most confident box last, on top."""
        for *xyxy, conf, c in reversed(image.boxes[:, SCORED].tolist()):
            annotator.box_label(xyxy, label(int(c), conf), color=colors(int(c), True))

    def match(self, image, native, labels, batch, si, iouv):
        return process_batch(native[:, SCORED], labels, iouv)

    def txt_columns(self, native, shape):
        h, w = shape
        return ops.xyxy2xywh(native[:, :4]) / torch.tensor((w, h, w, h), device=native.device)

    def to_json(self, rows, image, native, batch, si):
        return rows + box_to_coco_json(native[:, SCORED], image_id_from_path(Path(batch["paths"][si])))


def _unletterbox_xywh(xywh, fit):
    """Rotated boxes' xywh (n, 4) from input to original-image pixels, in place: the centre as any point, the sides
    by the mean of the two axes' gains (a rotated side runs along neither axis; the two differ by a rounding)."""
    (gx, gy), pad = ops._gains_pad(fit.input, fit.shape, fit.ratio_pad)
    xywh[:, 0] = (xywh[:, 0] - pad[0]) / gx
    xywh[:, 1] = (xywh[:, 1] - pad[1]) / gy
    xywh[:, 2:4] /= (gx + gy) / 2


class RotatedBoxes(Boxes):
    """Oriented boxes (the OBB head's rows: xywh, conf, cls, then the angle in radians, the last column); matched by
    exact polygon IoU with the labels' rotated boxes (cls, xywhr: `labels`), in original-image pixels. Rows are
    regularised on decode as Ultralytics reports them (utils/rotated.regularize: angle in [0, pi/2)). Written as the
    four corners (DOTA's form: the --save-txt label line and JSON's `poly`, with `rbox` xywhr); not in pycocotools,
    which has no rotated boxes (`iou_type` None)."""

    iou_type = None
    pair_iou = staticmethod(labels_rotated_iou)

    @staticmethod
    def plotted(boxes):
        """Per-image NMS rows -> plot_images rows (N, 7): image, cls, xywh pixels (the box's own sides), conf; their
        angles go to plot_images as `angles` (`plot_kwargs`)."""
        rows = [torch.cat((torch.full_like(p[:, :1], i), p[:, CLS, None], p[:, BOX], p[:, CONF, None]), 1)
                for i, p in enumerate(boxes)]
        return torch.cat(rows).float() if rows else torch.zeros((0, 7))

    def plot_kwargs(self, preds, batch):
        return {"angles": torch.cat([image.boxes[:MAX_PLOTTED_PREDS, -1] for image in preds]).float()
                if preds else None}

    @staticmethod
    def xywhr(rows):
        """(n, 5) xywhr of NMS rows."""
        return torch.cat((rows[:, BOX], rows[:, -1:]), 1)

    @staticmethod
    def corners(rows):
        return xywhr_to_corners(RotatedBoxes.xywhr(rows).float())

    @staticmethod
    def labels(batch, si):
        """Labels of image si as (m, 6) cls, xywhr in original-image pixels (the targets' cxcywhr boxes)."""
        t = batch["targets"].of_image(si)
        xywhr = t.boxes.pixels().data.clone()  # unletterboxed in place
        _unletterbox_xywh(xywhr[:, :4], Letterbox.of_batch(batch, si))
        return torch.cat((t.cls[:, None], xywhr), 1)

    def decode(self, image, fit):
        rows = image.boxes.clone()
        rb = regularize(self.xywhr(rows))
        rows[:, :4], rows[:, -1] = rb[:, :4], rb[:, 4]
        return dataclasses.replace(image, boxes=rows)

    def scale(self, native, fit):
        _unletterbox_xywh(native[:, :4], fit)

    @staticmethod
    def objects(image):
        """(xyxy of the corners' bounding box, class, confidence) of each prediction: what --save-crop cuts."""
        c = RotatedBoxes.corners(image.boxes)
        xyxy = torch.cat((c.amin(1), c.amax(1)), 1)
        return [(b, int(k), conf) for b, conf, k in zip(xyxy.tolist(), image.conf.tolist(), image.cls.tolist())]

    def draw(self, annotator, image, label):
        for corners, conf, c in zip(reversed(self.corners(image.boxes).tolist()), reversed(image.conf.tolist()),
                                    reversed(image.cls.tolist())):
            pts = torch.tensor(corners).round().int().numpy()
            cv2.polylines(annotator.im, [pts], True, colors(int(c), True), annotator.lw, cv2.LINE_AA)
            annotator.text(tuple(int(v) for v in pts[pts[:, 1].argmin()]), label(int(c), conf))

    def match(self, image, native, labels, batch, si, iouv):
        return process_rotated_batch(native[:, SCORED], native[:, -1], labels, iouv)

    def txt_columns(self, native, shape):
        h, w = shape
        return (self.corners(native) / torch.tensor((w, h), device=native.device)).flatten(1)

    def to_json(self, rows, image, native, batch, si):
        image_id = image_id_from_path(Path(batch["paths"][si]))
        return rows + [{"image_id": image_id, "category_id": int(r[CLS]), "score": round(float(r[CONF]), 5),
                        "rbox": [round(v, 3) for v in xywhr], "poly": [round(v, 3) for v in poly]}
                       for r, xywhr, poly in zip(native.tolist(), self.xywhr(native).tolist(),
                                                 self.corners(native).flatten(1).tolist())]


class Masks(Field):
    """Instance masks: decoded from the prototypes at the input size (coefficients: the nm columns after cls),
    matched by mask IoU with the labels' masks there, as the official validators; COCO RLE in original-image pixels.
    Nothing in the rows or the --save-txt lines: the masks go back to the original image for the JSON only."""

    key, metric, suffix, title, curve, iou_type = "tp_m", "seg", "M", "Mask", "Mask", "segm"

    def decode(self, image, fit):
        """The record with `masks` (n, H, W) at the input size, from the rows' boxes in input pixels (coefficients and
        boxes in fp32: under --half they come in fp16). One image at a time: a batch's at once would hold up to
        max_det input-size masks per image."""
        b, nm = image.boxes, len(image.proto)
        masks = ops.process_mask(image.proto, b[:, 6 : 6 + nm].float(), b[:, :4].float(), fit.input, upsample=True)
        return dataclasses.replace(image, masks=masks)

    @staticmethod
    def native(masks, fit):
        """Input-size masks -> binary masks at the original image's size."""
        return ops.scale_masks(masks, fit.shape[:2], fit.ratio_pad).gt(0.5)

    def to_original(self, image, fit):
        return dataclasses.replace(image, masks=self.native(image.masks, fit))

    def label_values(self, values, image, shape):
        """The outline of each mask (its largest contour), normalised, in place of the values before it: a
        segmentation label line is `cls` and a polygon. A mask without a contour has no line."""
        h, w = shape
        return [[v for x, y in seg for v in (x / w, y / h)] if len(seg) else None
                for seg in ops.masks2segments(image.masks)]

    def draw(self, annotator, image, label):
        annotator.masks(image.masks, [colors(int(c), True) for c in image.cls])

    def match(self, image, native, labels, batch, si, iouv):
        """Ground truth from the overlap map or the per-instance stack, as the batch's `overlap` says."""
        n = len(labels)
        gt = instance_masks(batch["masks"][si], n) if batch["overlap"] else \
            batch["masks"][batch["targets"].image == si].gt(0.5)
        return process_mask_batch(native, labels, image.masks, gt, iouv)

    def to_json(self, rows, image, native, batch, si):
        masks = self.native(image.masks, Letterbox.of_batch(batch, si))
        for row, rle in zip(rows, masks_to_rle(masks.cpu().numpy())):
            row["segmentation"] = rle
        return rows

    def plot_kwargs(self, preds, batch):
        fit = Letterbox(batch["img"].shape[2:], None)
        masks = [self.decode(dataclasses.replace(image, boxes=image.boxes[:MAX_PLOTTED_PREDS]), fit).masks
                 for image in preds if len(image.boxes)]
        return {"masks": torch.cat(masks).float() if masks else None}


class Keypoints(Field):
    """K keypoints of ndim values (x, y in pixels, a visibility probability with ndim 3): the rows' last K x ndim
    columns; matched by OKS (evaluation/metrics.keypoint_oks) in original-image pixels, with the label's box area
    x 0.53 as its scale, as the official validator."""

    key, metric, suffix, title, curve, iou_type = "tp_p", "pose", "P", "Pose", "Pose", "keypoints"

    def __init__(self, kpt_shape, skeleton=None):
        """`skeleton`: the keypoint pairs the predictor draws lines between."""
        self.kpt_shape, self.skeleton = tuple(kpt_shape), skeleton
        self.nk = self.kpt_shape[0] * self.kpt_shape[1]
        self.sigmas = keypoint_sigmas(self.kpt_shape[0])

    def of(self, rows):
        """The keypoints (n, K, ndim) of NMS rows (a view)."""
        return rows[:, rows.shape[1] - self.nk :].reshape(len(rows), *self.kpt_shape)

    @staticmethod
    def _native(kpts, fit):
        """Keypoints (n, K, ndim) in input pixels -> original-image pixels (a copy)."""
        kpts = kpts.clone().float()
        ops.scale_coords(fit.input, kpts[..., :2], fit.shape, ratio_pad=fit.ratio_pad)
        return kpts

    def scale(self, native, fit):
        native[:, native.shape[1] - self.nk :] = self._native(self.of(native), fit).flatten(1)

    def match(self, image, native, labels, batch, si, iouv):
        """Labels' keypoints (m, K, 3) in original-image pixels, visibility 0 where not labelled."""
        gt = self._native(batch["targets"].of_image(si).keypoints_pixels(), Letterbox.of_batch(batch, si))
        return process_keypoint_batch(native[:, SCORED], labels, self.of(native), gt, self.sigmas, iouv)

    def txt_columns(self, native, shape):
        h, w = shape
        kpts = self.of(native)
        return (kpts / torch.tensor([w, h, 1][: kpts.shape[-1]], device=kpts.device)).flatten(1)

    def draw(self, annotator, image, label):
        for kpts in self.of(image.boxes):
            annotator.keypoints(kpts, self.skeleton)

    def to_json(self, rows, image, native, batch, si):
        for row, k in zip(rows, coco_keypoints(self.of(native).cpu())):
            row["keypoints"] = k
        return rows

    def plot_kwargs(self, preds, batch):
        kpts = [self.of(image.boxes[:MAX_PLOTTED_PREDS]) for image in preds]
        return {"keypoints": torch.cat(kpts).float() if kpts else None}

    def coco_kwargs(self, args):
        return {"kpt_sigmas": self.sigmas, "max_dets": args.max_det}


class ClassScores:
    """A classifier's class probabilities of each whole image, (n, nc) in a validation batch, (nc,) in the predictor's
    record (`Predictions.probs`): matched by whether the label is the most probable class (top-1) or among the five
    most probable (top-5); written and drawn as the five most probable classes with their probabilities."""

    def __init__(self, names):
        self.names = names

    @staticmethod
    def top(probs, k=5):
        """The k most probable classes, best first, along the last dimension."""
        return probs.argsort(-1, descending=True)[..., :k]

    @staticmethod
    def to_device(batch, device, half):
        """A validation batch's images (floats in [0, 1] already), in the model's precision, and labels on `device`."""
        batch["img"] = batch["img"].to(device, non_blocking=True)
        batch["img"] = batch["img"].half() if half else batch["img"].float()
        return labels_to(batch, device, ("cls",))

    @staticmethod
    def match(probs, batch):
        """A batch's record: each image's five most probable classes and its label, on the CPU."""
        return {"pred": [ClassScores.top(probs).cpu()], "target": [batch["cls"].cpu()]}

    @staticmethod
    def accumulate(records, metrics, confusion):
        """Top-1 and top-5 accuracy (`metrics`, a ClassifyMetrics) and the top-1 class against the label (`confusion`)
        over every batch's records; returns the metrics by their results.csv names."""
        pred, targets = torch.cat(records["pred"]), torch.cat(records["target"])
        confusion.process_cls_preds(pred, targets)
        metrics.process(targets, pred)
        return dict(metrics.results_dict)

    def _ranked(self, probs):
        return [(self.names[j], probs[j]) for j in self.top(probs).tolist()]

    def _texts(self, probs):
        return [f"{p:.2f} {name}" for name, p in self._ranked(probs)]

    def lines(self, fields, image, shape, conf, ids=None):
        """--save-txt lines: `probability name` of the five most probable classes (nothing is tracked)."""
        return [t + "\n" for t in self._texts(image.probs)]

    def draw(self, annotator, image, label):
        """The lines of --save-txt, in the image's top-left corner."""
        annotator.text((4 * annotator.lw, 4 * annotator.lw), "\n".join(self._texts(image.probs)))

    def summary(self, image, names):
        return ", ".join(f"{name} {p:.2f}" for name, p in self._ranked(image.probs))

    @staticmethod
    def objects(image):
        """The most probable class of the whole image: no box to crop."""
        conf, c = image.probs.max(0)
        return [(None, int(c), float(conf))]
