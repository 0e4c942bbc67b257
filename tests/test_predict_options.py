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
from utils.errors import BadOption

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
    from utils.log import LOGGER

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


@pytest.mark.parametrize("script", ["detect", "segment.predict", "pose.predict", "classify.predict"])
def test_predict_runs_a_pt_in_fp32_unless_bf16_is_asked(script, tmp_path, monkeypatch):
    """Issue 46: on a CPU with native bf16 a .pt predicts in fp32 by default, as its exports do (bf16 autocast had
    given other boxes than the .onnx); `--amp bf16` still asks for bf16. Recorded for each prediction: the output
    dtype of its first convolution (the stem) and whether any convolution ran under autocast (the box decoding's DFL
    conv leaves autocast on purpose: models/heads.no_autocast)."""
    import importlib

    from models.backend import InferenceBackend
    from models.yolo import PoseModel, SegmentationModel
    from utils import torch_utils

    monkeypatch.setattr(torch_utils, "cpu_bf16_native", lambda *a: True)  # as on a CPU with AMX or AVX512-BF16
    monkeypatch.setattr(torch_utils, "cpu_bf16_flags", lambda *a: ("amx_bf16",))
    model = {"detect": lambda: DetectionModel("yolov8n.yaml", nc=3), "segment.predict": lambda: SegmentationModel(
        "yolov8n-seg.yaml", nc=3), "pose.predict": lambda: PoseModel("yolov8n-pose.yaml", nc=1, kpt_shape=(4, 3)),
             "classify.predict": lambda: ClassificationModel("yolov8n-cls.yaml", nc=3)}[script]()
    weights, source = tmp_path / "m.pt", tmp_path / "im.jpg"
    torch.save({"model": model_to_ckpt(model)}, weights)
    cv2.imwrite(str(source), np.random.default_rng(0).integers(0, 255, (64, 80, 3), np.uint8))
    module = importlib.import_module(script)
    runs = []  # per prediction: [stem output dtype, any conv under autocast]
    forward = InferenceBackend.forward

    def predict(self, im):  # convolutions outside it build the model (its stride probe), not predictions
        runs.append([None, False])
        return forward(self, im)

    def record(m, inputs, output):
        if isinstance(m, torch.nn.Conv2d) and runs:
            runs[-1][0] = runs[-1][0] or output.dtype
            runs[-1][1] |= torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(InferenceBackend, "forward", predict)
    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        for amp, expected in (([], [torch.float32, False]), (["--amp", "bf16"], [torch.bfloat16, True])):
            runs.clear()
            module.main(module.parse_opt(["--weights", str(weights), "--source", str(source), "--imgsz", "64",
                                          "--device", "cpu", "--project", str(tmp_path), "--nosave", *amp]))
            assert runs and all(r == expected for r in runs), (amp, runs)
    finally:
        handle.remove()


@pytest.mark.parametrize("flag", ["--save-crop", "--save-conf", "--hide-labels", "--hide-conf"])
def test_a_classifier_refuses_the_box_flags_it_would_not_read(flag):
    """A classifier's result is the whole image's top 5: no box to crop or label, no confidence column to add. Its
    parser leaves those flags out (a user error: one line, exit 2), while the box tasks keep them."""
    with pytest.raises(BadOption, match=f"unrecognized arguments: {flag}"):
        cls_predict.parse_opt(["--weights", "x.pt", flag])
    opt = cls_predict.parse_opt(["--weights", "x.pt"])
    assert not (opt.save_crop or opt.save_conf or opt.hide_labels or opt.hide_conf)
    assert getattr(detect.parse_opt(["--weights", "x.pt", flag]), flag[2:].replace("-", "_")) is True
