"""--image-weights: draw training images with weights that favour rare classes (and, YOLOv5's rule, classes the
last validation scored poorly on).

Class weight = 1 / label count of the class, normalised, times (1 - that class's mAP50-95)^2; an image's weight is
the sum of its labels' class weights (so, as in YOLOv5, an image without labels is never drawn). Under DDP rank 0
computes the weights each epoch (it alone holds the validation results) and broadcasts them; every rank then makes
the same seeded draw of the whole epoch and takes its own share of it, so the shares are one weighted sample split
across ranks, not world_size independent ones.
"""

import math

import numpy as np
import torch
from torch.utils.data import Sampler

from utils import dist as du


def class_weights(labels_cls, nc):
    """(nc,) inverse label frequencies, normalised to sum 1 (a class without labels counts as one label)."""
    counts = np.bincount(np.concatenate([c.reshape(-1) for c in labels_cls]).astype(int), minlength=nc)[:nc]
    w = 1.0 / np.maximum(counts, 1)
    return w / w.sum()


def image_weights(image_of, classes, n, cw, maps):
    """(n,) image weights: the sum over each image's labels of its class's weight (class weights (nc,) times
    (1 - per-class mAP (nc,))^2 / nc). The labels are given as two (M,) arrays, their image and their class: an
    N x nc count matrix would be 2.6 GB per rank for Objects365 (1.7M images, 365 classes)."""
    w = cw * (1 - maps) ** 2 / len(cw)
    return np.bincount(image_of, weights=w[classes], minlength=n)


class ImageWeightSampler(Sampler):
    """Weighted sampling with replacement, ceil(n / num_replicas) images per rank and epoch.

    `maps_fn()` gives the per-class mAP50-95 of the last validation (zeros before any); it is called on rank 0
    only. `set_epoch` is a collective under DDP: every rank must call it, as the trainer does each epoch.
    """

    reads_validation = True  # an epoch's weights come from the validation before it

    def __init__(self, labels_cls, nc, num_replicas=1, rank=-1, seed=0, maps_fn=None):
        classes = [c.reshape(-1).astype(np.int64) for c in labels_cls]
        image_of = np.repeat(np.arange(len(classes)), [len(c) for c in classes])
        classes = np.concatenate(classes) if classes else np.zeros(0, np.int64)
        known = classes < nc  # as a count matrix of nc columns, which has no place for others
        self.n, self.image_of, self.classes = len(labels_cls), image_of[known], classes[known]
        self.cw = class_weights(labels_cls, nc)
        self.num_replicas, self.rank, self.seed = num_replicas, max(rank, 0), seed
        self.maps_fn = maps_fn or (lambda: np.zeros(nc))
        self.num_samples = math.ceil(self.n / num_replicas)
        self.epoch, self.skip, self.weights = 0, 0, None

    def set_epoch(self, epoch, skip=0):
        """`skip`: samples of the epoch already done (a run resumed inside the epoch)."""
        self.epoch, self.skip = epoch, min(skip, self.num_samples)
        maps = np.asarray(self.maps_fn()) if du.is_main_process() else None
        w = image_weights(self.image_of, self.classes, self.n, self.cw, maps) if maps is not None else None
        self.weights = du.broadcast_object(w)

    def __len__(self):
        return self.num_samples - self.skip

    def __iter__(self):
        if self.weights is None:
            self.set_epoch(self.epoch)
        w = torch.as_tensor(self.weights, dtype=torch.float64)
        if w.sum() <= 0:  # no labels anywhere: nothing to favour
            w = torch.ones_like(w)
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        idx = torch.multinomial(w, self.num_samples * self.num_replicas, replacement=True, generator=g)
        return iter(idx[self.rank :: self.num_replicas][self.skip :].tolist())
