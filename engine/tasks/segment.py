"""Segmentation task: the detection hooks plus masks (YOLOv5-seg and YOLOv8-seg)."""

from data.label_formats import SegmentLabels
from engine.options import SegmentTrainOptions, SegmentValOptions
from engine.tasks.detect import DetectionPredictor, DetectionTrainer, DetectionValidator
from evaluation.fields import Boxes, Masks
from models.yolo import SegmentationModel


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
    """Box and mask mAP (utils/fields.Masks)."""

    tasks = ("segment",)
    options = SegmentValOptions

    def declare_fields(self):
        return Boxes(), Masks()

    def dataset_kwargs(self):
        return {"task": SegmentLabels(overlap=not self.args.no_overlap)}


class SegmentationPredictor(DetectionPredictor):
    """Boxes over their masks; --save-txt lines are polygons, as segmentation labels are."""

    tasks = ("segment",)
    default_project = "runs/predict-seg"

    def declare_fields(self):
        return Boxes(), Masks()
