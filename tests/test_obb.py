"""Oriented boxes end to end on CPU: obb/train.py for one epoch at 64 px on a synthetic obb set -> obb/val.py
(rotated-box mAP, DOTA-style --save-txt and JSON) -> obb/predict.py (corners written) -> export.py, whose ONNX and
TorchScript files give obb/predict.py the .pt's rotated boxes; and the `yolo obb` names."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from data.synthetic import CLASS_NAMES, generate_dataset
from utils.files import ROOT


@pytest.fixture(scope="module")
def obb_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("obb")
    generate_dataset(root / "data", task="obb", n_train=8, n_val=4, seed=0, min_side=96, max_side=128, max_objects=4)
    data = root / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(root / "data"), "train": "images/train", "val": "images/val",
                                    "names": dict(enumerate(CLASS_NAMES))}))
    from obb import train as obb_train

    opt = obb_train.parse_opt(["--data", str(data), "--img", "64", "--epochs", "1", "--batch-size", "4", "--workers",
                               "0", "--device", "cpu", "--project", str(root / "runs"), "--name", "exp"])
    trainer, _ = obb_train.main(opt)
    return trainer, data


def test_train_writes_the_obb_run(obb_run):
    trainer, _ = obb_run
    d = trainer.save_dir
    for f in ("weights/last.pt", "weights/best.pt", "results.csv", "val_batch0_pred.jpg"):
        assert (d / f).is_file(), f
    header = (d / "results.csv").read_text().splitlines()[0].replace(" ", "").split(",")
    assert {"train/box_loss", "train/angle_loss", "val/angle_loss", "metrics/mAP50(B)", "metrics/mAP50-95(B)"} <= \
        set(header)
    from models.checkpoints import attempt_load

    model = attempt_load(d / "weights" / "best.pt")
    assert type(model).__name__ == "OBBModel" and model.output_layout.angle and model.model[-1].task == "obb"


def test_val_and_predict_write_dota_rows(obb_run, tmp_path):
    from obb import predict as obb_predict
    from obb import val as obb_val

    trainer, data = obb_run
    best = trainer.save_dir / "weights" / "best.pt"
    stats = obb_val.main(obb_val.parse_opt(["--weights", str(best), "--data", str(data), "--img", "64", "--device",
                                            "cpu", "--project", str(tmp_path / "val"), "--save-txt", "--save-json"]))
    assert {"metrics/mAP50(B)", "metrics/mAP50-95(B)"} <= set(stats)
    saved = [line.split() for f in (tmp_path / "val" / "exp" / "labels").glob("*.txt") for line in
             f.read_text().splitlines()]
    assert saved and all(len(v) == 1 + 8 + 1 for v in saved)  # cls, four corners, conf
    rows = json.loads((tmp_path / "val" / "exp" / "predictions.json").read_text())
    assert rows and {"image_id", "category_id", "score", "rbox", "poly"} <= set(rows[0])
    assert len(rows[0]["rbox"]) == 5 and len(rows[0]["poly"]) == 8
    source = data.parent / "data" / "images" / "val"
    obb_predict.main(obb_predict.parse_opt([
        "--weights", str(best), "--source", str(source), "--img", "64", "--project", str(tmp_path / "pred"),
        "--device", "cpu", "--save-txt", "--conf-thres", "0.001", "--max-det", "5"]))
    from yolo import YOLO

    r = YOLO(str(best)).predict(str(source), imgsz=64, conf=0.001, max_det=5, device="cpu")[0]
    # Ultralytics' names: r.obb, and no r.boxes
    assert r.boxes is None and r.obb.xywhr.shape == (len(r), 5) and r.obb.xyxyxyxy.shape == (len(r), 4, 2)
    assert r.obb.numpy().xyxy.shape == (len(r), 4) and r.obb[0].cls.shape == (1,)
    lines = [line.split() for f in (tmp_path / "pred" / "exp" / "labels").glob("*.txt")
             for line in f.read_text().splitlines()]
    assert lines and all(len(v) == 9 for v in lines)  # the label format: cls and four corners


def _labels(folder):
    return {f.stem: [list(map(float, line.split())) for line in f.read_text().splitlines()]
            for f in sorted(folder.glob("*.txt"))}


def same_box(a, b, tol=1e-4):
    """Two label lines (cls, four corners, conf) of the same class, confidence and rectangle: the corners may start
    at another corner (a square-ish box's regularised angle may land either side of a quarter turn)."""
    ca, cb = np.array(a[1:9]).reshape(4, 2), np.array(b[1:9]).reshape(4, 2)
    corners = np.linalg.norm(ca[:, None] - cb[None], axis=-1).min(1).max()
    return a[0] == b[0] and abs(a[9] - b[9]) < tol and corners < tol


def test_exports_give_the_pt_rotated_boxes(obb_run, tmp_path):
    """export.py's ONNX and TorchScript files, run by obb/predict.py, write the .pt's rotated boxes. The class
    branch's last convolution is redrawn first, so that confidences differ from anchor to anchor, and NMS keeps every
    box (--iou-thres 1): after one epoch the boxes pile up, and pairs at NMS's threshold would flip on rounding."""
    pytest.importorskip("onnxruntime")
    from obb import predict as obb_predict

    trainer, data = obb_run
    weights = tmp_path / "best.pt"
    ckpt = torch.load(trainer.save_dir / "weights" / "best.pt", weights_only=True)
    head = max(int(k.split(".")[1]) for k in ckpt["model"]["state_dict"] if k.startswith("model."))
    for k, v in ckpt["model"]["state_dict"].items():
        if k.startswith(f"model.{head}.cv3.") and ".2." in k:
            spread = 2 if k.endswith("bias") else 0.2
            v.copy_(torch.randn(v.shape, generator=torch.Generator().manual_seed(2)) * spread)
    torch.save(ckpt, weights)
    cmd = [sys.executable, str(ROOT / "export.py"), "--weights", str(weights), "--include", "onnx", "torchscript",
           "--img", "64", "--device", "cpu"]
    subprocess.run(cmd, check=True, timeout=300, cwd=tmp_path, capture_output=True, text=True)
    source = data.parent / "data" / "images" / "val"
    runs = {}
    for suffix in (".pt", ".onnx", ".torchscript"):
        obb_predict.main(obb_predict.parse_opt([
            "--weights", str(weights.with_suffix(suffix)), "--source", str(source), "--img", "64", "--device", "cpu",
            "--save-txt", "--save-conf", "--nosave", "--conf-thres", "0.3", "--iou-thres", "1", "--project",
            str(tmp_path / "runs"), "--name", suffix[1:]]))
        runs[suffix] = _labels(tmp_path / "runs" / suffix[1:] / "labels")
    ref = runs[".pt"]
    assert sum(len(v) for v in ref.values()) >= 8
    for suffix in (".onnx", ".torchscript"):
        assert runs[suffix].keys() == ref.keys()
        for stem, rows in ref.items():
            assert len(runs[suffix][stem]) == len(rows)
            for row in runs[suffix][stem]:
                assert any(same_box(row, r) for r in rows), (suffix, stem, row)


def test_augment_is_refused():
    from models.tta import tta_layout
    from models.yolo import OBBModel
    from utils.errors import BadOption

    with pytest.raises(BadOption, match="oriented-box"):
        tta_layout(OBBModel("yolov8n-obb.yaml").output_layout)


def test_yolo_names_and_script_defaults():
    """`yolo obb ...` finds the obb scripts, a `-obb` model name is an obb model, and the scripts default to the
    synthetic shapes-obb set."""
    from data.dataset_yaml import find_dataset_yaml
    from engine.inherit import run_values
    from engine.options import OBBValOptions
    from obb import predict as obb_predict
    from obb import train as obb_train
    from obb import val as obb_val
    from utils.files import yaml_load
    from yolo.scripts import model_task, script_path

    assert model_task("yolov8n-obb.yaml") == model_task("yolo11s-obb.pt") == "obb"
    assert [script_path("obb", m) for m in ("train", "val", "predict")] == ["obb/train.py", "obb/val.py",
                                                                            "obb/predict.py"]
    opt = obb_train.parse_opt([]).opt
    assert (opt.data, opt.cfg) == ("data/shapes-obb.yaml", "yolov8n-obb.yaml")
    val_opt = OBBValOptions.from_cli(obb_val.parse_opt(["--weights", "w.pt"]))
    assert val_opt.data is None  # the weights' run's dataset, else obb's own
    assert run_values(val_opt, {}) == {"data": "data/shapes-obb.yaml", "imgsz": 320}
    assert obb_predict.parse_opt([]).weights == "runs/train-obb/exp/weights/best.pt"
    assert yaml_load(find_dataset_yaml(opt.data))["synthetic"]["task"] == "obb"


@pytest.mark.slow
def test_short_run_learns_rotated_boxes(tmp_path):
    """yolov8n-obb overfitting 8 images (validated on themselves) for 30 epochs of 4 optimizer steps, as the pose and
    segmentation learning tests (nbs 2, no warmup, no augmentation, AdamW at 0.002, BatchNorm momentum 0.3). Measured:
    rotated-box mAP50-95 0.0 after the first epoch, 0.32 after the 30th (mAP50 0.58); the angle loss 0.52 -> 0.10."""
    import csv

    generate_dataset(tmp_path / "data", task="obb", n_train=8, n_val=1, seed=0, min_side=96, max_side=120,
                     max_objects=3)
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path / "data"), "train": "images/train", "val": "images/train",
                                    "names": dict(enumerate(CLASS_NAMES))}))
    hyp = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.v8.yaml").read_text())
    hyp.update(lr0=0.002, nbs=2, warmup_epochs=0.0, mosaic=0.0, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0,
               hsv_s=0.0, hsv_v=0.0, close_mosaic=0)
    (tmp_path / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    cfg = yaml.safe_load((ROOT / "models" / "yolov8-obb.yaml").read_text())
    cfg.update(scale="n", bn_momentum=0.3)
    (tmp_path / "yolov8n-obb.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    from obb import train as obb_train

    trainer, _ = obb_train.main(obb_train.parse_opt([
        "--data", str(data), "--cfg", str(tmp_path / "yolov8n-obb.yaml"), "--hyp", str(tmp_path / "hyp.yaml"),
        "--img", "96", "--batch-size", "2", "--epochs", "30", "--optimizer", "AdamW", "--workers", "0", "--device",
        "cpu", "--project", str(tmp_path / "runs"), "--name", "exp"]))
    rows = [{k.strip(): float(v) for k, v in r.items()} for r in csv.DictReader(open(trainer.save_dir / "results.csv"))]
    assert rows[-1]["metrics/mAP50-95(B)"] > 0.15
    assert rows[-1]["train/angle_loss"] < 0.5 * rows[0]["train/angle_loss"]


@pytest.mark.ddp
@pytest.mark.slow
def test_torchrun_two_ranks_obb(tmp_path):
    """2 ranks with gloo: identical weights on both ranks, only rank 0 saves, the angle loss and rotated-box metrics
    logged; then obb/val.py sharded over 2 ranks gives the single-process metrics."""
    from obb import val as obb_val
    from tests.test_ddp import DRIVER, plain_hyp, sharded_val, torchrun

    generate_dataset(tmp_path / "data", task="obb", n_train=8, n_val=4, seed=0, min_side=96, max_side=128)
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path / "data"), "train": "images/train", "val": "images/val",
                                    "names": dict(enumerate(CLASS_NAMES))}))
    project = tmp_path / "runs"
    args = ["--data", str(data), "--cfg", "yolov8n-obb.yaml", "--imgsz", "64", "--batch-size", "4", "--epochs", "1",
            "--workers", "0", "--device", "cpu", "--project", str(project), "--name", "exp",
            "--hyp", str(plain_hyp(tmp_path, "hyp.v8.yaml")), "--sync-bn"]  # BatchNorm statistics the same on both
    r = torchrun([str(DRIVER), "obb", *args], ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    exp = project / "exp"
    hashes = [(exp / f"weights_rank{i}.sha").read_text() for i in range(2)]
    assert hashes[0] == hashes[1], "ranks ended with different weights"
    assert [(exp / f"saved_rank{i}.txt").read_text() for i in range(2)] == ["1", "0"]
    assert {"train/angle_loss", "metrics/mAP50-95(B)"} <= set((exp / "results.csv").read_text().replace(" ", "")
                                                              .splitlines()[0].split(","))
    val_args = ["--weights", str(exp / "weights" / "last.pt"), "--data", str(data), "--imgsz", "64", "--batch-size",
                "1", "--device", "cpu", "--workers", "0", "--conf", "0.0001", "--name", "exp"]
    ranks, single = sharded_val(tmp_path, "obb", obb_val, val_args)
    assert ranks == [single, single]
