"""How the optimizer steps through a run: gradient accumulation, weight decay per step, the optimizer and its learning
rate, warmup, the LR schedule, and when mosaic closes. The one reader of these hyperparameters (engine/hyp.py checks
them against `HYP_KEYS`)."""

import dataclasses
import math
from typing import Callable

import numpy as np

from utils.torch_utils import lr_lambda, resolve_optimizer

# The keys this module reads, with the values it can work with (brackets as in mathematics; `whole`: a count), and
# the defaults of those a hyp file may leave out. `lr_auto_gain` multiplies the learning rate `--optimizer auto`
# picks for a short run from scratch; `lr_new_gain` that of the tensors --weights did not give when it fine-tunes (the
# hyp files say why each has its value).
HYP_KEYS = {
    "lr0": "(0, inf)", "lrf": "[0, inf)", "momentum": "[0, 1)", "weight_decay": "[0, inf)",
    "warmup_epochs": "[0, inf)", "warmup_momentum": "[0, 1)", "warmup_bias_lr": "[0, inf)",
    "nbs": "[1, inf) whole", "close_mosaic": "[0, inf) whole", "lr_auto_gain": "(0, inf)", "lr_new_gain": "(0, inf)",
}
# nbs: the nominal batch size gradients are accumulated to (a hyp may lower it so that small datasets get enough
# optimizer steps); close_mosaic: the last epochs trained without mosaic (0: none); lr_new_gain 1: new tensors step
# as the others
HYP_DEFAULTS = {"nbs": 64, "close_mosaic": 0, "lr_new_gain": 1.0}
WARMUP_FLOOR = 100  # the fewest warmup iterations from scratch (YOLOv5's and Ultralytics' 8.0-8.3 rule)


def warmup_iters(warmup_epochs, epochs, batches, pretrained):
    """Batches of warmup (-1: none). From scratch: warmup_epochs, at least WARMUP_FLOOR batches. Fine-tuning:
    warmup_epochs, at most epochs - 1 (Ultralytics 8.4's rule): on a small set the floor spans half a short run, which
    held COCO128 fine-tuning back, while from scratch the shorter warmup lost accuracy on the shapes sets under the
    larger step there (docs/recipes.md, "Real photos")."""
    if not pretrained:
        return max(round(warmup_epochs * batches), WARMUP_FLOOR) if warmup_epochs > 0 else -1
    return round(min(warmup_epochs, max(epochs - 1, 0)) * batches) or -1


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The optimizer's plan for one run, fixed at set-up (`Schedule.plan`)."""

    optimizer: str  # SGD, Adam or AdamW (`auto` resolved)
    lr0: float
    new_lr0: float  # lr0 of the tensors --weights did not give (a new class layer)
    momentum: float
    weight_decay: float  # scaled to the images per optimizer step
    accumulate: int  # batches per optimizer step after warmup
    total_batch: int  # images per batch over all ranks
    nbs: int
    warmup_iters: int  # batches of warmup (-1: none)
    warmup_bias_lr: float
    warmup_momentum: float
    epochs: int
    close_mosaic: int
    lr_factor: Callable  # epoch -> multiplier of lr0 (linear or cosine to lrf)

    @classmethod
    def plan(cls, hyp, optimizer, epochs, total_batch, n_images, batches, nc, pretrained=False, cos_lr=False,
             chosen=None):
        """`batches`: per epoch and rank; `n_images`: the training set's size; `chosen`: what `--optimizer auto` chose
        when the run started (a resumed run's), kept whatever its length is now; `pretrained`: fine-tuning, where
        `--optimizer auto` keeps the Ultralytics fit (its larger step was measured from scratch, and would overwrite
        pretrained features) for the tensors --weights gave, and steps `lr_new_gain` times that for the others: at
        the fit's small lr a new class layer barely leaves its random start in a short run (docs/recipes.md, "Real
        photos"). The warmup has no floor there (`warmup_iters`)."""
        h = {**HYP_DEFAULTS, **hyp}
        nbs = h["nbs"]
        accumulate = max(round(nbs / total_batch), 1)
        # weight decay is applied once per optimizer step: scale it to the images per step
        weight_decay = h["weight_decay"] * total_batch * accumulate / nbs
        iterations = math.ceil(n_images / max(total_batch, nbs)) * epochs
        if optimizer == "auto" and chosen is not None:  # the long-run rule decided once, at the run's start
            iterations = math.inf if chosen == "SGD" else 0
        gain = 1.0 if pretrained else h["lr_auto_gain"]
        name, lr0, momentum = resolve_optimizer(optimizer, h["lr0"], h["momentum"], nc, iterations, gain)
        warmup = warmup_iters(h["warmup_epochs"], epochs, batches, pretrained)
        new_gain = h["lr_new_gain"] if optimizer == "auto" and name == "AdamW" and pretrained else 1.0
        return cls(
            optimizer=name, lr0=lr0, new_lr0=lr0 * new_gain, momentum=momentum, weight_decay=weight_decay,
            accumulate=accumulate, total_batch=total_batch, nbs=nbs, warmup_iters=warmup,
            # a bias warmup from 0.1 suits SGD; Adam-family steps are already lr-sized, so there it would blow up
            warmup_bias_lr=h["warmup_bias_lr"] if name == "SGD" else 0.0, warmup_momentum=h["warmup_momentum"],
            epochs=epochs, close_mosaic=h["close_mosaic"], lr_factor=lr_lambda(epochs, h["lrf"], cos_lr),
        )

    def accumulate_at(self, step):
        """Batches per optimizer step at global batch `step`: rising from 1 over the warmup."""
        if step > self.warmup_iters:
            return self.accumulate
        return max(1, int(np.interp(step, [0, self.warmup_iters], [1, self.nbs / self.total_batch]).round()))

    def warmup(self, optimizer, step, epoch):
        """Set each group's lr (and momentum) for global batch `step` of the warmup: the bias groups (index 2, and 5
        where new tensors have their own: utils/torch_utils.build_optimizer) fall from warmup_bias_lr to the scheduled
        lr, the others rise from 0."""
        ramp = [0, self.warmup_iters]
        for j, g in enumerate(optimizer.param_groups):
            start = self.warmup_bias_lr if j % 3 == 2 else 0.0
            g["lr"] = float(np.interp(step, ramp, [start, g["initial_lr"] * self.lr_factor(epoch)]))
            if "momentum" in g:
                g["momentum"] = float(np.interp(step, ramp, [self.warmup_momentum, self.momentum]))
            elif "betas" in g:
                g["betas"] = (float(np.interp(step, ramp, [self.warmup_momentum, self.momentum])), 0.999)

    def mosaic_closed(self, epoch):
        """Whether `epoch` is one of the last `close_mosaic` epochs, trained without mosaic."""
        return bool(self.close_mosaic) and epoch >= self.epochs - self.close_mosaic
