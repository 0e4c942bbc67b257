"""Pieces of the task hooks (engine/tasks/) checked on their own, without a model or a dataset."""

import torch

from engine.tasks.detect import DetectionValidator
from engine.validator import ValOptions


def test_json_category_ids_are_class_indices_past_a_thousand(tmp_path):
    """--save-json writes each class index as its category id, for any class count (a fixed map of 1000 ids used
    to end a 1200-class validation with an IndexError)."""
    validator = DetectionValidator(ValOptions(imgsz=64), tmp_path, {i: f"c{i}" for i in range(1200)})
    predn = torch.tensor([[1.0, 2.0, 11.0, 12.0, 0.9, 1100.0], [0.0, 0.0, 4.0, 4.0, 0.5, 3.0]])
    rows = validator.pred_to_json(None, predn, {"paths": ["images/val/7.jpg"]}, 0)
    assert [(r["image_id"], r["category_id"], r["bbox"]) for r in rows] == [(7, 1100, [1.0, 2.0, 10.0, 10.0]),
                                                                          (7, 3, [0.0, 0.0, 4.0, 4.0])]
