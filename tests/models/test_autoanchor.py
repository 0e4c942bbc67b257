"""models/autoanchor.py: the `anchors: 3` placeholders of yolov5-p2 and -p7 are refitted to the labels."""

import warnings

import numpy as np
import pytest
import torch

from models.autoanchor import anchor_fit, check_anchors, head_anchors_px, label_sizes
from models.yolo import DetectionModel, yaml_model_load


@pytest.mark.parametrize("cfg, levels", [("yolov5-p2.yaml", 4), ("yolov5-p7.yaml", 5)])
def test_placeholder_anchors_are_fitted_to_the_labels(cfg, levels):
    """Placeholders 0..5 px (a 0-wide anchor among them) fit nothing: they are refitted without a numpy warning,
    smallest to the finest level, and written into the YAML the checkpoint keeps."""
    d = {**yaml_model_load(cfg), "depth_multiple": 0.33, "width_multiple": 0.25}
    model = DetectionModel(d, nc=3)
    assert d["anchors"] == 3 and (head_anchors_px(model.model[-1]).min(1) == 0).any()
    rng = np.random.default_rng(0)
    labels = [{"shape": (480, 640), "bboxes": np.c_[rng.uniform(0.2, 0.8, (20, 2)), rng.uniform(0.02, 0.5, (20, 2))]}
              for _ in range(10)]
    np.random.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_anchors(model, labels, {"anchor_t": 4.0}, 256)
    head = model.model[-1]
    px = head_anchors_px(head)
    assert px.shape == (levels * 3, 2) and (px >= 2.0).all()
    area = (head.anchors * head.stride.view(-1, 1, 1)).prod(-1)  # (levels, 3) in the head's level order
    assert (area[torch.argsort(head.stride)].flatten().diff() >= 0).all()
    assert len(model.yaml["anchors"]) == levels and all(len(a) == 6 for a in model.yaml["anchors"])
    bpr, _ = anchor_fit(label_sizes(labels, 256, np.random.default_rng(1)), px, 4.0)
    assert bpr > 0.98
