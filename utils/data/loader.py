"""DataLoaders: the DDP sampler that gives each rank a fixed share of the data, and seeded, per-worker RNGs."""

import math
import os
import random

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler


def rank_indices(n, num_replicas, rank, seed=0):
    """The sorted dataset indices that rank `rank` of `num_replicas` owns: a seeded random, disjoint split of range(n).

    Fixed for the whole run (it depends on the seed only), so a rank can cache exactly the images it will read.
    """
    if num_replicas <= 1:
        return np.arange(n)
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is outside [0, {num_replicas})")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g).numpy()
    return np.sort(perm[rank::num_replicas])


class SmartDistributedSampler(Sampler):
    """DDP sampler over a fixed per-rank subset (see `rank_indices`), reshuffled every epoch by seed + epoch.

    Unlike torch's DistributedSampler, which deals a new global permutation every epoch (so each rank would
    touch every image over a run), a rank here only ever reads its own share: `--cache ram` needs to hold just
    1/world_size of the images per rank. Every rank yields the same count, ceil(n / num_replicas), padding
    its own subset by repeating its first samples, so the ranks run the same number of steps.
    Call `set_epoch(epoch)` before each epoch, or every epoch repeats the same order.
    """

    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
        self.n = len(dataset)
        self.num_replicas, self.rank, self.shuffle, self.seed = num_replicas, rank, shuffle, seed
        self.indices = rank_indices(self.n, num_replicas, rank, seed)
        self.num_samples = math.ceil(self.n / num_replicas)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        idx = self.indices
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            idx = idx[torch.randperm(len(idx), generator=g).numpy()]
        if len(idx) < self.num_samples:
            idx = np.resize(idx, self.num_samples)  # repeats from the start
        return iter(idx.tolist())


def seed_worker(worker_id):
    """Seed python/numpy from torch's per-worker seed (the loader's generator + worker id), so augmentations
    differ across workers and ranks yet repeat from run to run."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    cv2.setNumThreads(0)  # the workers already run in parallel; OpenCV's own threads would oversubscribe the CPU


def build_dataloader(dataset, batch_size, workers, shuffle=True, rank=-1, world_size=1, seed=0, sampler=None):
    """A DataLoader with the dataset's `collate_fn`, a SmartDistributedSampler when world_size > 1, and a
    generator seeded with seed + rank.

    A plain DataLoader, not an 'infinite' one that keeps one iterator alive: that design reads the sampler
    before `set_epoch` takes effect, and so repeats the first epoch's order (yolov5 issue #6741). Persistent
    workers still avoid re-forking every epoch.
    """
    if getattr(dataset, "rect", False) and shuffle:
        shuffle = False  # rect batches are built from aspect-ratio-sorted neighbours; shuffling would break them
    nw = min((os.cpu_count() or 1) // max(world_size, 1), batch_size if batch_size > 1 else 0, workers)
    if sampler is None and world_size > 1:  # a given sampler (--image-weights) splits the ranks' shares itself
        sampler = SmartDistributedSampler(dataset, world_size, rank, shuffle, seed)
    generator = torch.Generator().manual_seed(seed + max(rank, 0))
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle and sampler is None,
        sampler=sampler,
        num_workers=nw,
        pin_memory=torch.cuda.is_available(),
        collate_fn=getattr(dataset, "collate_fn", None),
        worker_init_fn=seed_worker,
        persistent_workers=nw > 0,
        generator=generator,
    )
