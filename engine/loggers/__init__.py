"""The loggers `--loggers` chooses among: the
per-epoch results.csv and TensorBoard writers here, and the experiment trackers, one module each beside this file
(wandb.py, mlflow.py, clearml.py, comet.py, on the shared rules of tracker.py). Each is a training callback
(engine/callbacks.py) that reads what an event carries, such as the epoch's row (`event.row`), never the trainer."""

import copy
import csv
import importlib
import os
import warnings

from utils.cli import ALWAYS
from utils.log import LOGGER


class CSVLogger:
    """results.csv: one row per epoch, keyed by epoch, numbered from 1 as the progress bar numbers them. A resumed run
    that repeats an epoch (killed after the row, before the checkpoint) replaces that epoch's row; the file is
    rewritten whole and renamed into place, so a kill mid-write leaves the previous version. A file written by an
    earlier version, which numbered epochs from 0, is renumbered when a resumed run first writes to it."""

    def __init__(self, path):
        self.path = path

    def on_fit_epoch_end(self, event):
        self.log(event.epoch, event.row)

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

    def on_pretrain_routine_end(self, event):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            LOGGER.warning("tensorboard not installed: no TensorBoard logs (pip install tensorboard)")
            return
        self.writer = SummaryWriter(str(self.log_dir))
        LOGGER.info(f"TensorBoard: tensorboard --logdir {self.log_dir.parent}")
        if self.plots and self.graph:
            _add_graph(self.writer, event.model, int(max(event.model.stride)))

    def on_fit_epoch_end(self, event):
        self.log(event.row, event.epoch)

    def on_train_end(self, event):
        if self.writer is not None and self.plots:  # results.png is drawn by then (evaluation.charts.RunPlots, before)
            for f in sorted([*self.log_dir.glob("*.png"), *self.log_dir.glob("*.jpg")]):
                _add_image_file(self.writer, f)
        self.close()

    def on_train_interrupted(self, event):
        self.close()

    def on_train_failed(self, event):
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
# package only when the run starts (engine/loggers/tracker.py), so a run that does not name it needs no package.
TRACKERS = {"wandb": ("engine.loggers.wandb", "WandbTracker"), "mlflow": ("engine.loggers.mlflow", "MLflowTracker"),
            "clearml": ("engine.loggers.clearml", "ClearMLTracker"), "comet": ("engine.loggers.comet", "CometTracker")}


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
