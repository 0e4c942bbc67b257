"""The tasks: one `Task` record each, in `TASKS`, which every list of tasks above the models and data floors reads.

A record says what differs between tasks as data: the model class, the fields a prediction holds
(evaluation/fields.py), the label format the datasets read (data/label_formats.py), the dataset check, the options
classes (engine/options.py), the default run folders, the scripts and how its images reach the model (which INT8
calibration follows: engine/calibration.py). One trainer, validator and predictor per family read it
(engine/tasks/boxes.py for the box tasks, classify.py for classification); `Task.trainer`, `.validator` and
`.predictor` are those classes bound to the record, which the scripts and the trainer use. No task's class subclasses
another task's.

The names of the tasks are `utils.tasks.TASKS` (torch-free, so that the floors below read it and `yolo --help` stays
quick); the registry holds exactly those. A new task is one record here, its head, loss, label format and fields.
"""

import dataclasses
from functools import cached_property
from typing import Callable

from data.label_formats import DetectLabels, OBBLabels, PoseLabels, SegmentLabels
from engine.calibration import CENTRE_CROPPED, LETTERBOXED, POSE_LETTERBOXED, Inputs
from engine.messages import SCRIPTS
from engine.options import (
    ClassifyValOptions,
    DetectPredictOptions,
    DetectTrainOptions,
    OBBValOptions,
    PosePredictOptions,
    PoseValOptions,
    PredictOptions,
    SegmentTrainOptions,
    SegmentValOptions,
    TrainOptions,
    ValOptions,
)
from engine.tasks.boxes import BoxPredictor, BoxTrainer, BoxValidator, box_data, pose_data, pose_skeleton_of
from engine.tasks.classify import ClassificationPredictor, ClassificationTrainer, ClassificationValidator, cls_data
from evaluation.fields import Boxes, ClassScores, Keypoints, Masks, RotatedBoxes
from models.yolo import ClassificationModel, DetectionModel, OBBModel, PoseModel, SegmentationModel
from utils.tasks import TASKS as NAMES


def _none(*_):
    return None


def _no_extras(*_):
    return {}


@dataclasses.dataclass(frozen=True)
class Task:
    """What one task is. The callables take what their caller holds: `fields(names, layout, skeleton)` the class
    names, the model's `output_layout` (None for a classifier) and the keypoint pairs drawn; `data(data, options,
    role, autodownload)` the --data argument, the run's options and the script's role ('train', 'val', 'predict');
    `train_labels(options, data)` and `val_labels(options)` the run's options and the dataset dict."""

    name: str
    title: str  # the classes' names: f"{title}Trainer", ...
    model: type  # models/yolo.py
    fields: Callable  # -> the fields a prediction holds, the first one speaking for the whole image
    data: Callable  # -> the dataset dict, checked for this task (and --single-cls applied)
    train: type  # the options classes of the train, val and predict scripts (engine/options.py)
    val: type
    predict: type
    projects: dict  # the default run folders by script role
    engine: tuple  # (trainer, validator, predictor): the family's classes that read the record
    reads: tuple = ()  # the tasks whose models this task's val and predict scripts take (default: its own)
    train_labels: Callable = _none  # -> the label format training reads (YOLODataset's `task`)
    val_labels: Callable = _none  # -> the label format validation reads
    model_kwargs: Callable = _no_extras  # (data) -> what the model class takes from the dataset besides nc
    val_extras: Callable = _no_extras  # (train options, data) -> the val options' task fields in training
    skeleton: Callable = _none  # (predict options, layout) -> the keypoint pairs drawn, or None
    inputs: Inputs = LETTERBOXED  # how its images reach the model: INT8 calibration follows it (engine/calibration)

    @property
    def scripts(self):
        """{'train', 'val', 'predict'}: the script paths under the repository root."""
        return SCRIPTS[self.name]

    @property
    def accepts(self):
        """The tasks of the models its val and predict scripts take (a head's `task`)."""
        return self.reads or (self.name,)

    # each a class made once per record: the trainer's run(), evolve() and the val scripts take classes
    @cached_property
    def trainer(self):
        return _bound(self.engine[0], f"{self.title}Trainer", record=self, task=self.name, options=self.train,
                      default_project=self.projects["train"])

    @cached_property
    def validator(self):
        return _bound(self.engine[1], f"{self.title}Validator", record=self, tasks=self.accepts, options=self.val)

    @cached_property
    def predictor(self):
        return _bound(self.engine[2], f"{self.title}Predictor", record=self, tasks=self.accepts, options=self.predict,
                      default_project=self.projects["predict"])


def _bound(cls, name, **attributes):
    return type(name, (cls,), {"__module__": __name__, "__qualname__": name, **attributes})


BOXES = (BoxTrainer, BoxValidator, BoxPredictor)

DETECT = Task(
    "detect", "Detect", DetectionModel,
    fields=lambda names, layout, skeleton=None: (Boxes(),),
    data=box_data, train=DetectTrainOptions, val=ValOptions, predict=DetectPredictOptions,
    projects={"train": "runs/train", "val": "runs/val", "predict": "runs/detect"}, engine=BOXES,
    # box mAP of any box model: a segmenter's or pose model's boxes are scored as a detector's
    reads=("detect", "segment", "pose"),
    train_labels=lambda options, data: DetectLabels(), val_labels=lambda options: DetectLabels(),
    val_extras=lambda options, data: {"single_cls": options.single_cls},
)

SEGMENT = Task(
    "segment", "Segment", SegmentationModel,
    fields=lambda names, layout, skeleton=None: (Boxes(), Masks()),
    data=box_data, train=SegmentTrainOptions, val=SegmentValOptions, predict=DetectPredictOptions,
    projects={"train": "runs/train-seg", "val": "runs/val-seg", "predict": "runs/predict-seg"}, engine=BOXES,
    train_labels=lambda options, data: SegmentLabels(overlap=not options.no_overlap),
    val_labels=lambda options: SegmentLabels(overlap=not options.no_overlap),
    val_extras=lambda options, data: {"single_cls": options.single_cls, "no_overlap": options.no_overlap},
)

POSE = Task(
    "pose", "Pose", PoseModel,
    fields=lambda names, layout, skeleton=None: (Boxes(), Keypoints(tuple(layout.kpt_shape), skeleton)),
    data=pose_data, train=DetectTrainOptions, val=PoseValOptions, predict=PosePredictOptions,
    projects={"train": "runs/train-pose", "val": "runs/val-pose", "predict": "runs/predict-pose"}, engine=BOXES,
    train_labels=lambda options, data: PoseLabels(data["kpt_shape"], data["flip_idx"]),
    val_labels=lambda options: PoseLabels(options.kpt_shape),
    model_kwargs=lambda data: {"kpt_shape": data["kpt_shape"]},
    val_extras=lambda options, data: {"single_cls": options.single_cls, "kpt_shape": tuple(data["kpt_shape"])},
    skeleton=lambda options, layout: pose_skeleton_of(options.data, layout.kpt_shape[0]),
    inputs=POSE_LETTERBOXED,
)

OBB = Task(
    "obb", "OBB", OBBModel,
    fields=lambda names, layout, skeleton=None: (RotatedBoxes(),),
    data=box_data, train=DetectTrainOptions, val=OBBValOptions, predict=DetectPredictOptions,
    projects={"train": "runs/train-obb", "val": "runs/val-obb", "predict": "runs/predict-obb"}, engine=BOXES,
    train_labels=lambda options, data: OBBLabels(), val_labels=lambda options: OBBLabels(),
    val_extras=lambda options, data: {"single_cls": options.single_cls},
)

CLASSIFY = Task(
    "classify", "Classify", ClassificationModel,
    fields=lambda names, layout, skeleton=None: (ClassScores(names),),
    data=cls_data, train=TrainOptions, val=ClassifyValOptions, predict=PredictOptions,
    projects={"train": "runs/train-cls", "val": "runs/val-cls", "predict": "runs/predict-cls"},
    engine=(ClassificationTrainer, ClassificationValidator, ClassificationPredictor),
    inputs=CENTRE_CROPPED,
)

TASKS = {t.name: t for t in (DETECT, SEGMENT, POSE, OBB, CLASSIFY)}
# a record under a name the floors below do not know would be refused there (exports, synthetic sets, `yolo`)
assert set(TASKS) <= set(NAMES), f"tasks {sorted(set(TASKS) - set(NAMES))} are not in utils.tasks.TASKS"
