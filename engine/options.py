"""Training options, typed: `TrainOptions` holds what every task's train script takes, subclasses add a task's extras.

An options object is frozen. It is built once from the parsed command line (or a checkpoint's saved options, on
--resume) by `from_values`; what set-up derives from it is a new field (`train_imgsz`, `loader_workers`), set with
`dataclasses.replace`, never a rewrite of what the user gave. What --resume may change is each field's metadata
(`resume`): "launch" options are this launch's (its hardware, whether to profile it), "given" ones are taken when the
command line names them, "search" says where to look for the run, "extend" is the run's length (--epochs); every
other option given with --resume is refused, since it would change the run.
"""

import dataclasses
from typing import Optional


def _resume(rule):
    return dataclasses.field(metadata={"resume": rule})


def _derived():
    return dataclasses.field(default=None, metadata={"derived": True})


def _planned():
    """Not an option: what `engine/resume.plan_run` decides from the options given, kept in the run's options (and
    so in its checkpoints, where --resume reads it back)."""
    return dataclasses.field(default=False, metadata={"planned": True})


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """The options of classify/train.py, and of every train script (utils/cli.train_parser writes their defaults)."""

    cfg: str  # model YAML or .pt
    weights: str
    data: str
    hyp: Optional[str]
    epochs: int = _resume("extend")
    batch_size: int  # images per step over all ranks
    imgsz: int  # as given; train_imgsz is what the run uses
    resume: object = _resume("launch")  # False, True (the newest unfinished run) or a last.pt path
    nosave: bool
    noval: bool
    noplots: bool
    cache: Optional[str]
    device: str = _resume("launch")
    optimizer: str
    sync_bn: bool
    workers: Optional[int] = _resume("launch")  # as given (None: by device); loader_workers is what the run uses
    project: Optional[str] = _resume("search")
    name: str
    exist_ok: bool
    cos_lr: bool
    patience: int
    save_period: int
    save_interval: str = _resume("given")
    seed: int
    deterministic: bool
    amp: str
    freeze: list
    multi_scale: bool
    label_smoothing: Optional[float]
    profile: bool = _resume("launch")
    loggers: list = _resume("given")  # names in utils.loggers.LOGGERS: results.csv, TensorBoard, trackers
    log_model: bool = _resume("given")  # trackers receive best.pt at the end
    local_rank: int = _resume("given")
    # the user's block files: this launch's only, never the checkpoint's (a checkpoint names no file to import)
    modules: list = _resume("launch")
    # `cfg` is the checkpoint --weights names, trained as its own model (--weights without --cfg), not a model that
    # --weights seeds (engine/resume.weights_own_model)
    train_checkpoint_model: bool = _planned()
    train_imgsz: Optional[int] = _derived()  # imgsz rounded up to the model's largest stride
    loader_workers: Optional[int] = _derived()  # dataloader workers per rank, resolved for the device

    @classmethod
    def from_values(cls, values):
        """From a dict or namespace of option values (a parsed command line, a checkpoint's `opt`): the fields this
        class declares, derived ones left to set-up; anything else (`given`, a field of another task) is ignored."""
        values = values if isinstance(values, dict) else vars(values)
        names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("derived")]
        return cls(**{k: values[k] for k in names if k in values})

    @classmethod
    def resume_rules(cls):
        """{option: how --resume treats it} for the options --resume may come with."""
        return {f.name: f.metadata["resume"] for f in dataclasses.fields(cls) if "resume" in f.metadata}

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DetectTrainOptions(TrainOptions):
    """train.py: the box tasks' extras (utils/cli.add_detect_train_args)."""

    rect: bool = False
    noautoanchor: bool = False
    single_cls: bool = False
    image_weights: bool = False
    evolve: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class SegmentTrainOptions(DetectTrainOptions):
    """segment/train.py: masks as one map of overlapping instances, or one mask per instance."""

    no_overlap: bool = False
