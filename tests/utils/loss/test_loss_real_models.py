"""Each criterion on a real model from models/ in train mode, backpropagated (skipped until models/ exists)."""

import pytest
import torch
from loss_fakes import box_masks, missing_grads

from data.targets import Targets
from losses import REGISTRY

yolo = pytest.importorskip("models.yolo", reason="models/yolo.py is not there yet")
HYP_V5 = {"box": 0.05, "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}
HYP_V8 = {"box": 7.5, "cls": 0.5, "dfl": 1.5}
HYP_POSE = {**HYP_V8, "pose": 12.0, "kobj": 1.0}

CASES = [  # (model class, yaml, hyp, expected criterion name)
    ("DetectionModel", "yolov5n.yaml", HYP_V5, "v5"),
    ("DetectionModel", "yolov7-tiny.yaml", HYP_V5, "ota"),
    ("DetectionModel", "yolov8n.yaml", HYP_V8, "v8"),
    ("SegmentationModel", "yolov5n-seg.yaml", HYP_V5, "v5seg"),
    ("SegmentationModel", "yolov8n-seg.yaml", HYP_V8, "v8seg"),
    ("PoseModel", "yolov8n-pose.yaml", HYP_POSE, "v8pose"),
]


def build(cls_name, cfg, **kw):
    torch.manual_seed(0)
    try:
        return getattr(yolo, cls_name)(cfg, **kw).train()
    except FileNotFoundError:
        pytest.skip(f"{cfg} is not in models/ yet")


@pytest.mark.parametrize("cls_name,cfg,hyp,name", CASES)
def test_criterion_on_real_model(cls_name, cfg, hyp, name):
    model = build(cls_name, cfg, nc=3)
    crit = model.init_criterion(hyp, imgsz=64)
    assert type(crit) is REGISTRY[name]
    img = torch.rand(2, 3, 64, 64)
    kpts = torch.rand(3, 17, 3).round() if "pose" in name else None  # visibility 0 or 1, x y anywhere
    targets = Targets.from_rows(torch.tensor([[0, 0, 0.30, 0.40, 0.25, 0.30], [0, 2, 0.70, 0.65, 0.40, 0.35],
                                              [1, 1, 0.50, 0.50, 0.60, 0.50]]), (64, 64), keypoints=kpts)
    batch = {"img": img, "targets": targets}
    if "seg" in name:
        batch["masks"], batch["overlap"] = box_masks(targets, 2, (16, 16)), True
    loss, items = crit(model(img), batch)
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss) and items.shape == (len(crit.loss_names),)
    assert torch.allclose(loss, items.sum() * 2)
    assert missing_grads(model.model[-1]) == []


@pytest.mark.parametrize("cls_name,cfg,hyp,name", CASES)
def test_real_model_head_grads_without_targets(cls_name, cfg, hyp, name):
    model = build(cls_name, cfg, nc=3)
    crit = model.init_criterion(hyp, imgsz=64)
    targets = Targets.from_rows(torch.zeros(0, 6), (64, 64), keypoints=torch.zeros(0, 17, 3))
    batch = {"img": torch.rand(2, 3, 64, 64), "targets": targets, "masks": torch.zeros(2, 16, 16), "overlap": True}
    crit(model(batch["img"]), batch)[0].backward()
    assert missing_grads(model.model[-1]) == []


def test_classification_model():
    model = build("ClassificationModel", "yolov8n-cls.yaml", nc=5)
    crit = model.init_criterion({"label_smoothing": 0.1})
    assert type(crit) is REGISTRY["cls"]
    img = torch.rand(4, 3, 64, 64)
    loss, items = crit(model(img), {"img": img, "cls": torch.tensor([0, 1, 4, 2])})
    loss.backward()
    assert torch.isfinite(loss) and items.shape == (1,)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
