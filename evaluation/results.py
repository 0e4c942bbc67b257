"""`Results`: one image's predictions as Ultralytics' users read them (`r.boxes.xyxy`, `r.masks.xy`, `r.probs.top1`,
`r.plot()`, `r.save_txt()`, `r.to_json()`), over the record the predictors make (`evaluation/fields.Predictions`, in
original-image pixels) and the task's fields, which draw it and write its --save-txt lines: no second box format.

    for r in YOLO("best.pt").predict("data/images", stream=True):
        r.boxes.xyxy, r.boxes.conf, r.boxes.cls          # (n, 4), (n,), (n,) in the image's pixels
        r.boxes.id                                       # the track ids, None where nothing tracked the boxes
        r.save_txt("labels.txt", save_conf=True)         # the predict script's --save-txt lines

An oriented-box model's boxes are `r.obb` (`ResultOBB`: `xywhr`, `xyxyxyxy`, `conf`, `cls`) and `r.boxes` is None,
as in Ultralytics. The views (`ResultBoxes`, `ResultMasks`, `ResultKeypoints`, `ResultOBB`, `Probs`) hold tensors
or, after `.numpy()`, arrays; indexing one (`r.boxes[0]`, `r.boxes[r.boxes.conf > 0.5]`) keeps its rows
two-dimensional, as Ultralytics' do.
"""

import dataclasses
import json
import os
import sys
from pathlib import Path

import cv2
import numpy as np
import torch

from evaluation.fields import ClassScores, Keypoints, Masks, Predictions, RotatedBoxes
from evaluation.plots import Annotator, save_one_box
from utils.errors import UserError
from utils.imageio import printable, write_image
from utils.log import LOGGER
from utils.rotated import xywhr_to_corners


def nms_iou(layout):
    """Predict's NMS IoU threshold by default for a model of `layout` (utils/ops.OutputLayout): the checkpoint's own
    tool's, so its boxes are the ones that tool draws: yolov5's detect.py 0.45 for the anchor-based families with
    objectness (YOLOv5, YOLOv7), Ultralytics' predict 0.7 for the anchor-free ones (YOLOv8, YOLO11, YOLOv5u)."""
    return 0.45 if layout.objectness else 0.7


def _convert(x, how):
    """A tensor (or array) converted by `how`: 'cpu', 'numpy', or (args, kwargs) for Tensor.to; anything else as it
    is."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x) if how != "numpy" else x
    if not isinstance(x, torch.Tensor):
        return x
    if how == "cpu":
        return x.cpu()
    if how == "numpy":
        return x.detach().cpu().numpy()
    return x.to(*how[0], **how[1])


def _torch(x):
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _rows(x, idx):
    """Rows `idx` of x (an int keeps its row as a one-row table)."""
    return x[slice(idx, idx + 1 or None)] if isinstance(idx, int) else x[idx]


def _cat(parts):
    return np.concatenate(parts, 1) if isinstance(parts[0], np.ndarray) else torch.cat(parts, 1)


class _Moves:
    """`cpu()`, `numpy()`, `cuda()`, `to(...)` as Ultralytics' results have them: each a copy made by `_apply`."""

    def cpu(self):
        return self._apply("cpu")

    def numpy(self):
        return self._apply("numpy")

    def cuda(self):
        return self._apply(((), {"device": "cuda"}))

    def to(self, *args, **kwargs):
        return self._apply((args, kwargs))


class _View(_Moves):
    """What every view shares: `data`, its length, `shape`, indexing, iteration and the conversions."""

    def __init__(self, data, orig_shape):
        self._data, self.orig_shape = data, tuple(orig_shape[:2])

    @property
    def data(self):
        return self._data

    @property
    def shape(self):
        return self.data.shape

    def __len__(self):
        return len(self._data)

    def _new(self, data, **kw):
        return type(self)(data, self.orig_shape, **kw)

    def __getitem__(self, idx):
        return self._new(_rows(self._data, idx))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def _apply(self, how):
        return self._new(_convert(self._data, how))

    def __repr__(self):
        return f"{type(self).__name__}(data={self.data!r}, orig_shape={self.orig_shape})"

    def _scale(self):
        """(w, h, w, h) of the original image, as `data`'s kind of array."""
        h, w = self.orig_shape
        scale = np.array([w, h, w, h], dtype=np.float32)
        return scale if isinstance(self._data, np.ndarray) else torch.as_tensor(scale, device=self._data.device)


class _Scored(_View):
    """A view whose rows hold each object's confidence and class, in the columns its table puts them, and `id` (n,),
    the track ids, None where no tracker gave them; `data` is Ultralytics' table, with the id before conf where
    tracked."""

    conf_column, cls_column = 4, 5

    def __init__(self, data, orig_shape, id=None):
        super().__init__(data, orig_shape)
        self.id = id

    @property
    def conf(self):
        return self._data[:, self.conf_column]

    @property
    def cls(self):
        return self._data[:, self.cls_column]

    @property
    def data(self):
        if self.id is None:
            return self._data
        ids = self.id.reshape(-1, 1)
        c = self.conf_column
        return _cat([self._data[:, :c], ids.astype(self._data.dtype) if isinstance(ids, np.ndarray) else
                     ids.to(self._data.dtype), self._data[:, c:]])

    @property
    def is_track(self):
        return self.id is not None

    def _new(self, data, id=None):
        return type(self)(data, self.orig_shape, id=id)

    def __getitem__(self, idx):
        return self._new(_rows(self._data, idx), None if self.id is None else _rows(self.id[:, None], idx)[:, 0])

    def _apply(self, how):
        return self._new(_convert(self._data, how), _convert(self.id, how))


class ResultBoxes(_Scored):
    """Boxes in the image's pixels: NMS rows (n, 6+) xyxy, conf, cls (the columns after cls are the masks' and
    keypoints' own). `data` is Ultralytics' table: (n, 6), or (n, 7) with the id before conf where tracked."""

    def __init__(self, rows, orig_shape, id=None):
        super().__init__(rows[:, :6], orig_shape, id)

    @property
    def xyxy(self):
        return self._data[:, :4]

    @property
    def xywh(self):
        b = self.xyxy
        xy, wh = (b[:, :2] + b[:, 2:4]) / 2, b[:, 2:4] - b[:, :2]
        return _cat([xy, wh])

    @property
    def xyxyn(self):
        return self.xyxy / self._scale()

    @property
    def xywhn(self):
        return self.xywh / self._scale()


class ResultOBB(_Scored):
    """Oriented boxes in the image's pixels, from NMS rows (n, 7) xywh, conf, cls, angle; `data` is Ultralytics'
    table (n, 7): x, y, w, h, angle (radians), conf, cls; (n, 8) with the track id before conf where tracked."""

    conf_column, cls_column = 5, 6

    @property
    def xywhr(self):
        return self._data[:, :5]

    @property
    def xyxyxyxy(self):
        """(n, 4, 2) the corners."""
        corners = xywhr_to_corners(_torch(self.xywhr))
        return corners.numpy() if isinstance(self._data, np.ndarray) else corners

    @property
    def xyxyxyxyn(self):
        return self.xyxyxyxy / self._scale()[:2]

    @property
    def xyxy(self):
        """(n, 4) each box's axis-aligned bounding box."""
        c = self.xyxyxyxy
        return _cat([c.min(1), c.max(1)]) if isinstance(c, np.ndarray) else _cat([c.amin(1), c.amax(1)])


class ResultMasks(_View):
    """Instance masks at the original image's size, (n, h, w) uint8 0 / 1, in the boxes' order; `xy` / `xyn` the
    outline (largest contour) of each, in the image's pixels / normalised, as the segmentation --save-txt lines hold
    it. Ultralytics 8.4 gives uint8 masks too, at this size with `retina_masks=True` (its default: at the
    letterboxed input's size, and `xy` scaled from there to the image); docs/api.md says what differs."""

    def __init__(self, data, orig_shape):
        super().__init__(data.astype(np.uint8) if isinstance(data, np.ndarray) and data.dtype == bool else
                         data.to(torch.uint8) if isinstance(data, torch.Tensor) and data.dtype == torch.bool else data,
                         orig_shape)

    @property
    def xy(self):
        from utils.ops import masks2segments

        return masks2segments(_torch(self._data))

    @property
    def xyn(self):
        h, w = self.orig_shape
        return [seg / np.array([w, h], dtype=np.float32) for seg in self.xy]


class ResultKeypoints(_View):
    """Keypoints (n, K, 2 or 3) in the image's pixels: x, y and, with 3 values, the probability that the point is
    visible (`conf`)."""

    @property
    def xy(self):
        return self._data[..., :2]

    @property
    def xyn(self):
        return self.xy / self._scale()[:2]

    @property
    def conf(self):
        return self._data[..., 2] if self._data.shape[-1] == 3 else None

    @property
    def has_visible(self):
        return self.conf is not None


class Probs(_View):
    """A classifier's class probabilities (nc,) of the whole image."""

    def __len__(self):
        return len(self._data)

    @property
    def top1(self):
        return int(self._data.argmax())

    @property
    def top5(self):
        return ClassScores.top(_torch(self._data)).tolist()

    @property
    def top1conf(self):
        return self._data[self.top1]

    @property
    def top5conf(self):
        return self._data[self.top5]


class Results(_Moves):
    """One image's predictions: `boxes`, `masks`, `keypoints` (None where the task has none) or `probs`, the image
    as read (`orig_img`, BGR), its `path`, the model's `names`, and the milliseconds each step took (`speed`:
    preprocess, inference, postprocess). `fields` are the task's (evaluation/fields.py): they draw the image
    (`plot`) and write its label lines (`save_txt`) as the predict scripts do."""

    def __init__(self, orig_img, path, names, fields, record, speed=None, id=None):
        self.orig_img, self.path, self.names = orig_img, str(path), dict(names)
        self.fields, self.record = tuple(fields), Predictions.of(record)
        self.orig_shape = tuple(orig_img.shape[:2])
        self.speed = dict(speed or {"preprocess": None, "inference": None, "postprocess": None})
        self.id = id  # the track ids of the boxes (n,), set by a tracker

    def _field(self, kind):
        return next((f for f in self.fields if isinstance(f, kind)), None)

    @property
    def boxes(self):
        rows = self.record.boxes
        return None if rows is None or self._field(RotatedBoxes) else ResultBoxes(rows, self.orig_shape, id=self.id)

    @property
    def obb(self):
        rows = self.record.boxes
        if rows is None or not self._field(RotatedBoxes):
            return None
        return ResultOBB(_cat([rows[:, :4], rows[:, -1:], rows[:, 4:6]]), self.orig_shape, id=self.id)

    @property
    def masks(self):
        return None if self.record.masks is None else ResultMasks(self.record.masks, self.orig_shape)

    @property
    def keypoints(self):
        field = self._field(Keypoints)
        if field is None or self.record.boxes is None:
            return None
        return ResultKeypoints(field.of(self.record.boxes), self.orig_shape)

    @property
    def probs(self):
        return None if self.record.probs is None else Probs(self.record.probs, self.orig_shape)

    def __len__(self):
        """The number of objects (of classes, for a classifier)."""
        return len(self.record.boxes if self.record.boxes is not None else self.record.probs)

    def __getitem__(self, idx):
        """The Results of objects `idx` alone."""
        rec = self.record
        record = dataclasses.replace(rec, boxes=_rows(rec.boxes, idx),
                                     masks=None if rec.masks is None else _rows(rec.masks, idx))
        ids = None if self.id is None else _rows(self.id[:, None], idx)[:, 0]
        return Results(self.orig_img, self.path, self.names, self.fields, record, self.speed, id=ids)

    def _apply(self, how):
        record = Predictions(**{k.name: _convert(getattr(self.record, k.name), how)
                                for k in dataclasses.fields(Predictions)})
        return Results(self.orig_img, self.path, self.names, self.fields, record, self.speed,
                       id=_convert(self.id, how))

    def _torch_record(self):
        """The record as tensors on the CPU, what the fields draw and write from."""
        return Predictions(**{k.name: _convert(getattr(self.record, k.name), "cpu")
                              for k in dataclasses.fields(Predictions)})

    def __repr__(self):
        return f"Results({self.path!r}: {self.verbose() or 'nothing'})"

    def verbose(self):
        """What the log line says of the image: the count of each class, or the five most probable classes."""
        if not self.fields:
            return ""
        return self.fields[0].summary(self._torch_record(), self.names)

    def plot(self, conf=True, line_width=None, labels=True, boxes=True, masks=True, probs=True, kpts=True,
             img=None, save=False, filename=None):
        """The image (BGR, a copy of `orig_img`, or `img`) with the predictions drawn as the predict scripts draw
        them: the boxes with their class names (`labels`) and confidences (`conf`), masks, keypoints, or the five
        most probable classes; `line_width` in pixels (default: by image size). `save` also writes it to
        `filename`."""
        skip = {ClassScores: not probs, Masks: not masks, Keypoints: not kpts}
        record, annotator = self._torch_record(), Annotator(np.array(self.orig_img if img is None else img),
                                                           line_width=line_width)
        for f in reversed(self.fields):
            if skip.get(type(f)) or (not boxes and type(f).__name__ == "Boxes"):
                continue
            f.draw(annotator, record, lambda c, p: "" if not labels else
                   f"{self.names[c]} {p:.2f}" if conf else self.names[c])
        im = annotator.result()
        if save:
            write_image(filename or f"results_{Path(self.path).name}", im)
        return im

    def show(self):
        """Shows the drawn image in a window where there is a display; one line saying so where there is none."""
        if window_problem("show") is None:
            cv2.imshow(printable(Path(self.path).name), self.plot())
            cv2.waitKey(1)

    def save(self, filename=None, **plot_options):
        """Writes the drawn image (`plot`'s options) to `filename` (default: results_<image name>); returns it."""
        filename = str(filename or f"results_{Path(self.path).name}")
        self.plot(save=True, filename=filename, **plot_options)
        return filename

    def save_txt(self, txt_file, save_conf=False):
        """Appends the image's label lines, as the predict scripts' --save-txt writes them (the task's label format,
        normalised; with `save_conf` the confidence, then a tracked row's id), to `txt_file`; returns its path."""
        lines = self.fields[0].lines(self.fields, self._torch_record(), self.orig_shape, save_conf,
                                     None if self.id is None else self.id.tolist())
        Path(txt_file).parent.mkdir(parents=True, exist_ok=True)
        with open(txt_file, "a") as f:
            f.writelines(lines)
        return str(txt_file)

    def save_crop(self, save_dir, file_name=Path("im.jpg")):
        """Each box's crop from `orig_img`, as save_dir/<class name>/<file_name stem>.jpg (2, 3, ... when taken);
        a classifier's results have no boxes to crop (one line says so)."""
        if self.record.probs is not None:
            LOGGER.warning("WARNING: save_crop: a classifier's results have no boxes to crop")
            return
        for xyxy, c, _ in self.fields[0].objects(self._torch_record()):
            save_one_box(xyxy, self.orig_img, Path(save_dir) / self.names[c] / f"{Path(file_name).stem}.jpg")

    def summary(self, normalize=False, decimals=5):
        """A list of dicts, one per object, as Ultralytics' `summary`: name, class, confidence, box (x1, y1, x2, y2;
        an oriented box's four corners x1, y1 ... x4, y4), and where present track_id, segments {x, y}, keypoints
        {x, y, visible}; a classifier's is its top-1 class. `normalize`: coordinates as fractions of the image's
        width and height."""
        if self.record.probs is not None:
            p = self.probs
            return [{"name": self.names[p.top1], "class": p.top1, "confidence": round(float(p.top1conf), decimals)}]
        h, w = self.orig_shape if normalize else (1, 1)
        boxes, masks, kpts = self.obb if self.boxes is None else self.boxes, self.masks, self.keypoints
        points = boxes.xyxyxyxy if isinstance(boxes, ResultOBB) else boxes.xyxy.reshape(-1, 2, 2)
        segs = masks.xy if masks is not None else None
        out = []
        for i, (conf, c, xy) in enumerate(zip(*(_convert(v, "cpu").tolist() for v in (boxes.conf, boxes.cls, points)))):
            row = {"name": self.names[int(c)], "class": int(c), "confidence": round(conf, decimals),
                   "box": {k: round(v, decimals) for j, (x, y) in enumerate(xy, 1)
                           for k, v in ((f"x{j}", x / w), (f"y{j}", y / h))}}
            if boxes.id is not None:
                row["track_id"] = int(boxes.id[i])
            if segs is not None:
                row["segments"] = {"x": (segs[i][:, 0] / w).round(decimals).tolist(),
                                   "y": (segs[i][:, 1] / h).round(decimals).tolist()}
            if kpts is not None:
                k = _convert(kpts.data[i], "numpy").astype(float)
                row["keypoints"] = {"x": (k[:, 0] / w).round(decimals).tolist(),
                                    "y": (k[:, 1] / h).round(decimals).tolist(),
                                    **({"visible": k[:, 2].round(decimals).tolist()} if k.shape[1] == 3 else {})}
            out.append(row)
        return out

    def to_json(self, normalize=False, decimals=5):
        return json.dumps(self.summary(normalize, decimals), indent=2)

    def to_df(self, normalize=False, decimals=5):
        """`summary` as a pandas DataFrame; a UserError saying how to install pandas where it is missing."""
        try:
            import pandas as pd
        except ImportError:
            raise MissingPackage("to_df() needs pandas: pip install pandas (to_json() and summary() do not)") from None
        return pd.DataFrame(self.summary(normalize, decimals))


def window_problem(option):
    """None where cv2.imshow can open a window here, else why not, said once in a warning naming `option` (results
    are saved, not shown), instead of failing later."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        reason = "no display (DISPLAY is not set)"
    else:
        try:
            cv2.imshow("test", np.zeros((8, 8, 3), dtype=np.uint8))
            cv2.waitKey(1)
            cv2.destroyAllWindows()
            return None
        except cv2.error:
            reason = "this OpenCV build cannot open windows (opencv-python-headless: pip install opencv-python)"
    LOGGER.warning(f"WARNING: {option}: {reason}; results are not shown")
    return reason


class MissingPackage(UserError, ImportError):
    """A method needs a package this install lacks (names the pip command)."""
