"""Exports that take one input size (OpenVINO's default, --no-dynamic for the others) are refused where predict and
val could not feed them. No test here loads OpenVINO (it runs in a process of its own: test_export_openvino.py)."""

from types import SimpleNamespace

import pytest
from models_testutil import save_checkpoint

from engine.exporter import Exporter
from engine.tasks import TASKS
from models.yolo import ClassificationModel
from utils.errors import BadOption


def export(weights, include, **options):
    opt = SimpleNamespace(**{"weights": str(weights), "include": list(include), "imgsz": [64], "batch_size": 1,
                             "device": "cpu", **options})
    return Exporter(opt, {name: task.inputs for name, task in TASKS.items()})()


def test_a_static_classifier_of_a_non_square_size_is_refused_in_one_line(tmp_path, monkeypatch):
    """Classify predict and val crop every image square at the export's size: a fixed 64x96 file could never run
    (predict stopped at its first image, val refused it), so the export says so before writing anything; a dynamic
    one, or a square fixed one, is made."""
    written = []  # the metadata of each IR made, the folder left empty
    monkeypatch.setattr(Exporter, "export_openvino",
                        lambda self, wrapper, im, f, meta, *a: written.append(meta) or f.mkdir(exist_ok=True))
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    for include, dynamic in ((["openvino"], None), (["onnx", "openvino"], None), (["onnx"], False)):
        with pytest.raises(BadOption, match=r"^--img 64 96: a classifier sees square crops, and "
                                            r"(onnx|openvino) would take 64x96 only: export it with --img 96 or "
                                            r"--dynamic$"):
            export(weights, include, imgsz=[64, 96], dynamic=dynamic)
    assert not written and not list(tmp_path.glob("cls.*[!t]"))
    export(weights, ["openvino"], imgsz=[64, 96], dynamic=True)
    export(weights, ["openvino"], imgsz=[96])
    assert [(m["imgsz"], m["dynamic"]) for m in written] == [([64, 96], True), ([96, 96], False)]


def test_export_and_train_from_an_ir_folder_say_it_is_a_folder_in_one_line(tmp_path):
    """export.py --weights x_openvino_model (the IR the default export writes) said 'weights file not found' of a
    folder that is there."""
    import subprocess
    import sys

    from utils.files import ROOT

    folder = tmp_path / "best_openvino_model"
    folder.mkdir()
    (folder / "best.xml").write_text("<net/>")
    run = subprocess.run([sys.executable, str(ROOT / "export.py"), "--weights", str(folder), "--include", "onnx"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        f"error: {folder}: a folder, not a .pt checkpoint (a model exported with export.py runs in the predict and "
        "val scripts only)"], run.stderr[-2000:]
