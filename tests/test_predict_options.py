"""Predict options: --save-crop, --save-csv, --line-thickness, --hide-labels, --hide-conf, and --view-img where no
window can open."""

import csv
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch

import classify.predict as cls_predict
import detect
from engine.predictor import BasePredictor
from models.checkpoints import model_to_ckpt
from models.yolo import ClassificationModel, DetectionModel

NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """A YOLOv5n whose head biases make boxes pass conf 0.25: objectness raised, class scores spread."""
    torch.manual_seed(0)
    model = DetectionModel("yolov5n.yaml", nc=3)
    model.names = dict(NAMES)
    with torch.no_grad():
        for m in model.model[-1].m:
            b = m.bias.view(3, -1)
            b[:, 4] = 0.0
            b[:, 5:] = torch.randn(b[:, 5:].shape, generator=torch.Generator().manual_seed(2)) * 2
    path = tmp_path_factory.mktemp("weights") / "v5n.pt"
    torch.save({"model": model_to_ckpt(model)}, path)
    return path

@pytest.fixture
def log(caplog):
    """Records of the project logger (it does not propagate to the root logger once set_logging has run)."""
    from utils.loggers import LOGGER

    LOGGER.addHandler(caplog.handler)
    yield caplog
    LOGGER.removeHandler(caplog.handler)



def _images(shapes_detect, n=3):
    return sorted((Path(shapes_detect).parent / "images" / "val").glob("*.jpg"))[:n]


def _run(weights, source, project, name, *extra):
    opt = detect.parse_opt(["--weights", str(weights), "--source", str(source), "--imgsz", "96", "--device", "cpu",
                            "--project", str(project), "--name", name, *extra])
    return detect.main(opt)


def _csv(path):
    return list(csv.DictReader(open(path)))


def test_save_crop_and_csv_agree_with_the_labels(detector, shapes_detect, tmp_path):
    src = _images(shapes_detect)[0]
    _run(detector, src, tmp_path, "exp", "--save-crop", "--save-csv", "--save-txt", "--save-conf", "--nosave",
         "--max-det", "10")
    d = tmp_path / "exp"
    rows = _csv(d / "predictions.csv")
    lines = [line.split() for line in (d / "labels" / f"{src.stem}.txt").read_text().splitlines()]
    assert len(rows) == len(lines) >= 2
    im = cv2.imread(str(src))
    h, w = im.shape[:2]
    crops = sorted((d / "crops").rglob("*.jpg"))
    assert len(crops) == len(rows)
    for row in rows:
        assert row["image"] == src.name
        x1, y1, x2, y2 = (float(row[k]) for k in ("x1", "y1", "x2", "y2"))
        # the same box as its --save-txt line (normalised xywh)
        conf = float(row["confidence"])
        same = [ln for ln in lines if NAMES[int(ln[0])] == row["class"] and abs(float(ln[5]) - conf) < 1e-3]
        assert any(abs(float(ln[1]) * w - (x1 + x2) / 2) < 0.2 and abs(float(ln[3]) * w - (x2 - x1)) < 0.2
                   for ln in same)
    # a crop is its box grown by 2 % and 10 px, clipped to the image
    sizes = sorted(cv2.imread(str(c)).shape[:2] for c in crops)
    expected = []
    for row in rows:
        x1, y1, x2, y2 = (float(row[k]) for k in ("x1", "y1", "x2", "y2"))
        cx, cy, bw, bh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) * 1.02 + 10, (y2 - y1) * 1.02 + 10
        ch = int(np.clip(cy + bh / 2, 0, h)) - int(np.clip(cy - bh / 2, 0, h))
        cw = int(np.clip(cx + bw / 2, 0, w)) - int(np.clip(cx - bw / 2, 0, w))
        expected.append((ch, cw))
    for k in range(2):  # heights, then widths; the CSV's 0.1 px rounding can move a crop edge by a pixel
        assert np.abs(np.sort([s[k] for s in sizes]) - np.sort([e[k] for e in expected])).max() <= 1


def _changed(a, b):
    return np.abs(a.astype(int) - b).max(2) > 0


def test_hidden_labels_draw_only_box_outlines_of_the_given_width(detector, shapes_detect, tmp_path):
    im = cv2.imread(str(_images(shapes_detect)[1]))
    src = tmp_path / "shape.png"  # lossless in and out: every changed pixel was drawn
    cv2.imwrite(str(src), im)
    drawn = {}
    for lw in (1, 4):
        _run(detector, src, tmp_path, f"lw{lw}", "--hide-labels", "--line-thickness", str(lw), "--save-csv",
             "--max-det", "4")
        drawn[lw] = cv2.imread(str(tmp_path / f"lw{lw}" / src.name))
    rows = _csv(tmp_path / "lw1" / "predictions.csv")
    assert rows
    near_edges = np.zeros(im.shape[:2], bool)  # within 2 px of a box edge (line width 1 plus anti-aliasing)
    for r in rows:
        x1, y1, x2, y2 = (int(round(float(r[k]))) for k in ("x1", "y1", "x2", "y2"))
        outer = np.zeros_like(near_edges)
        outer[max(y1 - 2, 0) : y2 + 3, max(x1 - 2, 0) : x2 + 3] = True
        inner = np.zeros_like(near_edges)
        inner[y1 + 3 : max(y2 - 2, y1 + 3), x1 + 3 : max(x2 - 2, x1 + 3)] = True
        near_edges |= outer & ~inner
    changed1 = _changed(drawn[1], im)
    assert changed1.any() and not (changed1 & ~near_edges).any(), "no label boxes or text with --hide-labels"
    assert _changed(drawn[4], im).sum() > 1.8 * changed1.sum(), "thicker lines with --line-thickness 4"
    _run(detector, src, tmp_path, "labels", "--line-thickness", "1", "--max-det", "4")
    labelled = _changed(cv2.imread(str(tmp_path / "labels" / src.name)), im)
    assert (labelled & ~near_edges).any(), "labels are drawn by default"


def test_label_text_options():
    def label(**flags):
        args = SimpleNamespace(**{"hide_labels": False, "hide_conf": False, **flags})
        return BasePredictor.label(SimpleNamespace(args=args, names=NAMES), 2, 0.875)

    assert label() == "triangle 0.88" and label(hide_conf=True) == "triangle" and label(hide_labels=True) == ""


def test_view_img_without_display_warns_once(detector, shapes_detect, tmp_path, monkeypatch, log):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    src = Path(shapes_detect).parent / "images" / "val"
    results = _run(detector, src, tmp_path, "view", "--view-img", "--nosave")
    assert len(results) > 1
    assert sum("--view-img" in r.message for r in log.records) == 1


def test_classifier_csv_has_the_top1_of_each_image(shapes_classify, tmp_path):
    torch.manual_seed(0)
    model = ClassificationModel("yolov8n-cls.yaml", nc=3)
    model.names = dict(NAMES)
    weights = tmp_path / "cls.pt"
    torch.save({"model": model_to_ckpt(model)}, weights)
    src = next((Path(shapes_classify) / "val").iterdir())
    opt = cls_predict.parse_opt(["--weights", str(weights), "--source", str(src), "--imgsz", "64", "--device", "cpu",
                                 "--project", str(tmp_path), "--name", "exp", "--save-csv", "--save-txt", "--nosave"])
    results = cls_predict.main(opt)
    rows = _csv(tmp_path / "exp" / "predictions.csv")
    assert len(rows) == len(results) > 0
    for row in rows:
        top = (tmp_path / "exp" / "labels" / f"{Path(row['image']).stem}.txt").read_text().splitlines()[0].split()
        assert row["class"] == top[1] and abs(float(row["confidence"]) - float(top[0])) < 0.01
        assert row["x1"] == ""
