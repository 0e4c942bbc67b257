"""Segmentation task: the detection hooks plus masks (YOLOv5-seg and YOLOv8-seg)."""

from pathlib import Path

import torch

from engine.options import SegmentTrainOptions
from engine.tasks.detect import MAX_PLOTTED_PREDS, DetectionPredictor, DetectionTrainer, DetectionValidator
from engine.validator import ValOptions
from models.yolo import SegmentationModel
from utils import ops
from utils.coco import box_to_coco_json, image_id_from_path, masks_to_rle
from utils.data.label_formats import SegmentLabels
from utils.metrics import SegmentMetrics, instance_masks, process_mask_batch
from utils.plots import colors


class SegmentationTrainer(DetectionTrainer):
    default_project = "runs/train-seg"
    options = SegmentTrainOptions
    task = "segment"

    @staticmethod
    def model_class():
        return SegmentationModel

    def dataset_kwargs(self, mode):
        return {"task": SegmentLabels(overlap=not self.opt.no_overlap)}

    def preprocess_batch(self, batch):
        batch = super().preprocess_batch(batch)
        batch["masks"] = batch["masks"].float()  # overlap maps come as integers
        return batch

    def build_validator(self):
        options = ValOptions.from_train(self.opt, self.batch_size * 2, no_overlap=self.opt.no_overlap,
                                        single_cls=self.opt.single_cls)
        return SegmentationValidator(options, self.save_dir, self.names, criterion=self.criterion,
                                     label_names=self.data.get("label_names"))


class SegmentationValidator(DetectionValidator):
    """Box and mask mAP; masks compared at the letterboxed input size, predictions upsampled from the prototypes
    and ground truth from its 1/4-resolution map, as the official validators do."""

    tasks = ("segment",)

    def dataset_kwargs(self):
        return {"task": SegmentLabels(overlap=not self.args.no_overlap)}

    def init_metrics(self, model):
        super().init_metrics(model)
        self.metrics = SegmentMetrics(names=self.names)

    def new_record(self):
        return {**super().new_record(), "tp_m": []}

    def description(self):
        return ("%22s" + "%11s" * 10) % (
            "Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)", "Mask(P", "R", "mAP50", "mAP50-95)",
        )

    def postprocess(self, preds, batch):
        """One record per image: `boxes` as detection's (with mask coefficients), `proto` its prototypes."""
        det, protos = self.layout.split(preds)
        return [{**image, "proto": proto} for image, proto in zip(super().postprocess(det, batch), protos)]

    def decode(self, image, batch):
        """The record with `masks` (n, H, W) at the input size, upsampled from its prototypes (coefficients and boxes
        in fp32: under --half they come in fp16). One image at a time: a batch's at once would hold up to max_det
        input-size masks per image."""
        b, shape = image["boxes"], batch["img"].shape[2:]
        masks = ops.process_mask(image["proto"], b[:, 6:].float(), b[:, :4].float(), shape, upsample=True)
        return {**image, "masks": masks}

    @staticmethod
    def _gt_masks(batch, si, n):
        """Ground-truth masks of image si's n targets as bool (n, h, w): from the overlap map, or the per-instance
        stack, as the batch's `overlap` says."""
        if batch["overlap"]:
            return instance_masks(batch["masks"][si], n)
        return batch["masks"][batch["targets"][:, 0] == si].gt(0.5)

    def match_extra(self, record, image, batch, si, predn, labelsn, correct):
        """Mask matches of image si, in the same rows as its box matches (`correct`)."""
        if len(labelsn):
            gt = self._gt_masks(batch, si, len(labelsn))
            tp_m = process_mask_batch(predn, labelsn, image["masks"], gt, self.iouv)
        else:
            tp_m = torch.zeros_like(correct)
        record["tp_m"].append(tp_m)

    def pred_to_json(self, image, predn, batch, si):
        """Boxes and masks in original-image pixels, the masks as COCO RLE."""
        native = ops.scale_masks(image["masks"], batch["shapes"][si][0], batch["shapes"][si][1])
        rles = masks_to_rle(native.gt(0.5).cpu().numpy())
        path = Path(batch["paths"][si])
        return box_to_coco_json(predn[:, :6], image_id_from_path(path), rles=rles)

    def curve_metrics(self):
        return [("", self.metrics.box), ("Mask", self.metrics.seg)]

    def plotted_pred_masks(self, preds, batch):
        masks = [self.decode({**image, "boxes": image["boxes"][:MAX_PLOTTED_PREDS]}, batch)["masks"]
                 for image in preds if len(image["boxes"])]
        return torch.cat(masks).float() if masks else None

    def _concat_stats(self, records):
        out = super()._concat_stats(records)
        tp_m = records.get("tp_m", [])
        # the names SegmentMetrics.process takes
        out["tp_box"], out["tp_mask"] = out.pop("tp"), torch.cat(tp_m).numpy() if tp_m else out["tp"][:0]
        return out

    def finalize(self, stats):
        stats = super().finalize(stats)
        if self.args.save_json and self.jdict:
            stats = self.coco_eval(stats, self.save_dir / "predictions.json", iou_type="segm", key="M")
        return stats


class SegmentationPredictor(DetectionPredictor):
    tasks = ("segment",)
    default_project = "runs/predict-seg"

    def postprocess(self, preds, im, im0):
        layout = self.model.output_layout
        det_out, protos = layout.split(preds)
        det = ops.non_max_suppression(
            det_out, self.args.conf_thres, self.args.iou_thres, self.args.classes, self.args.agnostic_nms,
            max_det=self.args.max_det, layout=layout,
        )[0]
        if len(det):
            masks = ops.process_mask(protos[0], det[:, 6:].float(), det[:, :4].float(), im.shape[2:], upsample=True)
            masks = ops.scale_masks(masks, im0.shape[:2]).gt(0.5)
        else:  # interpolate cannot resize an empty stack
            masks = torch.zeros((0, *im0.shape[:2]), dtype=torch.bool, device=det.device)
        ops.scale_boxes(im.shape[2:], det[:, :4], im0.shape)
        return det[:, :6], masks

    def boxes(self, result):
        return super().boxes(result[0])

    def write_result(self, result, im, im0, path, txt_path):
        det, masks = result
        if len(det):
            annotator = self.annotator(im0)
            annotator.masks(masks, [colors(int(c), True) for c in det[:, 5]])
            im0[:] = annotator.result()
        summary = super().write_result(det, im, im0, path, None)
        if txt_path is not None and len(det):
            h, w = im0.shape[:2]
            with open(txt_path, "a") as f:
                for seg, (*_, conf, c) in zip(ops.masks2segments(masks), det.tolist()):
                    if len(seg):
                        xy = " ".join(f"{x / w:.6g} {y / h:.6g}" for x, y in seg)
                        f.write(f"{int(c)} {xy}" + (f" {conf:.6g}" if self.args.save_conf else "") + "\n")
        return summary
