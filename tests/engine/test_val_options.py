"""The val scripts' options: --task read once into the split to evaluate and the speed mode; a task's extras are the
fields of its validator's options class."""

import dataclasses

import pytest

import val
from classify import val as cls_val
from engine.options import ClassifyValOptions, PoseValOptions, SegmentValOptions
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
    from engine.tasks import TASKS

    ClassificationValidator, DetectionValidator = TASKS["classify"].validator, TASKS["detect"].validator
    PoseValidator, SegmentationValidator = TASKS["pose"].validator, TASKS["segment"].validator

    def extras(cls):
        return {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(ValOptions)}

    assert (ClassificationValidator.options, DetectionValidator.options) == (ClassifyValOptions, ValOptions)
    assert extras(ClassifyValOptions) == extras(TASKS["obb"].val) == set()  # their own fallbacks only
    assert (SegmentationValidator.options, PoseValidator.options) == (SegmentValOptions, PoseValOptions)
    assert (extras(SegmentValOptions), extras(PoseValOptions)) == ({"no_overlap"}, {"kpt_shape"})
    seg = SegmentationValidator.options.from_cli(seg_val.parse_opt(["--weights", "x.pt"]))
    assert type(seg) is SegmentValOptions and seg.no_overlap is False  # the overlap map, as training's default
    pose = PoseValidator.options.from_cli(pose_val.parse_opt(["--weights", "x.pt", "--task", "speed"]))
    pose = pose.for_dataset({"kpt_shape": [4, 3]})
    assert type(pose) is PoseValOptions and (pose.kpt_shape, pose.conf) == ((4, 3), 0.25)
    assert PoseValidator.record.val_labels(pose).kpt_shape == (4, 3)  # the label lines read with the dataset's


PARSER_ONLY = {"local_rank"}  # read by the parser: the launcher's rank


@pytest.mark.parametrize("script, options", [(val, ValOptions), (seg_val, SegmentValOptions),
                                             (pose_val, PoseValOptions), (cls_val, ClassifyValOptions)])
def test_every_option_of_a_val_script_is_a_field_of_its_class_with_the_field_s_default(script, options):
    parsed = vars(script.parse_opt(["--weights", "w.pt"]))
    flagged = {f.name for f in dataclasses.fields(options) if "flags" in f.metadata}  # classify's box flags: defaults
    assert set(parsed) - PARSER_ONLY == flagged | {"speed"}
    made = options(imgsz=64)  # in code, as training and tests make them
    own = {"weights", "imgsz", "project"} | ({"batch"} if script is cls_val else set())  # the script's defaults
    assert {k: parsed[k] for k in flagged - own} == {k: getattr(made, k) for k in flagged - own}
    typed = options.from_cli(script.parse_opt(["--weights", "w.pt", "--img", "96"]))
    assert type(typed) is options and (typed.weights, typed.imgsz, typed.split) == ("w.pt", 96, "val")
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.conf = 0.5


def test_val_values_by_flag_or_key_land_in_the_fields_and_a_bad_one_names_its_flag():
    opt = ValOptions.from_cli(val.parse_opt(["--weights", "x.pt", "batch=8", "conf=0.2", "--iou-thres", "0.5",
                                             "--max-det", "10", "--skip-unknown-classes"]))
    assert (opt.batch, opt.conf, opt.iou, opt.max_det, opt.skip_unknown_classes) == (8, 0.2, 0.5, 10, True)
    assert cls_val.parse_opt(["--weights", "x.pt"]).batch == 64  # classify/val.py's own default
    for argv, error in ((["--iou-thres", "1.5"], r"^--iou-thres 1.5: must be in \[0, 1\]$"),
                        (["--batch-size", "-1"], r"^--batch-size -1: must be in \[1, inf\) \(there is no automatic"),
                        (["conf=-0.1"], r"^--conf-thres -0.1: must be in \[0, 1\]$")):
        with pytest.raises(BadOption, match=error):
            val.parse_opt(["--weights", "x.pt", *argv])
    with pytest.raises(BadOption, match="unrecognized arguments: --conf-thres"):
        cls_val.parse_opt(["--weights", "x.pt", "--conf-thres", "0.5"])  # a classifier has no NMS


def test_for_dataset_names_the_yaml_unless_unknown_classes_are_skipped_and_pose_takes_its_kpt_shape():
    data = {"yaml_file": "/d/data.yaml", "kpt_shape": [5, 2]}
    assert ValOptions(imgsz=64).for_dataset(data).names_from == "/d/data.yaml"
    assert ValOptions(imgsz=64).for_dataset({}).names_from == "the dataset dict"
    assert ValOptions(imgsz=64, skip_unknown_classes=True).for_dataset(data).names_from is None
    pose = PoseValOptions(imgsz=64, skip_unknown_classes=True).for_dataset(data)
    assert (pose.kpt_shape, pose.names_from) == ((5, 2), None)


@pytest.mark.parametrize("script", [val, cls_val])
def test_the_val_arguments_made_from_the_fields_keep_their_order_and_help(script, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # no line broken inside a word (argparse breaks at hyphens)
    with pytest.raises(SystemExit):
        script.parse_opt(["--help"])
    out = capsys.readouterr().out
    flags = [w.split()[0].rstrip(",") for w in out.splitlines() if w.startswith("  --")]
    boxes = ["--save-txt", "--save-json", "--single-cls", "--skip-unknown-classes", "--conf-thres", "--iou-thres",
             "--max-det", "--augment"] if script is val else []
    assert flags == ["--data", "--weights", "--batch-size", "--imgsz", "--task", "--device", "--workers", "--half",
                     "--project", "--name", "--exist-ok", *boxes, "--modules", "--local-rank"]
    text = " ".join(out.split())
    said = {val: ["--batch-size BATCH_SIZE images per batch on each process (default: 32) --imgsz",
                  "--task {val,test,speed} split to evaluate, or speed: val at conf 0.25, IoU 0.45, no JSON "
                  "(default: val) --device",
                  "--conf-thres CONF_THRES confidence threshold (default: 0.001) --iou-thres IOU_THRES NMS IoU "
                  "threshold (default: 0.6) --max-det",
                  "else data/shapes.yaml) --weights WEIGHTS model weights",
                  "--project PROJECT results go to PROJECT/NAME (default: runs/val) --name"],
            cls_val: ["--batch-size BATCH_SIZE images per batch on each process (default: 64) --imgsz",
                      "--task {val,test} split to evaluate (default: val) --device", "trained at, else 96) --task",
                      "--data DATA dataset folder with train/ and val/ (or test/)"]}[script]
    for s in said:
        assert s in text
