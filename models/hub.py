"""The model that `torch.hub.load` returns (see hubconf.py): any of our detectors, segmenters, pose models or
classifiers behind
one call that takes image paths, numpy arrays (HWC RGB, as PIL gives them), PIL images or a list of them, and
returns results that carry the class names.

    model = torch.hub.load('path/to/repo', 'custom', path='best.pt', source='local')
    results = model(['bus.jpg', np.asarray(pil_image), pil_image], size=320)   # augment=True: test-time aug.
    results.xyxy[0]      # (n, 6) tensor: x1, y1, x2, y2, conf, class, in the image's own pixels
    results.tolist()     # per image, a list of dicts {'box', 'conf', 'class', 'name'} (+ 'mask' for segmenters,
                         # 'keypoints' (K, 2 or 3) in the image's pixels for pose models)
"""

import dataclasses
import time
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn as nn

from data.augment import letterbox
from evaluation.fields import Letterbox, Predictions, in_original_pixels
from evaluation.results import Results, nms_iou
from models.tta import TTAModel
from models.yolo import ClassificationModel
from utils import ops
from utils.errors import BadFile
from utils.imageio import read_image


def _to_bgr(im, i=0):
    """A path, PIL image or HWC RGB array -> (name, HWC BGR uint8 array). The name is the file's, also for a PIL
    image opened from one; else what the input was and its place in the call (`image2`, `array1`)."""
    if isinstance(im, (str, Path)):
        try:
            bgr = read_image(im)
        except BadFile as e:
            raise BadFile(f"{im}: {e}") from None
        if bgr is None:
            raise FileNotFoundError(f"cannot read image {im}")
        return Path(im).name, bgr
    name = f"array{i}"
    if hasattr(im, "convert"):  # PIL
        name = Path(getattr(im, "filename", "") or f"image{i}").name
        im = np.asarray(im.convert("RGB"))
    if not isinstance(im, np.ndarray) or im.ndim != 3 or im.shape[2] != 3:
        raise TypeError(f"expected an image path, a PIL image or an HWC RGB array, got {type(im).__name__}")
    return name, np.ascontiguousarray(im[..., ::-1]).astype(np.uint8)


def _cat_columns(xyxy, conf, cls):
    """(n, 6) rows of upright boxes, confidences and classes, as a tensor or an array as the boxes are."""
    if isinstance(xyxy, torch.Tensor):
        return torch.cat([xyxy, conf[:, None], cls[:, None]], 1)
    return np.concatenate([xyxy, conf[:, None], cls[:, None]], 1)


class ResultsList(list):
    """One `evaluation.results.Results` per image, in the call's order, as Ultralytics' `predict` returns them; also
    what torch.hub's YOLOv5 models give: `files`, `xyxy` (per image (n, 6): x1, y1, x2, y2, conf, class), `masks`,
    `keypoints`, `obb` or `probs`, and `tolist()`."""

    def __init__(self, results, names):
        super().__init__(results)
        self.names = names

    @property
    def files(self):
        return tuple(Path(r.path).name for r in self)

    @property
    def xyxy(self):
        """Per image (n, 6); an oriented-box model's rows are each box's upright bounds (yolov5 has no such model)."""
        return [r.boxes.data if r.obb is None else _cat_columns(r.obb.xyxy, r.obb.conf, r.obb.cls) for r in self]

    @property
    def obb(self):
        return [r.obb.data for r in self] if self and self[0].obb is not None else None

    @property
    def masks(self):
        return [r.masks.data for r in self] if self and self[0].masks is not None else None

    @property
    def keypoints(self):
        return [r.keypoints.data for r in self] if self and self[0].keypoints is not None else None

    @property
    def probs(self):
        return torch.stack([r.probs.data for r in self]) if self and self[0].probs is not None else None

    def tolist(self):
        """Per image: the five most probable classes {'class', 'name', 'conf'} of a classifier, else a dict per
        object {'box', 'conf', 'class', 'name'}, with 'mask' (h, w) and 'keypoints' (K, 2 or 3) where the model has
        them."""
        out = []
        for r in self:
            if r.probs is not None:
                out.append([{"class": c, "name": self.names[c], "conf": float(r.probs.data[c])} for c in r.probs.top5])
                continue
            if r.obb is not None:  # Ultralytics' table: x, y, w, h, angle (radians), conf, cls
                out.append([{"xywhr": d[:5].tolist(), "corners": c.tolist(), "conf": float(d[5]), "class": int(d[6]),
                             "name": self.names[int(d[6])]} for d, c in zip(r.obb.data, r.obb.xyxyxyxy)])
                continue
            rows = [{"box": d[:4].tolist(), "conf": float(d[4]), "class": int(d[5]), "name": self.names[int(d[5])]}
                    for d in r.boxes.data]
            for key, view in (("mask", r.masks), ("keypoints", r.keypoints)):
                for row, v in zip(rows, view.data if view is not None else ()):
                    row[key] = v
            out.append(rows)
        return out

    def __repr__(self):
        return "\n".join(f"{Path(r.path).name}: {r.verbose()}" for r in self)


class HubModel(nn.Module):
    """Inference wrapper: letterbox (or resize for classifiers), forward in eval mode, NMS, back to the image's
    pixels. `conf`, `iou`, `classes`, `max_det` are NMS settings the caller may change; returns a ResultsList.
    `fields(names, layout)`: the fields of the model's task, its record's (engine/tasks: hubconf.py and the `YOLO`
    class, above the engine, look it up)."""

    conf, iou, classes, agnostic, max_det = 0.25, None, None, False, 1000  # iou None: the family's (nms_iou)

    def __init__(self, model, fields):
        """`model`: a model of ours (nn.Module), or a models.backend.InferenceBackend of an export."""
        super().__init__()
        self.model = model.eval()
        self.names = dict(model.names)
        self.layout = model.output_layout if not isinstance(model, ClassificationModel) else None
        self.classify = self.layout is None
        self.stride = 32 if self.classify else int(torch.as_tensor(model.stride).max())
        self.static = None if getattr(model, "dynamic", True) else model.imgsz  # the one size an export takes
        self.fields = fields(self.names, self.layout)

    @torch.no_grad()
    def forward(self, ims, size=640, augment=False):
        """`augment`: test-time augmentation (models/tta.py) for detectors and segmenters."""
        ims = ims if isinstance(ims, (list, tuple)) else [ims]
        return ResultsList([self.one(im, i, size, augment) for i, im in enumerate(ims)], self.names)

    def one(self, im, i=0, size=640, augment=False):
        """The `Results` of one image (what `forward` takes; `i` its place in the call, which names an array);
        one at a time: each image keeps its own minimum letterbox, as detect.py does."""
        t0 = time.perf_counter()
        file, im0 = _to_bgr(im, i)
        p = next(self.model.parameters())
        if self.classify:
            h, w = self.static or (size, size)
            x = cv2.resize(im0, (w, h), interpolation=cv2.INTER_LINEAR)[..., ::-1]
        else:
            x = letterbox(im0, self.static or size, stride=self.stride, auto=self.static is None)[0][..., ::-1]
        x = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))).to(p.device, p.dtype)[None] / 255
        t1 = time.perf_counter()
        model = TTAModel(self.model) if augment else self.model
        out = model(x)
        t2 = time.perf_counter()
        if self.classify:
            record = Predictions(probs=out[0].float().cpu())
        else:
            layout = model.output_layout
            out, protos = layout.split(out)
            iou = nms_iou(layout) if self.iou is None else self.iou
            det = ops.non_max_suppression(out, self.conf, iou, self.classes, self.agnostic, max_det=self.max_det,
                                          layout=layout)[0]
            record = in_original_pixels(self.fields, det, None if protos is None else protos[0],
                                        Letterbox.placed(x.shape[2:], im0.shape))
            record = dataclasses.replace(record, boxes=record.boxes.float().cpu(),
                                         masks=None if record.masks is None else record.masks.cpu())
        speed = {"preprocess": (t1 - t0) * 1e3, "inference": (t2 - t1) * 1e3,
                 "postprocess": (time.perf_counter() - t2) * 1e3}
        return Results(im0, file, self.names, self.fields, record, speed)
