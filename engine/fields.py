"""What a detection-family model predicts of each object, one field object per kind: boxes, masks, keypoints.

The validator (`engine/tasks/detect.DetectionValidator`) walks the fields its task declares, boxes first (the first
field also reads each image's labels, `labels`: cls and its geometry in original-image pixels); each field does for
one image what is particular to it:
- `decode`: completes the image's record with what its matching needs, on the device (masks: from the prototypes);
- `scale`: brings its columns of the image's NMS rows (a CPU copy) back to original-image pixels;
- `match`: marks its predictions that match the labels at each IoU threshold (box IoU, mask IoU, OKS), bool (n, t) in
  the rows' order, which the validator keeps under the field's `key` and hands to the metrics' attribute `metric`
  (results.csv columns `(suffix)`, the header's `title`, curves `<curve>PR_curve.png`, pycocotools `iou_type`);
- `txt_columns` and `to_json`: its values in a --save-txt line and a COCO result row;
- `plot_kwargs`: what `plot_images` draws of it in val_batch*_pred.jpg.
"""

import dataclasses
from pathlib import Path

import torch

from utils import ops
from utils.coco import box_to_coco_json, coco_keypoints, image_id_from_path, masks_to_rle
from utils.metrics import (
    instance_masks,
    keypoint_sigmas,
    process_batch,
    process_keypoint_batch,
    process_mask_batch,
)

MAX_PLOTTED_PREDS = 30  # per image in val_batch*_pred.jpg: the most confident, enough to judge a tile


@dataclasses.dataclass(frozen=True)
class Predictions:
    """One image's predictions, from NMS through validation."""

    boxes: torch.Tensor  # (n, 6 + nm + nk) NMS rows: xyxy input pixels, conf, cls, every column after the class scores
    proto: torch.Tensor | None = None  # segmentation: the image's prototypes (nm, H/4, W/4)
    masks: torch.Tensor | None = None  # after Masks.decode: (n, H, W) at the input size, in the rows' order

    @classmethod
    def of(cls, record):
        """A record, or the mapping of its fields (a record built by hand)."""
        return record if isinstance(record, cls) else cls(**record)


def txt_lines(rows, columns, conf=True):
    """--save-txt lines: `cls` then the fields' `columns` (n, k) (normalised values), then the confidence when `conf`;
    rows (n, 6+) hold conf and cls in columns 4 and 5."""
    return [f"{int(c)} " + " ".join(f"{v:.6g}" for v in values) + (f" {p:.6g}" if conf else "") + "\n"
            for values, (p, c) in zip(columns.tolist(), rows[:, 4:6].tolist())]


class Field:
    """What every field does; a field with nothing to add in a step keeps these."""

    key = metric = suffix = title = curve = iou_type = None

    def decode(self, image, batch):
        return image

    def scale(self, native, batch, si):
        """Its columns of `native` (image si's rows) to original-image pixels, in place."""

    def match(self, image, native, labels, batch, si, iouv):
        """bool (n, len(iouv)): prediction i matches a label of its class at threshold j; labels (m, 5) are the
        image's cls, xyxy in original-image pixels (`Boxes.labels`), m > 0."""
        raise NotImplementedError

    def txt_columns(self, native, shape):
        return native[:, :0]

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

    @staticmethod
    def labels(batch, si):
        """Labels of image si as (m, 5) cls, xyxy in original-image pixels."""
        t = batch["targets"][batch["targets"][:, 0] == si]
        h, w = batch["img"].shape[2:]
        boxes = ops.xywh2xyxy(t[:, 2:6]) * torch.tensor((w, h, w, h), device=t.device)
        shape, ratio_pad = batch["shapes"][si]
        ops.scale_boxes((h, w), boxes, shape, ratio_pad=ratio_pad)
        return torch.cat([t[:, 1:2], boxes], 1)

    def scale(self, native, batch, si):
        shape, ratio_pad = batch["shapes"][si]
        ops.scale_boxes(batch["img"].shape[2:], native[:, :4], shape, ratio_pad=ratio_pad)

    def match(self, image, native, labels, batch, si, iouv):
        return process_batch(native[:, :6], labels, iouv)

    def txt_columns(self, native, shape):
        h, w = shape
        return ops.xyxy2xywh(native[:, :4]) / torch.tensor((w, h, w, h), device=native.device)

    def to_json(self, rows, image, native, batch, si):
        return rows + box_to_coco_json(native[:, :6], image_id_from_path(Path(batch["paths"][si])))


class Masks(Field):
    """Instance masks: decoded from the prototypes at the input size (coefficients: the nm columns after cls),
    matched by mask IoU with the labels' masks there, as the official validators; COCO RLE in original-image pixels.
    Nothing in the rows or the --save-txt lines: the masks go back to the original image for the JSON only."""

    key, metric, suffix, title, curve, iou_type = "tp_m", "seg", "M", "Mask", "Mask", "segm"

    def decode(self, image, batch):
        """The record with `masks` (n, H, W) at the input size (coefficients and boxes in fp32: under --half they come
        in fp16). One image at a time: a batch's at once would hold up to max_det input-size masks per image."""
        b, shape, nm = image.boxes, batch["img"].shape[2:], len(image.proto)
        masks = ops.process_mask(image.proto, b[:, 6 : 6 + nm].float(), b[:, :4].float(), shape, upsample=True)
        return dataclasses.replace(image, masks=masks)

    def match(self, image, native, labels, batch, si, iouv):
        """Ground truth from the overlap map or the per-instance stack, as the batch's `overlap` says."""
        n = len(labels)
        gt = instance_masks(batch["masks"][si], n) if batch["overlap"] else \
            batch["masks"][batch["targets"][:, 0] == si].gt(0.5)
        return process_mask_batch(native, labels, image.masks, gt, iouv)

    def to_json(self, rows, image, native, batch, si):
        masks = ops.scale_masks(image.masks, batch["shapes"][si][0], batch["shapes"][si][1])
        for row, rle in zip(rows, masks_to_rle(masks.gt(0.5).cpu().numpy())):
            row["segmentation"] = rle
        return rows

    def plot_kwargs(self, preds, batch):
        masks = [self.decode(dataclasses.replace(image, boxes=image.boxes[:MAX_PLOTTED_PREDS]), batch).masks
                 for image in preds if len(image.boxes)]
        return {"masks": torch.cat(masks).float() if masks else None}


class Keypoints(Field):
    """K keypoints of ndim values (x, y in pixels, a visibility probability with ndim 3): the rows' last K x ndim
    columns; matched by OKS (utils/metrics.keypoint_oks) in original-image pixels, with the label's box area x 0.53 as
    its scale, as the official validator."""

    key, metric, suffix, title, curve, iou_type = "tp_p", "pose", "P", "Pose", "Pose", "keypoints"

    def __init__(self, kpt_shape):
        self.kpt_shape = tuple(kpt_shape)
        self.nk = self.kpt_shape[0] * self.kpt_shape[1]
        self.sigmas = keypoint_sigmas(self.kpt_shape[0])

    def of(self, rows):
        """The keypoints (n, K, ndim) of NMS rows (a view)."""
        return rows[:, rows.shape[1] - self.nk :].reshape(len(rows), *self.kpt_shape)

    def _native(self, kpts, batch, si):
        """Keypoints (n, K, ndim) in input pixels -> original-image pixels (a copy)."""
        kpts = kpts.clone().float()
        shape, ratio_pad = batch["shapes"][si]
        ops.scale_coords(batch["img"].shape[2:], kpts[..., :2], shape, ratio_pad=ratio_pad)
        return kpts

    def scale(self, native, batch, si):
        native[:, native.shape[1] - self.nk :] = self._native(self.of(native), batch, si).flatten(1)

    def match(self, image, native, labels, batch, si, iouv):
        """Labels' keypoints (m, K, 3) in original-image pixels, visibility 0 where not labelled."""
        gt = batch["keypoints"][batch["targets"][:, 0] == si].clone()
        h, w = batch["img"].shape[2:]
        gt[..., 0] *= w
        gt[..., 1] *= h
        gt = self._native(gt, batch, si)
        return process_keypoint_batch(native[:, :6], labels, self.of(native), gt, self.sigmas, iouv)

    def txt_columns(self, native, shape):
        h, w = shape
        kpts = self.of(native)
        return (kpts / torch.tensor([w, h, 1][: kpts.shape[-1]], device=kpts.device)).flatten(1)

    def to_json(self, rows, image, native, batch, si):
        for row, k in zip(rows, coco_keypoints(self.of(native).cpu())):
            row["keypoints"] = k
        return rows

    def plot_kwargs(self, preds, batch):
        kpts = [self.of(image.boxes[:MAX_PLOTTED_PREDS]) for image in preds]
        return {"keypoints": torch.cat(kpts).float() if kpts else None}

    def coco_kwargs(self, args):
        return {"kpt_sigmas": self.sigmas, "max_dets": args.max_det}
