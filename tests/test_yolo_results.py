"""What the `YOLO` methods return, as Ultralytics' users read it: val's metrics object (checked against Ultralytics'
own for the same checkpoint and images: tests/models/fixtures/make_val_metrics.py), predict's Results (a list, or a
generator with stream=True) and the files its save options write; the Ultralytics habit words; close matches."""

import importlib.util
import json
import re

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from data.synthetic import generate_dataset
from engine.callbacks import EVENTS
from evaluation.results import Results
from models.checkpoints import model_to_ckpt
from models.yolo import DetectionModel
from utils.errors import BadFile, BadModelYaml, BadOption
from utils.files import ROOT
from yolo import YOLO

FIXTURES = ROOT / "tests" / "models" / "fixtures"
PEER_VAL = json.loads((FIXTURES / "ultralytics-val-metrics.json").read_text())
IMAGE = ROOT / "data" / "images" / "shapes1.jpg"
CONF = 1e-4  # an untrained model's scores are tiny; this keeps plenty of boxes


@pytest.fixture(scope="module")
def peer_data(tmp_path_factory):
    """make_peer_trained.py's val split, regenerated and checked against the digest the figures were made on."""
    spec = importlib.util.spec_from_file_location("make_peer_trained", FIXTURES / "make_peer_trained.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    tmp = tmp_path_factory.mktemp("peer")
    root = generate_dataset(tmp / "shapes", **peer.DATA)
    assert peer.val_digest(root) == PEER_VAL["val_digest"], "the generator changed: rebuild the fixtures"
    data = tmp / "shapes.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                    "names": peer.NAMES}))
    return data


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=3)
    model.names = {0: "circle", 1: "rectangle", 2: "triangle"}
    f = tmp_path_factory.mktemp("w") / "best.pt"
    torch.save({"model": model_to_ckpt(model), "epoch": -1, "opt": {"imgsz": 64, "train_imgsz": 64}}, f)
    return f


def test_val_returns_ultralytics_metrics_object(peer_data, tmp_path):
    """The same model, images and settings as Ultralytics' val (imgsz 160, batch 16, iou 0.7): metrics.box.map,
    map50, map75, mp and mr within 0.005 of what Ultralytics' metrics object said, maps per class within 0.01."""
    m = YOLO(FIXTURES / "ultralytics-v8t-shapes.pt").val(data=str(peer_data), imgsz=160, batch=16, iou=0.7,
                                                          workers=0, device="cpu", project=str(tmp_path))
    for key in ("map", "map50", "map75", "mp", "mr"):
        assert abs(getattr(m.box, key) - PEER_VAL[key]) <= 0.005, (key, getattr(m.box, key), PEER_VAL[key])
    # per class, on 16 images, one box ranked otherwise moves an AP by about 0.01 (the means agree within 0.005)
    np.testing.assert_allclose(m.box.maps, PEER_VAL["maps"], atol=0.01)
    assert list(m.results_dict)[:5] == PEER_VAL["results_dict_keys"] and m.seg is None and m.pose is None
    assert m["metrics/mAP50-95(B)"] == m.box.map and m.fitness == m.results_dict["fitness"]
    assert set(m.speed) >= {"preprocess", "inference", "postprocess"} and m.names[0] == "circle"


def test_predict_stream_is_a_generator_of_results_and_save_options_write(untrained, tmp_path):
    model = YOLO(untrained)
    gen = model.predict(str(IMAGE.parent), stream=True, conf=CONF, save=True, save_txt=True, save_conf=True,
                        save_crop=True, line_width=1, max_det=5, project=str(tmp_path), name="p", verbose=False)
    assert not isinstance(gen, list) and iter(gen) is gen
    first = next(gen)
    rest = list(gen)
    assert isinstance(first, Results) and len(rest) == len(list(IMAGE.parent.glob("*.jpg"))) - 1
    assert 0 < len(first.boxes) <= 5 and set(first.speed) == {"preprocess", "inference", "postprocess"}
    assert not (first.orig_img == first.plot()).all()  # orig_img is the picture as read, not the drawn one
    out = tmp_path / "p"
    assert (out / first.path.split("/")[-1]).is_file() and any((out / "crops").rglob("*.jpg"))
    lines = (out / "labels" / f"{IMAGE.stem}.txt").read_text().splitlines()
    assert len(lines) == len([r for r in [first, *rest] if r.path.endswith(IMAGE.name)][0].boxes)
    assert len(lines[0].split()) == 6  # cls, xywh, conf


def test_predict_keywords_as_ultralytics_names_them(untrained, tmp_path):
    model = YOLO(untrained)
    rgb = np.asarray(Image.open(IMAGE).convert("RGB"))
    a = model.predict(str(IMAGE), conf=CONF, iou=0.5, classes=[1], max_det=3, imgsz=64)[0]
    assert len(a.boxes) <= 3 and set(a.boxes.cls.tolist()) <= {1.0}
    b = model.predict([rgb], conf=CONF, iou=0.5, classes=[1], max_det=3, imgsz=64)[0]
    torch.testing.assert_close(b.boxes.data, a.boxes.data, atol=0.05, rtol=0)  # JPEG decoders may differ slightly
    assert not (tmp_path / "runs").exists()  # nothing saved unless asked
    with pytest.raises(BadOption, match="did you mean conf="):
        model.predict(str(IMAGE), conff=0.3)
    with pytest.raises(BadOption, match="did you mean max_det"):
        model.predict([rgb], max_dets=3)


def test_predict_in_memory_values_of_another_kind_are_one_error_as_the_script_s(untrained):
    """imgsz=[480, 640] on an array raised TypeError from int() (a path's predict refuses it as --imgsz does); a
    number given as text is read as the script reads it."""
    model = YOLO(untrained)
    rgb = np.asarray(Image.open(IMAGE).convert("RGB"))
    for key, value, kind in [("imgsz", [480, 640], "whole number"), ("imgsz", "abc", "whole number"),
                             ("conf", "x", "number"), ("max_det", [3], "whole number"), ("iou", True, "number")]:
        said = f"predict on images in memory: {key}={value!r}: give one {kind}"
        with pytest.raises(BadOption, match=re.escape(said)):
            model.predict([rgb], **{key: value})
    a = model.predict([rgb], conf=CONF, max_det=3, imgsz=64)[0]
    b = model.predict([rgb], conf=str(CONF), max_det="3", imgsz="64")[0]
    assert torch.equal(a.boxes.data, b.boxes.data)


def test_model_names_info_fuse_and_callbacks(untrained):
    model = YOLO(untrained)
    assert model.names == {0: "circle", 1: "rectangle", 2: "triangle"}
    layers, params, _, _ = YOLO("yolov8n.yaml").info()
    assert layers == 23 and params == 3157200  # yolov8n at 80 classes, as Ultralytics counts it
    assert model.fuse() is model
    model.add_callback("on_train_end", print)
    assert model.callbacks == {"on_train_end": [print]}
    with pytest.raises(BadOption, match="did you mean 'on_train_end'|did you mean on_train_end"):
        model.add_callback("on_train_ends", print)
    assert "on_train_end" in EVENTS


def test_a_model_name_that_is_nothing_fails_at_construction_with_the_closest():
    with pytest.raises(BadModelYaml, match=r"did you mean yolov8n\.yaml\?"):
        YOLO("yolov8q.yaml")
    with pytest.raises(BadFile, match=r"did you mean yolov8n\.pt\?"):
        YOLO("yolov8q.pt")
