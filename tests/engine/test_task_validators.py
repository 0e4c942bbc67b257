"""Pieces of the task hooks (engine/tasks/) checked on their own, without a model or a dataset."""

import torch

from engine.tasks.detect import DetectionValidator
from engine.tasks.pose import keypoint_txt_lines
from engine.validator import ValOptions


def test_json_category_ids_are_class_indices_past_a_thousand(tmp_path):
    """--save-json writes each class index as its category id, for any class count (a fixed map of 1000 ids used
    to end a 1200-class validation with an IndexError)."""
    validator = DetectionValidator(ValOptions(imgsz=64), tmp_path, {i: f"c{i}" for i in range(1200)})
    predn = torch.tensor([[1.0, 2.0, 11.0, 12.0, 0.9, 1100.0], [0.0, 0.0, 4.0, 4.0, 0.5, 3.0]])
    rows = validator.pred_to_json(None, predn, {"paths": ["images/val/7.jpg"]}, 0)
    assert [(r["image_id"], r["category_id"], r["bbox"]) for r in rows] == [(7, 1100, [1.0, 2.0, 10.0, 10.0]),
                                                                          (7, 3, [0.0, 0.0, 4.0, 4.0])]


def test_keypoint_txt_lines():
    """The --save-txt line of a pose detection, by hand: an image 200 wide and 100 high, box (20, 10)-(60, 50),
    keypoints (40, 30) visible 0.8 and (100, 50) visible 1."""
    det = torch.tensor([[20.0, 10.0, 60.0, 50.0, 0.9, 2.0]])
    kpts = torch.tensor([[[40.0, 30.0, 0.8], [100.0, 50.0, 1.0]]])
    assert keypoint_txt_lines(det, kpts, (100, 200), conf=True) == ["2 0.2 0.3 0.2 0.4 0.2 0.3 0.8 0.5 0.5 1 0.9\n"]
    assert keypoint_txt_lines(det, kpts[..., :2], (100, 200), conf=False) == ["2 0.2 0.3 0.2 0.4 0.2 0.3 0.5 0.5\n"]
