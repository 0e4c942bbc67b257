"""Bad input, round 2 (issue 25), through the scripts' own main: the classification class map shared by every split,
a last training batch of one image, option and hyp values, predict sources, a split without one usable image and
dataset YAML mistakes. Each mistake ends in exactly one `error:` line and exit status 2; what is not a mistake runs
and says what it did. The data-level kinds (file names, label paths, image entries, label values) are cases of the
fault corpus in tests/data/test_fault_corpus.py."""

import importlib
import logging
import os
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
import yaml

from data.image_files import IMG_FORMATS, VID_FORMATS
from data.synthetic import generate_dataset
from engine.hyp import read_hyp
from models.checkpoints import model_to_ckpt
from models.yolo import ClassificationModel, DetectionModel, SegmentationModel
from tests.conftest import LogLines
from utils.budget import MAX_IMGSZ
from utils.files import ROOT
from utils.run import run_cli

NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}


def cli(argv, capsys):
    """(exit status, the `error:` lines, result) of a script run as `python <argv>` would, in this process."""
    script = importlib.import_module(argv[0].removesuffix(".py").replace("/", "."))
    capsys.readouterr()
    try:
        result, code = run_cli(script.main, lambda: script.parse_opt(argv[1:])), 0
    except SystemExit as e:
        result, code = None, e.code
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    return code, errors, result


# ---------------------------------------------------------------- classification: one class map (items 1-3)
@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    """A classifier trained 1 epoch at 32 px (the last feature map is 1 x 1) on 25 images in batches of 4, with an
    empty extra class folder in train and no circle folder in val: (trainer, dataset root, logged lines)."""
    root = generate_dataset(tmp_path_factory.mktemp("cls") / "d", "classify", 9, 3, seed=0, min_side=40,
                            max_side=48)
    for f in sorted((root / "train" / "circle").iterdir())[:2]:
        f.unlink()  # 25 training images: a last batch of one at --batch-size 4
    (root / "train" / "blank").mkdir()  # sorts first: every class id after it shifts if val numbered its own
    shutil.rmtree(root / "val" / "circle")
    import classify.train

    logger, handler = logging.getLogger("yolo"), LogLines()
    logger.addHandler(handler)
    try:
        trainer, _ = classify.train.main(classify.train.parse_opt([
            "--data", str(root), "--img", "32", "--epochs", "1", "--batch-size", "4", "--workers", "0",
            "--device", "cpu", "--noplots", "--project", str(root.parent / "runs")]))
    finally:
        logger.removeHandler(handler)
    return trainer, root, handler.messages


def test_item1_val_scored_under_the_training_class_map(cls_run):
    trainer, root, lines = cls_run
    assert trainer.names == {0: "blank", 1: "circle", 2: "rectangle", 3: "triangle"}
    samples = trainer.validator.dataloader.dataset.samples
    assert len(samples) == 6 and all(os.path.basename(os.path.dirname(f)) == trainer.names[c] for f, c in samples)
    m = trainer.validator.confusion.matrix  # [predicted, true]
    assert m[:, [0, 1]].sum() == 0 and m[:, 2].sum() == 3 and m[:, 3].sum() == 3
    best = trainer.checkpointer.best
    final = lines[lines.index(f"\nValidating {best}..."):]
    final = final[:next(i for i, line in enumerate(final) if line.startswith("Results saved to"))]  # before "Next:"
    rows = [line.split()[0] for line in final if line[:4] == "    "]
    assert rows == ["all", "rectangle", "triangle"], rows
    problems = (trainer.save_dir / "data_problems.txt").read_text().splitlines()
    assert problems == [f"train: {root / 'train' / 'blank'}: skipped, class folder has no readable image"]
    assert f"val: no folder here for class(es) blank, circle: no images of them in {root / 'val'}" in lines


def test_item1_classify_val_uses_the_checkpoint_map(cls_run, tmp_path, yolo_log, capsys):
    trainer, root, _ = cls_run
    data = tmp_path / "other"  # the same val images under a dataset whose train split sorts differently
    shutil.copytree(root / "val", data / "val")
    for name in ("blank", "circle", "rectangle", "triangle"):
        (data / "train" / name).mkdir(parents=True)
        shutil.copy(next((root / "val" / "rectangle").iterdir()), data / "train" / name / "x.jpg")
    code, errors, stats = cli(["classify/val.py", "--weights", str(trainer.checkpointer.best), "--data", str(data),
                               "--img", "32", "--device", "cpu", "--workers", "0", "--project", str(tmp_path / "val")],
                              capsys)
    assert code == 0 and errors == [] and stats == {k: v for k, v in trainer.state.metrics.items() if "loss" not in k}
    assert [line.split()[0] for line in yolo_log if line[:4] == "    "] == ["all", "rectangle", "triangle"]


def test_item2_a_val_class_that_train_lacks_is_an_error(cls_run, tmp_path, capsys):
    _, root, _ = cls_run
    data = tmp_path / "d"
    shutil.copytree(root, data, ignore=shutil.ignore_patterns("*.cache"))
    shutil.copytree(data / "val" / "triangle", data / "val" / "square")
    code, errors, _ = cli(["classify/train.py", "--data", str(data), "--img", "32", "--epochs", "1", "--device", "cpu",
                           "--project", str(tmp_path / "runs")], capsys)
    assert code == 2 and errors == [
        f"error: {data / 'val'}: class folder(s) 'square' are not classes of the training split {data / 'train'} "
        "(blank, circle, rectangle, triangle); a classifier cannot predict a class it never trained on: add its "
        "images to train/ or remove the folder"]
    assert not (tmp_path / "runs").exists()


def test_item3_a_last_batch_of_one_image_is_left_out(cls_run):
    trainer, _, lines = cls_run
    plan = trainer.data_plan
    assert plan.train_loader.drop_last and plan.batches_per_epoch == 6 and len(plan.train_set) == 25
    assert ("WARNING: 25 training images per rank at 4 per batch: the last batch would hold one image, which "
            "BatchNorm cannot train on; it is left out, a different image each epoch") in lines
    assert (trainer.save_dir / "results.csv").is_file()


# ---------------------------------------------------------------- options and hyps (items 7, 8)
def _train(data, tmp_path, *extra):
    return ["train.py", "--data", str(data), "--img", "64", "--epochs", "1", "--batch-size", "4", "--workers", "0",
            "--device", "cpu", "--noplots", "--project", str(tmp_path / "runs"), *extra]


@pytest.mark.parametrize("argv, error", [
    (["--batch-size", "0"], "error: --batch-size 0: must be in [1, inf)"),
    (["--batch-size", "-2"], "error: --batch-size -2: must be in [1, inf)"),  # -1 is AutoBatch
    (["--epochs", "0"], "error: --epochs 0: must be in [1, inf)"),
    (["--epochs", "-1"], "error: --epochs -1: must be in [1, inf)"),
    (["--workers", "-1"], "error: --workers -1: must be in [0, inf)"),
    (["--img", "0"], f"error: --imgsz 0: must be in [1, {MAX_IMGSZ}]"),
    (["--label-smoothing", "1"], "error: --label-smoothing 1.0: must be in [0, 1)"),
    (["--freeze", "-3"], "error: --freeze -3: must be in [0, inf)"),
    (["--epochs", "ten"], "error: argument --epochs: invalid int value: 'ten' (see --help)"),
])
def test_item7_option_mistakes(shapes_detect, tmp_path, capsys, argv, error):
    code, errors, _ = cli(_train(shapes_detect, tmp_path, *argv), capsys)
    assert (code, errors) == (2, [error]) and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, error", [
    (["classify/train.py", "--batch-size", "0"], "error: --batch-size 0: must be in [1, inf)"),
    (["val.py", "--weights", "x.pt", "--batch-size", "0"], "error: --batch-size 0: must be in [1, inf)"),
    (["segment/val.py", "--weights", "x.pt", "--conf-thres", "2"], "error: --conf-thres 2.0: must be in [0, 1]"),
    (["detect.py", "--vid-stride", "0"], "error: --vid-stride 0: must be in [1, inf)"),
    (["classify/predict.py", "--img", "-5"], f"error: --imgsz -5: must be in [1, {MAX_IMGSZ}]"),
    (["val.py"], "error: the following arguments are required: --weights (see --help)"),
    (["classify/train.py", "--rect"], "error: unrecognized arguments: --rect (see --help)"),  # nothing read it
    (["detect.py", "--name", "../../escape"],
     "error: --name '../../escape': must name a folder inside --project (no '..', not absolute)"),
    (["val.py", "--weights", "x.pt", "--name", "/tmp/abs"],
     "error: --name '/tmp/abs': must name a folder inside --project (no '..', not absolute)"),
])
def test_item7_option_mistakes_in_the_other_scripts(capsys, argv, error):
    assert cli(argv, capsys)[:2] == (2, [error])


@pytest.mark.parametrize("script", ["train.py", "detect.py", "segment/val.py"])
def test_a_project_below_a_file_is_refused_before_any_work(tmp_path, capsys, script):
    """It was a NotADirectoryError traceback once the run folder was made."""
    (tmp_path / "afile").write_text("")
    argv = [script, "--project", str(tmp_path / "afile" / "runs"), *(["--weights", "x.pt"] if "val" in script else [])]
    assert cli(argv, capsys)[:2] == (2, [f"error: --project {tmp_path / 'afile' / 'runs'}: {tmp_path / 'afile'} is a "
                                         "file, not a folder"])


@pytest.mark.parametrize("freeze, error", [("1000", "the model has layers 0-24 only"),
                                           ("25", "that freezes every layer, which leaves nothing to train")])
def test_freezing_past_the_model_is_refused(shapes_detect, tmp_path, capsys, freeze, error):
    """It was `optimizer got an empty parameter list` from torch."""
    code, errors, _ = cli(_train(shapes_detect, tmp_path, "--cfg", "yolov5n.yaml", "--freeze", freeze), capsys)
    assert (code, errors) == (2, [f"error: --freeze {freeze}: {error}"])


def test_item7_exit_status_of_the_real_script(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "train.py"), "--epochs", "0"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.splitlines() == ["error: --epochs 0: must be in [1, inf)"], p.stderr


@pytest.mark.parametrize("hyp, error", [
    ({"mosaic": "lots"}, "mosaic must be a number in [0, 1], got str 'lots'"),
    ({"lr0": "fast"}, "lr0 must be a number in (0, inf), got str 'fast'"),
    ({"lr0": "1e-3"}, "lr0 must be a number in (0, inf), got str '1e-3' (YAML reads 1e-3 as text: write 1.0e-3)"),
    ({"fliplr": True}, "fliplr must be a number in [0, 1], got bool True"),
    ({"close_mosaic": 2.5}, "close_mosaic must be a whole number in [0, inf), got float 2.5"),
    ({"loss": "v9"}, "loss 'v9' is not a criterion; known: aux_ota, cls, ota, v5, v5seg, v8, v8obb, v8pose, v8seg"),
])
def test_item8_hyp_values_are_checked_before_any_work(shapes_detect, tmp_path, capsys, hyp, error):
    f = tmp_path / "hyp.yaml"
    f.write_text(yaml.safe_dump(hyp))
    code, errors, _ = cli(_train(shapes_detect, tmp_path, "--hyp", str(f)), capsys)
    assert (code, errors) == (2, [f"error: --hyp {f}: {error}"]) and not (tmp_path / "runs").exists()


def test_item8_a_loss_that_cannot_train_the_model_head(shapes_detect, tmp_path, capsys):
    f = tmp_path / "hyp.yaml"
    f.write_text("loss: v8seg\n")  # a registered criterion, but for a v8 segmentation head
    code, errors, _ = cli(_train(shapes_detect, tmp_path, "--hyp", str(f)), capsys)
    assert (code, errors) == (2, ["error: hyp loss 'v8seg' cannot train the model's Detect head (its loss is 'v5')"])


def test_item8_a_partial_hyp_file_is_completed_from_the_model_default(shapes_detect, tmp_path, yolo_log):
    import train

    f = tmp_path / "hyp.yaml"
    f.write_text("lr0: 0.002\nmosaic: 0.0\n")
    trainer, _ = train.main(train.parse_opt(_train(shapes_detect, tmp_path, "--hyp", str(f), "--cfg",
                                                   "yolov8n.yaml")[1:]))
    default = read_hyp("hyp.v8.yaml")
    assert yaml.safe_load((trainer.save_dir / "hyp.yaml").read_text()) == {**default, "lr0": 0.002, "mosaic": 0.0}
    note = [line for line in yolo_log if line.startswith(f"--hyp {f} sets 2 keys; taken from hyp.v8.yaml: ")]
    assert note == [f"--hyp {f} sets 2 keys; taken from hyp.v8.yaml: "
                    + ", ".join(f"{k}={v}" for k, v in default.items() if k not in ("lr0", "mosaic"))]


# ---------------------------------------------------------------- predict sources (item 9)
@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    t = tmp_path_factory.mktemp("weights")
    out = {}
    for script, model in (("detect.py", DetectionModel("yolov5n.yaml", nc=3)),
                          ("segment/predict.py", SegmentationModel("yolov5n-seg.yaml", nc=3)),
                          ("classify/predict.py", ClassificationModel("yolov8n-cls.yaml", nc=3))):
        model.names = dict(NAMES)
        out[script] = t / f"{script.replace('/', '_')}.pt"
        torch.save({"model": model_to_ckpt(model)}, out[script])
    return out


def _predict(script, weights, source, tmp_path):
    return [script, "--weights", str(weights[script]), "--source", str(source), "--img", "64", "--device", "cpu",
            "--project", str(tmp_path / "pred")]


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """A good 64 px image, a truncated AVI (half its bytes: 10 of the 20 frames it reports) and a truncated MP4 (its
    index lost: it cannot be opened)."""
    t = tmp_path_factory.mktemp("videos")
    cv2.imwrite(str(t / "ok.jpg"), np.full((64, 64, 3), 90, np.uint8))
    w = cv2.VideoWriter(str(t / "full.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 64))
    for i in range(20):
        w.write(np.random.default_rng(i).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    w.release()
    (t / "half.avi").write_bytes((t / "full.avi").read_bytes()[: (t / "full.avi").stat().st_size // 2])
    w = cv2.VideoWriter(str(t / "full.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 64))
    for i in range(20):
        w.write(np.full((64, 64, 3), 10 * i, np.uint8))
    w.release()
    (t / "cut.mp4").write_bytes((t / "full.mp4").read_bytes()[:300])
    return t


@pytest.mark.parametrize("script", ["detect.py", "segment/predict.py", "classify/predict.py"])
def test_item9_missing_or_empty_sources_are_errors(weights, tmp_path, capsys, script):
    (tmp_path / "empty").mkdir()
    formats = ", ".join(sorted(IMG_FORMATS | VID_FORMATS))
    for source, why in ((tmp_path / "empty", f"no supported files found in {tmp_path / 'empty'} (formats: {formats})"),
                        (tmp_path / "*.png", f"no supported files found in {tmp_path / '*.png'} (formats: {formats})"),
                        (tmp_path / "gone.jpg", f"{tmp_path / 'gone.jpg'} does not exist")):
        code, errors, _ = cli(_predict(script, weights, source, tmp_path), capsys)
        assert (code, errors) == (2, [f"error: --source {source}: {why}"]), (script, source)
    assert not (tmp_path / "pred").exists()


@pytest.mark.parametrize("script", ["detect.py", "segment/predict.py", "classify/predict.py"])
def test_item9_unreadable_videos_are_warnings_while_anything_is_read(weights, videos, tmp_path, capsys, yolo_log,
                                                                    script):
    files = [videos / "cut.mp4", videos / "half.avi", videos / "ok.jpg"]
    (tmp_path / "list.txt").write_text("".join(f"{f}\n" for f in files))
    code, errors, results = cli(_predict(script, weights, tmp_path / "list.txt", tmp_path), capsys)
    assert code == 0 and errors == [] and len(results) == 10 + 1
    assert [m for m in yolo_log if m.startswith("WARNING")] == [
        f"WARNING: skipping video {videos / 'cut.mp4'}: cannot be opened (truncated, or not a video)",
        f"WARNING: video {videos / 'half.avi'} ended at frame 10 of the 20 it reports (truncated?)"]
    code, errors, _ = cli(_predict(script, weights, videos / "cut.mp4", tmp_path), capsys)
    assert (code, errors) == (2, [f"error: nothing could be read from {videos / 'cut.mp4'}: none of its 1 files is a "
                                  "readable image or video (see the warnings above)"])


def test_predict_class_filter_outside_the_model_and_a_latin1_image_name(weights, videos, tmp_path, capsys):
    args = _predict("detect.py", weights, videos / "ok.jpg", tmp_path)
    assert cli([*args, "--classes", "1", "7"], capsys)[:2] == (2, [f"error: --classes 7: {weights['detect.py']} has "
                                                                   "classes 0-2 only"])
    name = os.fsencode(tmp_path) + b"/caf\xe9.jpg"  # OpenCV crashes on such a name given as a string
    shutil.copy(videos / "ok.jpg", name)
    code, errors, results = cli([*_predict("detect.py", weights, os.fsdecode(name), tmp_path), "--save-csv",
                                 "--save-crop", "--conf-thres", "0"], capsys)
    assert (code, errors, len(results)) == (0, [], 1)
    out = tmp_path / "pred" / "exp"  # the refused command made no run folder
    assert (out / os.fsdecode(b"caf\xe9.jpg")).is_file()
    assert os.fsdecode(b"caf\xe9.jpg") in {f.name for f in (out / "crops").rglob("*.jpg")}
    assert (out / "predictions.csv").read_bytes().splitlines()[1].startswith(b"caf\xe9.jpg,")


# ---------------------------------------------------------------- a split without one usable image (item 10)
def test_item10_a_whole_split_of_bad_labels_lists_every_reason(tmp_path, capsys):
    root = generate_dataset(tmp_path / "d", "detect", 12, 2, seed=3, min_side=64, max_side=64, max_objects=1)
    for lb in (root / "labels" / "train").iterdir():
        lb.write_text("1 0.5 0.5 0.2\n")  # a value short
    (root / "d.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                                 "names": list(NAMES.values())}))
    code, errors, _ = cli(_train(root / "d.yaml", tmp_path), capsys)
    listed = tmp_path / "runs" / "exp" / "data_problems.txt"
    assert (code, errors) == (2, [f"error: train: no usable images in {root / 'images' / 'train'} (12 skipped); every "
                                  f"reason is listed in {listed}"])
    lines = listed.read_text().splitlines()
    assert lines == [f"train: {root / 'images' / 'train' / f'{i:05d}.jpg'}: skipped, "
                     f"{root / 'labels' / 'train' / f'{i:05d}.txt'} line 1: 4 values, expected 5 (cls cx cy w h) or "
                     "cls + >= 3 x y pairs" for i in range(12)]


def test_a_class_id_the_yaml_does_not_name_is_one_line_naming_the_yaml_and_the_first_file(tmp_path, capsys):
    """names one short: the scan would skip most images (every one holding the last class); refused unless asked."""
    root = generate_dataset(tmp_path / "d", "detect", 8, 4, seed=3, min_side=64, max_side=64, max_objects=1)
    yaml_file = root / "two.yaml"
    yaml_file.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                         "names": ["circle", "rectangle"]}))
    over = sorted(f for f in (root / "labels" / "train").iterdir() if f.read_text().startswith("2 "))
    assert over, "the generator drew a triangle"
    code, errors, _ = cli(_train(yaml_file, tmp_path), capsys)
    image = str(over[0]).replace("/labels/", "/images/").replace(".txt", ".jpg")
    assert code == 2 and errors == [
        f"error: train: {len(over)} label files hold a class id >= nc 2, the classes {yaml_file} names; the first: "
        f"{image}: skipped, {over[0]} line 1: class 2 >= nc 2; correct its names (or the labels), or give "
        "--skip-unknown-classes to skip those images"]
    assert not (tmp_path / "runs").exists()
    code, errors, (trainer, _) = cli(_train(yaml_file, tmp_path, "--skip-unknown-classes"), capsys)
    assert code == 0 and errors == [] and len(trainer.train_set) == 8 - len(over)
    code, errors, _ = cli(["val.py", "--weights", str(trainer.checkpointer.best), "--data", str(yaml_file),
                           "--project", str(tmp_path / "val")], capsys)
    assert code == 2 and errors[0].startswith("error: val: ") and f"the classes {yaml_file} names" in errors[0]


# ---------------------------------------------------------------- dataset YAMLs (item 12)
@pytest.mark.parametrize("text, error", [
    ("nc: '3'\n", "'nc' must be a positive integer, got str '3'"),
    ("nc: true\n", "'nc' must be a positive integer, got bool True"),
    ("val: images/train\n", "line 5 invalid YAML (duplicate key 'val' (first on line 3))"),
])
def test_item12_dataset_yaml_mistakes_end_training(shapes_detect, tmp_path, capsys, text, error):
    f = tmp_path / "data.yaml"
    f.write_text(f"path: {shapes_detect.parent}\ntrain: images/train\nval: images/val\nnames: [circle, rectangle, "
                 f"triangle]\n{text}")
    code, errors, _ = cli(_train(f, tmp_path), capsys)
    assert (code, errors) == (2, [f"error: {f}: {error}"])


def test_item12_detection_data_folder_and_help(shapes_detect, tmp_path, capsys):
    """A folder is looked into (data/annotations.find_layout); one holding no dataset is one line saying what
    was looked for."""
    folder = tmp_path / "images-only"
    (folder / "images").mkdir(parents=True)
    code, errors, _ = cli(_train(folder, tmp_path), capsys)
    assert code == 2 and errors == [
        f"error: {folder} is a folder holding no dataset this project reads: looked for one data.yaml (0 YAML files "
        "found), COCO's annotations/instances_<split>.json, Roboflow's <split>/_annotations.coco.json, VOC's "
        "Annotations/, ImageSets/Main/ and JPEGImages/, and Label Studio JSON exports (a train and a val .json)"]
    says_folder = "or a folder holding a dataset: its data.yaml (a Roboflow export), COCO JSON"
    for script, says in (("train.py", says_folder), ("segment/val.py", says_folder),
                         ("classify/train.py", "dataset folder with train/ and val/ (or test/) holding one folder"),
                         ("classify/val.py", "dataset folder with train/ and val/ (or test/) holding one folder")):
        with pytest.raises(SystemExit) as e:
            importlib.import_module(script.removesuffix(".py").replace("/", ".")).parse_opt(["--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert e.value.code == 0 and says in help_text, script
