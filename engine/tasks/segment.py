"""Segmentation task: the detection hooks plus masks (YOLOv5-seg and YOLOv8-seg)."""

import torch

from engine.fields import Boxes, Masks
from engine.options import SegmentTrainOptions, SegmentValOptions
from engine.tasks.detect import DetectionPredictor, DetectionTrainer, DetectionValidator
from models.yolo import SegmentationModel
from utils import ops
from utils.data.label_formats import SegmentLabels
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
        options = SegmentValOptions.from_train(self.opt, self.batch_size * 2, no_overlap=self.opt.no_overlap,
                                               single_cls=self.opt.single_cls)
        return SegmentationValidator(options, self.save_dir, self.names, criterion=self.criterion,
                                     label_names=self.data.get("label_names"))


class SegmentationValidator(DetectionValidator):
    """Box and mask mAP (engine/fields.Masks)."""

    tasks = ("segment",)
    options = SegmentValOptions

    def declare_fields(self):
        return Boxes(), Masks()

    def dataset_kwargs(self):
        return {"task": SegmentLabels(overlap=not self.args.no_overlap)}


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
