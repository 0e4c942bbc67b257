"""`YOLO`: the Python API Ultralytics' users know, over this project's scripts and hub wrapper.

    from yolo import YOLO
    model = YOLO("yolov8n.yaml")                      # a model YAML to train, or weights: .pt, .onnx, .torchscript
    # (a YAML's model predicts, validates and exports untrained, as Ultralytics': yolo/untrained.py)
    model.train(data="data/shapes.yaml", epochs=3, imgsz=160, batch=8)   # then `model` is the run's best.pt
    metrics = model.val()                             # metrics.box.map, .map50, .maps; the run's dataset and size
    for r in model.predict("data/images", stream=True):   # evaluation.results.Results, one per image or frame
        r.boxes.xyxy, r.boxes.conf, r.boxes.cls
    path = model.export(format="onnx")                # the exported file

Each method runs the script of the model's task and mode (yolo/scripts.py), with keyword arguments named as the
script's flags or as Ultralytics names them (batch, conf, iou, format, save, show, line_width), checked as a command
line is; a mistake is a utils.errors.UserError naming the option, with the closest known one.
"""

import logging
from contextlib import nullcontext
from pathlib import Path

from yolo.metrics import ValMetrics
from yolo.scripts import check_model, check_words, load_script, model_task
from yolo.untrained import Untrained, is_yaml


def _task(name):
    """The task's record (engine/tasks), whose predictor and validator the predict and val scripts run."""
    from engine.tasks import TASKS

    return TASKS[name]


class YOLO:
    """A model YAML or weights file, and the task its head serves (`task` to say it where the name does not). A
    name that is neither a model YAML nor a file nor official weights is refused here, with the closest name."""

    def __init__(self, model="yolov8n.yaml", task=None):
        from utils.versions import check_torch_pair

        check_torch_pair()  # as every script does at start
        self.model = str(model)
        check_model(self.model)
        self.task = task or model_task(self.model)
        check_words(self.task, "train")
        self.trainer = self.metrics = None
        self.callbacks = {}
        self._backend = None
        self._untrained = Untrained(self.model, self.task) if is_yaml(self.model) else None
        self._tracker = None  # track(persist=True): the last call's tracks (engine/track.FrameTracker)

    def __repr__(self):
        return f"YOLO({self.model!r}, task={self.task!r})"

    def _opt(self, mode, options):
        """The script module of `mode` and its options: `options` as `key=value` words, the model first (a YAML's
        untrained checkpoint where weights are read)."""
        module = load_script(self.task, mode)
        model = self.model if mode == "train" else self._weights()
        words = [f"{k}={v}" for k, v in {"model": model, **options}.items() if v is not None]
        return module, module.parse_opt(words)

    def _weights(self):
        """The weights file predict, val, track and export read: the model's, or its YAML's untrained model's."""
        return self._untrained.checkpoint() if self._untrained else self.model

    def _named(self):
        """Where a YAML's untrained checkpoint runs: its errors name the YAML, not that passing file."""
        return self._untrained.named() if self._untrained else nullcontext()

    def _named_stream(self, gen):
        """`gen`'s items, under `_named` while it runs."""
        with self._named():
            yield from gen

    def _net(self):
        """The model as the predictors load it (models/backend.py), once per weights file; a YAML's untrained
        model itself."""
        if self._untrained:
            return self._untrained.model
        if self._backend is None or self._backend[0] != self.model:
            from models.backend import InferenceBackend

            self._backend = (self.model, InferenceBackend(self.model, device="cpu"))
        return self._backend[1]

    def _module(self):
        """The torch model (a YAML's, or a .pt's), None for an export."""
        from models.backend import InferenceBackend

        net = self._net()
        return net.model if isinstance(net, InferenceBackend) else net

    @property
    def names(self):
        """{class id: name} of the model."""
        return dict(self._net().names)

    def info(self, verbose=False, imgsz=640):
        """Logs and returns (layers, parameters, gradients, GFLOPs at imgsz) of a .pt or YAML model; `verbose`: a
        line per layer too."""
        net = self._module()
        if net is None:
            from utils.errors import BadOption

            raise BadOption(f"info(): {self.model} is an export; its graph has no layers to count")
        return net.info(verbose=verbose, imgsz=imgsz)

    def fuse(self):
        """Folds each BatchNorm into its convolution (as exports and the predictors do); returns self."""
        if self._untrained:
            self._untrained.fuse()
            return self
        net = self._module()
        if net is not None:
            net.fuse()
        return self

    def add_callback(self, event, fn):
        """`fn(event)` runs at `event` (engine/callbacks.EVENTS) of the next `train`, given an engine/callbacks.Event
        (the names Ultralytics' callbacks read on their trainer: `epoch`, `metrics`, `save_dir`, `best`, `last`); a
        misspelled event is refused here."""
        from engine.callbacks import EVENTS
        from utils.cli import did_you_mean
        from utils.errors import BadOption

        if event not in EVENTS:
            raise BadOption(f"add_callback: no event {event!r}{did_you_mean(event, EVENTS)}; events: "
                            f"{', '.join(EVENTS)}")
        self.callbacks.setdefault(event, []).append(fn)

    def train(self, callbacks=None, **options):
        """Train (train.run's options; `callbacks` as it takes them, beside add_callback's); afterwards this object
        is the run's best.pt (last.pt where no epoch validated). Returns the final metrics (ValMetrics)."""
        module, opt = self._opt("train", options)
        listeners = [self.callbacks] if self.callbacks else []
        listeners += callbacks if isinstance(callbacks, (list, tuple)) else [callbacks] if callbacks else []
        self.trainer, stats = module.main(opt, listeners or None)
        ck = self.trainer.checkpointer
        self.model = str(ck.best if ck.best.is_file() else ck.last)
        self._untrained = None
        validator = getattr(self.trainer, "validator", None)
        self.metrics = ValMetrics(stats or {}, validator, getattr(self.trainer, "save_dir", None))
        return self.metrics

    def val(self, **options):
        """Validate (the val script's options); returns its metrics (ValMetrics: `metrics.box.map`, ..., and the
        results dict itself)."""
        _, opt = self._opt("val", options)
        seen = []

        class Kept(_task(self.task).validator):  # run_val as the script runs it, keeping the validator
            def __call__(self, *args, **kwargs):
                seen.append(self)
                return super().__call__(*args, **kwargs)

        with self._named():
            stats = Kept.run_val(opt)
        self.metrics = ValMetrics(stats, seen[-1] if seen else None, seen[-1].save_dir if seen else None)
        return self.metrics

    def export(self, **options):
        """Export (export.py's options; format= is --include); returns the path of the file, or the paths of several
        formats (a YAML's untrained model's: in the working folder, named after the YAML)."""
        module, opt = self._opt("export", options)
        with self._named():
            files = [str(f) for f in module.main(opt)]
        if self._untrained:
            files = self._untrained.publish(files)
        return files[0] if len(files) == 1 else files

    def predict(self, source="data/images", stream=False, **options):
        """One `evaluation.results.Results` per image or frame of `source`: a list (models.hub.ResultsList), or with
        `stream` a generator that holds one frame at a time. `source`: what the predict scripts read (an image, a
        folder, a glob, a video, a stream, ...), with their options as keywords (conf, iou, imgsz, classes, max_det,
        half, device, save, save_txt, save_conf, save_crop, show, line_width, ...); or numpy HWC RGB arrays, PIL
        images and lists of them or of paths (the hub wrapper, models/hub.py, with conf, iou, imgsz, classes,
        max_det, augment, device and the save options). Nothing is saved unless asked (save=True); `verbose=False`
        keeps the log to warnings."""
        from models.hub import ResultsList

        verbose = options.pop("verbose", True)
        if isinstance(source, (str, Path)):
            gen = self._script_predict(source, options)
        else:
            from yolo.inmemory import hub_predict

            gen = hub_predict(self, source, options)
        gen = self._named_stream(gen)
        if str(verbose).lower() in ("false", "0", "no", "off"):
            gen = _quiet(gen)
        if stream:
            return gen
        results = list(gen)
        return ResultsList(results, results[0].names if results else {})

    __call__ = predict

    def track(self, source, stream=False, persist=False, tracker="bytetrack", **options):
        """predict() with a tracker (bytetrack, botsort or a tracker YAML): each Results' `boxes.id` holds the track
        ids. `persist`: go on with the tracks of the last call (a video fed a call at a time), else start afresh.
        `source`: a path, video, stream or folder (what the predict scripts read)."""
        if not isinstance(source, (str, Path)):
            from utils.errors import BadOption

            raise BadOption("track: give the source as a path, video or stream (the predict scripts' sources)")
        check_words(self.task, "track")
        verbose = options.pop("verbose", True)
        _, opt = self._opt("predict", {"save": False, **options, "source": str(source), "track": tracker})
        with self._named():
            predictor = _task(self.task).predictor(opt)
        if persist and self._tracker is not None:
            predictor.tracker = self._tracker
        self._tracker = predictor.tracker
        self._tracker.one_sequence = persist
        gen = self._named_stream(predictor.stream())
        if str(verbose).lower() in ("false", "0", "no", "off"):
            gen = _quiet(gen)
        return gen if stream else list(gen)

    def _script_predict(self, source, options):
        """The task's predictor over `source`, its Results one at a time."""
        _, opt = self._opt("predict", {"save": False, **options, "source": str(source)})
        yield from _task(self.task).predictor(opt).stream()


def _quiet(gen):
    """`gen`'s items, with the `yolo` logger at warnings while it runs."""
    log = logging.getLogger("yolo")
    it = iter(gen)
    while True:
        level = log.level
        log.setLevel(logging.WARNING)
        try:
            item = next(it)
        except StopIteration:
            return
        finally:
            log.setLevel(level)
        yield item


