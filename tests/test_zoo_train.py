"""The model zoo trains: one short run each (64 px, 1 epoch, 16 images) of a P6, a ghost, a transformer, a Swin V2
(attention) and a YOLOv7 P6 model in one process, and of YOLO11 under torchrun. The P2/P7 files' `anchors: 3`
placeholders are refitted by autoanchor: tests/models/test_autoanchor.py."""

import csv
import math
import os
import subprocess
import sys

import pytest
import torch
import yaml

import train
from models.checkpoints import attempt_load
from models.yolo import yaml_model_load
from tests.ddp_utils import free_port
from utils.files import ROOT

N_MULTIPLES = {"depth_multiple": 0.33, "width_multiple": 0.25}
CASES = {  # name: (cfg, YAML keys replaced: the one-size YAMLs at n's multiples)
    "yolov5n6": ("yolov5n6.yaml", None),
    "yolov8n-ghost": ("yolov8n-ghost.yaml", None),
    "yolov5s-transformer-n": ("yolov5s-transformer.yaml", N_MULTIPLES),
    "yolov8n-swinv2": ("yolov8n-swinv2.yaml", None),
    "yolov7-w6-narrow": ("yolov7-w6.yaml", {"width_multiple": 0.125}),  # trains its auxiliary head too
}


def _args(data, out, cfg):
    return ["--data", str(data), "--cfg", str(cfg), "--imgsz", "64", "--batch-size", "8", "--epochs", "1",
            "--workers", "0", "--device", "cpu", "--project", str(out), "--name", "exp", "--noplots"]


def _cfg(name, tmp_path):
    cfg, replace = CASES[name]
    if replace is None:
        return cfg
    d = {k: v for k, v in yaml_model_load(cfg).items() if k != "yaml_file"}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({**d, **replace}))
    return tmp_path / f"{name}.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_zoo_model_trains(name, shapes_detect, tmp_path):
    trainer, metrics = train.main(train.parse_opt(_args(shapes_detect, tmp_path / "runs", _cfg(name, tmp_path))))
    rows = list(csv.DictReader((trainer.save_dir / "results.csv").read_text().splitlines()))
    assert len(rows) == 1
    losses = [float(v) for k, v in rows[0].items() if k.strip().startswith("train/")]
    assert losses and all(math.isfinite(v) and v > 0 for v in losses)
    model = attempt_load(trainer.save_dir / "weights" / "best.pt")
    assert model.yaml["backbone"] == yaml_model_load(_cfg(name, tmp_path))["backbone"]
    head = model.model[-1]
    if getattr(head, "anchor_based", False):  # grid units: placeholders 0..5 divided by the stride are not anchors
        assert (head.anchors > 0).all() and not torch.equal(head.anchors[0].flatten() * head.stride[0],
                                                            torch.arange(6.0))
    with torch.no_grad():
        assert torch.isfinite(model(torch.rand(1, 3, 64, 64))[0]).all()


@pytest.mark.ddp
def test_yolo11_under_torchrun(shapes_detect, tmp_path):
    cmd = ["timeout", "400", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(ROOT / "train.py"), *_args(shapes_detect, tmp_path / "runs", "yolo11n.yaml")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "runs" / "exp" / "results.csv").read_text().splitlines()))
    assert len(rows) == 1 and math.isfinite(float(rows[0]["train/box_loss"]))
    assert type(attempt_load(tmp_path / "runs" / "exp" / "weights" / "best.pt").model[10]).__name__ == "C2PSA"
