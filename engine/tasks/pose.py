"""Pose task: the detection hooks plus keypoints (YOLOv8-pose). kpt_shape, flip_idx and skeleton come from the dataset
YAML (data/dataset_yaml.check_pose_dataset); the head declares its keypoint columns (OutputLayout.kpt_shape)."""

from data.dataset_yaml import check_pose_dataset, pose_skeleton
from data.label_formats import PoseLabels
from engine.options import PosePredictOptions, PoseValOptions
from engine.tasks.detect import DetectionPredictor, DetectionTrainer, DetectionValidator, single_class
from evaluation.fields import Boxes, Keypoints
from models.yolo import PoseModel
from utils.errors import BadCheckpoint

# COCO's person skeleton (0-based keypoint pairs), drawn for 17 keypoints when the dataset gives none
COCO_SKELETON = [[15, 13], [13, 11], [16, 14], [14, 12], [11, 12], [5, 11], [6, 12], [5, 6], [5, 7], [6, 8], [7, 9],
                 [8, 10], [1, 2], [0, 1], [0, 2], [1, 3], [2, 4], [3, 5], [4, 6]]


def pose_data(data, options, autodownload=True):
    data = check_pose_dataset(data, autodownload)
    return single_class(data) if options.single_cls else data


class PoseTrainer(DetectionTrainer):
    default_project = "runs/train-pose"
    task = "pose"

    def get_data(self):
        return pose_data(self.opt.data, self.opt, autodownload=not self.resume_from)

    @staticmethod
    def model_class():
        return PoseModel

    def model_kwargs(self):
        return {"kpt_shape": self.data["kpt_shape"]}

    def dataset_kwargs(self, mode):
        return {"task": PoseLabels(self.data["kpt_shape"], self.data["flip_idx"])}

    def build_validator(self):
        options = PoseValOptions.from_train(self.opt, self.batch_size * 2, single_cls=self.opt.single_cls,
                                            kpt_shape=tuple(self.data["kpt_shape"]))
        return PoseValidator(options, self.save_dir, self.names, criterion=self.criterion,
                             label_names=self.data.get("label_names"))


class PoseValidator(DetectionValidator):
    """Box and keypoint mAP (utils/fields.Keypoints), for the dataset's kpt_shape."""

    tasks = ("pose",)
    options = PoseValOptions

    def declare_fields(self):
        return Boxes(), Keypoints(self.args.kpt_shape)

    @staticmethod
    def get_data(data, options):
        return pose_data(data, options)

    @classmethod
    def val_names(cls, data, model, options):
        names = super().val_names(data, model, options)
        shape = tuple(model.output_layout.kpt_shape)
        if shape != tuple(data["kpt_shape"]):
            raise BadCheckpoint(f"--weights {options.weights} predicts kpt_shape {list(shape)} but --data "
                                f"{options.data} has {data['kpt_shape']}")
        return names

    def dataset_kwargs(self):
        return {"task": PoseLabels(self.args.kpt_shape)}


class PosePredictor(DetectionPredictor):
    """Boxes with keypoints and the skeleton drawn: the `skeleton` of --data when given, COCO's for 17 keypoints."""

    tasks = ("pose",)
    default_project = "runs/predict-pose"
    options = PosePredictOptions

    def declare_fields(self):
        kpt_shape = tuple(self.model.output_layout.kpt_shape)
        return Boxes(), Keypoints(kpt_shape, self._skeleton(self.args.data, kpt_shape[0]))

    @staticmethod
    def _skeleton(data, k):
        skeleton = pose_skeleton(data, k) if data else None
        if skeleton is None and k == 17:
            return COCO_SKELETON
        return skeleton
