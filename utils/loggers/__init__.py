"""The project's one logger (every module imports LOGGER from here), and the loggers `--loggers` chooses among: the
per-epoch results.csv and TensorBoard writers here, and the experiment trackers, one module each beside this file
(wandb.py, mlflow.py, clearml.py, comet.py, on the shared rules of tracker.py). Each is a training callback
(engine/callbacks.py) that reads what the trainer holds at an event, such as the epoch's row (`trainer.epoch_row`)."""

import copy
import csv
import importlib
import logging
import os
import sys
import warnings

from utils.errors import BadOption
from utils.text import escape_controls

LOGGER = logging.getLogger("yolo")


class PrintableFormatter(logging.Formatter):
    """Messages as text any terminal takes: a file name that is not UTF-8 (held by Python as surrogate escapes, e.g.
    a Latin-1 'caf\\xe9.jpg') is shown with its bytes escaped, where a strict UTF-8 stdout would refuse the line, and
    control characters are escaped, line breaks inside the message included: whatever a file or class name holds,
    it can neither drive the terminal nor start a line of its own ('All checks passed'). Only the blank lines a
    message starts or ends with are kept; a message of several lines is logged a line at a time."""

    def format(self, record):
        text = super().format(record).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        body = text.strip("\n")
        if not body:
            return text
        start = text.index(body)
        return text[:start] + escape_controls(body) + text[start + len(body):]


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever sys.stdout is when a record comes, not to the stream it was at set-up: a caller that swaps
    it (a notebook, contextlib.redirect_stdout, a test's capture that is closed afterwards) gets the later lines."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _):
        pass


def set_logging(rank=-1, verbose=True):
    """INFO on rank 0 (or single process, rank -1), WARNING elsewhere, so N ranks do not print N copies."""
    level = logging.INFO if verbose and rank in (-1, 0) else logging.WARNING
    if not LOGGER.handlers:
        handler = _StdoutHandler()
        handler.setFormatter(PrintableFormatter("%(message)s"))
        LOGGER.addHandler(handler)
        LOGGER.propagate = False
    LOGGER.setLevel(level)
    return LOGGER


class CSVLogger:
    """results.csv: one row per epoch, keyed by epoch, numbered from 1 as the progress bar numbers them. A resumed run
    that repeats an epoch (killed after the row, before the checkpoint) replaces that epoch's row; the file is
    rewritten whole and renamed into place, so a kill mid-write leaves the previous version. A file written by an
    earlier version, which numbered epochs from 0, is renumbered when a resumed run first writes to it."""

    def __init__(self, path):
        self.path = path

    def on_fit_epoch_end(self, trainer):
        self.log(trainer.state.epoch + 1, trainer.epoch_row)

    def rows(self):
        if not self.path.exists():
            return {}
        with open(self.path, newline="") as f:
            rows = {int(r["epoch"]): r for r in csv.DictReader(f)}
        if 0 in rows:  # numbered from 0: every run's first row was epoch 0
            rows = {e + 1: {**r, "epoch": e + 1} for e, r in rows.items()}
        return rows

    def log(self, epoch, values):
        rows = self.rows()
        rows[epoch] = {"epoch": epoch, **{k: f"{float(v):.6g}" for k, v in values.items()}}
        columns = list(dict.fromkeys(k for r in rows.values() for k in r))
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, columns, restval="")
            writer.writeheader()
            writer.writerows(rows[e] for e in sorted(rows))
        os.replace(tmp, self.path)


class TensorBoardLogger:
    """Scalars (losses, metrics, learning rates) per epoch in the run folder, from set-up to the end of the run (or its
    interruption); with `plots`, every picture of the run folder at the end, and with `graph` too the model graph
    after set-up (a trace of the model: 6.2 s at 640 px on a 2-core CPU, hence only when asked). Absent, with one
    warning, if tensorboard is not installed."""

    def __init__(self, log_dir, plots=True, graph=False):
        self.log_dir = log_dir
        self.plots, self.graph = plots, graph
        self.writer = None

    def on_pretrain_routine_end(self, trainer):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            LOGGER.warning("tensorboard not installed: no TensorBoard logs (pip install tensorboard)")
            return
        self.writer = SummaryWriter(str(self.log_dir))
        LOGGER.info(f"TensorBoard: tensorboard --logdir {self.log_dir.parent}")
        if self.plots and self.graph:
            _add_graph(self.writer, trainer.model, int(max(trainer.model.stride)))

    def on_fit_epoch_end(self, trainer):
        self.log(trainer.epoch_row, trainer.state.epoch + 1)

    def on_train_end(self, trainer):
        if self.writer is not None and self.plots:  # results.png is drawn by then (utils.charts.RunPlots, before)
            for f in sorted([*self.log_dir.glob("*.png"), *self.log_dir.glob("*.jpg")]):
                _add_image_file(self.writer, f)
        self.close()

    def on_train_interrupted(self, trainer):
        self.close()

    def on_train_failed(self, trainer):
        self.close()

    def log(self, scalars, step):
        if self.writer is None:
            return
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _add_image_file(writer, path):
    """A PNG or JPEG file to TensorBoard as it is encoded (TensorBoard shows either). `add_image` would decode it and
    encode it again as PNG, which costs more than drawing the picture did."""
    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary  # installed with tensorboard, which is optional

    try:
        with Image.open(path) as im:  # reads the header only
            width, height = im.size
    except OSError:  # not a picture after all: skipped, as an unreadable one always was
        return
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=path.read_bytes())
    writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=path.stem, image=image)]), 0)


def _add_graph(writer, model, stride):
    """The inference graph of a copy of the model (tracing must not touch the training model's mode or state)."""
    import torch

    net = copy.deepcopy(model).float().cpu().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values taken from tensors
        # non-strict: the heads return lists of level outputs
        writer.add_graph(net, torch.zeros(1, 3, 2 * stride, 2 * stride), use_strict_trace=False)


# ------------------------------------------------------------------------------------------------ --loggers
# name: what it writes. results.csv is the run's record (results.png, --resume's rows, every peer writes it): always
# written; --loggers adds to the default, `no-name` drops one, `none` keeps results.csv alone. A tracker's module is
# imported on global rank 0 only, when --loggers names it, and imports its
# package only when the run starts (utils/loggers/tracker.py), so a run that does not name it needs no package.
LOGGERS = {
    "csv": "results.csv in the run folder, one row per epoch",
    "tensorboard": "TensorBoard scalars and pictures in the run folder",
    "tensorboard-graph": "the same with the model's graph, traced at set-up (seconds of a run)",
    "wandb": "Weights & Biases (utils/loggers/wandb.py; pip install wandb)",
    "mlflow": "MLflow (utils/loggers/mlflow.py; pip install mlflow)",
    "clearml": "ClearML (utils/loggers/clearml.py; pip install clearml)",
    "comet": "Comet (utils/loggers/comet.py; pip install comet_ml)",
}
DEFAULT_LOGGERS = ["csv", "tensorboard"]
ALWAYS = "csv"
TRACKERS = {"wandb": ("utils.loggers.wandb", "WandbTracker"), "mlflow": ("utils.loggers.mlflow", "MLflowTracker"),
            "clearml": ("utils.loggers.clearml", "ClearMLTracker"), "comet": ("utils.loggers.comet", "CometTracker")}


def check_loggers(value):
    """The loggers a run has, in order, each once, from the words --loggers was given: a name adds a logger to the
    default (csv tensorboard), `no-name` drops one, `none` drops all but results.csv; words may be comma lists
    ('wandb,mlflow'), or one such string. BadOption naming the first unknown name, or an attempt to drop results.csv.
    Read the words once: the list that results, read again, has the default's loggers added back."""
    items = [value] if isinstance(value, str) else list(value or [])
    names = list(DEFAULT_LOGGERS)
    for word in (n.strip().lower() for item in items for n in str(item).split(",") if n.strip()):
        drop = word.startswith("no-")
        name = word.removeprefix("no-")
        if word == "none":
            names = [ALWAYS]
            continue
        if name not in LOGGERS:
            raise BadOption(f"--loggers {word}: unknown logger; choose from {', '.join(LOGGERS)} (no-NAME drops one, "
                            "none keeps results.csv alone)")
        if drop and name == ALWAYS:
            raise BadOption("--loggers no-csv: results.csv is the run's record and is always written")
        names = [n for n in names if n != name] if drop else [*names, name]
    return list(dict.fromkeys([ALWAYS, *names]))


def build_loggers(names, save_dir, plots=True, log_model=True):
    """The listeners of --loggers `names`, in that order, for global rank 0 (no other rank writes or reports);
    results.csv in any case (a checkpoint of an older run may list none)."""
    listeners = []
    for name in dict.fromkeys([ALWAYS, *names]):
        if name == "csv":
            listeners.append(CSVLogger(save_dir / "results.csv"))
        elif name.startswith("tensorboard"):
            if not any(isinstance(x, TensorBoardLogger) for x in listeners):  # one, with the graph if either asks
                listeners.append(TensorBoardLogger(save_dir, plots, graph="tensorboard-graph" in names))
        else:
            module, cls = TRACKERS[name]
            listeners.append(getattr(importlib.import_module(module), cls)(log_model=log_model))
    return listeners
