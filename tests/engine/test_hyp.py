"""Hyperparameter keys are declared by their readers and checked both ways: a key nothing reads and a key this run's
readers need are each one `error:` line naming the key and its reader, exit status 2."""

import re
from types import SimpleNamespace

import pytest
import yaml

import losses as criteria
import train
from engine.hyp import (
    READERS,
    SCHEDULE,
    Reader,
    default_hyp_file,
    known_keys,
    load_hyp,
    read_hyp,
    require_keys,
    run_hyp,
)
from losses import V5DetectionLoss
from models.yolo import DetectionModel, head_class, yaml_model_load
from utils.errors import BadModelYaml, BadOption
from utils.files import ROOT
from utils.run import run_cli


def cli(argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_cli(train.main, lambda: train.parse_opt(argv))
    return e.value.code, [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]


def _args(data, tmp_path, *extra):
    return ["--data", str(data), "--imgsz", "64", "--batch-size", "4", "--epochs", "1", "--workers", "0",
            "--device", "cpu", "--project", str(tmp_path / "runs"), *extra]


def test_readers_of_one_key_agree_and_every_shipped_file_is_complete():
    for key, values in known_keys().items():
        assert {r.keys[key] for r in READERS if key in r.keys} == {values}, key
    for f in sorted((ROOT / "data" / "hyps").glob("*.yaml")):
        read_hyp(f)  # every key is read by something, every value in range


def test_the_first_missing_key_is_named_with_its_reader():
    with pytest.raises(BadOption, match=r"^hyp hyp.v8.yaml: 'obj' is missing; V5DetectionLoss \(losses/v5.py\)"):
        require_keys(read_hyp("hyp.v8.yaml"), [Reader.of(V5DetectionLoss)], None, "hyp.v8.yaml")


def test_an_unknown_key_is_one_line_naming_it(shapes_detect, tmp_path, capsys):
    f = tmp_path / "hyp.yaml"
    f.write_text("lr0: 0.01\nmosiac: 1.0\n")  # misspelled
    code, lines = cli(_args(shapes_detect, tmp_path, "--hyp", str(f)), capsys)
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(f"error: --hyp {f}: 'mosiac' is read by nothing in this project (remove it)")
    assert not (tmp_path / "runs").exists()


def test_a_missing_key_is_one_line_naming_its_reader(shapes_detect, tmp_path, capsys):
    """A model YAML may name only a file of data/hyps (docs/safety.md); a v8 head given YOLOv5's file lacks 'dfl'."""
    assert "dfl" not in read_hyp("hyp.scratch-low.yaml")
    model = yaml.safe_load((ROOT / "models" / "yolov8.yaml").read_text())
    (tmp_path / "yolov8n.yaml").write_text(yaml.safe_dump({**model, "hyp": "hyp.scratch-low.yaml"}))
    code, lines = cli(_args(shapes_detect, tmp_path, "--cfg", str(tmp_path / "yolov8n.yaml")), capsys)
    assert code == 2 and len(lines) == 1, lines
    assert re.fullmatch(r"error: hyp \S*hyp\.scratch-low\.yaml: 'dfl' is missing; "
                        r"V8DetectionLoss \(losses/v8\.py\) reads it", lines[0]), lines


def test_a_classifier_hyp_for_a_detector_is_completed_not_a_traceback():
    """`--cfg yolov8n.yaml --hyp hyp.cls.yaml` once ended in a KeyError inside the criterion: now the detector's keys
    come from its own default file, and the classifier's values where both have the key."""
    opt = SimpleNamespace(hyp="hyp.cls.yaml", label_smoothing=None)
    model = DetectionModel("yolov8n.yaml", nc=3)
    hyp = run_hyp(model, opt.hyp, opt.label_smoothing)
    v8, cls = read_hyp("hyp.v8.yaml"), read_hyp("hyp.cls.yaml")
    assert hyp == {**v8, **cls} and hyp["dfl"] == v8["dfl"] and hyp["lr_auto_gain"] == cls["lr_auto_gain"]
    model.init_criterion(hyp, imgsz=64)


def test_a_resumed_run_s_recorded_hyp_is_checked_and_completed_as_a_file_is():
    """--resume reads the hyperparameters the checkpoint records: a key the project added since comes from the default
    file, one it no longer reads is left out, and a value no reader takes is a one-line error."""
    v8 = read_hyp("hyp.v8.yaml")
    saved = {k: v for k, v in v8.items() if k != "lr_new_gain"} | {"box": 5.0, "gone": 1}
    assert load_hyp("ignored.yaml", "hyp.v8.yaml", saved) == {**v8, "box": 5.0}
    with pytest.raises(BadOption, match="the run's checkpoint records: lr0 must be"):
        load_hyp(None, "hyp.v8.yaml", {**v8, "lr0": -1.0})


MODEL_YAMLS = sorted(p.name for p in (ROOT / "models").glob("*.yaml"))


@pytest.mark.parametrize("name", MODEL_YAMLS)
def test_the_default_hyp_file_follows_the_model_family(name):
    """The one rule (engine/hyp.default_hyp_file): the file a YAML names; for the same layers in a YAML that names
    none (what a checkpoint trained by Ultralytics, the yolov5 package or YOLOv7 holds), that same file, found by the
    layers, so yolov7-tiny keeps its own file though yolov7 ends in the same head; for layers no YAML here lists,
    the file of the criterion its head trains with."""
    d = yaml_model_load(name)
    own = d["hyp"]
    assert default_hyp_file(d) == (own, f"named by its model YAML {name}")
    official = {k: v for k, v in d.items() if k not in ("hyp", "yaml_file")}
    file, why = default_hyp_file(official)
    assert file == own and why.startswith("its YAML names none; its layers are those of models/")
    other = {**official, "backbone": [*official["backbone"][:-1], [-1, 1, "Conv", [64, 1, 1]]]}  # one layer differs
    if head_class(other).default_loss == "cls":  # a classifier's Classify reads any channel count
        other["backbone"] = [*official["backbone"], [-1, 1, "Conv", [64, 1, 1]]]
    file, why = default_hyp_file(other)
    head = head_class(d)
    loss = criteria.REGISTRY[head.default_loss]
    family = loss.hyp_file
    assert (file, why) == (family, "its YAML names none and no model YAML here has its layers; the file of the "
                                   f"criterion of its {head.__name__} head, {loss.__name__}")
    expected = {"v5": "hyp.scratch-low.yaml", "v5seg": "hyp.scratch-low.yaml", "ota": "hyp.v7.yaml",
                "aux_ota": "hyp.v7-p6.yaml", "v8": "hyp.v8.yaml", "v8seg": "hyp.v8.yaml", "v8pose": "hyp.v8.yaml",
                "v8obb": "hyp.v8.yaml",
                "cls": "hyp.cls.yaml"}
    assert family == expected[head.default_loss]


def test_each_criterion_family_file_gives_every_key_the_run_needs():
    """A family file is what a model trains with when nothing names another, so it must complete the schedule and
    its criterion (a v5 file for a v8 loss was the issue-44 failure: 'dfl' is missing)."""
    for name, loss in criteria.REGISTRY.items():
        require_keys(read_hyp(loss.hyp_file), (SCHEDULE, Reader.of(loss)), None, loss.hyp_file)


def test_a_yaml_ending_in_no_head_has_no_hyp_file():
    d = yaml_model_load("yolov8n.yaml")
    d = {k: v for k, v in d.items() if k != "hyp"}
    d["head"] = d["head"][:-1]
    with pytest.raises(BadModelYaml, match="ends in no head, so no hyp file fits"):
        default_hyp_file(d)
