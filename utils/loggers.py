"""The project's one logger (every module imports LOGGER from here), and the per-epoch results.csv and TensorBoard
writers: training callbacks (engine/callbacks.py) that read the epoch's row the trainer keeps (`trainer.epoch_row`)."""

import csv
import logging
import os
import sys

LOGGER = logging.getLogger("yolo")


class PrintableFormatter(logging.Formatter):
    """Messages as text any terminal takes: a file name that is not UTF-8 (held by Python as surrogate escapes, e.g.
    a Latin-1 'caf\\xe9.jpg') is shown with its bytes escaped, where a strict UTF-8 stdout would refuse the line."""

    def format(self, record):
        return super().format(record).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def set_logging(rank=-1, verbose=True):
    """INFO on rank 0 (or single process, rank -1), WARNING elsewhere, so N ranks do not print N copies."""
    level = logging.INFO if verbose and rank in (-1, 0) else logging.WARNING
    if not LOGGER.handlers:
        handler = logging.StreamHandler(sys.stdout)
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
    interruption); absent, with one warning, if tensorboard is not installed."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.writer = None

    def on_pretrain_routine_end(self, trainer):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            LOGGER.warning("tensorboard not installed: no TensorBoard logs (pip install tensorboard)")
            return
        self.writer = SummaryWriter(str(self.log_dir))
        LOGGER.info(f"TensorBoard: tensorboard --logdir {self.log_dir.parent}")

    def on_fit_epoch_end(self, trainer):
        self.log(trainer.epoch_row, trainer.state.epoch + 1)

    def on_train_end(self, trainer):
        self.close()

    def on_train_interrupted(self, trainer):
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
