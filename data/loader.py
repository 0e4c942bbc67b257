"""DataLoaders: the DDP sampler that gives each rank a fixed share of the data, and seeded, per-worker RNGs."""

import ctypes
import gc
import itertools
import math
import multiprocessing
import os
import random
import signal
import sys

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from utils.dist import get_local_world_size
from utils.heap import release_heap

WORKERS = 2  # --workers when not given on a CPU whose cores are not all busy with the model step (below)
GPU_WORKERS = 8  # at most, per rank, when the model steps on a GPU (as both official trainers)
# training images per group of whole batches (GroupedLoader); Ultralytics' mosaic buffer holds 8 batches of 16
GROUP_IMAGES = 128


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
    """Training sampler over a fixed per-rank subset (see `rank_indices`), reshuffled every epoch by seed + epoch.

    Unlike torch's DistributedSampler, which deals a new global permutation every epoch (so each rank would
    touch every image over a run), a rank here only ever reads its own share: `--cache ram` needs to hold just
    1/world_size of the images per rank. Every rank yields the same count, ceil(n / num_replicas), padding
    its own subset by repeating its first samples, so the ranks run the same number of steps.
    The order is a function of (seed, epoch) only, never of a generator's history, so a resumed run sees the same
    order; `set_epoch(epoch, skip)` also drops the first `skip` samples, to resume inside an epoch. Single-process
    training uses it too (one replica), for the same reasons.
    """

    reads_validation = False  # an epoch's order is known before the validation of the one before it

    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
        self.n = len(dataset)
        self.num_replicas, self.rank, self.shuffle, self.seed = num_replicas, rank, shuffle, seed
        self.indices = rank_indices(self.n, num_replicas, rank, seed)
        self.num_samples = math.ceil(self.n / num_replicas)
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch, skip=0):
        self.epoch, self.skip = epoch, min(skip, self.num_samples)

    def __len__(self):
        return self.num_samples - self.skip

    def __iter__(self):
        idx = self.indices
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            idx = idx[torch.randperm(len(idx), generator=g).numpy()]
        if len(idx) < self.num_samples:
            idx = np.resize(idx, self.num_samples)  # repeats from the start
        return iter(idx[self.skip:].tolist())


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent():
    """In a forked worker (Linux): SIGKILL when the process that forked it dies. A worker outliving a killed rank keeps
    every socket that rank had open, among them rank 0's store: a restarted group reaching that socket finds it
    listening but never answered. torch's own check (the parent's pid, every 5 s) misses a worker busy or blocked
    in its exit, so a survivor could hold the socket for minutes. The signal follows the thread that forked the worker:
    every loader here is iterated from the main thread."""
    if not sys.platform.startswith("linux"):
        return
    parent = multiprocessing.parent_process()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent.pid:  # it died before the request took effect
        os._exit(0)


def seed_worker(worker_id):
    """Worker set-up: dies with its rank (`die_with_parent`), its inherited objects frozen (`gc.freeze`);
    python/numpy seeded from torch's per-worker seed (the loader's generator + worker id), so anything drawing from
    them differs across workers and ranks yet repeats from run to run."""
    die_with_parent()
    # what the worker inherited is never walked by its garbage collector, which would write to (and so copy) every
    # page of the training process's objects it holds; freezing moves two list ends, whatever the heap's size
    gc.freeze()
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    cv2.setNumThreads(0)  # the workers already run in parallel; OpenCV's own threads would oversubscribe the CPU


def default_workers(device):
    """--workers when not given. On a GPU: this rank's share of the cores less one for the training loop, at most
    GPU_WORKERS: the training process launches the GPU's kernels, and workers on every core starve it. On a CPU:
    WORKERS, but none where every core already runs one of torch's intra-op threads (threads x processes on this
    machine >= cores): there a worker process does not add a core, it takes its time from the model step, which then
    runs slower by more than the loading it moves away. The measurements behind both rules are in
    docs/performance.md ("Dataloader workers", "One GPU")."""
    cores = os.cpu_count() or 1
    if device.type == "cuda":
        return min(GPU_WORKERS, max(1, cores // get_local_world_size() - 1))
    if torch.get_num_threads() * get_local_world_size() >= cores:
        return 0
    return WORKERS


def loader_workers(workers, batch_size):
    """The worker processes of one rank's loader: --workers, at most this rank's share of the machine's cores (the
    ranks on other machines have their own), and none for batches of one image."""
    return min((os.cpu_count() or 1) // get_local_world_size(), batch_size if batch_size > 1 else 0, workers)


def worker_base_seed(seed, epoch, rank):
    """The loader generator's seed for one epoch of one rank; worker w's torch seed is then derived from it and w."""
    return int(np.random.SeedSequence([seed, epoch, max(rank, 0)]).generate_state(1)[0])


def set_loader_epoch(loader, epoch, start_batch=0):
    """Before a training epoch: the sampler's order, the augmentation RNG's epoch and the worker seeds, all derived
    from (seed, epoch, rank[, worker]); `start_batch` batches are skipped when resuming inside the epoch."""
    loader.start_at(epoch, start_batch)
    if hasattr(loader.dataset, "rng"):
        loader.dataset.rng.set_epoch(epoch)
    loader.generator.manual_seed(worker_base_seed(loader.sampler.seed, epoch, loader.sampler.rank))


def group_starts(n, size):
    """Where the groups of an order of n samples start: every `size` samples, except that a rest under half a group
    joins the group before it, so that no group but a lone one holds fewer than size / 2 images to draw from. Cut
    from a group's start onwards, an order keeps the same boundaries."""
    k = max(1, math.ceil(n / size))
    if k > 1 and n - (k - 1) * size < size / 2:
        k -= 1
    return [g * size for g in range(k)]


class _Groups(Sampler):
    """The sampler's order (what is left of it after a resume's skip) cut at `group_starts`."""

    def __init__(self, sampler, size):
        self.sampler, self.size = sampler, size

    def __iter__(self):
        idx = list(self.sampler)
        if not idx:
            return iter(())
        starts = group_starts(len(idx), self.size)
        return iter([idx[a:b] for a, b in zip(starts, [*starts[1:], len(idx)])])

    def __len__(self):
        n = len(self.sampler)
        return len(group_starts(n, self.size)) if n else 0


class _CollateGroup:
    """A group's samples -> its batches, each collated by the dataset's collate_fn; a last batch of a single image
    is left out when `drop_single` (only the epoch's last group can end in one: the others hold whole batches)."""

    def __init__(self, collate_fn, batch_size, drop_single):
        self.collate_fn, self.batch_size, self.drop_single = collate_fn, batch_size, drop_single

    def __call__(self, samples):
        n = len(samples)
        if self.drop_single and (n % self.batch_size or self.batch_size) == 1:
            n -= 1
        batches = []
        for j in range(0, n, self.batch_size):
            batches.append(self.collate_fn(samples[j : j + self.batch_size]))
            # the list is the DataLoader's own: emptied as it is collated, a group's samples and its batches are
            # not held whole at once (at 640 px a group of 128 samples is 157 MB per worker)
            samples[j : j + self.batch_size] = [None] * len(samples[j : j + self.batch_size])
        if torch.utils.data.get_worker_info() is not None:
            release_heap()
        return batches


class GroupedLoader:
    """The training loader: each item of its DataLoader is a group of consecutive batches (about GROUP_IMAGES
    images, the last one up to half as many again: `group_starts`), which one worker loads whole and hands on
    batch by batch.

    A dataset that can load several samples at once (`__getitems__`) sees the whole group in one call: mosaic then
    draws its partner images among the group's own, and reads and resizes each of them once for all its mosaics,
    where drawing from the whole share reads four images per sample. The groups are cut from the sampler's order,
    a function of (seed, epoch, rank) alone, so the batches do not depend on --workers and a run resumed inside a
    group loads that whole group again and skips the batches it had done.
    """

    def __init__(self, dataset, sampler, batch_size, drop_single, **loader_kwargs):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_single
        self.group_batches = max(1, round(GROUP_IMAGES / batch_size))
        collate = _CollateGroup(getattr(dataset, "collate_fn", None) or torch.utils.data.default_collate,
                                batch_size, drop_single)
        self.loader = DataLoader(dataset, batch_sampler=_Groups(sampler, self.group_batches * batch_size),
                                 collate_fn=collate, **loader_kwargs)
        self.skip = 0  # batches of the first group done before a resume
        self.position = None  # (epoch, batch) `start_at` set
        self.ahead = None  # the DataLoader iterator `load_ahead` started there, which the next `iter` goes on with

    def __getattr__(self, name):  # dataset, generator, num_workers, persistent_workers: the DataLoader's
        if "loader" not in self.__dict__:  # copy and pickle look attributes up before __init__ has run
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def start_at(self, epoch, start_batch=0):
        """Epoch `epoch` from batch `start_batch`: from the start of the group that holds it, skipping the batches
        of that group before it. Loading `load_ahead` started at this very position goes on; any other is dropped."""
        if self.ahead is not None and self.position == (epoch, start_batch):
            return
        self.position = epoch, start_batch
        starts = group_starts(self.sampler.num_samples, self.group_batches * self.batch_size)
        first = max(a for a in starts if a <= start_batch * self.batch_size)
        self.sampler.set_epoch(epoch, skip=first)
        self.skip = start_batch - first // self.batch_size
        self.stop_loading()

    def load_ahead(self):
        """Start loading at the position `start_at` set, now: the workers start and each takes a group, while the
        caller does other work (the trainer validates). They receive the dataset as it is now; the next `iter` goes on
        from here. Nothing runs ahead without workers."""
        self.stop_loading()
        self.ahead = iter(self.loader)

    def stop_loading(self):
        """Drop an iterator started ahead (its workers exit)."""
        self.ahead = None

    def __len__(self):
        n = len(self.sampler)
        return max((n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)) - self.skip, 0)

    def __iter__(self):
        return itertools.islice(self._batches(), self.skip, None)

    def _batches(self):
        groups, self.ahead = iter(self.loader) if self.ahead is None else self.ahead, None
        for group in groups:
            group.reverse()
            while group:  # a batch handed on is no longer held here: the group's memory goes as the loop trains
                yield group.pop()


def dropped_batch_warning(loader, batch_size):
    """What a training loader's `drop_last` (`build_dataloader`'s drop_single) leaves out, for the log."""
    which = ("the same image every epoch (rect batches are not shuffled): choose another --batch-size to train on it"
             if getattr(loader.dataset, "rect", False) else "a different image each epoch")
    return (f"WARNING: {len(loader.sampler)} training images per rank at {batch_size} per batch: the last batch would "
            f"hold one image, which BatchNorm cannot train on; it is left out, {which}")


def build_dataloader(dataset, batch_size, workers, shuffle=True, rank=-1, world_size=1, seed=0, sampler=None,
                     drop_single=False):
    """A DataLoader with the dataset's `collate_fn` and seeded per-worker RNGs; for training (shuffle=True) a
    SmartDistributedSampler unless `sampler` is given, and then `set_loader_epoch` must be called before each epoch.
    `drop_single`: leave out the last batch of an epoch when it would hold a single image (training BatchNorm on
    one image fails wherever a feature map is 1 x 1); the loader's `drop_last` then says so. Every rank draws the
    same number of samples, so all decide alike.

    Training loaders are GroupedLoaders over plain DataLoaders, not an 'infinite' one that keeps one iterator
    alive: that design reads the sampler before `set_epoch` takes effect, and so repeats the first epoch's order
    (yolov5 issue #6741). Training workers are not persistent: each epoch starts new ones, which receive the
    dataset as it is then (its augmentation epoch, a closed mosaic), the trainer before the previous epoch's
    validation (`GroupedLoader.load_ahead`); evaluation loaders keep theirs.
    """
    train = shuffle
    if getattr(dataset, "rect", False) and shuffle:
        shuffle = False  # rect batches are built from aspect-ratio-sorted neighbours; shuffling would break them
    n_workers = loader_workers(workers, batch_size)
    if sampler is None and (train or world_size > 1):  # a given sampler (--image-weights) splits the shares itself
        sampler = SmartDistributedSampler(dataset, max(world_size, 1), max(rank, 0), shuffle, seed)
    per_rank = len(sampler) if sampler is not None else len(dataset)
    drop_single = drop_single and per_rank > batch_size and per_rank % batch_size == 1
    common = dict(num_workers=n_workers, pin_memory=torch.cuda.is_available(), worker_init_fn=seed_worker,
                  generator=torch.Generator().manual_seed(worker_base_seed(seed, 0, rank)))
    if train:
        # an item is a whole group already: one in flight per worker keeps the loop fed
        prefetch = dict(prefetch_factor=1) if n_workers else {}
        return GroupedLoader(dataset, sampler, batch_size, drop_single, **common, **prefetch)
    return DataLoader(dataset, batch_size=batch_size, drop_last=drop_single, sampler=sampler,
                      collate_fn=getattr(dataset, "collate_fn", None), persistent_workers=n_workers > 0, **common)
