"""The Python API (`from yolo import YOLO`) and the `yolo` command: each runs this clone's script of the model's task
and mode, with Ultralytics' `key=value` words or the flags; val, predict and export take the image size and dataset
from the run that made the weights (engine/inherit.py). Checked against the scripts and the hub wrapper themselves."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import hubconf
import val
from models.backend import InferenceBackend
from models.checkpoints import model_to_ckpt
from models.yolo import DetectionModel, SegmentationModel
from utils.errors import BadOption
from utils.files import ROOT
from yolo import YOLO
from yolo.cli import main as yolo_main
from yolo.cli import run as yolo_run
from yolo.cli import split_words

IMAGE = ROOT / "data" / "images" / "shapes1.jpg"
NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}
CONF = 1e-4  # an untrained model's scores are tiny; this keeps plenty of boxes to compare


def run_checkpoint(path, model, imgsz, data):
    """A finished run's best.pt as the trainer leaves it: the weights and the run's options."""
    model.names = dict(NAMES)
    torch.save({"model": model_to_ckpt(model), "epoch": 0, "opt": {"imgsz": imgsz + 1, "train_imgsz": imgsz,
                                                                   "data": "a name", "data_path": str(data)}}, path)
    return path


@pytest.fixture(scope="module")
def best(tmp_path_factory, shapes_detect):
    torch.manual_seed(0)
    return run_checkpoint(tmp_path_factory.mktemp("api") / "best.pt", DetectionModel("yolov8n.yaml", nc=3), 64,
                          shapes_detect)


def test_val_takes_the_runs_size_and_dataset_and_says_so(best, shapes_detect, tmp_path, yolo_log):
    stats = YOLO(best).val(batch=4, workers=0, project=str(tmp_path))
    said = [m for m in yolo_log if "from the run that made" in m]
    assert said == [f"--img 64 and --data {shapes_detect} from the run that made {best} (give the option to choose "
                    "another)"]
    given = val.main(val.parse_opt(["--weights", str(best), "--data", str(shapes_detect), "--img", "64",
                                    "--batch-size", "4", "--workers", "0", "--project", str(tmp_path)]))
    assert stats == given
    assert any("at shape (1, 3, 64, 64)" in m for m in yolo_log)


def test_a_given_option_wins_and_a_vanished_dataset_falls_back_to_the_default(tmp_path, yolo_log):
    gone = run_checkpoint(tmp_path / "gone.pt", DetectionModel("yolov8n.yaml", nc=3), 64, tmp_path / "moved.yaml")
    from engine.inherit import run_values
    from engine.options import ValOptions

    opt = ValOptions.from_cli(val.parse_opt(["--weights", str(gone), "--img", "96"]))
    assert run_values(opt, InferenceBackend(gone).run) == {"data": "data/shapes.yaml"}
    assert yolo_log[-1] == f"its run's dataset {tmp_path / 'moved.yaml'} no longer exists, so --data data/shapes.yaml" \
                           " (give the option to choose another)"


def test_predict_returns_the_hub_wrappers_results_at_the_runs_size(best):
    results = YOLO(best).predict(str(IMAGE), conf=CONF)
    hub = hubconf.custom(str(best), device="cpu")
    hub.conf = CONF
    ref = hub(str(IMAGE), size=64)
    assert type(results) is type(ref) and len(results.xyxy[0]) > 0
    torch.testing.assert_close(results.xyxy[0], ref.xyxy[0])
    folder = YOLO(best)(str(IMAGE.parent), conf=CONF)  # a folder: its images, in order
    assert len(folder) == len(list(IMAGE.parent.glob("*.jpg"))) and folder.files[0] == sorted(
        p.name for p in IMAGE.parent.glob("*.jpg"))[0]


COCO128 = Path("/work/datasets/coco128/images/train2017")
PEER = json.loads((ROOT / "tests" / "models" / "fixtures" / "ultralytics-predict-defaults.json").read_text())


@pytest.mark.skipif(not COCO128.is_dir(), reason=f"COCO128 not found at {COCO128}")
def test_predict_at_defaults_gives_ultralytics_boxes_at_its_defaults():
    """An Ultralytics-trained checkpoint on COCO128 photos, every option left out: Ultralytics 8.4's predict gives
    these boxes (conf 0.25, IoU 0.7, the checkpoint's size; tests/models/fixtures/make_predict_defaults.py); on four
    of the photos NMS at yolov5's IoU 0.45 keeps fewer. The predictor (a path) and the hub wrapper (a list) agree."""
    model = YOLO(ROOT / "tests" / "models" / "fixtures" / "ultralytics-v8t-shapes.pt")
    files = [str(COCO128 / name) for name in PEER["images"]]
    listed = model.predict(files)
    assert sum(len(r.boxes) for r in listed) == 9
    for f, r in zip(files, listed):
        one = model.predict(f)[0]
        expected = torch.tensor(PEER["images"][Path(f).name]).reshape(-1, 6)
        torch.testing.assert_close(one.boxes.data, expected, atol=1e-4, rtol=1e-6)
        torch.testing.assert_close(r.boxes.data, expected, atol=1e-4, rtol=1e-6)


def test_export_carries_the_runs_size_and_dataset_and_gives_the_pts_boxes(best, shapes_detect, tmp_path):
    weights = tmp_path / "best.pt"
    weights.write_bytes(best.read_bytes())
    f = YOLO(weights).export(format="onnx")
    assert f == str(tmp_path / "best.onnx")
    backend = InferenceBackend(f)
    assert backend.metadata["imgsz"] == [64, 64] and backend.metadata["data"] == str(shapes_detect)
    rgb = np.asarray(Image.open(IMAGE).convert("RGB"))
    exported, pt = YOLO(f).predict(rgb, conf=CONF), YOLO(weights).predict(rgb, conf=CONF)
    assert len(pt.xyxy[0]) > 0
    torch.testing.assert_close(exported.xyxy[0], pt.xyxy[0], atol=1e-3, rtol=1e-4)


def test_each_command_reads_its_weights_once(best, tmp_path, monkeypatch):
    """What the weights say of their run comes with them (InferenceBackend.run, checkpoints.load_model): val, export
    and predict read a .pt once, and val builds one backend of an export (a second would repeat its dry run)."""
    weights = tmp_path / "best.pt"
    weights.write_bytes(best.read_bytes())
    reads, backends = [], []
    read, init = torch.load, InferenceBackend.__init__  # every .pt goes through the one loader, and it to torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append("pt") or read(*a, **k))
    monkeypatch.setattr(InferenceBackend, "__init__",
                        lambda self, w, *a, **k: backends.append(Path(w).name) or init(self, w, *a, **k))
    pt = YOLO(weights)  # which task's scripts: a read of its own
    reads.clear(), backends.clear()
    pt.val(batch=4, workers=0, project=str(tmp_path))
    f = pt.export(format="onnx", dynamic=True)
    assert reads == ["pt"] * 2 and backends == ["best.pt"]
    exported = YOLO(f)
    backends.clear()
    exported.val(batch=4, workers=0, project=str(tmp_path))
    pt.predict(str(IMAGE), conf=CONF)
    assert reads == ["pt"] * 3 and backends == ["best.onnx", "best.pt"]


def test_the_model_says_its_task(tmp_path):
    seg = tmp_path / "best.pt"
    torch.save({"model": model_to_ckpt(SegmentationModel("yolov8n-seg.yaml", nc=3))}, seg)
    assert YOLO(seg).task == "segment"  # from its head: the name says nothing
    assert YOLO("yolov8n-pose.yaml").task == "pose" and YOLO("yolov5s-cls.pt").task == "classify"
    assert split_words(["val", f"model={seg}"])[:2] == ("segment", "val")
    assert split_words(["classify", "train", "epochs=1"]) == ("classify", "train", ["epochs=1"])
    with pytest.raises(BadOption, match="expected a mode"):
        split_words(["detect", "fit"])


def test_a_tensorrt_engine_says_its_task_from_its_header_without_a_gpu(tmp_path):
    """YOLO('best.engine') took every engine for a detection model (its suffix was not among the files read), so a
    segmentation engine ran the detection scripts; its task is in the metadata header export.py writes before the
    engine's bytes, read here without TensorRT."""
    from models.backend import ExportWrapper, export_metadata, flatten_outputs
    from models.runtimes import engine_file_bytes

    model = SegmentationModel("yolov8n-seg.yaml", nc=3).eval()
    _, structure = flatten_outputs(ExportWrapper(model).kept(model(torch.zeros(1, 3, 64, 64))))
    meta = {**export_metadata(model, (64, 64), 1, False, structure), "dynamic": True}
    engine = tmp_path / "best.engine"
    engine.write_bytes(engine_file_bytes(meta, b"TensorRT's bytes"))
    assert YOLO(engine).task == "segment"
    assert split_words(["predict", f"model={engine}"])[:2] == ("segment", "predict")


def test_yolo_command_runs_the_script_with_key_value_words_beside_flags(best, shapes_detect, tmp_path):
    words = ["val", f"model={best}", "batch=4", "--workers", "0", "--project", str(tmp_path)]
    stats = yolo_run(words)
    ref = val.main(val.parse_opt(["--weights", str(best), "--data", str(shapes_detect), "--img", "64",
                                  "--batch-size", "4", "--workers", "0", "--project", str(tmp_path)]))
    assert stats == ref
    # The console script exits with main()'s value: the metrics there would print and exit with status 1.
    assert yolo_main(words) == 0


def test_yolo_command_mistakes_are_one_error_line(tmp_path):
    for words, said in [(["detect", "fit"], "expected a mode"), (["train", "lr0=0.1"], "lr0=0.1: no option --lr0"),
                        (["train", "cos_lr=maybe"], "--cos-lr is on or off")]:
        r = subprocess.run(["timeout", "120", sys.executable, "-m", "yolo", *words], cwd=tmp_path,
                           capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr[-2000:]
    r = subprocess.run(["timeout", "120", sys.executable, "-m", "yolo", "help"], capture_output=True, text=True)
    assert r.returncode == 0 and "yolo detect train data=" in r.stdout


def test_train_from_python_then_val_on_its_own_run(shapes_detect, tmp_path, yolo_log):
    model = YOLO("yolov5n.yaml")
    metrics = model.train(data=str(shapes_detect), epochs=1, imgsz=64, batch=8, workers=0, device="cpu",
                          project=str(tmp_path), name="api", noplots=True)
    assert model.model == str(tmp_path / "api" / "weights" / "best.pt") and "fitness" in metrics
    assert model.val(batch=16, workers=0, project=str(tmp_path / "val"))["fitness"] == pytest.approx(
        metrics["fitness"])
    assert f"--img 64 and --data {shapes_detect} from the run that made {model.model} (give the option to choose " \
           "another)" in yolo_log
