"""The val scripts' options: --task read once into the split to evaluate and the speed mode; a task's extras are the
fields of its validator's options class."""

import dataclasses

import pytest

import val
from classify import val as cls_val
from engine.options import PoseValOptions, SegmentValOptions
from engine.validator import BaseValidator, ValOptions
from pose import val as pose_val
from segment import val as seg_val
from utils.errors import BadOption


@pytest.mark.parametrize("argv, split, speed", [([], "val", False), (["--task", "test"], "test", False),
                                                (["--task", "speed"], "val", True)])
def test_task_option_is_a_split_or_speed(argv, split, speed):
    opt = val.parse_opt(["--weights", "x.pt", *argv])
    assert (opt.split, opt.speed) == (split, speed) and not hasattr(opt, "task")


def test_speed_validates_at_deployment_thresholds_without_json():
    assert ValOptions.from_cli(val.parse_opt(["--weights", "x.pt", "--save-json"])).save_json
    options = ValOptions.from_cli(val.parse_opt(["--weights", "x.pt", "--task", "speed", "--save-json"]))
    assert (options.conf, options.iou, options.save_json) == (0.25, 0.45, False)
    with pytest.raises(BadOption, match="--task"):  # classification has no NMS to time
        cls_val.parse_opt(["--weights", "x.pt", "--task", "speed"])


def test_split_path_falls_back_to_val_without_a_test_split():
    assert BaseValidator.split_path({"val": "v", "test": "t"}, "test") == "t"
    assert BaseValidator.split_path({"val": "v", "test": None}, "test") == "v"
    assert BaseValidator.split_path({"val": "v", "test": "t"}, "val") == "v"


def test_a_task_s_extras_are_the_fields_of_its_validator_s_options(tmp_path):
    from engine.tasks.classify import ClassificationValidator
    from engine.tasks.detect import DetectionValidator
    from engine.tasks.pose import PoseValidator
    from engine.tasks.segment import SegmentationValidator

    def extras(cls):
        return {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(ValOptions)}

    assert ClassificationValidator.options is DetectionValidator.options is ValOptions
    assert (SegmentationValidator.options, PoseValidator.options) == (SegmentValOptions, PoseValOptions)
    assert (extras(SegmentValOptions), extras(PoseValOptions)) == ({"no_overlap"}, {"kpt_shape"})
    seg = SegmentationValidator.options.from_cli(seg_val.parse_opt(["--weights", "x.pt"]))
    assert type(seg) is SegmentValOptions and seg.no_overlap is False  # the overlap map, as training's default
    pose = PoseValidator.options.from_cli(pose_val.parse_opt(["--weights", "x.pt", "--task", "speed"]))
    pose = dataclasses.replace(pose, **PoseValidator.data_options({"kpt_shape": [4, 3]}))
    assert type(pose) is PoseValOptions and (pose.kpt_shape, pose.conf) == ((4, 3), 0.25)
    assert PoseValidator(pose, tmp_path, {0: "a"}).fields[1].kpt_shape == (4, 3)
