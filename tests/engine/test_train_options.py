"""Typed training options: each train script's parser and its task's options class name the same options, derived
values are their own fields, and what --resume may change is the fields' metadata."""

import dataclasses

import pytest

import train
from classify import train as cls_train
from engine.options import DetectTrainOptions, SegmentTrainOptions, TrainOptions
from segment import train as seg_train


@pytest.mark.parametrize("script, options", [(train, DetectTrainOptions), (seg_train, SegmentTrainOptions),
                                             (cls_train, TrainOptions)])
def test_every_option_of_a_train_script_is_a_field_of_its_class(script, options):
    parsed, given = script.parse_opt([])
    fields = {f.name for f in dataclasses.fields(options) if not f.metadata.get("derived")}
    planned = {f.name for f in dataclasses.fields(options) if f.metadata.get("planned")}
    assert set(vars(parsed)) == fields - planned and given == []
    assert planned == {"train_checkpoint_model", "new_params", "chosen_optimizer"}
    opt = options.from_values(parsed)
    assert opt.train_imgsz is None and opt.loader_workers is None  # set-up derives them
    assert opt.train_checkpoint_model is False  # plan_run decides it
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.imgsz = 64


def test_what_resume_may_change_is_declared_on_the_fields():
    assert TrainOptions.resume_rules() == {
        "epochs": "extend", "resume": "launch", "device": "launch", "workers": "launch", "project": "search",
        "save_interval": "given", "profile": "launch", "loggers": "given", "log_model": "given", "local_rank": "given",
        "modules": "launch"}
    assert SegmentTrainOptions.resume_rules() == TrainOptions.resume_rules()  # no task extra may change a run


def test_a_checkpoint_s_derived_values_are_derived_again():
    saved = {**TrainOptions.from_values(cls_train.parse_opt([]).opt).to_dict(), "train_imgsz": 999, "loader_workers": 9,
             "single_cls": True, "train_checkpoint_model": True}  # single_cls: a detection run's, unknown here
    opt = TrainOptions.from_values(saved)
    assert (opt.train_imgsz, opt.loader_workers) == (None, None) and not hasattr(opt, "single_cls")
    assert opt.train_checkpoint_model  # what plan_run decided stays the run's
    del saved["train_checkpoint_model"]  # a checkpoint saved before the field was
    assert TrainOptions.from_values(saved).train_checkpoint_model is False


def test_validation_in_training_names_the_dataset_file_unless_unknown_classes_are_skipped():
    detect = dataclasses.replace(DetectTrainOptions.from_values(train.parse_opt([]).opt), data_path="/d/data.yaml")
    assert detect.val_names_from() == "/d/data.yaml"
    assert dataclasses.replace(detect, data_path=None).val_names_from() == "the dataset dict"
    assert dataclasses.replace(detect, skip_unknown_classes=True).val_names_from() is None
    assert TrainOptions.from_values(cls_train.parse_opt([]).opt).val_names_from() is None  # classes are its folders


def test_the_train_arguments_made_from_the_fields_keep_the_script_s_defaults_flags_and_help(capsys, monkeypatch):
    opt = cls_train.parse_opt(["--model", "m.yaml", "--no-log-model", "--cache", "--img", "64"]).opt
    assert (opt.cfg, opt.log_model, opt.cache, opt.imgsz, opt.data, opt.freeze, opt.resume, opt.workers) == \
        ("m.yaml", False, "ram", 64, "data/shapes-cls", [0], False, None)
    opt.freeze.append(3)  # each parse its own default list
    seg = seg_train.parse_opt(["--no-overlap", "--evolve"]).opt
    assert (seg.no_overlap, seg.evolve, seg.cfg, seg.imgsz, seg.freeze, cls_train.parse_opt([]).opt.freeze) == \
        (True, 300, "yolov5n-seg.yaml", 320, [0], [0])
    monkeypatch.setenv("COLUMNS", "300")  # no line broken inside a word (argparse breaks at hyphens)
    with pytest.raises(SystemExit):
        cls_train.parse_opt(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in ("--model CFG, --cfg CFG model YAML (name under models/ or a path), or a .pt whose model to train "
                 "(with --weights and no --cfg: the weights' own model) (default: yolov8n-cls.yaml) --weights",
                 "--data DATA dataset folder with train/ and val/ (or test/) holding one folder per class, or a YAML "
                 "naming it (default: data/shapes-cls) --hyp",
                 "--project PROJECT runs go to PROJECT/NAME (default: runs/train-cls) --name",
                 "--no-log-model trackers do not receive best.pt at the end (large models; by default they do) "
                 "--modules FILE.py [FILE.py ...]"):
        assert said in text
    assert "--rect" not in text and "--no-overlap" not in text  # the box tasks' and segmentation's only
