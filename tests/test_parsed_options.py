"""The options hold only options: every script's parsed namespace has a key per option and nothing else; a train
script's parser gives the names the command line named beside it (utils/cli.Parsed), and the fallbacks of the options
a val, predict or export command takes from the weights' run are the fields' metadata, read from the options class
(engine/inherit.py), not values the options carry."""

import dataclasses
import importlib
from pathlib import Path

import pytest

import export
import train
from engine.inherit import run_values
from engine.options import ExportOptions
from engine.tasks import TASKS
from utils.cli import Parsed, options_from_kwargs

LAUNCHER = {"local_rank"}  # --local-rank, the older launcher's: an option of every parser, a field of training's
SCRIPTS = [(t, role) for t in TASKS for role in ("train", "val", "predict")]


def _script(task, role):
    return importlib.import_module(TASKS[task].scripts[role].removesuffix(".py").replace("/", "."))


def _options_class(task, role):
    return getattr(TASKS[task], role)


@pytest.mark.parametrize("task, role", SCRIPTS)
def test_every_key_of_a_script_s_parsed_options_is_an_option(task, role):
    argv = [] if role == "train" else ["--weights", "w.pt"]
    parsed = _script(task, role).parse_opt([*argv, "--img", "64"])
    opt = parsed.opt if role == "train" else parsed
    assert isinstance(parsed, Parsed) == (role == "train")  # only training needs the names given
    fields = {f.name for f in dataclasses.fields(_options_class(task, role))}
    assert set(vars(opt)) - LAUNCHER <= fields, sorted(set(vars(opt)) - LAUNCHER - fields)
    assert not {"given", "run_defaults"} & set(vars(opt))
    assert opt.imgsz == 64


def test_export_s_parsed_options_are_its_fields_only():
    opt = export.parse_opt(["--weights", "w.pt"])
    assert set(vars(opt)) == {f.name for f in dataclasses.fields(ExportOptions)}


@pytest.mark.parametrize("task", list(TASKS))
def test_a_train_script_gives_the_names_its_command_line_named(task):
    script = _script(task, "train")
    opt, given = script.parse_opt(["--epoch", "3", "batch=8", "--img=64", "--resume", "model=m.yaml"])
    assert given == ["batch_size", "cfg", "epochs", "imgsz", "resume"]  # an abbreviation and key=value too
    assert (opt.epochs, opt.batch_size, opt.imgsz, opt.resume, opt.cfg) == (3, 8, 64, True, "m.yaml")
    assert script.parse_opt([]).given == []
    # a default given explicitly is given: --resume refuses it, or --epochs extends the run by it
    default = script.parse_opt([]).opt.epochs
    assert script.parse_opt(["--epochs", str(default)]).given == ["epochs"]


def test_a_python_caller_s_keywords_are_the_names_given():
    opt, given = options_from_kwargs(train.parse_opt, {"epochs": 2, "batch_size": 4, "cfg": "yolov5n.yaml"})
    assert given == ["batch_size", "cfg", "epochs"]
    assert set(vars(opt)) == set(vars(train.parse_opt([]).opt))  # options only, as a command line's


def test_the_api_passes_the_keywords_it_was_given_to_training(monkeypatch, tmp_path):
    from yolo import YOLO
    from yolo.scripts import load_script

    seen = []

    class Stop(Exception):
        pass

    def main(parsed, callbacks=None):
        seen.append(parsed)
        raise Stop

    monkeypatch.setattr(load_script("detect", "train"), "main", main)  # the module YOLO runs
    with pytest.raises(Stop):
        YOLO("yolov8n.yaml").train(epochs=3, batch=8, imgsz=64, project=str(tmp_path))
    [(opt, given)] = seen
    assert given == ["batch_size", "cfg", "epochs", "imgsz", "project"] and (opt.epochs, opt.batch_size) == (3, 8)
    assert "given" not in vars(opt)


# what each script fell back to where the weights' run says nothing, as its parser's `run_defaults` said before the
# fallbacks became the fields' metadata (commit 5a3239f's val, predict and export scripts)
FALLBACKS = {
    ("detect", "val"): {"data": "data/shapes.yaml", "imgsz": 320},
    ("segment", "val"): {"data": "data/shapes-seg.yaml", "imgsz": 320},
    ("pose", "val"): {"data": "data/shapes-pose.yaml", "imgsz": 320},
    ("obb", "val"): {"data": "data/shapes-obb.yaml", "imgsz": 320},
    ("classify", "val"): {"data": "data/shapes-cls", "imgsz": 96},
    ("detect", "predict"): {"imgsz": 320},
    ("segment", "predict"): {"imgsz": 320},
    ("obb", "predict"): {"imgsz": 320},
    ("pose", "predict"): {"imgsz": 320, "data": None},
    ("classify", "predict"): {"imgsz": 96},
}


def _typed(task, role, argv=()):
    opt = _script(task, role).parse_opt(["--weights", "w.pt", *argv])
    return _options_class(task, role).from_values(opt)


@pytest.mark.parametrize("task, role", list(FALLBACKS))
def test_each_script_falls_back_to_its_task_s_own_values(task, role):
    assert run_values(_typed(task, role), {}) == FALLBACKS[(task, role)]


@pytest.mark.parametrize("task, role", list(FALLBACKS))
def test_the_weights_run_comes_before_the_fallback_and_a_given_option_before_both(task, role, tmp_path):
    data = tmp_path / "data.yaml"
    data.write_text("names: [a]\n")
    known = {"imgsz": 64, "data": str(data)}
    taken = run_values(_typed(task, role), known)
    assert taken["imgsz"] == 64 and ("data" not in taken or Path(taken["data"]) == data)
    gone = run_values(_typed(task, role), {"imgsz": 64, "data": str(tmp_path / "gone.yaml")})
    assert gone.get("data") == FALLBACKS[(task, role)].get("data")  # a dataset that no longer exists is not taken
    given = ["--img", "96"] + (["--data", "mine.yaml"] if "data" in FALLBACKS[(task, role)] else [])
    assert run_values(_typed(task, role, given), known) == {}


def test_export_falls_back_to_640_and_no_dataset_each_call_its_own_list():
    opt = ExportOptions.from_values(export.parse_opt(["--weights", "w.pt"]))
    first, second = run_values(opt, {}), run_values(opt, {})
    assert first == {"imgsz": [640], "data": None}
    first["imgsz"].append(1)
    assert second["imgsz"] == [640] and run_values(opt, {})["imgsz"] == [640]
    assert run_values(ExportOptions(weights="w.pt"), {"imgsz": 64}) == {"imgsz": 64, "data": None}
