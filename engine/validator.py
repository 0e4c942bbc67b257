"""BaseValidator: the evaluation loop shared by per-epoch validation in the trainer and the stand-alone val scripts.

Task subclasses implement `init_metrics`, `postprocess`, `update_metrics`, `get_stats` and `print_results`.
"""

from types import SimpleNamespace

import torch
from tqdm import tqdm

from utils.loggers import LOGGER
from utils.torch_utils import time_sync


class BaseValidator:
    """Run a model over a dataloader and compute the task's metrics. Called as `validator(model=..., trainer=...)`."""

    def __init__(self, dataloader, save_dir, args, names):
        self.dataloader = dataloader
        self.save_dir = save_dir
        self.args = args if isinstance(args, SimpleNamespace) else SimpleNamespace(**vars(args))
        self.names = names
        self.nc = len(names)
        self.speed = {"preprocess": 0.0, "inference": 0.0, "postprocess": 0.0}
        self.seen = 0

    def preprocess(self, batch, device, half):
        batch["img"] = batch["img"].to(device, non_blocking=True)
        batch["img"] = (batch["img"].half() if half else batch["img"].float()) / 255
        for k in ("targets", "masks", "cls"):
            if k in batch:
                batch[k] = batch[k].to(device)
        return batch

    def init_metrics(self, model):
        raise NotImplementedError

    def postprocess(self, preds):
        raise NotImplementedError

    def update_metrics(self, preds, batch):
        raise NotImplementedError

    def get_stats(self):
        """Return the results dict, including 'fitness'."""
        raise NotImplementedError

    def print_results(self, final=False):
        raise NotImplementedError

    def plot_val_batch(self, batch, preds, bi):
        """Optional: save val_batch{bi}_labels.jpg and val_batch{bi}_pred.jpg."""

    def plot_metrics(self):
        """Optional: save the run's metric charts (curves, confusion matrices) to save_dir."""

    def finalize(self, stats):
        """Hook after the stats (e.g. COCO JSON evaluation); may update and return them."""
        return stats

    @torch.no_grad()
    def __call__(self, model, trainer=None, final=False):
        """Evaluate `model` (a plain, unwrapped module). In training it is the EMA model on the training device."""
        device = next(model.parameters()).device
        half = bool(getattr(self.args, "half", False)) and device.type == "cuda"
        training = model.training
        model.eval()
        if half:
            model.half()
        self.init_metrics(model)
        self.seen = 0
        dt = [0.0, 0.0, 0.0]
        final = final or trainer is None
        plots = final and not getattr(self.args, "noplots", False)  # the final or stand-alone run, not each epoch
        bar = tqdm(self.dataloader, desc=self.description(), bar_format="{l_bar}{bar:10}{r_bar}")
        for bi, batch in enumerate(bar):
            t0 = time_sync()
            batch = self.preprocess(batch, device, half)
            t1 = time_sync()
            preds = model(batch["img"])
            t2 = time_sync()
            preds = self.postprocess(preds)
            t3 = time_sync()
            self.update_metrics(preds, batch)
            if plots and bi < 3:
                self.plot_val_batch(batch, preds, bi)
            dt[0], dt[1], dt[2] = dt[0] + t1 - t0, dt[1] + t2 - t1, dt[2] + t3 - t2
        if half:
            model.float()
        model.train(training)
        n = max(self.seen, 1)
        self.speed = {k: v * 1e3 / n for k, v in zip(self.speed, dt)}
        stats = self.finalize(self.get_stats())
        self.print_results(final=final)
        if plots:
            self.plot_metrics()
        return stats

    def description(self):
        return "validating"

    def print_speed(self, shape):
        s = self.speed
        LOGGER.info(
            f"Speed: {s['preprocess']:.1f}ms pre-process, {s['inference']:.1f}ms inference, "
            f"{s['postprocess']:.1f}ms {self.postprocess_name} per image at shape {tuple(shape)}"
        )

    postprocess_name = "post-process"
