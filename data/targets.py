"""A batch's labels as typed records, from the collate function to the criteria and the metrics: boxes that say
their format and the canvas they lie on (as torchvision's `tv_tensors.BoundingBoxes`), and `Targets`, the labelled
objects of a batch (which image, class, box, keypoints). Conversions are explicit calls, in the order a consumer asks
for them: `pixels().convert("xyxy")` and `convert("xyxy").pixels()` round differently, and each consumer keeps the
order it was pinned with (tests/data/test_targets.py)."""

import dataclasses

import torch

from utils import ops

# cxcywh: centre, width, height (YOLO's label form); xyxy: two corners; cxcywhr: cxcywh of a rotated box and its
# angle in radians (the OBB labels'; its width and height run along the box's own axes)
FORMATS = ("xyxy", "cxcywh", "cxcywhr")
_CONVERT = {("cxcywh", "xyxy"): ops.xywh2xyxy, ("xyxy", "cxcywh"): ops.xyxy2xywh}


@dataclasses.dataclass(frozen=True)
class BoundingBoxes:
    """Boxes (N, 4), or (N, 5) as cxcywhr, in `format`, on a canvas of `canvas` (h, w) pixels: in pixels, or
    normalised (x and width divided by the canvas's width, y and height by its height; an angle is never scaled)."""

    data: torch.Tensor
    format: str
    canvas: tuple
    normalized: bool

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"box format must be one of {FORMATS}, got {self.format!r}")
        width = 5 if self.format == "cxcywhr" else 4
        if self.data.ndim != 2 or self.data.shape[1] != width:
            raise ValueError(f"{self.format} boxes are (N, {width}), got {tuple(self.data.shape)}")
        object.__setattr__(self, "canvas", tuple(int(s) for s in self.canvas))

    def __len__(self):
        return len(self.data)

    def _replace(self, data, **changes):
        return dataclasses.replace(self, data=data, **changes)

    def _scaled(self, op):
        """A copy with x and width (columns 0 and 2) and y and height (1 and 3) taken through `op(column, side)` by
        the canvas's width and height, as host numbers: a (w, h, w, h) tensor would be a copy to the device that
        waits for it in every loss."""
        h, w = self.canvas
        data = self.data.clone()
        data[:, 0:4:2] = op(data[:, 0:4:2], w)
        data[:, 1:4:2] = op(data[:, 1:4:2], h)
        return data

    def pixels(self):
        """The same boxes in pixels of their canvas."""
        if not self.normalized:
            return self
        return self._replace(self._scaled(torch.mul), normalized=False)

    def normalize(self):
        """The same boxes as fractions of their canvas."""
        if self.normalized:
            return self
        return self._replace(self._scaled(torch.div), normalized=True)

    def convert(self, format):
        """The same boxes in `format` (xyxy <-> cxcywh); a rotated box keeps its own format."""
        if format == self.format:
            return self
        if (self.format, format) not in _CONVERT:
            raise ValueError(f"{self.format} boxes do not convert to {format}")
        return self._replace(_CONVERT[self.format, format](self.data), format=format)

    def on_canvas(self, canvas):
        """Normalised boxes on a resized canvas (multi-scale training resizes a batch's images, not its labels)."""
        if not self.normalized:
            raise ValueError("pixel boxes move with their image; normalised ones keep their values on a new canvas")
        return dataclasses.replace(self, canvas=tuple(canvas))

    def __getitem__(self, index):
        return self._replace(self.data[index])

    def to(self, *args, **kwargs):
        return self._replace(self.data.to(*args, **kwargs))

    @classmethod
    def cat(cls, boxes):
        """One record of several of one format, units and canvas (a batch's images share one)."""
        first = boxes[0]
        if any((b.format, b.normalized, b.canvas) != (first.format, first.normalized, first.canvas) for b in boxes):
            raise ValueError("boxes of different formats, units or canvases do not concatenate")
        return first._replace(torch.cat([b.data for b in boxes], 0))


@dataclasses.dataclass(frozen=True)
class Targets:
    """The labelled objects of a batch, one row each across the batch's images: `image` (N,) int64 the index of each
    object's image in the batch, `cls` (N,) float32 its class, `boxes` its `BoundingBoxes` (normalised on the batch's
    canvas; cxcywhr for oriented boxes), `keypoints` (N, K, 3) x and y normalised on the same canvas and the
    visibility, or None. Instance masks are per image (an overlap map) or per object, as the batch's `overlap` says:
    they stay beside the targets in the batch."""

    image: torch.Tensor
    cls: torch.Tensor
    boxes: BoundingBoxes
    keypoints: torch.Tensor | None = None

    def __len__(self):
        return len(self.image)

    @property
    def canvas(self):
        return self.boxes.canvas

    @property
    def device(self):
        return self.image.device

    @classmethod
    def collate(cls, samples):
        """Samples' `cls` (n,) and `boxes` (and `keypoints`) -> the batch's targets, in the samples' order."""
        image = torch.cat([torch.full((len(s["cls"]),), i, dtype=torch.int64) for i, s in enumerate(samples)])
        kpts = torch.cat([s["keypoints"] for s in samples], 0) if "keypoints" in samples[0] else None
        return cls(image, torch.cat([s["cls"] for s in samples]), BoundingBoxes.cat([s["boxes"] for s in samples]),
                   kpts)

    @classmethod
    def from_rows(cls, rows, canvas, angles=None, keypoints=None):
        """From rows (N, 6) [image, cls, cx, cy, w, h] normalised (YOLO's batch form, which tests and tools write by
        hand), and the rotated boxes' angles (N,) where the boxes are oriented."""
        boxes = rows[:, 2:6]
        if angles is not None:
            boxes = torch.cat((boxes, angles.view(-1, 1).to(boxes.dtype)), 1)
        fmt = "cxcywh" if angles is None else "cxcywhr"
        return cls(rows[:, 0].long(), rows[:, 1].clone(), BoundingBoxes(boxes.clone(), fmt, canvas, True), keypoints)

    def _map(self, fn):
        kpts = None if self.keypoints is None else fn(self.keypoints)
        return Targets(fn(self.image), fn(self.cls), self.boxes._replace(fn(self.boxes.data)), kpts)

    def to(self, *args, **kwargs):
        return self._map(lambda t: t.to(*args, **kwargs))

    def pin_memory(self):
        """Called by the DataLoader's pinning thread: every tensor in page-locked memory."""
        return self._map(lambda t: t.pin_memory())

    def of_image(self, i):
        """The targets of image i of the batch."""
        return self[self.image == i]

    def __getitem__(self, index):
        kpts = None if self.keypoints is None else self.keypoints[index]
        return Targets(self.image[index], self.cls[index], self.boxes[index], kpts)

    def on_canvas(self, canvas):
        return dataclasses.replace(self, boxes=self.boxes.on_canvas(canvas))

    def keypoints_pixels(self):
        """Keypoints (N, K, 3) with x and y in pixels of the canvas."""
        h, w = self.canvas
        kpts = self.keypoints.clone()
        kpts[..., 0] *= w
        kpts[..., 1] *= h
        return kpts
