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


class LabelStore(Sequence):
    """The records of `utils.data.label_formats` `finish`, packed (see the module's docstring)."""

    def __init__(self, records, extra_key="segments"):
        self.extra_key = extra_key
        self.im_files = PathList([r["im_file"] for r in records])
        self.shapes = _frozen(np.array([r["shape"] for r in records], np.int64).reshape(-1, 2))
        counts = [len(r["cls"]) for r in records]
        self.inst = _frozen(_offsets(counts))
        self.cls = _frozen(np.concatenate([r["cls"].reshape(-1, 1) for r in records] or [np.zeros((0, 1))])
                           .astype(np.float32))
        self.bboxes = _frozen(np.concatenate([r["bboxes"].reshape(-1, 4) for r in records] or [np.zeros((0, 4))])
                              .astype(np.float32))
        # polygons: an image holds a list (one per instance) or None
        self.has_segments = _frozen(np.array([r["segments"] is not None for r in records], bool))
        segs = [s for r in records if r["segments"] is not None for s in r["segments"]]
        lengths = np.zeros(len(self.cls), np.int64)  # points per instance, 0 where its image has no polygons
        lengths[np.repeat(self.has_segments, counts)] = [len(s) for s in segs]
        self.seg_ends = _frozen(_offsets(lengths))
        self.points = _frozen(np.concatenate([np.asarray(s, np.float32).reshape(-1, 2) for s in segs] or
                                             [np.zeros((0, 2), np.float32)]))
        kpts = [r["keypoints"] for r in records] if extra_key == "keypoints" else None
        self.keypoints = None if kpts is None else _frozen(np.concatenate(kpts).astype(np.float32))

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
        return LabelStore([self[int(i)] for i in order], self.extra_key)

    def single_class(self):
        """This store with every class 0 (a new store sharing the other buffers)."""
        new = object.__new__(LabelStore)
        new.__dict__.update(self.__dict__, cls=_frozen(np.zeros_like(self.cls)))
        return new
