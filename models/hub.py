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

from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn as nn

from models.tta import TTAModel
from models.yolo import ClassificationModel
from utils import ops
from utils.data.augment import letterbox
from utils.errors import BadFile
from utils.fields import Boxes, Keypoints, Letterbox, Masks, in_original_pixels
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


class Results:
    """Per-image results: `xyxy` (detections, original pixels) and `masks` (segmenters) or `keypoints` (pose models,
    (n, K, 2 or 3) original pixels), or `probs` (classifiers)."""

    def __init__(self, names, files, xyxy=None, masks=None, probs=None, keypoints=None):
        self.names, self.files, self.xyxy, self.masks, self.probs = names, files, xyxy, masks, probs
        self.keypoints = keypoints

    def __len__(self):
        return len(self.files)

    def tolist(self):
        if self.probs is not None:
            return [[{"class": int(i), "name": self.names[int(i)], "conf": float(p[i])} for i in p.argsort(0, True)[:5]]
                    for p in self.probs]
        out = []
        for k, det in enumerate(self.xyxy):
            rows = [{"box": d[:4].tolist(), "conf": float(d[4]), "class": int(d[5]), "name": self.names[int(d[5])]}
                    for d in det]
            if self.masks is not None:
                for row, m in zip(rows, self.masks[k]):
                    row["mask"] = m
            if self.keypoints is not None:
                for row, kp in zip(rows, self.keypoints[k]):
                    row["keypoints"] = kp
            out.append(rows)
        return out

    def __repr__(self):
        lines = []
        for f, rows in zip(self.files, self.tolist()):
            counts = {}
            for r in rows if self.probs is None else rows[:1]:
                counts[r["name"]] = counts.get(r["name"], 0) + 1
            lines.append(f"{f}: " + (", ".join(f"{n} {k}" for k, n in counts.items()) or "(no detections)"))
        return "\n".join(lines)


class HubModel(nn.Module):
    """Inference wrapper: letterbox (or resize for classifiers), forward in eval mode, NMS, back to the image's
    pixels. `conf`, `iou`, `classes`, `max_det` are NMS settings the caller may change."""

    conf, iou, classes, agnostic, max_det = 0.25, 0.45, None, False, 1000

    def __init__(self, model):
        """`model`: a model of ours (nn.Module), or a models.backend.InferenceBackend of an export."""
        super().__init__()
        self.model = model.eval()
        self.names = dict(model.names)
        self.layout = model.output_layout if not isinstance(model, ClassificationModel) else None
        self.classify = self.layout is None
        self.stride = 32 if self.classify else int(torch.as_tensor(model.stride).max())
        self.static = None if getattr(model, "dynamic", True) else model.imgsz  # the one size an export takes
        kpt_shape = None if self.classify else self.layout.kpt_shape
        self.fields = () if self.classify else ((Boxes(),) + ((Masks(),) if self.layout.proto else ())
                                                + ((Keypoints(kpt_shape),) if kpt_shape else ()))

    @torch.no_grad()
    def forward(self, ims, size=640, augment=False):
        """`augment`: test-time augmentation (models/tta.py) for detectors and segmenters."""
        ims = ims if isinstance(ims, (list, tuple)) else [ims]
        files, im0s = zip(*(_to_bgr(im, i) for i, im in enumerate(ims)))
        p = next(self.model.parameters())
        if self.classify:
            h, w = self.static or (size, size)
            x = np.stack([cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR)[..., ::-1] for im in im0s])
            x = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(p.device, p.dtype) / 255
            return Results(self.names, files, probs=self.model(x).cpu())
        xyxy, masks, kpts = [], [], []
        for im0 in im0s:  # one at a time: each image keeps its own minimum letterbox, as detect.py does
            det, mask, kpt = self._one(im0, size, p, augment)
            xyxy.append(det)
            masks.append(mask)
            kpts.append(kpt)
        return Results(self.names, files, xyxy=xyxy, masks=masks if self.layout.proto else None,
                       keypoints=kpts if self.layout.kpt_shape else None)

    def _one(self, im0, size, p, augment=False):
        im = letterbox(im0, self.static or size, stride=self.stride, auto=self.static is None)[0]
        x = torch.from_numpy(np.ascontiguousarray(im.transpose(2, 0, 1)[::-1])).to(p.device, p.dtype)[None] / 255
        model = TTAModel(self.model) if augment else self.model
        layout = model.output_layout
        out, protos = layout.split(model(x))
        det = ops.non_max_suppression(out, self.conf, self.iou, self.classes, self.agnostic, max_det=self.max_det,
                                      layout=layout)[0]
        image = in_original_pixels(self.fields, det, None if protos is None else protos[0],
                                   Letterbox(x.shape[2:], im0.shape))
        mask = None if image.masks is None else image.masks.cpu()
        kpts = layout.det_keypoints(image.boxes).float().cpu() if layout.kpt_shape else None
        return image.boxes[:, :6].cpu(), mask, kpts
