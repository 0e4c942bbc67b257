"""Typed predict options: each predict script's parser and its predictor's options class name the same options, and
the predictor reads them as that class, built once (no attribute a task lacks is read with a fallback)."""

import dataclasses

import pytest

import detect
from classify import predict as cls_predict
from engine.options import DetectPredictOptions, PosePredictOptions, PredictOptions
from pose import predict as pose_predict
from segment import predict as seg_predict

PARSER_ONLY = {"local_rank", "run_defaults"}  # read by the parser (the launcher's rank) and engine/inherit.py


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
    from engine.tasks.classify import ClassificationPredictor
    from engine.tasks.detect import DetectionPredictor
    from engine.tasks.pose import PosePredictor
    from engine.tasks.segment import SegmentationPredictor

    assert (ClassificationPredictor.options, DetectionPredictor.options, SegmentationPredictor.options,
            PosePredictor.options) == (PredictOptions, DetectPredictOptions, DetectPredictOptions, PosePredictOptions)
