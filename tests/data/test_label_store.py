"""Packed labels (issue 60): the same records back for detect, segment and pose; a forked process reads them all
without copying them; --image-weights holds no N x nc matrix."""

import gc
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from data.detect_dataset import YOLODataset
from data.image_weights import ImageWeightSampler
from data.label_formats import DetectLabels, PoseLabels, SegmentLabels
from data.label_store import LabelStore, PathList, check_packed, pack_records
from tests.conftest import ROOT


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
    store = LabelStore.from_records(recs, "keypoints" if kind == "pose" else "segments")
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


def _scan_records(n, seed=1):
    """Records as the scan makes them: each instance's polygon may be None (a box line)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, 4))
        mode = i % 3  # 0: all polygons, 1: none, 2: mixed
        segs = [None if mode == 1 or (mode == 2 and j == 0) else rng.random((int(rng.integers(3, 7)), 2))
                for j in range(k)]
        out.append({"im_file": f"{i}.jpg", "shape": (9 + i, 20), "cls": np.full((k, 1), i % 5, np.float32),
                    "bboxes": rng.uniform(0.2, 0.4, (k, 4)).astype(np.float32), "segments": segs})
    return out


def test_formats_finish_a_packed_scan():
    """detect keeps an image's polygons only when every instance has one; segment gives a box line its rectangle
    (corners from cx cy w h); pose keeps the keypoints."""
    recs = _scan_records(60)
    packed = pack_records(recs, "segments", 2)
    check_packed(packed, 2)
    det, seg = LabelStore.from_scan(packed, DetectLabels()), LabelStore.from_scan(packed, SegmentLabels())
    for r, d, g in zip(recs, det, seg):
        full = bool(r["segments"]) and all(x is not None for x in r["segments"])
        assert (d["segments"] is not None) == full
        assert len(g["segments"]) == len(r["segments"])
        for x, got, (cx, cy, w, h) in zip(r["segments"], g["segments"], r["bboxes"].tolist()):
            x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
            want = np.float32(x) if x is not None else np.float32([[x1, y1], [x2, y1], [x2, y2], [x1, y2]])
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
        if full:
            assert all(np.array_equal(a, np.float32(b)) for a, b in zip(d["segments"], r["segments"]))
    kp = [dict(r, keypoints=[np.full((2, 3), i, np.float32)] * len(r["cls"])) for i, r in enumerate(recs)]
    pose = LabelStore.from_scan(pack_records(kp, "keypoints", 3), PoseLabels((2, 3)))
    assert [lb["keypoints"].shape for lb in pose] == [(len(r["cls"]), 2, 3) for r in recs]
    assert all((lb["keypoints"] == i).all() and lb["segments"] is None for i, lb in enumerate(pose))
    packed["inst"] = np.append(packed["inst"][:-1], packed["inst"][-1] + 1)  # arrays that disagree: refused
    with pytest.raises(ValueError, match="do not fit"):
        check_packed(packed, 2)


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
    """40,000 images: under 1 MB copied from the store; the same records as a list of dicts cost over 10 MB. Measured
    in a fresh interpreter: inside the test session, whatever earlier tests left in the heap moves the figure."""
    code = ("from tests.data.test_label_store import _records, _copied_by_forked_reader, LabelStore\n"
            f"recs = _records(40_000, {kind!r})\n"
            "as_list = _copied_by_forked_reader(recs)\n"
            "store = LabelStore.from_records(recs, 'segments')\n"
            "del recs\n"
            "print(_copied_by_forked_reader(store), as_list)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    packed, as_list = map(int, out.stdout.split())
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


def test_rect_shapes_per_batch_from_sorted_ratios():
    """--rect's batch shapes (the official rule: the batch's widest or tallest ratio sets its shape), computed
    without a pass over all images per batch, agree with each batch's own min and max."""
    from types import SimpleNamespace

    recs = _records(1001, "detect")
    stub = SimpleNamespace(labels=LabelStore.from_records(recs), imgsz=640)
    YOLODataset._set_rect_shapes(stub, 16, 32, 0.5)
    ar = np.sort([r["shape"][0] / r["shape"][1] for r in recs], kind="stable")
    assert len(stub.batch_shapes) == 63
    for b, shape in enumerate(stub.batch_shapes):
        lo, hi = ar[16 * b : 16 * b + 16].min(), ar[16 * b : 16 * b + 16].max()
        want = [hi, 1] if hi < 1 else [1, 1 / lo] if lo > 1 else [1, 1]
        assert shape.tolist() == (np.ceil(np.array(want) * 640 / 32 + 0.5).astype(int) * 32).tolist()
    assert [lb["shape"][0] / lb["shape"][1] for lb in stub.labels] == ar.tolist()


def test_packed_arrays_of_another_kind_are_refused():
    """A cache (signed, so written by this user) whose arrays fit in shape but not in kind is refused, not indexed."""
    packed = pack_records(_scan_records(5), "segments", 2)
    for key, bad in (("has_extra", packed["has_extra"].astype(np.float32)), ("inst", packed["inst"] + 0.5)):
        with pytest.raises(ValueError, match="do not fit"):
            check_packed(dict(packed, **{key: bad}), 2)
