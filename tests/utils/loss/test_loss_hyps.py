from pathlib import Path

import pytest
import torch
import yaml
from loss_fakes import det_batch, fake_model

from losses import build_criterion

HYPS = Path(__file__).resolve().parents[3] / "data" / "hyps"
TRAIN_KEYS = {"lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr",
              "lr_auto_gain", "label_smoothing", "hsv_h", "hsv_s", "hsv_v", "fliplr", "flipud", "scale"}
DETECT_KEYS = TRAIN_KEYS | {"box", "cls", "degrees", "translate", "shear", "perspective", "mosaic", "mixup",
                            "copy_paste", "close_mosaic"}
ANCHOR_KEYS = DETECT_KEYS | {"obj", "obj_pw", "cls_pw", "anchor_t", "fl_gamma"}
ANCHOR_FILES = ["hyp.scratch-low.yaml", "hyp.scratch-high.yaml", "hyp.v7.yaml", "hyp.v7-tiny.yaml"]


def load(name):
    return yaml.safe_load((HYPS / name).read_text())


def test_scratch_low_is_official():
    h = load("hyp.scratch-low.yaml")
    assert set(h) == ANCHOR_KEYS
    assert (h["lr0"], h["lrf"], h["box"], h["cls"], h["obj"], h["translate"], h["scale"], h["mixup"]) == (
        0.01, 0.01, 0.05, 0.5, 1.0, 0.1, 0.5, 0.0)
    assert h["close_mosaic"] == 0 and h["label_smoothing"] == 0.0


def test_v7_and_high_values():
    high, p5, tiny = load("hyp.scratch-high.yaml"), load("hyp.v7.yaml"), load("hyp.v7-tiny.yaml")
    assert (high["cls"], high["obj"], high["scale"], high["mixup"], high["copy_paste"]) == (0.3, 0.7, 0.9, 0.1, 0.1)
    assert (p5["lrf"], p5["translate"], p5["scale"], p5["mixup"]) == (0.1, 0.2, 0.9, 0.15)
    assert (tiny["lrf"], tiny["cls"], tiny["obj"], tiny["mixup"]) == (0.01, 0.5, 1.0, 0.05)
    assert "loss" not in p5 and "loss" not in tiny  # the head's default (OTA) decides


def test_v8_and_cls_values():
    v8, c = load("hyp.v8.yaml"), load("hyp.cls.yaml")
    # pose and kobj: the v8 pose criterion's gains; lr_new_gain: the step of a fine-tuning's new tensors
    assert set(v8) == DETECT_KEYS | {"dfl", "pose", "kobj", "lr_new_gain"}
    assert (v8["box"], v8["cls"], v8["dfl"], v8["close_mosaic"], v8["lr_new_gain"]) == (7.5, 0.5, 1.5, 10, 10.0)
    assert (v8["pose"], v8["kobj"]) == (12.0, 1.0)
    assert set(c) == TRAIN_KEYS
    assert (c["label_smoothing"], 1 - c["scale"], c["fliplr"]) == (0.1, pytest.approx(0.08), 0.5)


@pytest.mark.parametrize("name", ANCHOR_FILES)
def test_anchor_hyps_schema_and_criterion(name):
    h = load(name)
    assert set(h) == ANCHOR_KEYS
    model = fake_model("anchor", default_loss="ota" if "v7" in name else "v5")
    batch = det_batch()
    loss, _ = build_criterion(model, h, imgsz=64)(model(batch["img"]), batch)
    assert torch.isfinite(loss)


def test_v8_hyp_runs_v8_criterion():
    model = fake_model("free")
    batch = det_batch()
    loss, _ = build_criterion(model, load("hyp.v8.yaml"))(model(batch["img"]), batch)
    assert torch.isfinite(loss)
