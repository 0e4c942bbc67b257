"""Typed predict options: each predict script's parser and its predictor's options class name the same options, and
the predictor reads them as that class, built once (no attribute a task lacks is read with a fallback)."""

import dataclasses

import pytest

import detect
from classify import predict as cls_predict
from engine.options import DetectPredictOptions, PosePredictOptions, PredictOptions
from pose import predict as pose_predict
from segment import predict as seg_predict
from utils.errors import BadOption

PARSER_ONLY = {"local_rank"}  # read by the parser: the launcher's rank


@pytest.mark.parametrize("script, options", [(detect, DetectPredictOptions), (seg_predict, DetectPredictOptions),
                                             (pose_predict, PosePredictOptions), (cls_predict, PredictOptions)])
def test_every_option_of_a_predict_script_is_a_field_of_its_class(script, options):
    parsed = script.parse_opt([])
    assert set(vars(parsed)) - PARSER_ONLY == {f.name for f in dataclasses.fields(options)}
    opt = options.from_values(parsed)
    assert opt.imgsz is None  # the weights' run's size, filled in by the predictor
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.imgsz = 64


def test_each_predictor_names_its_script_s_options_class():
    from engine.tasks import TASKS

    ClassificationPredictor, DetectionPredictor = TASKS["classify"].predictor, TASKS["detect"].predictor
    PosePredictor, SegmentationPredictor = TASKS["pose"].predictor, TASKS["segment"].predictor

    assert (ClassificationPredictor.options, DetectionPredictor.options, SegmentationPredictor.options,
            PosePredictor.options) == (PredictOptions, DetectPredictOptions, DetectPredictOptions, PosePredictOptions)


def test_the_predict_arguments_made_from_the_fields_keep_their_defaults_types_and_help(capsys, monkeypatch):
    assert vars(cls_predict.parse_opt([])) == {
        "local_rank": -1, "weights": "runs/train-cls/exp/weights/best.pt",
        "source": "data/images", "vid_stride": 1, "imgsz": None, "device": "", "view_img": False, "save_txt": False,
        "save_conf": False, "nosave": False, "save_crop": False, "save_csv": False, "line_thickness": None,
        "hide_labels": False, "hide_conf": False, "project": None, "name": "exp", "exist_ok": False, "half": False,
        "amp": "auto", "modules": []}
    opt = detect.parse_opt(["--img", "64", "--vid-stride", "2", "--line-thickness", "3", "--amp", "bf16", "--half"])
    assert (opt.imgsz, opt.vid_stride, opt.line_thickness, opt.amp, opt.half) == (64, 2, 3, "bf16", True)
    with pytest.raises(BadOption, match="--amp"):
        detect.parse_opt(["--amp", "fp16"])  # the .pt predictors autocast to bf16 only
    opt = pose_predict.parse_opt(["--classes", "0", "2", "--agnostic-nms"])
    assert (opt.classes, opt.agnostic_nms, opt.conf_thres, opt.iou_thres, opt.max_det, opt.augment, opt.data) == \
        ([0, 2], True, None, None, 1000, False, None)  # iou None: the family's (nms_iou); conf: 0.25, 0.1 tracked
    assert all("flags" in f.metadata for f in dataclasses.fields(PosePredictOptions))  # every argument is a field's
    monkeypatch.setenv("COLUMNS", "300")  # no line broken inside a word (argparse breaks at hyphens)
    with pytest.raises(SystemExit):
        pose_predict.parse_opt(["--help"])
    out = capsys.readouterr().out
    flags = [w.split()[0] for w in out.splitlines() if w.startswith("  --")]
    assert flags[:20] == ["--weights", "--source", "--vid-stride", "--imgsz", "--device", "--view-img", "--save-txt",
                          "--save-conf", "--nosave", "--save-crop", "--save-csv", "--line-thickness", "--hide-labels",
                          "--hide-conf", "--project", "--name", "--exist-ok", "--half", "--amp", "--modules"]
    text = " ".join(out.split())  # as read, wherever a long option puts its help
    for said in ("--imgsz IMGSZ, --img IMGSZ, --img-size IMGSZ inference size, long side in pixels (default: the size "
                 "the weights trained at, else 320; a static export takes its own) --device",
                 "--weights WEIGHTS model weights: .pt, .onnx or .torchscript (default: "
                 "runs/train-pose/exp/weights/best.pt) --source",
                 "--project PROJECT results go to PROJECT/NAME (default: runs/predict-pose) --name",
                 "--view-img show results in a window --save-txt"):
        assert said in text
