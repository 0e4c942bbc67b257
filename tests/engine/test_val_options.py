"""The val scripts' options: --task read once into the split to evaluate and the speed mode."""

import pytest

import val
from classify import val as cls_val
from engine.validator import BaseValidator, ValOptions
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
