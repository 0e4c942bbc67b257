import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from data import loader as loader_mod
from data.augment import SampleRNG
from data.detect_dataset import YOLODataset
from data.loader import SmartDistributedSampler, build_dataloader, rank_indices, set_loader_epoch
from tests.ddp_utils import descendants, proc_stat
from utils.files import ROOT


class _Range(Dataset):
    def __init__(self, n):
        self.n = n
        self.rng = SampleRNG(0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return i, float(self.rng(i).random()), info.id if info else -1


def test_rank_indices_partition():
    parts = [rank_indices(10, 3, r, seed=4) for r in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))
    assert [len(p) for p in parts] == [4, 3, 3]
    assert all((np.diff(p) > 0).all() for p in parts)
    assert not np.array_equal(parts[0], rank_indices(10, 3, 0, seed=5))
    assert np.array_equal(rank_indices(5, 1, 0), np.arange(5))
    with pytest.raises(ValueError):
        rank_indices(5, 2, 2)


def test_smart_sampler_fixed_subsets_reshuffled_each_epoch():
    ds, world = list(range(10)), 3
    samplers = [SmartDistributedSampler(ds, world, r, shuffle=True, seed=7) for r in range(world)]
    epochs = []
    for epoch in range(4):
        per_rank = []
        for s in samplers:
            s.set_epoch(epoch)
            per_rank.append(list(s))
        epochs.append(per_rank)
        assert all(len(o) == 4 == len(s) for o, s in zip(per_rank, samplers))  # ceil(10 / 3), padded
    for r in range(world):
        own = set(rank_indices(10, world, r, 7).tolist())
        assert all(set(e[r]) == own for e in epochs)  # the same subset every epoch, never another rank's images
    unique = [set(x) for x in epochs[0]]
    assert set.union(*unique) == set(range(10)) and sum(map(len, unique)) == 10  # disjoint cover
    assert len({tuple(e[0]) for e in epochs}) > 1  # the order changes with set_epoch
    samplers[0].set_epoch(2)
    assert list(samplers[0]) == epochs[2][0]  # and is reproducible
    ordered = SmartDistributedSampler(ds, world, 1, shuffle=False, seed=7)
    assert list(ordered) == sorted(rank_indices(10, world, 1, 7).tolist()) + [rank_indices(10, world, 1, 7)[0]]


def test_build_dataloader_single_and_distributed(shapes_det):
    ds = YOLODataset(str(shapes_det / "images" / "train"), imgsz=64, augment=False, nc=3)
    a = build_dataloader(ds, 4, workers=0, shuffle=True, seed=1)
    b = build_dataloader(ds, 4, workers=0, shuffle=True, seed=1)
    assert [x["paths"] for x in a] == [x["paths"] for x in b]  # seeded: reproducible order
    epoch0 = [x["paths"] for x in a]
    set_loader_epoch(a, 1)
    assert [x["paths"] for x in a] != epoch0  # ...that reshuffles every epoch
    set_loader_epoch(a, 0)
    assert [x["paths"] for x in a] == epoch0  # as a function of the epoch alone
    batch = next(iter(a))
    assert batch["img"].shape == (4, 3, 64, 64) and batch["targets"].boxes.data.shape[1] == 4
    d = build_dataloader(ds, 4, workers=0, shuffle=True, rank=1, world_size=2, seed=1)
    assert isinstance(d.sampler, SmartDistributedSampler) and d.sampler.rank == 1 and len(d) == 2
    rect = YOLODataset(str(shapes_det / "images" / "train"), imgsz=64, rect=True, batch_size=4, nc=3)
    r = build_dataloader(rect, 4, workers=0, shuffle=True)
    assert [p for x in r for p in x["paths"]] == rect.im_files  # rect keeps the aspect-sorted order


@pytest.mark.parametrize("workers", [0, 2])
def test_augmentation_draws_depend_on_sample_and_epoch_only(workers):
    """Exact resume needs each sample's draws to be independent of the worker that loads it and of what came
    before: the same (epoch, index) gives the same draw with 0 or 2 workers and when the epoch starts at batch 3;
    other epochs and other samples draw differently."""
    def run(loader, epoch, start=0):
        set_loader_epoch(loader, epoch, start)
        return {int(i): float(v) for batch in loader for i, v, _ in zip(*batch)}

    ref = run(build_dataloader(_Range(10), 2, workers=0, shuffle=True, seed=3), 1)
    loader = build_dataloader(_Range(10), 2, workers=workers, shuffle=True, seed=3)
    assert loader.num_workers == workers and not loader.persistent_workers  # new workers get each epoch's state
    assert run(loader, 1) == ref and len(set(ref.values())) == 10
    order = list(loader.sampler.__iter__())
    tail = run(loader, 1, start=3)
    assert list(tail) == order[6:] and tail == {i: ref[i] for i in order[6:]}
    other = run(loader, 2)
    assert all(other[i] != ref[i] for i in ref)


def _mosaic_set(shapes_det):
    hyp = dict(mosaic=1.0, mixup=0.5, degrees=5.0, translate=0.1, scale=0.5, fliplr=0.5)
    return YOLODataset(str(shapes_det / "images" / "train"), imgsz=64, augment=True, hyp=hyp, nc=3)


def test_a_group_reads_each_image_once_and_draws_partners_among_its_own(shapes_det, monkeypatch):
    """Training loads groups of batches: every image a group's mosaics and mixups use is one of the group's own, and
    is read once for the whole group; a lone `dataset[i]` still draws from the whole share."""
    monkeypatch.setattr(loader_mod, "GROUP_IMAGES", 4)
    ds = _mosaic_set(shapes_det)
    reads = []
    real = YOLODataset.load_image
    monkeypatch.setattr(YOLODataset, "load_image", lambda self, i: reads.append(i) or real(self, i))
    loader = build_dataloader(ds, 2, workers=0, shuffle=True, seed=5)
    assert loader.group_batches == 2 and len(loader) == 8
    set_loader_epoch(loader, 3)
    order = list(loader.sampler)
    groups = [order[j : j + 4] for j in range(0, 16, 4)]
    reads_per_group = []
    for k, _ in enumerate(loader):
        if k % 2 == 0:  # a group's first batch: the whole group was loaded for it
            reads_per_group.append(reads[:])
            reads.clear()
    assert [len(b) for b in reads_per_group] == [len(set(b)) for b in reads_per_group]  # each image once per group
    assert all(set(r) == set(g) for r, g in zip(reads_per_group, groups))  # partners among the group's images only
    reads.clear()
    for i in range(16):
        ds[i]
    assert len(reads) > 16 and len(set(reads)) > 4  # one sample at a time: four reads each, from the whole share


@pytest.mark.parametrize("workers", [0, 2])
def test_grouped_batches_do_not_depend_on_workers_and_resume_inside_a_group(shapes_det, monkeypatch, workers):
    monkeypatch.setattr(loader_mod, "GROUP_IMAGES", 6)  # groups of 3 batches of 2 images
    ds = _mosaic_set(shapes_det)

    def epoch(loader, start=0):
        set_loader_epoch(loader, 1, start)
        return [(b["paths"], b["img"], torch.cat((b["targets"].image[:, None], b["targets"].cls[:, None],
                                                   b["targets"].boxes.data), 1)) for b in loader]

    ref = epoch(build_dataloader(ds, 2, workers=0, shuffle=True, seed=2))
    loader = build_dataloader(ds, 2, workers=workers, shuffle=True, seed=2)
    got = epoch(loader)
    assert loader.num_workers == workers and len(got) == len(ref) == 8
    for (pa, ia, ta), (pb, ib, tb) in zip(got, ref):
        assert pa == pb and torch.equal(ia, ib) and torch.equal(ta, tb)
    for start in (1, 3, 4):  # inside the first group, at a group's start, inside the second
        tail = epoch(loader, start)
        assert len(tail) == len(loader) == 8 - start
        assert all(a[0] == b[0] and torch.equal(a[1], b[1]) for a, b in zip(tail, ref[start:]))


class _Groupwise(Dataset):
    """Each sample is (index, the indices of the group it was loaded with)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitems__(self, indices):
        return [(i, tuple(indices)) for i in indices]

    def collate_fn(self, batch):
        return batch


@pytest.mark.parametrize("n, batch, group_images", [
    (130, 16, 128), (129, 16, 128), (200, 16, 128), (300, 64, 128), (16, 16, 128), (7, 2, 128), (20, 2, 6)])
def test_no_group_but_a_lone_one_is_small_and_a_resume_loads_the_same_groups(monkeypatch, n, batch, group_images):
    """A rest under half a group joins the group before it (130 images: one group, not 128 and 2), and a run resumed
    at any batch loads each sample with the same group as the uninterrupted epoch, so its partners are the same."""
    monkeypatch.setattr(loader_mod, "GROUP_IMAGES", group_images)
    loader = build_dataloader(_Groupwise(n), batch, workers=0, shuffle=True, seed=1, drop_single=True)
    set_loader_epoch(loader, 2)
    order = list(loader.sampler)
    batches = list(loader)
    groups = list(dict.fromkeys(g for b in batches for _, g in b))
    size = loader.group_batches * batch
    assert [i for g in groups for i in g] == order  # consecutive slices of the order, the lone dropped one included
    assert len(groups) == 1 or min(len(g) for g in groups) >= size / 2
    assert len(groups) == len(loader_mod.group_starts(n, size)) and len(batches) == len(loader)
    for start in range(len(batches) + 1):
        set_loader_epoch(loader, 2, start)
        assert list(loader) == batches[start:] and len(loader) == len(batches) - start


def test_grouped_loader_leaves_out_a_last_single_image_batch(shapes_det, monkeypatch):
    monkeypatch.setattr(loader_mod, "GROUP_IMAGES", 10)  # 16 images: groups of 10 and 6 images, batches of 5
    ds = _mosaic_set(shapes_det)
    loader = build_dataloader(ds, 5, workers=0, shuffle=True, drop_single=True)
    set_loader_epoch(loader, 0)
    sizes = [len(b["paths"]) for b in loader]
    assert loader.drop_last and sizes == [5, 5, 5] and len(loader) == 3
    kept = build_dataloader(ds, 5, workers=0, shuffle=True)
    set_loader_epoch(kept, 0)
    assert [len(b["paths"]) for b in kept] == [5, 5, 5, 1] and len(kept) == 4


class _Logged(Dataset):
    """Each sample is (index, the augmentation epoch of the dataset copy that loaded it); every group's indices are
    appended to a file when a worker takes it."""

    def __init__(self, n, log):
        self.n, self.log, self.rng = n, log, SampleRNG(0)

    def __len__(self):
        return self.n

    def __getitems__(self, indices):
        with open(self.log, "a") as f:
            f.write(" ".join(map(str, indices)) + "\n")
        return [(i, self.rng.epoch) for i in indices]

    def collate_fn(self, batch):
        return batch


def test_an_epoch_loaded_ahead_is_the_epoch_set(tmp_path, monkeypatch):
    """`load_ahead` starts the workers on their first groups before the loop asks for a batch; setting the same
    position again (the trainer does at the epoch's start) goes on with them, and the batches are those of a loader
    that starts loading when iterated, with the dataset's epoch as it was set. Another position drops them."""
    monkeypatch.setattr(loader_mod, "GROUP_IMAGES", 4)  # 16 images: 4 groups of 2 batches of 2

    def epoch(loader, e):
        set_loader_epoch(loader, e)
        return list(loader)

    ref = build_dataloader(_Logged(16, tmp_path / "ref.log"), 2, workers=0, shuffle=True, seed=1)
    want = {e: epoch(ref, e) for e in (3, 5)}
    log = tmp_path / "groups.log"
    loader = build_dataloader(_Logged(16, log), 2, workers=2, shuffle=True, seed=1)
    set_loader_epoch(loader, 3)
    loader.load_ahead()
    for _ in range(600):  # both workers take a group at once, before anything is iterated
        if log.exists() and len(log.read_text().splitlines()) >= 2:
            break
        time.sleep(0.1)
    assert len(log.read_text().splitlines()) >= 2
    assert epoch(loader, 3) == want[3] and {e for b in want[3] for _, e in b} == {3}
    assert len(log.read_text().splitlines()) == 4  # each group loaded once
    set_loader_epoch(loader, 4)
    loader.load_ahead()
    assert epoch(loader, 5) == want[5] and loader.ahead is None


@pytest.mark.parametrize("device, threads, local_procs, cores, expected", [
    ("cpu", 2, 1, 2, 0),  # torch's threads fill both cores: a worker would only slow the model step
    ("cpu", 1, 2, 2, 0),  # two CPU ranks of one thread each fill them too
    ("cpu", 1, 1, 2, 2),  # a core left over
    ("cuda", 2, 1, 2, 1),  # the model step runs on the GPU: every core but the training loop's
    ("cuda", 2, 1, 6, 5),
    ("cuda", 2, 8, 16, 1),  # eight GPUs share the cores
    ("cuda", 2, 2, 128, 8),  # at most GPU_WORKERS
])
def test_default_workers(monkeypatch, device, threads, local_procs, cores, expected):
    from data import loader

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(loader.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(loader, "get_local_world_size", lambda: local_procs)
    assert loader.default_workers(torch.device(device)) == expected


ORPHAN_SCRIPT = """
import os, sys, time
from torch.utils.data import Dataset
from data.loader import build_dataloader

class Stuck(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(120)  # busy: torch's own parent check (between batches) never runs

next(iter(build_dataloader(Stuck(), 2, workers=1, shuffle=False)))
"""


def _alive(pid):
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has exited (nobody reaped it yet)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_with_its_killed_rank(tmp_path):
    """A rank killed outright (SIGKILL, the OOM killer) must not leave its loader workers behind: they hold its
    sockets, among them rank 0's store, on which a restarted group would wait without end."""
    pid_file = tmp_path / "worker.pid"
    parent = subprocess.Popen(["timeout", "-s", "KILL", "150", sys.executable, "-c", ORPHAN_SCRIPT, str(pid_file)],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        for _ in range(600):
            if pid_file.exists() or parent.poll() is not None:
                break
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        assert _alive(worker)
        rank = descendants(parent.pid)[0]  # timeout's child
        os.kill(rank, signal.SIGKILL)
        for _ in range(100):
            if not _alive(worker):
                break
            time.sleep(0.1)
        assert not _alive(worker), "the loader worker outlived its killed parent"
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("cores,local_ranks,workers,batch,expected", [
    (8, 2, 8, 16, 4),  # this rank's share of the cores
    (8, 1, 3, 16, 3),  # --workers
    (8, 1, 8, 1, 0),  # batches of one image: none
    (1, 4, 8, 16, 0),  # fewer cores than ranks
])
def test_loader_workers(monkeypatch, cores, local_ranks, workers, batch, expected):
    """One rule for the training and the validation loaders (data.loader.loader_workers)."""
    monkeypatch.setattr(loader_mod.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(loader_mod, "get_local_world_size", lambda: local_ranks)
    assert loader_mod.loader_workers(workers, batch) == expected
