"""The project's one logger (every module imports LOGGER from here), and the per-epoch CSV and TensorBoard writers
that the trainer calls on rank 0."""

import csv
import logging
import sys

LOGGER = logging.getLogger("yolo")


def set_logging(rank=-1, verbose=True):
    """INFO on rank 0 (or single process, rank -1), WARNING elsewhere, so N ranks do not print N copies."""
    level = logging.INFO if verbose and rank in (-1, 0) else logging.WARNING
    if not LOGGER.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.addHandler(handler)
        LOGGER.propagate = False
    LOGGER.setLevel(level)
    return LOGGER


class CSVLogger:
    """results.csv: one row per epoch, header written with the first row."""

    def __init__(self, path):
        self.path = path

    def log(self, epoch, values):
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["epoch", *values.keys()])
            writer.writerow([epoch, *(f"{float(v):.6g}" for v in values.values())])


class TensorBoardLogger:
    """Scalars (losses, metrics, learning rates) per epoch; silently absent if tensorboard is not installed."""

    def __init__(self, log_dir):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            LOGGER.warning("tensorboard not installed: no TensorBoard logs (pip install tensorboard)")
            self.writer = None
            return
        self.writer = SummaryWriter(str(log_dir))
        LOGGER.info(f"TensorBoard: tensorboard --logdir {log_dir.parent}")

    def log(self, scalars, step):
        if self.writer is None:
            return
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()
