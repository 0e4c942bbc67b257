"""The `yolo` command with Ultralytics' habits: its two resume forms, save/show/line_width/verbose/stream, a close
match for every unknown key, flag and model name, and `yolo` lines for what to run next."""

import os
import subprocess
import sys

import pytest

import detect
import train
from engine import messages
from utils.errors import BadOption
from utils.files import ROOT
from yolo.cli import split_words, verbose


def script_words(argv):
    return split_words(argv)[2], verbose(argv)


@pytest.mark.parametrize("argv", [["train", "resume", "model=runs/train/exp/weights/last.pt"],
                                  ["train", "model=runs/train/exp/weights/last.pt", "resume=True"],
                                  ["detect", "train", "resume=true", "model=runs/train/exp/weights/last.pt"]])
def test_both_ultralytics_resume_forms_are_resume_from_that_file(argv):
    words, loud = script_words(argv)
    opt, given = train.parse_opt(words)
    assert opt.resume == "runs/train/exp/weights/last.pt" and opt.weights == "" and given == ["resume"]
    assert loud


def test_resume_alone_is_the_newest_run_and_false_is_nothing():
    assert script_words(["train", "resume"])[0] == ["--resume"]
    assert train.parse_opt(script_words(["train", "resume"])[0]).opt.resume is True
    assert script_words(["train", "resume=False", "epochs=3"])[0] == ["epochs=3"]


def test_habit_words_of_predict():
    words, loud = script_words(["predict", "model=best.pt", "save=False", "show=False", "line_width=2",
                                   "verbose=False", "stream=True", "save_txt=True", "save_conf=1", "conf=0.5"])
    assert not loud and "stream=True" not in words
    opt = detect.parse_opt(words)
    assert (opt.nosave, opt.view_img, opt.line_thickness, opt.save_txt, opt.save_conf, opt.conf_thres) == \
        (True, False, 2, True, True, 0.5)
    assert detect.parse_opt(["save=True"]).nosave is False


def test_a_bare_on_off_key_turns_it_on_unless_it_is_the_flag_before_s_value():
    """Ultralytics reads `format=onnx dynamic` as dynamic=True; a word after a flag that takes a value stays its
    value, and a word that names no switch stays where argparse puts it."""
    import export

    words, _ = script_words(["export", "model=best.pt", "format=onnx", "dynamic", "half"])
    opt = export.parse_opt(words)
    assert (opt.include, opt.dynamic, opt.half) == (["onnx"], True, True)
    opt = detect.parse_opt(["--name", "half", "save_txt", "show", "track", "--source", "a.jpg", "augment"])
    assert (opt.name, opt.half, opt.save_txt, opt.view_img, opt.track, opt.source, opt.augment) == \
        ("half", False, True, True, "bytetrack", "a.jpg", True)
    opt = train.parse_opt(["cache", "rect", "--nosave", "cos_lr"]).opt
    assert (opt.cache, opt.rect, opt.nosave, opt.cos_lr) == ("ram", True, True, True)
    with pytest.raises(BadOption, match="argument --cache: invalid choice: 'rect'"):  # --cache's value, as typed
        train.parse_opt(["--cache", "rect"])
    with pytest.raises(BadOption, match="unrecognized arguments: dynamc"):
        detect.parse_opt(["dynamc"])


@pytest.mark.parametrize("words, said", [
    (["epoch=1"], "epoch=1: no option --epoch; did you mean epochs=?"),
    (["--epcohs", "1"], "unrecognized arguments: --epcohs 1; did you mean --epochs?"),
    (["imgsize=64"], "did you mean imgsz=?"),
    (["model=yolov8q.yaml", "epochs=1"], None),  # the model is read when the run starts: its own test below
])
def test_unknown_keys_and_flags_name_the_closest(words, said):
    if said is None:
        return
    with pytest.raises(BadOption) as e:
        train.parse_opt(words)
    assert said in str(e.value)


def test_a_misspelled_model_is_one_error_line_naming_the_closest(tmp_path):
    r = subprocess.run(["timeout", "120", sys.executable, "-m", "yolo", "train", "model=yolov8q.yaml", "epochs=1"],
                       cwd=tmp_path, capture_output=True, text=True)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1 and "did you mean yolov8n.yaml?" in errors[0], r.stderr


def test_next_and_resume_lines_are_yolo_lines_under_the_yolo_command(monkeypatch, tmp_path):
    last = tmp_path / "weights" / "last.pt"
    monkeypatch.chdir(tmp_path)
    assert messages.resume_command(last).startswith("python ")
    monkeypatch.setattr(messages, "YOLO_TASK", "segment")
    assert messages.resume_command(last) == "yolo segment train resume model=weights/last.pt"
    lines = messages.next_commands(("segment/val.py", "segment/predict.py"), tmp_path / "best.pt", "data/shapes.yaml",
                                   "data/images", 64)
    assert lines == ["yolo segment val model=best.pt data=data/shapes.yaml imgsz=64",
                     "yolo segment predict model=best.pt source=data/images imgsz=64",
                     "yolo export model=best.pt format=onnx imgsz=64"]
    assert all(line.split()[0] == "yolo" for line in lines)


def test_a_clone_named_yolo_in_the_working_folder_says_why_the_import_fails(tmp_path):
    """Python takes the clone's folder for the package `yolo` (a namespace package); `from yolo import YOLO` then
    finds the clone's YOLO.py, which names the folder, where Python alone says '(unknown location)'."""
    clone = tmp_path / "yolo"
    (clone / "yolo").mkdir(parents=True)
    (clone / "yolo" / "__init__.py").write_text("")
    (clone / "YOLO.py").write_text((ROOT / "YOLO.py").read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package, as a user has it
    r = subprocess.run(["timeout", "60", sys.executable, "-c", "from yolo import YOLO"], cwd=tmp_path,
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1 and f"the folder {clone} (this project's clone, named 'yolo')" in r.stderr, r.stderr


def test_tracking_a_classifier_is_one_line_from_the_command_and_the_api(tmp_path):
    """A classifier has no boxes to track: `yolo classify track` and YOLO(classifier).track() say so alike (the API
    said 'track=bytetrack: no option --track', the classify script's option list)."""
    from yolo import YOLO

    for call in (lambda: split_words(["classify", "track", "model=yolov8n-cls.yaml", "source=x.mp4"]),
                 lambda: YOLO("yolov8n-cls.yaml").track(str(tmp_path / "x.mp4"))):
        with pytest.raises(BadOption, match=r"^classify track: a tracker follows boxes, which a classifier has none"):
            call()
