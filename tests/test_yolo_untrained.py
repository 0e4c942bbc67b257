"""`YOLO("yolov8n.yaml")` and `yolo predict model=yolov8n.yaml`: Ultralytics 8.4 builds the YAML's model with random
weights and predicts, validates and exports it without a word (checked with the peers' venv: 4 Results for
data/images, no error); so do we, with one warning that the weights are untrained (yolo/untrained.py). The
untrained model's boxes are those of the same weights saved by hand and read as any .pt."""

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from evaluation.results import Results
from models.checkpoints import model_to_ckpt
from utils.files import ROOT
from yolo import YOLO

IMAGE = ROOT / "data" / "images" / "shapes1.jpg"
CONF = 1e-4  # untrained scores are tiny: this keeps boxes to compare


def by_hand(model, tmp_path):
    """The same weights as YOLO(yaml)'s model, saved here as a checkpoint of ours."""
    f = tmp_path / "same.pt"
    torch.save({"model": model_to_ckpt(model._net(), half=False)}, f)
    return YOLO(f)


def test_a_yaml_predicts_with_its_untrained_weights_and_says_so(tmp_path, yolo_log):
    torch.manual_seed(0)
    model = YOLO("yolov8n.yaml")
    assert model.names == {i: str(i) for i in range(80)}  # as Ultralytics names a YAML's classes
    listed = model.predict(str(IMAGE.parent), imgsz=64, conf=CONF)
    assert len(listed) == 4 and all(isinstance(r, Results) for r in listed)
    ref = by_hand(model, tmp_path).predict(str(IMAGE.parent), imgsz=64, conf=CONF)
    assert sum(len(r.boxes) for r in ref) > 0
    for ours, theirs in zip(listed, ref):
        torch.testing.assert_close(ours.boxes.data, theirs.boxes.data)
    rgb = np.asarray(Image.open(IMAGE).convert("RGB"))
    inmemory = model.predict(rgb, imgsz=64, conf=CONF)[0]
    torch.testing.assert_close(inmemory.boxes.data, by_hand(model, tmp_path).predict(rgb, imgsz=64,
                                                                                     conf=CONF)[0].boxes.data)
    said = [m for m in yolo_log if "untrained (random) weights" in m]
    assert len(said) == 1 and said[0].startswith("yolov8n.yaml: ")


def test_streamed_and_segmentation_yamls_run_too():
    model = YOLO("yolov8n-seg.yaml")
    stream = model.predict(str(IMAGE), imgsz=64, conf=CONF, stream=True)
    assert not isinstance(stream, list)
    (r,) = list(stream)
    assert r.masks is not None and r.masks.data.shape[0] == len(r.boxes) > 0


def test_fuse_before_predict_keeps_the_unfused_checkpoint(tmp_path):
    model = YOLO("yolov8n.yaml")
    ref = by_hand(model, tmp_path).predict(str(IMAGE), imgsz=64, conf=CONF)[0]
    model.fuse()
    got = model.predict(str(IMAGE), imgsz=64, conf=CONF)[0]
    torch.testing.assert_close(got.boxes.data, ref.boxes.data, atol=1e-4, rtol=1e-4)


def test_its_passing_folder_goes_with_it():
    model = YOLO("yolov5n.yaml")
    folder = Path(model._weights()).parent
    assert folder.is_dir()
    del model
    gc.collect()
    assert not folder.exists()


def test_export_lands_in_the_working_folder_named_after_the_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = YOLO("yolov8n.yaml").export(format="torchscript", imgsz=64)
    assert f == str(tmp_path / "yolov8n.torchscript") and Path(f).is_file()
    (r,) = YOLO(f).predict(str(IMAGE), imgsz=64, conf=CONF)
    assert r.boxes.data.shape[1] == 6


def test_the_command_runs_a_yaml_and_its_errors_name_the_yaml(tmp_path, shapes_detect):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "yolo"]
    r = subprocess.run(["timeout", "300", *run, "predict", "model=yolov8n.yaml", f"source={IMAGE}", "imgsz=64"],
                       cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "untrained (random) weights" in r.stderr + r.stdout, r.stderr[-2000:]
    r = subprocess.run(["timeout", "300", *run, "val", "model=yolov8n.yaml", f"data={shapes_detect}", "imgsz=64",
                        "workers=0"], cwd=tmp_path, env=env, capture_output=True, text=True)
    error = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and error.startswith("error: --weights yolov8n.yaml (untrained) predicts 80 classes"), \
        r.stderr[-2000:]


@pytest.mark.parametrize("yaml", ["yolov8n.yaml", "yolov8n-cls.yaml"])
def test_train_from_a_yaml_then_the_object_is_its_run(yaml, shapes_detect, shapes_classify, tmp_path):
    data = shapes_classify if "cls" in yaml else shapes_detect
    model = YOLO(yaml)
    model.train(data=str(data), epochs=1, imgsz=32 if "cls" in yaml else 64, batch=8, workers=0, device="cpu",
                project=str(tmp_path), name="run", noplots=True)
    assert model.model == str(tmp_path / "run" / "weights" / "best.pt") and model._untrained is None
    assert len(model.predict(str(IMAGE))) == 1


def test_the_apis_errors_name_the_yaml_too(shapes_detect, tmp_path):
    from utils.errors import BadCheckpoint

    with pytest.raises(BadCheckpoint, match=r"^--weights yolov8n.yaml \(untrained\) predicts 80 classes"):
        YOLO("yolov8n.yaml").val(data=str(shapes_detect), imgsz=64, workers=0, project=str(tmp_path))
