"""Packed labels (issue 60): the same records back for detect, segment and pose; a forked process reads them all
without copying them; --image-weights holds no N x nc matrix."""

import gc
import os
import sys
import tracemalloc

import numpy as np
import pytest

from utils.data.detect_dataset import YOLODataset
from utils.data.image_weights import ImageWeightSampler
from utils.data.label_store import LabelStore, PathList


def _records(n, kind, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, 4))
        r = {"im_file": f"/d/images/{i:06d}.jpg", "shape": (int(rng.integers(10, 900)), int(rng.integers(10, 900))),
             "cls": rng.integers(0, 80, (k, 1)).astype(np.float32), "bboxes": rng.random((k, 4), np.float32),
             "segments": None}
        if kind == "segment":
            r["segments"] = [rng.random((int(rng.integers(3, 9)), 2), np.float32) for _ in range(k)]
        elif kind == "detect" and i % 3 == 0 and k:
            r["segments"] = [rng.random((3, 2), np.float32) for _ in range(k)]
        elif kind == "pose":
            r["keypoints"] = rng.random((k, 17, 3), np.float32)
        out.append(r)
    return out


@pytest.mark.parametrize("kind", ["detect", "segment", "pose"])
def test_store_gives_the_records_back(kind):
    recs = _records(300, kind)
    store = LabelStore(recs, "keypoints" if kind == "pose" else "segments")
    assert len(store) == 300
    for r, got in zip(recs, store):
        assert got["im_file"] == r["im_file"] and got["shape"] == r["shape"] and set(got) == set(r)
        for k in ("cls", "bboxes", "keypoints"):
            if k in r:
                assert got[k].dtype == np.float32 and np.array_equal(got[k], r[k]) and got[k].shape == r[k].shape
        if r["segments"] is None:
            assert got["segments"] is None
        else:
            assert len(got["segments"]) == len(r["segments"])
            assert all(np.array_equal(a, b) for a, b in zip(got["segments"], r["segments"]))
    with pytest.raises(ValueError):
        store[5]["bboxes"][...] = 0  # read-only: a sample never changes the split's labels
    order = np.arange(300)[::-1]
    assert [lb["im_file"] for lb in store.reordered(order)] == [r["im_file"] for r in recs[::-1]]
    assert not store.single_class().cls.any() and store.cls.any()


def test_path_list_keeps_names_as_they_are():
    names = ["/a/caf\udce9.jpg", "/b/x y.png", "/c/\u00e9t\u00e9.jpg"]  # a Latin-1 name (surrogate escape), UTF-8
    p = PathList(names)
    assert list(p) == names and p == names and names == p and p[-1] == names[-1] and p.index(names[1]) == 1


def _private_kb():
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Dirty", "Private_Clean")))


def _copied_by_forked_reader(labels):
    """KB of its parent's memory that a forked process (a loader worker) copies reading every label and collecting
    garbage; the objects that exist before are frozen first, so that only what the labels cost is counted."""
    gc.collect()
    gc.freeze()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            before = _private_kb()
            n = sum(len(lb["cls"]) + len(lb["im_file"]) + len(lb["segments"] or ()) for lb in labels)
            gc.collect()
            os.write(w, f"{_private_kb() - before} {n}".encode())
        finally:
            os._exit(0)
    gc.unfreeze()
    os.close(w)
    grown, n = (int(x) for x in os.read(r, 100).split())
    os.waitpid(pid, 0)
    assert n > 40_000
    return grown


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("kind", ["detect", "segment"])
def test_forked_reader_copies_no_labels(kind):
    """40,000 images: under 1 MB copied from the store; the same records as a list of dicts cost over 10 MB."""
    recs = _records(40_000, kind)
    as_list = _copied_by_forked_reader(recs)
    store = LabelStore(recs, "segments")
    del recs
    packed = _copied_by_forked_reader(store)
    assert packed < 1024 and as_list > 10 * 1024, (packed, as_list)


def test_image_weights_hold_no_class_matrix():
    """20,000 images x 2,000 classes: the weights come from the labels themselves (a count matrix is 320 MB)."""
    rng = np.random.default_rng(0)
    labels = [rng.integers(0, 2000, int(rng.integers(0, 5))).astype(np.float32) for _ in range(20_000)]
    tracemalloc.start()
    s = ImageWeightSampler(labels, 2000, maps_fn=lambda: np.zeros(2000))
    s.set_epoch(0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20e6
    # independent: an image's weight is the sum of its labels' normalised inverse class counts / nc
    counts = np.bincount(np.concatenate(labels).astype(int), minlength=2000)
    cw = 1 / np.maximum(counts, 1)
    cw /= cw.sum()
    for i in (0, 1, 17, 19_999):
        assert s.weights[i] == pytest.approx(sum(cw[int(c)] for c in labels[i]) / 2000, rel=1e-12, abs=1e-300)


def test_dataset_labels_are_packed(shapes_det):
    ds = YOLODataset(str(shapes_det / "images" / "train"), imgsz=64, nc=3)
    assert isinstance(ds.labels, LabelStore) and isinstance(ds.im_files, PathList)
    assert not hasattr(ds, "npy_files")  # made per image when --cache disk reads one
