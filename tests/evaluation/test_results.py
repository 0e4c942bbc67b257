"""evaluation/results.Results: what Ultralytics' users read of a prediction. The geometry is checked against
hand-computed values, and against Ultralytics 8.4's own Results of the same boxes
(tests/models/fixtures/make_predict_defaults.py: its xywh, xyxyn, xywhn, summary() and save_txt lines for an
Ultralytics-trained checkpoint on a COCO128 photo)."""

import builtins
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from evaluation.fields import Boxes, ClassScores, Keypoints, Masks, Predictions
from evaluation.results import MissingPackage, Results

FIXTURE = json.loads((Path(__file__).parents[1] / "models" / "fixtures" / "ultralytics-predict-defaults.json")
                     .read_text())
NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}
H, W = 100, 200
ROWS = torch.tensor([[10.0, 20, 50, 80, 0.9, 1], [0, 0, 100, 40, 0.5, 0]])


def detections(rows=ROWS, shape=(H, W), **kw):
    return Results(np.zeros((*shape, 3), np.uint8), "/x/im.jpg", NAMES, (Boxes(),), Predictions(rows), **kw)


def test_boxes_in_every_form_indexing_and_iteration():
    r = detections()
    b = r.boxes
    assert torch.equal(b.xyxy, ROWS[:, :4]) and b.conf.tolist() == pytest.approx([0.9, 0.5])
    assert b.cls.tolist() == [1, 0]
    torch.testing.assert_close(b.xywh, torch.tensor([[30.0, 50, 40, 60], [50, 20, 100, 40]]))
    torch.testing.assert_close(b.xyxyn, ROWS[:, :4] / torch.tensor([W, H, W, H]))
    torch.testing.assert_close(b.xywhn, torch.tensor([[0.15, 0.5, 0.2, 0.6], [0.25, 0.2, 0.5, 0.4]]))
    assert b.id is None and not b.is_track and b.data.shape == (2, 6) and len(b) == len(r) == 2
    assert b[0].xyxy.shape == (1, 4) and b[-1].cls.tolist() == [0]  # one row stays a table, as Ultralytics'
    assert [box.cls.item() for box in b] == [1, 0] and len(b[b.conf > 0.6]) == 1
    assert r[1].boxes.cls.tolist() == [0] and r.orig_shape == (H, W) and r.path == "/x/im.jpg"


def test_track_ids_go_into_data_before_conf_as_ultralytics_lays_them():
    r = detections(id=torch.tensor([7, 3]))
    assert r.boxes.is_track and r.boxes.data[:, 4].tolist() == [7, 3] and r.boxes.data.shape == (2, 7)
    assert r.boxes[1].id.tolist() == [3] and r[0].boxes.id.tolist() == [7]
    assert [row["track_id"] for row in r.summary()] == [7, 3]
    n = r.numpy()
    assert isinstance(n.boxes.data, np.ndarray) and n.boxes.data[:, 4].tolist() == [7, 3]


def test_conversions_keep_the_values():
    r = detections()
    n = r.numpy()
    assert isinstance(n.boxes.xyxy, np.ndarray) and np.allclose(n.boxes.xywhn, r.boxes.xywhn.numpy())
    assert isinstance(r.cpu().boxes.xyxy, torch.Tensor) and r.to("cpu", torch.float64).boxes.xyxy.dtype == torch.float64
    assert n.boxes[0].xyxy.shape == (1, 4) and isinstance(r.boxes.numpy().conf, np.ndarray)
    assert n.summary() == r.summary()  # what a numpy record writes is the tensors'


def test_the_same_boxes_read_as_ultralytics_reads_them(tmp_path):
    """Ultralytics' Results of its own boxes (the fixture) and ours of the same rows: xywh, xyxyn, xywhn, summary (plain
    and normalised) and the save_txt lines with confidences."""
    ref = FIXTURE["results"]
    rows = torch.tensor(FIXTURE["images"][ref["image"]])
    h, w = 312, 460  # 000000000560.jpg's size (the fixture's xyxy / xyxyn say so too)
    r = detections(rows, (h, w))
    for key in ("xywh", "xyxyn", "xywhn"):
        torch.testing.assert_close(getattr(r.boxes, key), torch.tensor(ref[key]), atol=1e-5, rtol=1e-6)
    assert r.summary() == ref["summary"] and r.summary(normalize=True) == ref["summary_normalized"]
    assert json.loads(r.to_json()) == ref["summary"]
    f = tmp_path / "labels" / "x.txt"
    assert r.save_txt(f, save_conf=True) == str(f)
    assert f.read_text().splitlines() == ref["save_txt_conf"]


def test_plot_draws_a_copy_and_save_and_crops_write_files(tmp_path):
    r = detections()
    drawn = r.plot()
    assert drawn.shape == (H, W, 3) and drawn.any() and not r.orig_img.any()  # the original stays as read
    assert (drawn != r.plot(labels=False)).any() and not r.plot(boxes=False).any()
    thin, thick = r.plot(line_width=1, labels=False), r.plot(line_width=5, labels=False)
    assert (thin > 0).sum() < (thick > 0).sum()
    f = r.save(tmp_path / "a.jpg")
    assert f == str(tmp_path / "a.jpg") and cv2.imread(f).shape == (H, W, 3)
    r.save_crop(tmp_path / "crops", file_name="im.jpg")
    crop = cv2.imread(str(tmp_path / "crops" / "rectangle" / "im.jpg"))
    # the box (10, 20)-(50, 80) grown by 2 % and 10 px about its centre (30, 50): x 4.6-55.4, y 14.4-85.6, truncated
    assert crop.shape[:2] == (85 - 14, 55 - 4)
    assert (tmp_path / "crops" / "circle" / "im.jpg").is_file()


def test_masks_keypoints_and_probs():
    masks = torch.zeros(2, H, W, dtype=torch.bool)
    masks[0, 20:80, 10:50] = True
    rows = torch.cat([ROWS, torch.tensor([[20.0, 30, 0.9, 40, 50, 0.2], [1, 2, 0.8, 3, 4, 0.7]])], 1)
    r = Results(np.zeros((H, W, 3), np.uint8), "im.jpg", NAMES, (Boxes(), Masks(), Keypoints((2, 3))),
                Predictions(rows, masks=masks))
    xy = r.masks.xy
    assert len(xy) == 2 and len(xy[1]) == 0 and r.masks.data.shape == (2, H, W)
    assert (xy[0].min(0).tolist(), xy[0].max(0).tolist()) == ([10, 20], [49, 79])  # the mask's outline, in pixels
    assert np.allclose(r.masks.xyn[0].max(0), [49 / W, 79 / H])
    k = r.keypoints
    assert k.data.shape == (2, 2, 3) and k.xy[0].tolist() == [[20, 30], [40, 50]]
    assert k.conf[0].tolist() == pytest.approx([0.9, 0.2]) and k.xyn[0, 1].tolist() == pytest.approx([0.2, 0.5])
    row = r.summary()[0]
    assert row["keypoints"] == {"x": [20, 40], "y": [30, 50], "visible": [0.9, 0.2]}
    assert set(row["segments"]) == {"x", "y"}
    assert r[0].masks.data.shape == (1, H, W) and r[0].keypoints.data.shape == (1, 2, 3)
    p = Results(np.zeros((64, 64, 3), np.uint8), "c.jpg", NAMES, (ClassScores(NAMES),),
                Predictions(probs=torch.tensor([0.2, 0.1, 0.7])))
    assert p.boxes is None and p.masks is None and p.keypoints is None
    assert (p.probs.top1, p.probs.top5, float(p.probs.top1conf)) == (2, [2, 0, 1], pytest.approx(0.7))
    assert p.summary() == [{"name": "triangle", "class": 2, "confidence": 0.7}]
    assert p.plot().any()


def test_to_df_is_a_table_and_one_line_without_pandas(monkeypatch):
    r = detections()
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass
    else:
        df = r.to_df()
        assert list(df["name"]) == ["rectangle", "circle"] and list(df["class"]) == [1, 0]
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__",
                        lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name)) if name == "pandas" else
                        real(name, *a, **k))
    with pytest.raises(MissingPackage, match=r"^to_df\(\) needs pandas: pip install pandas"):
        r.to_df()
