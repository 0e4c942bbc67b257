"""Pieces of the task hooks (engine/tasks/) checked on their own, without a model or a dataset."""

import types

import pytest
import torch

from engine.tasks import TASKS
from engine.validator import ValOptions
from utils.errors import BadCheckpoint
from utils.ops import OutputLayout

DetectionValidator = TASKS["detect"].validator


def test_json_category_ids_are_class_indices_past_a_thousand(tmp_path):
    """--save-json writes each class index as its category id, for any class count (a fixed map of 1000 ids used
    to end a 1200-class validation with an IndexError)."""
    validator = DetectionValidator(ValOptions(imgsz=64), tmp_path, {i: f"c{i}" for i in range(1200)})
    validator.init_metrics(types.SimpleNamespace(output_layout=OutputLayout(1200)))  # which declares the fields
    predn = torch.tensor([[1.0, 2.0, 11.0, 12.0, 0.9, 1100.0], [0.0, 0.0, 4.0, 4.0, 0.5, 3.0]])
    rows = validator.pred_to_json(None, predn, {"paths": ["images/val/7.jpg"]}, 0)
    assert [(r["image_id"], r["category_id"], r["bbox"]) for r in rows] == [(7, 1100, [1.0, 2.0, 10.0, 10.0]),
                                                                          (7, 3, [0.0, 0.0, 4.0, 4.0])]


def test_val_refuses_data_naming_the_weights_classes_in_another_order():
    """The same classes in another order (a dataset folder whose class order another version or tool gives): each
    predicted id would be scored against another class's labels; refused, naming the first. The same order, or
    names the weights do not know, pass under the dataset's names."""
    model = types.SimpleNamespace(nc=3, names={0: "car", 1: "person", 2: "dog"})
    options = types.SimpleNamespace(weights="best.pt", data="voc")
    with pytest.raises(BadCheckpoint, match=r"predicts 'car' as class 0, --data voc labels it 1 \(2 classes in "
                                            r"another order\); validate on data whose names follow the weights': car, "
                                            "person, dog"):
        DetectionValidator.val_names({"nc": 3, "names": {0: "person", 1: "car", 2: "dog"}}, model, options)
    for names in ({0: "car", 1: "person", 2: "dog"}, {0: "car", 1: "bus", 2: "cat"}):
        assert DetectionValidator.val_names({"nc": 3, "names": names}, model, options) == names
    twice = {0: "car", 1: "car", 2: "dog"}  # a name given twice tells no id: the run that made the weights read it so
    assert DetectionValidator.val_names({"nc": 3, "names": twice}, types.SimpleNamespace(nc=3, names=twice),
                                        options) == twice
    with pytest.raises(BadCheckpoint, match="predicts 'dog' as class 2, --data voc labels it 0"):
        DetectionValidator.val_names({"nc": 3, "names": {0: "dog", 1: "car", 2: "car"}},
                                     types.SimpleNamespace(nc=3, names=twice), options)
