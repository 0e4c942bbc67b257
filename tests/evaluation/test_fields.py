"""The validator walks the fields its task declares (evaluation/fields.py): a field of one's own plugs in without a
subclass hook, and a validation in which no image has a prediction reports zeros for every field."""

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from data.targets import Targets
from engine.options import PoseValOptions, SegmentValOptions
from engine.tasks import TASKS
from engine.validator import ValOptions
from evaluation.fields import Boxes, Field, Keypoints, Predictions
from evaluation.metrics import DetMetrics
from utils.ops import OutputLayout

DetectionValidator = TASKS["detect"].validator
PoseValidator = TASKS["pose"].validator
SegmentationValidator = TASKS["segment"].validator

# one 64 x 64 image letterboxed from itself: labels of classes 0 and 1, boxes (8, 8)-(24, 24) and (32, 32)-(56, 48)
LABELS = torch.tensor([[0, 0, 16 / 64, 16 / 64, 16 / 64, 16 / 64], [0, 1, 44 / 64, 40 / 64, 24 / 64, 16 / 64]])


def _batch(**extra):
    targets = Targets.from_rows(LABELS, (64, 64), keypoints=extra.pop("keypoints", None))
    return {"img": torch.zeros(1, 3, 64, 64), "targets": targets, "shapes": [((64, 64), ((1.0, 1.0), (0.0, 0.0)))],
            "paths": ["/x/7.jpg"], **extra}


class Centers(Field):
    """A field of the test's own: a point per prediction (the rows' last two columns), matching a label of its class
    wherever the point lies inside the label's box, at every threshold."""

    key, metric, suffix, title, curve, iou_type = "tp_c", "centre", "C", "Ctr", "Ctr", "bbox"

    def match(self, image, native, labels, batch, si, iouv):
        xy = native[:, -2:]
        inside = ((xy[:, None] >= labels[None, :, 1:3]) & (xy[:, None] <= labels[None, :, 3:5])).all(2)
        hit = (inside & (native[:, None, 5] == labels[None, :, 0])).any(1)
        return hit[:, None].repeat(1, len(iouv))

    def txt_columns(self, native, shape):
        return native[:, -2:] / torch.tensor([shape[1], shape[0]])

    def to_json(self, rows, image, native, batch, si):
        for row, xy in zip(rows, native[:, -2:].tolist()):
            row["centre"] = xy
        return rows


# a task of one's own: the detection record with one more field
CentreValidator = dataclasses.replace(TASKS["detect"], fields=lambda names, layout, skeleton=None: (Boxes(),
                                                                                                   Centers())).validator


def test_a_field_of_one_s_own_plugs_in(tmp_path):
    """Boxes: the first prediction fits label 0 exactly, the second misses label 1. Points: the first lies outside
    label 0's box, the second inside label 1's; the third prediction (class 2) matches nothing."""
    v = CentreValidator(ValOptions(imgsz=64, save_txt=True, save_json=True), tmp_path, {0: "a", 1: "b", 2: "c"})
    v.init_metrics(SimpleNamespace(output_layout=OutputLayout(3)))
    rows = torch.tensor([[8.0, 8, 24, 24, 0.9, 0, 30, 30], [0, 0, 4, 4, 0.8, 1, 40, 40], [0, 0, 9, 9, 0.5, 2, 1, 1]])
    record = v.update_metrics([Predictions(rows)], _batch())
    assert record["tp"][0][:, 0].tolist() == [True, False, False]
    assert record["tp_c"][0][:, 0].tolist() == [False, True, False]
    stats = v.get_stats(record)
    assert [k for k in stats if k.endswith("(C)")] == [f"metrics/{k}(C)" for k in ("precision", "recall", "mAP50",
                                                                                  "mAP50-95")]
    assert v.metrics.centre.ap50.tolist() == [0.0, pytest.approx(0.995)]  # class a: missed, class b: found first
    assert "Ctr(P" in v.description()
    lines = (tmp_path / "labels" / "7.txt").read_text().splitlines()
    assert lines[1] == "1 0.03125 0.03125 0.0625 0.0625 0.625 0.625 0.8"
    assert json.loads(json.dumps(record["json"]))[1]["centre"] == [40.0, 40.0]


@pytest.mark.parametrize("task", ["segment", "pose"])
def test_no_prediction_in_any_image_scores_zero_for_every_field(tmp_path, task):
    """A model that predicts nothing above --conf (a fresh one, a high threshold): zeros, not a traceback."""
    if task == "segment":
        v = SegmentationValidator(SegmentValOptions(imgsz=64), tmp_path, {0: "a", 1: "b"})
        layout, batch = OutputLayout(2, nm=4, proto=(1,)), _batch(masks=torch.zeros(1, 16, 16), overlap=True)
        rows = torch.zeros(0, 10)
    else:
        v = PoseValidator(PoseValOptions(imgsz=64, kpt_shape=(4, 3)), tmp_path, {0: "a", 1: "b"})
        layout, batch = OutputLayout(2, kpt_shape=(4, 3)), _batch(keypoints=torch.rand(2, 4, 3))
        rows = torch.zeros(0, 18)
    v.init_metrics(SimpleNamespace(output_layout=layout))
    stats = v.get_stats(v.update_metrics([Predictions(rows)], batch))
    assert len(stats) == 9 and not any(stats.values())
    assert v.nt_per_class.tolist() == [1, 1]


def test_metrics_refuse_matches_of_another_count_of_parts():
    m = DetMetrics(parts=(("box", "B"), ("seg", "M")))
    with pytest.raises(ValueError, match="1 match arrays for the 2 parts"):
        m.process(np.zeros((1, 10), bool), np.ones(1), np.zeros(1), np.zeros(1))


def test_keypoint_lines():
    """The --save-txt line of a pose detection, by hand: an image 200 wide and 100 high, box (20, 10)-(60, 50),
    keypoints (40, 30) visible 0.8 and (100, 50) visible 1; with 2-value keypoints, without the confidence."""
    rows = torch.tensor([[20.0, 10.0, 60.0, 50.0, 0.9, 2.0, 40.0, 30.0, 0.8, 100.0, 50.0, 1.0]])
    fields = Boxes(), Keypoints((2, 3))
    assert fields[0].lines(fields, Predictions(rows), (100, 200), True) == [
        "2 0.2 0.3 0.2 0.4 0.2 0.3 0.8 0.5 0.5 1 0.9\n"]
    fields = Boxes(), Keypoints((2, 2))
    assert fields[0].lines(fields, Predictions(rows[:, [0, 1, 2, 3, 4, 5, 6, 7, 9, 10]]), (100, 200), False) == [
        "2 0.2 0.3 0.2 0.4 0.2 0.3 0.5 0.5\n"]
