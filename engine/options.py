"""Options, typed: `TrainOptions`, `ValOptions` and `PredictOptions` hold what every task's train, val and predict
scripts take; a task's extras are the fields of its subclass (`DetectTrainOptions`, `SegmentValOptions`,
`PosePredictOptions`, ...), which its trainer, validator or predictor names (`options`). A train or predict option's
field carries its flags, default and help (`_cli`), from which utils/cli makes the script's parser. What follows is of
training.

An options object is frozen. It is built once from the parsed command line (or a checkpoint's saved options, on
--resume) by `from_values`; what set-up derives from it is a new field (`train_imgsz`, `loader_workers`), set with
`dataclasses.replace`, never a rewrite of what the user gave (`data_path`, the dataset file read, is what the val,
predict and export commands take from the run: engine/inherit.py). What --resume may change is each field's metadata
(`resume`): "launch" options are this launch's (its hardware, whether to profile it), "given" ones are taken when the
command line names them, "search" says where to look for the run, "extend" is the run's length (--epochs); every
other option given with --resume is refused, since it would change the run.
"""

import argparse
import dataclasses
import typing
from types import SimpleNamespace
from typing import Optional, Union

from utils.cli import (
    DEFAULT_LOGGERS,
    DEFAULT_OPSET,
    EXPORT_FORMATS,
    LOGGERS_HELP,
    MODULES_ARG,
    MODULES_HELP,
    OPTION_CHOICES,
    LoggersAction,
    ValTaskAction,
    check_options,
    str2bool_or_path,
)
from utils.errors import BadCheckpoint, BadOption


def _resume(rule):
    return dataclasses.field(metadata={"resume": rule})


def _derived():
    return dataclasses.field(default=None, metadata={"derived": True})


def _planned(**default):
    """Not an option: what the run decides before it trains (`engine/resume.plan_run` from the options given, the
    trainer's set-up from the model), kept in the run's options (and so in its checkpoints, where --resume reads it
    back)."""
    return dataclasses.field(**(default or {"default": False}), metadata={"planned": True})


def _cli(*flags, text, resume=None, field_default=dataclasses.MISSING, boxes=False, run_default=dataclasses.MISSING,
         **settings):
    """A field the command line gives: its flags, help `text` (formatted with the script's own words: `{imgsz}`,
    `{project}`, `{data_help}`), what --resume may do with it (`resume`, see above) and argparse `settings` beyond
    what its type says (utils/cli.add_option_fields reads them). `field_default`: the value of an options object
    made without it (a checkpoint saved before the option existed); the command line's is `settings["default"]`.
    `boxes`: a flag only the box tasks have (a classifier's parser leaves it out and gives the default).
    `run_default`: the option is left to the run that made --weights when None (engine/inherit.py), and this is the
    task's value where that run does not say; the help text names it as `{<field name>}`."""
    metadata = {"flags": flags, "help": text, "argparse": settings, **({"resume": resume} if resume else {}),
                **({"boxes": True} if boxes else {}),
                **({"run_default": run_default} if run_default is not dataclasses.MISSING else {})}
    if isinstance(field_default, list):  # each object its own list
        return dataclasses.field(default_factory=lambda: list(field_default), metadata=metadata)
    return dataclasses.field(default=field_default, metadata=metadata)


def _opt(*flags, text, **settings):
    """A `_cli` field whose value in an options object made in code (validation inside training, a test's
    validator, an exporter given a namespace) is the command line's default, off for an on-flag."""
    return _cli(*flags, text=text, field_default=settings.get("default", False), **settings)


def _run_default(cls, name, value):
    """`cls`'s field `name`, falling back to `value` where the weights' run does not say: a task's own fallback
    (its dataset, its image size) in its options subclass."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=f.default, default_factory=f.default_factory,
                             metadata={**f.metadata, "run_default": value})


def _conforms(v, hint):
    """Whether `v` is a value of the type `hint` (str, int, float, bool, Optional[...], list[...], object), bools being
    no numbers."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is object:
        return True
    if origin is typing.Union:
        return any(_conforms(v, a) for a in args)
    if origin is list:
        return isinstance(v, list) and all(_conforms(x, args[0]) for x in v)
    if hint in (int, float):
        return isinstance(v, (int, float) if hint is float else int) and not isinstance(v, bool)
    return isinstance(v, hint)


class Options:
    """What the typed options classes share: built from values in one place, written out as a dict."""

    @classmethod
    def from_values(cls, values):
        """From a dict or namespace of option values (a parsed command line, a checkpoint's `opt`): the fields this
        class declares, derived ones left to set-up; anything else (a field of another task) is ignored."""
        values = values if isinstance(values, dict) else vars(values)
        names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("derived")]
        return cls(**{k: values[k] for k in names if k in values})

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TrainOptions(Options):
    """The options of classify/train.py, and of every train script: their flags, defaults and help are the fields'
    (utils/cli.train_parser makes the arguments from them, with the script's own model, dataset and size)."""

    cfg: str = _cli("--cfg", type=str,  # model YAML or .pt; classify/train.py also takes --model
                    text="model YAML (name under models/ or a path), or a .pt whose model to train (with --weights "
                         "and no --cfg: the weights' own model)")
    weights: str = _cli("--weights", type=str, default="",
                        text="initial weights, our .pt or an official one (default: none, train from scratch)")
    data: str = _cli("--data", type=str, text="{data_help}")
    hyp: Optional[str] = _cli("--hyp", type=str, default=None,
                              text="hyperparameter YAML, may set only some keys (default: the file the model YAML "
                                   "names)")
    epochs: int = _cli("--epochs", default=30, resume="extend", text="epochs to train (with --resume: to train in all)")
    batch_size: int = _cli("--batch-size", default=16, text="images per step, the total over all processes; -1: "
                                                            "AutoBatch, the largest that fits 60%% of a GPU's free "
                                                            "memory (one GPU; on a CPU 16)")
    imgsz: int = _cli("--imgsz", "--img", "--img-size", text="train/val image size")  # train_imgsz: what the run uses
    # False, True (the newest unfinished run) or a last.pt path
    resume: object = _cli("--resume", nargs="?", const=True, default=False, type=str2bool_or_path, resume="launch",
                          text="continue the newest unfinished run under --project, or the given last.pt; 'auto': "
                               "continue --project/--name if it holds an unfinished run, else start it there")
    nosave: bool = _cli("--nosave", text="only save the final checkpoint")
    noval: bool = _cli("--noval", text="only validate the final epoch")
    noplots: bool = _cli("--noplots", text="save no plots (results.png, labels.jpg, curves, ...)")
    cache: Optional[str] = _cli("--cache", type=str, nargs="?", const="ram", default=None,
                                choices=OPTION_CHOICES["cache"][1:],
                                text="cache images in RAM (this rank's share only under DDP) or on disk")
    device: str = _cli("--device", default="", resume="launch",
                       text="GPUs 0 or 0,1,2,3, or cpu (default: GPU 0 if there is one, else cpu)")
    optimizer: str = _cli("--optimizer", type=str, choices=OPTION_CHOICES["optimizer"], default="auto",
                          text="auto: AdamW at a small lr for short runs, SGD at the hyp lr0 beyond 10k iterations")
    sync_bn: bool = _cli("--sync-bn", text="SyncBatchNorm across ranks (DDP only)")
    # as given (None: by device); loader_workers is what the run uses
    workers: Optional[int] = _cli("--workers", default=None, resume="launch",
                                  text="max dataloader workers per process (default: on a GPU, the process's share of "
                                       "the cores less one, at most 8; on a CPU 2, or 0 where torch's threads fill the "
                                       "cores)")
    project: Optional[str] = _cli("--project", default=None, resume="search",
                                  text="runs go to PROJECT/NAME (default: {project})")
    name: str = _cli("--name", default="exp", text="run folder name; exp2, exp3, ... when taken")
    exist_ok: bool = _cli("--exist-ok", text="write into PROJECT/NAME even if it exists (not over a run)")
    cos_lr: bool = _cli("--cos-lr", text="cosine LR schedule")
    patience: int = _cli("--patience", default=100, text="early stopping patience in epochs (0 = off)")
    save_period: int = _cli("--save-period", default=-1, text="also keep weights/epochN.pt every N epochs (-1: off)")
    save_interval: str = _cli("--save-interval", default="0", resume="given",
                              text="also save last.pt inside epochs, every 10m / 90s / 2h or 500it (iterations); 0 = "
                                   "off")
    seed: int = _cli("--seed", default=0, text="global seed (each rank uses seed + 1 + RANK)")
    deterministic: bool = _cli("--deterministic", text="deterministic algorithms (slower)")
    amp: str = _cli("--amp", choices=OPTION_CHOICES["amp"], default="auto",
                    text="mixed precision: auto = fp16 on CUDA, bf16 on CPUs that compute it natively (AVX512-BF16, "
                         "AMX), else off")
    freeze: list[int] = _cli("--freeze", nargs="+", type=int, default=[0],
                             text="freeze layers: the first N (--freeze 10), or these indices (--freeze 0 1 2)")
    multi_scale: bool = _cli("--multi-scale", text="each step at a random size in 0.5-1.5 x --imgsz (a multiple of "
                                                   "the stride), same on all ranks")
    label_smoothing: Optional[float] = _cli("--label-smoothing", default=None,
                                            text="label smoothing epsilon, overrides the hyp's (v5/v7 and "
                                                 "classification losses)")
    profile: bool = _cli("--profile", resume="launch",
                         text="print where the run's wall time went (start-up, set-up, data wait, forward/backward, "
                              "...) and write profile.json; on CUDA, synchronizes at each timed region's ends")
    # names in engine.loggers.LOGGERS: results.csv, TensorBoard, trackers
    loggers: list[str] = _cli("--loggers", nargs="+", action=LoggersAction, default=list(DEFAULT_LOGGERS),
                              metavar="NAME", resume="given", text=LOGGERS_HELP)
    # trackers receive best.pt at the end
    log_model: bool = _cli("--no-log-model", action="store_false", resume="given",
                           text="trackers do not receive best.pt at the end (large models; by default they do)")
    local_rank: int = _resume("given")  # utils/cli.Parser's --local-rank, set by a launcher
    # the user's block files: this launch's only, never the checkpoint's (a checkpoint names no file to import)
    modules: list[str] = _cli("--modules", text=MODULES_HELP, resume="launch", **MODULES_ARG)
    # `cfg` is the checkpoint --weights names, trained as its own model (--weights without --cfg), not a model that
    # --weights seeds (engine/resume.weights_own_model)
    train_checkpoint_model: bool = _planned()
    # the parameters --weights did not give (a new class layer): their own optimizer groups (utils/schedule.py)
    new_params: list[str] = _planned(default_factory=list)
    # what --optimizer auto chose at the run's start (utils/schedule.py): a --resume whose --epochs would cross its
    # iteration threshold keeps it, as the saved optimizer state is that optimizer's
    chosen_optimizer: Optional[str] = _planned(default=None)
    train_imgsz: Optional[int] = _derived()  # imgsz rounded up to the model's largest stride
    loader_workers: Optional[int] = _derived()  # dataloader workers per rank, resolved for the device
    data_path: Optional[str] = _derived()  # the dataset YAML (or folder) --data named, absolute (engine/inherit.py)

    @classmethod
    def check_saved(cls, values, label):
        """Refuse (BadCheckpoint naming `label`) options read from a file (a checkpoint's `opt`) that the command line
        could not have given: a value of another type than its field's (`imgsz: '64'`, `data` a mapping with its own
        `download:`), outside utils/cli.OPTION_RANGES, or not among its choices. Fields the file lacks are left to the
        caller; keys that are no field of this class are ignored, as `from_values` ignores them."""
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in values or f.metadata.get("derived"):
                continue
            v = values[f.name]
            if not _conforms(v, hints[f.name]) or (f.name in OPTION_CHOICES and v not in OPTION_CHOICES[f.name]):
                raise BadCheckpoint(f"{label}: its saved option {f.name} is {type(v).__name__} {v!r:.60}, which "
                                    f"--{f.name.replace('_', '-')} does not take")
        try:
            check_options(SimpleNamespace(**{k: values[k] for k in hints if k in values}))
        except BadOption as e:
            raise BadCheckpoint(f"{label}: its saved options: {e}") from None

    def val_names_from(self):
        """`ValOptions.names_from` for validation in training: None, a classifier's classes being its folders."""
        return None

    @classmethod
    def resume_rules(cls):
        """{option: how --resume treats it} for the options --resume may come with."""
        return {f.name: f.metadata["resume"] for f in dataclasses.fields(cls) if "resume" in f.metadata}


@dataclasses.dataclass(frozen=True)
class DetectTrainOptions(TrainOptions):
    """train.py, pose/train.py: the box tasks' extras."""

    rect: bool = _cli("--rect", field_default=False, text="rectangular training batches (no mosaic)")
    # skip images labelled with a class id >= nc, rather than refuse the dataset
    skip_unknown_classes: bool = _cli("--skip-unknown-classes", field_default=False,
                                      text="skip the images whose labels hold a class id the dataset YAML does not "
                                           "name (by default such a label is an error: the YAML's names are often one "
                                           "short)")
    noautoanchor: bool = _cli("--noautoanchor", field_default=False,
                              text="keep the YAML's anchors even when they fit poorly")
    single_cls: bool = _cli("--single-cls", field_default=False, text="train every class as one class")
    image_weights: bool = _cli("--image-weights", field_default=False,
                               text="draw training images weighted by class rarity and the last validation's "
                                    "per-class mAP")
    evolve: Optional[int] = _cli("--evolve", type=int, nargs="?", const=300, default=None, field_default=None,
                                 text="evolve hyperparameters for N generations (300 without N); single process only")

    def val_names_from(self):
        """The dataset file whose names count the classes (a label beyond them is an error), unless
        --skip-unknown-classes."""
        return None if self.skip_unknown_classes else self.data_path or "the dataset dict"


@dataclasses.dataclass(frozen=True)
class SegmentTrainOptions(DetectTrainOptions):
    """segment/train.py: masks as one map of overlapping instances, or one mask per instance."""

    no_overlap: bool = _cli("--no-overlap", field_default=False,
                            text="one mask per instance instead of one overlap map")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ValOptions(Options):
    """The options of the val scripts and everything a validator reads; a task's extras are the fields of its
    subclass, which its validator names (`BaseValidator.options`). The fields with flags make the val scripts'
    arguments (utils/cli.val_parser, in field order; classify/val.py leaves out those marked `boxes`). Built by
    `from_cli` (the val scripts, `BaseValidator.run_val`) or `from_train` (the trainer), or in code with the command
    line's defaults."""

    # None: the weights' run's dataset, else the task's (engine/inherit.py)
    data: Optional[str] = _opt("--data", type=str, default=None, run_default="data/shapes.yaml",
                               text="{data_help} (default: the weights' training set where its file still exists, "
                                    "else {data})")
    weights: Optional[str] = _cli("--weights", type=str, required=True, field_default=None,  # None: in training
                                  text="model weights: .pt, or a file or OpenVINO folder made with export.py")
    batch: int = _opt("--batch-size", default=32, metavar="BATCH_SIZE", text="images per batch on each process")
    imgsz: int = _cli("--imgsz", "--img", "--img-size", default=None, run_default=320,
                      text="validation size, long side in pixels (default: the size the weights trained at, else "
                           "{imgsz})")
    # --task (the official scripts' name) is read into two options: this split and `speed`
    split: str = _opt("--task", action=ValTaskAction, default="val", choices=["val", "test", "speed"],
                      text="split to evaluate{speed_help}")
    device: str = _opt("--device", default="",
                       text="GPU 0, or cpu; under torchrun one GPU per process (default: GPU 0 if there is one, else "
                            "cpu)")
    workers: int = _opt("--workers", default=2, text="max dataloader workers per process")
    half: bool = _opt("--half", text="FP16 inference (CUDA only)")
    project: Optional[str] = _opt("--project", default=None, text="results go to PROJECT/NAME")  # the script's
    name: str = _opt("--name", default="exp", text="results folder name; exp2, exp3, ... when taken")
    exist_ok: bool = _opt("--exist-ok", text="write into PROJECT/NAME even if it exists")
    save_txt: bool = _opt("--save-txt", boxes=True, text="save predictions to labels/*.txt")
    save_json: bool = _opt("--save-json", boxes=True, text="save COCO-format predictions and run pycocotools")
    single_cls: bool = _opt("--single-cls", boxes=True, text="evaluate every class as one (a --single-cls model)")
    skip_unknown_classes: bool = _opt("--skip-unknown-classes", boxes=True,
                                      text="skip the images whose labels hold a class id the dataset YAML does not "
                                           "name (by default an error)")
    conf: float = _opt("--conf-thres", default=0.001, boxes=True, metavar="CONF_THRES", text="confidence threshold")
    iou: float = _opt("--iou-thres", default=0.6, boxes=True, metavar="IOU_THRES", text="NMS IoU threshold")
    max_det: int = _opt("--max-det", default=300, boxes=True, text="maximum detections per image")
    augment: bool = _opt("--augment", boxes=True, text="test-time augmentation: 3 scales, one flipped, one NMS")
    modules: list[str] = _opt("--modules", text=MODULES_HELP, **MODULES_ARG)
    speed: bool = False  # --task speed: the val split at deployment thresholds, for timing
    plots: bool = True  # val_batch images, curves and confusion matrices (final or stand-alone runs only)
    # the dataset YAML whose names give nc: a label with a class id >= nc is then an error naming it; None: the
    # images holding one are skipped (--skip-unknown-classes; classification, whose classes are folders)
    names_from: Optional[str] = None

    @classmethod
    def from_cli(cls, opt):
        """From a val script's parsed command line, the weights' run's settings filled in (engine/inherit.py)."""
        options = cls.from_values(opt)
        if options.speed:  # timing at deployment thresholds, no JSON
            options = dataclasses.replace(options, conf=0.25, iou=0.45, save_json=False)
        return options

    @classmethod
    def from_train(cls, opt, batch, **task_options):
        """For validation inside training (`opt`: TrainOptions after set-up): the training image size and workers,
        `batch` images per rank, and the fields `task_options` names (the task's extras among them)."""
        return cls(imgsz=opt.train_imgsz, batch=batch, workers=opt.loader_workers, plots=not opt.noplots,
                   names_from=opt.val_names_from(), **task_options)

    def for_dataset(self, data):
        """These options for the dataset dict `data` a val script read: a label whose class the dataset YAML does not
        name is an error naming the YAML, unless --skip-unknown-classes."""
        return dataclasses.replace(self, names_from=None if self.skip_unknown_classes else
                                   data.get("yaml_file") or "the dataset dict")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SegmentValOptions(ValOptions):
    """Segmentation validation: the form of the label masks, as the run trained with them."""

    data: Optional[str] = _run_default(ValOptions, "data", "data/shapes-seg.yaml")
    no_overlap: bool = False  # one mask per instance instead of the overlap map


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoseValOptions(ValOptions):
    """Pose validation: keypoints per instance and values per keypoint, the dataset's (its YAML's `kpt_shape`)."""

    data: Optional[str] = _run_default(ValOptions, "data", "data/shapes-pose.yaml")
    kpt_shape: tuple[int, int] = (17, 3)

    def for_dataset(self, data):
        return dataclasses.replace(super().for_dataset(data), kpt_shape=tuple(data["kpt_shape"]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class OBBValOptions(ValOptions):
    """Oriented-box validation: a detector's options, on the oriented-box dataset where the weights' run names none."""

    data: Optional[str] = _run_default(ValOptions, "data", "data/shapes-obb.yaml")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifyValOptions(ValOptions):
    """Classification validation: the box options unused (classify/val.py has no such flags), and the
    classification dataset and size where the weights' run names none."""

    data: Optional[str] = _run_default(ValOptions, "data", "data/shapes-cls")
    imgsz: int = _run_default(ValOptions, "imgsz", 96)


@dataclasses.dataclass(frozen=True)
class PredictOptions(Options):
    """The options of classify/predict.py, and of every predict script: their flags, defaults and help are the fields'
    (utils/cli.predict_parser makes the arguments from them); `BasePredictor` builds them from the parsed command
    line, once."""

    weights: str = _cli("--weights", text="model weights: .pt, .onnx or .torchscript")  # default: the script's
    source: str = _cli("--source", default="data/images",
                       text="image, folder (its own files; 'DIR/**/*.jpg' also reads sub-folders), glob, video, .txt "
                            "list, URL, webcam index (0), rtsp/rtmp/http stream or .streams file")
    vid_stride: int = _cli("--vid-stride", default=1, text="process every n-th frame of videos and streams")
    # None: the size the weights' run trained at, else the task's: classify/predict.py's here, the box tasks' in
    # DetectPredictOptions (engine/inherit.py)
    imgsz: Optional[int] = _cli("--imgsz", "--img", "--img-size", default=None, run_default=96,
                                text="inference size, long side in pixels (default: the size the weights trained at, "
                                     "else {imgsz}; a static export takes its own)")
    device: str = _cli("--device", default="", text="GPU 0, or cpu (default: GPU 0 if there is one, else cpu)")
    view_img: bool = _cli("--view-img", text="show results in a window")
    save_txt: bool = _cli("--save-txt", text="save results to labels/*.txt")
    save_conf: bool = _cli("--save-conf", text="add confidences to --save-txt lines", boxes=True)
    nosave: bool = _cli("--nosave", text="do not save images/videos")
    save_crop: bool = _cli("--save-crop", text="save each box's crop to crops/<class>/", boxes=True)
    save_csv: bool = _cli("--save-csv", text="save every result to predictions.csv")
    line_thickness: Optional[int] = _cli("--line-thickness", default=None,
                                         text="box line width in pixels (default: by image size)")
    hide_labels: bool = _cli("--hide-labels", text="draw boxes without class names", boxes=True)
    hide_conf: bool = _cli("--hide-conf", text="draw class names without confidences", boxes=True)
    project: Optional[str] = _cli("--project", default=None, text="results go to PROJECT/NAME (default: {project})")
    name: str = _cli("--name", default="exp", text="results folder name; exp2, exp3, ... when taken")
    exist_ok: bool = _cli("--exist-ok", text="write into PROJECT/NAME even if it exists")
    half: bool = _cli("--half", text="FP16 inference (CUDA only)")
    amp: str = _cli("--amp", choices=["auto", "off", "bf16"], default="auto",
                    text="bf16 = bfloat16 autocast (CPU or CUDA; faster on CPUs with AVX512-BF16 or AMX, boxes may "
                         "differ slightly from fp32's); off = fp32 (fp16 with --half); auto = .pt models in fp32, "
                         "OpenVINO models in OpenVINO's choice for the CPU (bf16 where it has bf16 units)")
    modules: list[str] = _cli("--modules", text=MODULES_HELP, **MODULES_ARG)


@dataclasses.dataclass(frozen=True)
class DetectPredictOptions(PredictOptions):
    """detect.py, segment/predict.py and obb/predict.py: NMS and test-time augmentation."""

    imgsz: Optional[int] = _run_default(PredictOptions, "imgsz", 320)
    # None: 0.25, or 0.1 with --track (engine/predictor.py: the tracker takes the low-score boxes, as Ultralytics')
    conf_thres: Optional[float] = _cli("--conf-thres", default=None,
                                       text="confidence threshold (default: 0.25; 0.1 with --track)")
    # None: the family's (evaluation/results.nms_iou), so a checkpoint gives the boxes its own tool's predict gives
    iou_thres: Optional[float] = _cli("--iou-thres", default=None,
                                      text="NMS IoU threshold (default: 0.7 for anchor-free models, YOLOv8, YOLO11 and "
                                           "YOLOv5u, as Ultralytics; 0.45 for YOLOv5 and YOLOv7, as yolov5)")
    max_det: int = _cli("--max-det", default=1000, text="maximum detections per image")
    # None: no tracking; the bare flag: bytetrack (engine/track.py)
    track: Optional[str] = _cli("--track", nargs="?", const="bytetrack", default=None,
                                text="track objects across a video's frames: bytetrack (the bare flag), botsort, or a "
                                     "tracker YAML (data/trackers/); ids drawn with their trails, tracks/*.txt in MOT "
                                     "format")
    classes: Optional[list[int]] = _cli("--classes", nargs="+", type=int, text="keep only these class ids")  # None: all
    agnostic_nms: bool = _cli("--agnostic-nms", text="class-agnostic NMS")
    augment: bool = _cli("--augment", text="test-time augmentation: 3 scales, one flipped, one NMS")


@dataclasses.dataclass(frozen=True)
class PosePredictOptions(DetectPredictOptions):
    """pose/predict.py: the dataset YAML whose skeleton is drawn (None: COCO's for 17 keypoints)."""

    # None: the run's, else no file (COCO's skeleton)
    data: Optional[str] = _cli("--data", default=None, run_default=None,
                               text="pose dataset YAML whose `skeleton` is drawn (default: the weights' training set "
                                    "where its file still exists; COCO's for 17 keypoints)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExportOptions(Options):
    """export.py's options: their flags, defaults and help are the fields' (utils/cli.export_parser makes the
    arguments from them); `Exporter` builds them once, from the parsed command line or a namespace naming some."""

    weights: str = _cli("--weights", type=str, required=True, text="our checkpoint or an official .pt")
    include: list[str] = _opt("--include", nargs="+", default=["torchscript", "onnx"],
                              text=f"formats: {', '.join(EXPORT_FORMATS)}")
    # h [w] as given; None: the weights' run's size (an int), else 640 (engine/inherit.py)
    imgsz: Union[list[int], int, None] = _opt("--imgsz", "--img", "--img-size", nargs="+", type=int, default=None,
                                              run_default=[640],
                                              text="example input size h [w]; with --no-dynamic the one size the file "
                                                   "takes (default: the size the weights trained at, else 640)")
    batch_size: int = _opt("--batch-size", "--batch", default=1,
                           text="example input batch; with --no-dynamic the largest batch the file takes")
    device: str = _opt("--device", default="cpu", text="device to export on: cpu, or GPU 0 (for --half)")
    half: bool = _opt("--half", text="FP16 model (CUDA only)")
    # None: each format's own (utils/cli.EXPORT_DYNAMIC)
    dynamic: Optional[bool] = _opt("--dynamic", action=argparse.BooleanOptionalAction, default=None,
                                   text="any batch and image size, so results equal the .pt's at the same --img; "
                                        "--no-dynamic: only the example input's (default: fixed for openvino, which "
                                        "runs a fixed input fastest; any for the other formats)")
    simplify: bool = _opt("--simplify", text="ONNX: simplify the graph with onnxslim")
    opset: int = _opt("--opset", default=DEFAULT_OPSET,
                      text="ONNX opset version; the versions this torch exports are checked before exporting")
    int8: bool = _opt("--int8", text="openvino, engine: INT8 post-training quantisation, calibrated on --data's "
                                     "training images")
    data: Optional[str] = _opt("--data", type=str, default=None, run_default=None,
                               text="--int8's calibration images: a dataset YAML, whose train split is read (default: "
                                    "the weights' training set where its file still exists)")
    calib_images: int = _opt("--calib-images", default=300, text="--int8: how many training images calibrate it "
                                                                 "(at least 32; fewer where the split has fewer)")
    modules: list[str] = _opt("--modules", text=MODULES_HELP, **MODULES_ARG)
