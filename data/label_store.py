"""A split's labels and file names in a few contiguous numpy buffers, so forked loader workers share them.

A list of one dict per image (file name, shape, class and box arrays, polygons) is some ten Python objects per
image; a forked worker that reads one writes its reference count, and the garbage collector walks (and so writes)
every object, so each worker copies the pages it touches and its private memory grows with the dataset through the
epoch (0.3-0.7 KB per image per worker, measured in issue 60). Here the whole split is a dozen arrays whatever its
size, as detectron2 serializes its dataset list: a worker reads them without writing a byte of theirs. `store[i]`
gives the same dict as before (im_file, shape, cls (n, 1), bboxes (n, 4), the format's extras: segments as a list
of (k, 2) polygons or None, pose keypoints (n, K, 3)), its arrays read-only views of the buffers.
"""

import os
from collections.abc import Sequence

import numpy as np


def _offsets(lengths):
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _frozen(a):
    a.setflags(write=False)
    return a


class PathList(Sequence):
    """File names held as one bytes buffer and offsets; `names[i]` is the str it was (surrogate escapes kept)."""

    def __init__(self, names):
        raw = [os.fsencode(n) for n in names]
        self.buf = _frozen(np.frombuffer(b"".join(raw), np.uint8))
        self.ends = _frozen(_offsets([len(r) for r in raw]))

    def __len__(self):
        return len(self.ends) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices, IndexError
        return os.fsdecode(self.buf[self.ends[i]:self.ends[i + 1]].tobytes())

    def __eq__(self, other):
        return isinstance(other, Sequence) and not isinstance(other, (str, bytes)) and list(self) == list(other)

    __hash__ = None


def pack_records(records, extra_key, extra_width):
    """The scan's records (data/labels.verify_image_label: im_file, shape, cls, bboxes and under `extra_key`
    a list of the format's per-instance extras, None or a (k, extra_width) array each) as a dict of a few arrays:
    what the label cache stores (saved and read in time independent of the number of objects) and
    `LabelStore.from_scan` reads."""
    extras = [e for r in records for e in r[extra_key]]
    has = np.array([e is not None for e in extras], bool)
    rows = [np.asarray(e, np.float32).reshape(-1, extra_width) for e in extras if e is not None]
    lengths = np.zeros(len(extras), np.int64)
    lengths[has] = [len(r) for r in rows]
    return {"im_files": [r["im_file"] for r in records],
            "shapes": np.array([r["shape"] for r in records], np.int64).reshape(-1, 2),
            "inst": _offsets([len(r["cls"]) for r in records]),
            "cls": np.concatenate([r["cls"].reshape(-1, 1) for r in records] + [np.zeros((0, 1), np.float32)]),
            "bboxes": np.concatenate([r["bboxes"].reshape(-1, 4) for r in records] + [np.zeros((0, 4), np.float32)]),
            "has_extra": has, "extra_ends": _offsets(lengths),
            "extra": np.concatenate(rows + [np.zeros((0, extra_width), np.float32)])}


def check_packed(packed, extra_width):
    """ValueError unless the arrays of a packed scan fit together (a cache read back is trusted only so far)."""
    n, inst, ends = len(packed["im_files"]), packed["inst"], packed["extra_ends"]
    m = len(packed["cls"])
    ok = (packed["shapes"].shape == (n, 2) and inst.shape == (n + 1,) and inst[0] == 0 and inst[-1] == m
          and (np.diff(inst) >= 0).all() and packed["cls"].shape == (m, 1) and packed["bboxes"].shape == (m, 4)
          and packed["has_extra"].shape == (m,) and ends.shape == (m + 1,) and ends[0] == 0
          and (np.diff(ends) >= 0).all() and packed["extra"].shape == (ends[-1], extra_width)
          and all(isinstance(f, str) for f in packed["im_files"])
          and all(packed[k].dtype.kind in "iu" for k in ("shapes", "inst", "extra_ends"))
          and packed["has_extra"].dtype == bool)
    if not ok:
        raise ValueError("its label arrays do not fit together")


class LabelStore(Sequence):
    """A split's labels as the label format finished them (see the module's docstring): im_files, shapes (N, 2),
    inst (N + 1) where each image's instances start, cls (M, 1), bboxes (M, 4), has_segments (N,) whether an image
    has polygons, seg_ends (M + 1) where each instance's points start in points (P, 2), keypoints (M, K, 3) or
    None."""

    def __init__(self, im_files, shapes, inst, cls, bboxes, has_segments, seg_ends, points, keypoints=None,
                 extra_key="segments"):
        self.extra_key = extra_key
        self.im_files = im_files if isinstance(im_files, PathList) else PathList(im_files)
        self.shapes, self.inst, self.cls, self.bboxes = (_frozen(np.ascontiguousarray(a, t)) for a, t in
                                                         ((shapes, np.int64), (inst, np.int64), (cls, np.float32),
                                                          (bboxes, np.float32)))
        self.has_segments = _frozen(np.asarray(has_segments, bool))
        self.seg_ends = _frozen(np.asarray(seg_ends, np.int64))
        self.points = _frozen(np.ascontiguousarray(points, np.float32).reshape(-1, 2))
        self.keypoints = None if keypoints is None else _frozen(np.ascontiguousarray(keypoints, np.float32))

    @classmethod
    def from_scan(cls, packed, fmt):
        """The store of a packed scan (`pack_records`) finished by label format `fmt` (its `finish_packed`)."""
        return cls(packed["im_files"], packed["shapes"], packed["inst"], packed["cls"], packed["bboxes"],
                   **fmt.finish_packed(packed), extra_key=fmt.extra_key)

    @classmethod
    def from_records(cls, records, extra_key="segments"):
        """The store of finished records (dicts as `store[i]` gives them)."""
        segs = [s for r in records if r["segments"] is not None for s in r["segments"]]
        has = np.array([r["segments"] is not None for r in records], bool)
        counts = [len(r["cls"]) for r in records]
        lengths = np.zeros(sum(counts), np.int64)  # points per instance, 0 where its image has no polygons
        lengths[np.repeat(has, counts)] = [len(s) for s in segs]
        kpts = [r["keypoints"] for r in records] if extra_key == "keypoints" else None
        return cls([r["im_file"] for r in records], np.array([r["shape"] for r in records]).reshape(-1, 2),
                   _offsets(counts), np.concatenate([r["cls"].reshape(-1, 1) for r in records] + [np.zeros((0, 1))]),
                   np.concatenate([r["bboxes"].reshape(-1, 4) for r in records] + [np.zeros((0, 4))]), has,
                   _offsets(lengths), np.concatenate([np.reshape(s, (-1, 2)) for s in segs] + [np.zeros((0, 2))]),
                   None if kpts is None else np.concatenate(kpts), extra_key)

    def __len__(self):
        return len(self.shapes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = range(len(self))[i]
        a, b = self.inst[i], self.inst[i + 1]
        lb = {"im_file": self.im_files[i], "shape": tuple(self.shapes[i].tolist()), "cls": self.cls[a:b],
              "bboxes": self.bboxes[a:b], "segments": None}
        if self.has_segments[i]:
            lb["segments"] = [self.points[self.seg_ends[j]:self.seg_ends[j + 1]] for j in range(a, b)]
        if self.keypoints is not None:
            lb["keypoints"] = self.keypoints[a:b]
        return lb

    def image_of_instance(self):
        """(M,) the image index of every instance."""
        return np.repeat(np.arange(len(self)), np.diff(self.inst))

    def reordered(self, order):
        """A new store with the images in `order` (indices)."""
        return LabelStore.from_records([self[int(i)] for i in order], self.extra_key)

    def single_class(self):
        """This store with every class 0 (a new store sharing the other buffers)."""
        new = object.__new__(LabelStore)
        new.__dict__.update(self.__dict__, cls=_frozen(np.zeros_like(self.cls)))
        return new
