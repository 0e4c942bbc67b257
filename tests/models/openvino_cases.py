"""Run by test_export_openvino.py, in a process of its own (OpenVINO and onnxruntime do not share one well).
export.py --include openvino (fp32 and --int8) and engine: the IR folder gives the PyTorch outputs and carries the
run's metadata; INT8 calibrates on the run's training images (and says in one line when it has none or too few);
the ONNX a TensorRT engine is built from is checked on the CPU, and a machine without TensorRT says what it lacks."""

import dataclasses
import logging
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from models_testutil import NAMES, assert_close_per_channel, assert_same_inference_outputs, save_checkpoint

import models.backend as backend_module
from engine.calibration import CalibrationError, letterboxed, spread
from engine.export_targets import calibration_batches, check_engine_onnx
from engine.exporter import Exporter
from engine.tasks import TASKS
from models.backend import ExportWrapper, InferenceBackend, flatten_outputs
from models.checkpoints import attempt_load
from models.yolo import ClassificationModel, DetectionModel, PoseModel, SegmentationModel
from utils.errors import BadFile, BadOption
from utils.log import LOGGER

pytest.importorskip("openvino")
ROOT = Path(__file__).resolve().parents[2]
MODELS = [("yolov5n.yaml", DetectionModel), ("yolov8n-seg.yaml", SegmentationModel),
          ("yolov8n-cls.yaml", ClassificationModel), ("yolov8n-pose.yaml", PoseModel)]


def export(weights, include=("openvino",), **options):
    opt = SimpleNamespace(**{"weights": str(weights), "include": list(include), "imgsz": [64], "batch_size": 1,
                             "device": "cpu", **options})
    return Exporter(opt, {name: task.inputs for name, task in TASKS.items()})()


@pytest.fixture(scope="module")
def calib_data(tmp_path_factory):
    """A dataset YAML whose train split holds 40 images (the calibration floor is 32), one of them undecodable."""
    from data.synthetic import generate_dataset
    from tests.conftest import write_yaml

    root = tmp_path_factory.mktemp("calib")
    generate_dataset(root, task="detect", n_train=40, n_val=4, seed=1, min_side=64, max_side=96)
    (root / "images" / "train" / "zz_broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return write_yaml(root, "detect")


@pytest.mark.parametrize("cfg,cls", MODELS, ids=[m[0].removesuffix(".yaml") for m in MODELS])
def test_openvino_fp32_matches_pytorch_and_carries_the_metadata(cfg, cls, tmp_path):
    weights = save_checkpoint(cfg, cls, tmp_path / "model.pt")
    (folder,) = export(weights)  # fixed at --img by default, as OpenVINO runs fastest
    assert folder == tmp_path / "model_openvino_model" and {p.name for p in folder.iterdir()} == {"model.xml",
                                                                                               "model.bin"}
    ref_model = attempt_load(weights, fuse=False)  # unfused: the export must fold BatchNorm correctly
    for path in (folder, folder / "model.xml"):  # the folder, or its .xml, as --weights
        backend = InferenceBackend(path, bf16=False)  # fp32 arithmetic asked (--amp off): the .pt's outputs
        assert backend.format == "openvino" and backend.names == NAMES and backend.nc == 3 and not backend.dynamic
        assert backend.stride == int(max(ref_model.stride)) and backend.imgsz == (64, 64) and backend.batch == 1
        assert backend.task == InferenceBackend(weights).task
        layout = getattr(ref_model, "output_layout", None)  # the prototypes, where there are some, come second
        assert backend.output_layout == (layout and dataclasses.replace(layout, proto=(1,) if layout.nm else ()))
    g = torch.Generator().manual_seed(1)
    assert_same_inference_outputs(backend, ref_model, torch.rand(1, 3, 64, 64, generator=g))
    with pytest.raises(BadOption, match="exported for 64x64 images"):
        backend(torch.rand(1, 3, 96, 128))
    (folder,) = export(weights, dynamic=True)
    backend = InferenceBackend(folder, bf16=False)
    assert backend.dynamic
    for x in (torch.rand(1, 3, 64, 64, generator=g), torch.rand(2, 3, 96, 128, generator=g)):  # any batch and size
        assert_same_inference_outputs(backend, ref_model, x)


def test_an_ir_holds_the_prediction_and_prototypes_and_one_made_with_the_raw_maps_still_runs(tmp_path, monkeypatch):
    """The IR's outputs are the .pt's prediction and prototypes alone; an IR exported before that (the whole eval
    output, its metadata declaring it) still loads, its shapes checked against that metadata, and runs."""
    import openvino as ov

    weights = save_checkpoint("yolov8n-seg.yaml", SegmentationModel, tmp_path / "new.pt")
    (folder,) = export(weights, dynamic=True)
    assert len(ov.Core().read_model(str(folder / "new.xml")).outputs) == 2
    monkeypatch.setattr(ExportWrapper, "kept", lambda self, out: out)  # the exporter as it was
    monkeypatch.setattr(backend_module, "export_layout", lambda layout: layout)
    (old,) = export(save_checkpoint("yolov8n-seg.yaml", SegmentationModel, tmp_path / "old.pt"), dynamic=True)
    ref_model = attempt_load(weights, fuse=False)
    x = torch.rand(2, 3, 96, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        n_raw = len(flatten_outputs(ref_model(x))[0])
    assert len(ov.Core().read_model(str(old / "old.xml")).outputs) == n_raw > 2
    for f in (folder, old):
        assert_same_inference_outputs(InferenceBackend(f, bf16=False), ref_model, x)


def test_openvino_int8_calibrates_on_the_training_images(calib_data, tmp_path, caplog, monkeypatch):
    """INT8: the IR holds FakeQuantize nodes (NNCF's), but not on the head's own arithmetic (box decoding), its
    weights are about a quarter of fp32's, and its boxes stay near the fp32 model's; the undecodable training image is
    skipped and named."""
    caplog.set_level(logging.INFO, logger="yolo")
    monkeypatch.setattr(LOGGER, "propagate", True)  # off once an earlier test ran set_logging
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "model.pt")
    (fp32,) = export(weights)
    (int8,) = export(weights, int8=True, data=str(calib_data), calib_images=40)
    assert int8 == tmp_path / "model_int8_openvino_model"
    assert "zz_broken.jpg" in caplog.text and "skipped 1 calibration image" in caplog.text
    assert "calibrating on 39 of the 41 training images" in caplog.text
    xml = (int8 / "model.xml").read_text()
    fq_layers = re.findall(r'<layer id="\d+" name="([^"]+)" type="FakeQuantize"', xml)
    assert len(fq_layers) > 20 and not any(re.search(r"model\.22/aten::(mul|sub|add|div)", n) for n in fq_layers)
    assert (int8 / "model.bin").stat().st_size < 0.4 * (fp32 / "model.bin").stat().st_size
    x = torch.from_numpy(letterboxed(cv2.imread(str(next((calib_data.parent / "images" / "val").iterdir()))),
                                     (64, 64)))[None]
    a, b = InferenceBackend(fp32)(x)[0], InferenceBackend(int8)(x)[0]
    boxes = a[:, :4]
    assert (b[:, :4] - boxes).abs().mean() < 0.05 * boxes.abs().mean()


def test_a_static_int8_ir_of_a_larger_batch_calibrates_in_batches_of_its_size(calib_data, tmp_path):
    """--int8 --batch-size 2 (static, the default) fed NNCF single images, which the IR refuses: a traceback from
    OpenVINO's infer request ('the model input (shape=[2,3,64,64]) and the tensor (shape=(1.3.64.64)) are
    incompatible')."""
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "model.pt")
    (int8,) = export(weights, int8=True, data=str(calib_data), calib_images=40, batch_size=2)
    backend = InferenceBackend(int8)
    assert backend.batch == 2 and not backend.dynamic and "FakeQuantize" in (int8 / "model.xml").read_text()
    x = torch.from_numpy(letterboxed(cv2.imread(str(next((calib_data.parent / "images" / "val").iterdir()))),
                                     (64, 64)))[None]
    a = InferenceBackend(export(weights)[0])(x)[0]  # the fp32 IR at batch 1
    b = backend(x)[0]  # one image, padded to the batch
    assert (b[:, :4] - a[:, :4]).abs().mean() < 0.05 * a[:, :4].abs().mean()


def test_calibration_batches_hold_every_image_the_last_filled_from_the_first():
    images = [np.full((1, 1), i) for i in range(5)]
    assert calibration_batches(images, 1) is images
    for batch, want in [(2, [[0, 1], [2, 3], [4, 0]]), (5, [[0, 1, 2, 3, 4]]), (7, [[0, 1, 2, 3, 4, 0, 1]])]:
        assert [b.ravel().tolist() for b in calibration_batches(images, batch)] == want


def test_the_default_arithmetic_is_openvino_s_own_choice_and_off_is_fp32(tmp_path, caplog, monkeypatch):
    """--amp auto (the predict scripts' default, and val) leaves the precision to OpenVINO, as a bare
    compile_model does; off asks fp32 and bf16 bf16 (where the CPU has bfloat16 units). Each says in one line what
    it runs in. Where OpenVINO picks bf16, the outputs are not fp32's but near them."""
    import openvino as ov

    caplog.set_level(logging.INFO, logger="yolo")
    monkeypatch.setattr(LOGGER, "propagate", True)
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "v8.pt")
    (folder,) = export(weights)
    core = ov.Core()
    bare = core.compile_model(str(folder / "v8.xml"), "CPU").get_property("INFERENCE_PRECISION_HINT").get_type_name()
    has_bf16 = "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    runs = {amp: InferenceBackend(folder, bf16=amp) for amp in (None, False, True)}
    assert runs[None].runner.precision == bare and runs[False].runner.precision == "f32"
    assert runs[True].runner.precision == ("bf16" if has_bf16 else "f32")
    assert f"OpenVINO: {bare} arithmetic (OpenVINO's choice for this CPU; --amp off for fp32)" in caplog.text
    assert "OpenVINO: f32 arithmetic (asked)" in caplog.text
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    auto, fp32 = runs[None](x)[0], runs[False](x)[0]
    with torch.no_grad():
        ref = attempt_load(weights)(x)[0]
    assert (fp32[:, :4] - ref[:, :4]).abs().max() < 1e-3
    if bare == "bf16":
        assert 1e-3 < (auto[:, :4] - ref[:, :4]).abs().max() < 0.05 * ref[:, :4].abs().max()


def test_int8_without_data_or_with_too_few_images_is_one_line(shapes_detect, tmp_path):
    weights = save_checkpoint("yolov5n.yaml", DetectionModel, tmp_path / "v5.pt")
    with pytest.raises(CalibrationError, match=r"^--int8 needs calibration images: give --data"):
        export(weights, int8=True)
    with pytest.raises(CalibrationError, match=r"16 training image\(s\) read, INT8 calibration needs at least 32$"):
        export(weights, include=["openvino"], int8=True, data=str(shapes_detect))
    with pytest.raises(BadOption, match=r"^--calib-images 5: INT8 calibration needs at least 32 images"):
        export(weights, int8=True, data=str(shapes_detect), calib_images=5)
    with pytest.raises(BadOption, match=r"^--int8 quantises the openvino and engine formats"):
        Exporter(SimpleNamespace(weights=str(weights), include=["onnx"], int8=True))
    assert not list(tmp_path.glob("*openvino*"))


def test_calibration_images_are_spread_and_prepared_as_the_predictor_sees_them():
    assert spread(list(range(10)), 4) == [0, 3, 6, 9] and spread([1, 2], 5) == [1, 2]
    im = np.full((50, 100, 3), 255, np.uint8)
    im[:, :, 0] = 0  # BGR: no blue
    for task in ("detect", "segment", "pose", "obb"):
        x = TASKS[task].inputs.prepare(im, (64, 64))
        assert x.shape == (3, 64, 64) and x.dtype == np.float32
        assert x[2, 32, 32] == 0 and x[0, 32, 32] == 1  # RGB: blue is the last plane
        assert abs(x[0, 0, 32] - 114 / 255) < 1e-6  # letterbox padding above the 64 x 32 picture
    im[:, :50, 1] = 0  # the left half blue-free and green-free: red; the right half yellow
    x = TASKS["classify"].inputs.prepare(im, (64, 96))  # shorter side to 64, the centre square: no padding
    assert x.shape == (3, 64, 64) and x.dtype == np.float32 and x.min() == 0 and x[0].min() == 1
    assert x[1, 32, 0] == 0 and x[1, 32, 63] == 1  # the centre of the 128 x 64 resize: red left, yellow right


def test_openvino_folder_problems_are_one_line(tmp_path, monkeypatch):
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    (folder,) = export(weights)
    empty = tmp_path / "empty_openvino_model"
    empty.mkdir()
    with pytest.raises(BadFile, match="holds one .xml model .* found 0"):
        InferenceBackend(empty)
    xml = (folder / "cls.xml").read_text()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "m.xml").write_text(re.sub(r"<framework>.*?</framework>", "", xml, flags=re.S))
    (tmp_path / "plain" / "m.bin").write_bytes((folder / "cls.bin").read_bytes())
    with pytest.raises(BadFile, match="has no 'yolo' metadata: export it with export.py"):
        InferenceBackend(tmp_path / "plain")
    (tmp_path / "plain" / "m.xml").write_text("<net>")
    with pytest.raises(BadFile, match="not a loadable OpenVINO model"):
        InferenceBackend(tmp_path / "plain")
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(BadOption, match="pip install openvino"):
        InferenceBackend(folder)


def test_an_onnx_file_named_xml_is_refused_not_read_past_the_onnx_checks(tmp_path):
    """OpenVINO reads an ONNX file by its content whatever its name (it ran, metadata and all): as an .xml it would
    skip models/graphs.py, which refuses an ONNX graph that reads other files (external data)."""
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    (onnx_file,) = export(weights, include=("onnx",))
    (tmp_path / "m.xml").write_bytes(onnx_file.read_bytes())
    (tmp_path / "m.bin").write_bytes(b"")
    for path in (tmp_path / "m.xml", tmp_path):
        with pytest.raises(BadFile, match="m.xml is not an OpenVINO IR"):
            InferenceBackend(path)
    with pytest.raises(BadFile, match="m.xml is not an OpenVINO IR"):
        backend_module.weights_task(tmp_path / "m.xml")  # YOLO(...) reads the task first


def test_engine_onnx_is_checked_here_and_a_machine_without_tensorrt_says_what_it_lacks(tmp_path):
    onnx = pytest.importorskip("onnx")
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "v8.pt")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: benchmarks/gpu_check.sh builds the engine")
    with pytest.raises(BadOption, match=r"^--include engine needs (the tensorrt package .* and )?a CUDA GPU here; "
                                        r".*v8\.onnx is ready to build it"):
        export(weights, include=["engine"], dynamic=False)
    model = onnx.load(str(tmp_path / "v8.onnx"))
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a free batch, even from --no-dynamic
    assert "NonMaxSuppression" not in {n.op_type for n in model.graph.node}
    model.graph.node.append(onnx.helper.make_node("NonMaxSuppression", ["a", "b"], ["c"]))
    with pytest.raises(RuntimeError, match="it holds NMS"):
        check_engine_onnx(model, 17)


@pytest.mark.slow
def test_export_py_and_yolo_write_openvino_and_detect_py_runs_it(shapes_detect, tmp_path):
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "v8.pt")
    run = subprocess.run([sys.executable, str(ROOT / "export.py"), f"--weights={weights}", "format=openvino",
                          "imgsz=64", "dynamic=true"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    images = shapes_detect.parent / "images" / "val"
    out = {}
    for w in (weights, tmp_path / "v8_openvino_model"):  # --amp off: fp32 arithmetic in both
        run = subprocess.run([sys.executable, str(ROOT / "detect.py"), "--weights", str(w), "--source", str(images),
                              "--img", "64", "--amp", "off", "--conf-thres", "0.001", "--save-txt", "--save-conf",
                              "--project",
                              str(tmp_path / "runs"), "--name", w.name], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        out[w.name] = sorted((tmp_path / "runs" / w.name / "labels").glob("*.txt"))
    pt, ov = out.values()
    assert len(pt) == len(ov) > 0
    for a, b in zip(pt, ov):
        ra, rb = np.loadtxt(a, ndmin=2), np.loadtxt(b, ndmin=2)
        assert ra.shape == rb.shape and np.abs(ra - rb).max() < 1e-3


def _validated(validator_cls, model, data, save_dir, rect):
    """(metrics, [(input shape, prediction)] per batch) of validating `model` on `data`'s val split at 64 px."""
    options = validator_cls.options(imgsz=64, batch=3, workers=0, plots=False)
    d = validator_cls.get_data(str(data), options)
    validator = validator_cls(options, save_dir, d["names"])
    validator.build_dataloader(d["val"], 32, rect=rect)
    seen, forward = [], model.forward
    model.forward = lambda im: seen.append((tuple(im.shape), out := forward(im))) or out
    try:
        return validator(model), seen
    finally:
        model.forward = forward


def test_a_static_ir_is_validated_square_at_its_size_and_batch_as_the_pt_is_there(shapes_detect, tmp_path):
    """The default IR takes one size and batch: validation letterboxes every image square to that size, in batches of
    its own (the last one padded, the padding's rows dropped), and gets the .pt's predictions and metrics validated
    the same way; val.py takes it, replacing another --img in one warning line."""
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "v8.pt")
    (folder,) = export(weights, batch_size=3)
    validator_cls = TASKS["detect"].validator
    pt, pt_seen = _validated(validator_cls, attempt_load(weights), shapes_detect, tmp_path / "pt", rect=False)
    ir, ir_seen = _validated(validator_cls, InferenceBackend(folder, bf16=False), shapes_detect, tmp_path / "ir",
                             rect=False)
    assert [s for s, _ in pt_seen] == [(3, 3, 64, 64), (3, 3, 64, 64), (2, 3, 64, 64)]  # 8 images, square
    assert [s for s, _ in ir_seen] == [s for s, _ in pt_seen]
    for (_, a), (_, b) in zip(pt_seen, ir_seen):
        assert_close_per_channel(b[0], a[0])
    assert pt.keys() == ir.keys() and all(abs(pt[k] - ir[k]) < 1e-4 for k in pt)
    run = subprocess.run([sys.executable, str(ROOT / "val.py"), "--weights", str(folder), "--data", str(shapes_detect),
                          "--img", "96", "--batch-size", "8", "--project", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert "validating at that size instead of --imgsz 96" in log and "--batch-size 8 -> 3" in log
    assert "per image at shape (1, 3, 64, 64)" in log, log[-2000:]


def test_a_static_ir_of_another_shape_than_square_is_refused_by_val_in_one_line(shapes_detect, tmp_path):
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "v8.pt")
    (folder,) = export(weights, imgsz=[64, 96])
    run = subprocess.run([sys.executable, str(ROOT / "val.py"), "--weights", str(folder), "--data", str(shapes_detect),
                          "--project", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        f"error: --weights {folder} takes 64x96 images only, and validation letterboxes them square: export it with "
        "--img 96 or --dynamic"], run.stderr[-2000:]


def test_an_export_sends_no_usage_report(tmp_path, monkeypatch):
    """OpenVINO's converter reports conversions to Google Analytics unless it believes it runs in CI; the export
    keeps it from doing so (and the variable is restored), where the user's environment says nothing."""
    tm = pytest.importorskip("openvino_telemetry")
    monkeypatch.delenv("CI", raising=False)
    sent = []
    monkeypatch.setattr(tm.Telemetry, "send_event", lambda self, *a, **k: sent.append((self.consent, a)))
    export(save_checkpoint("yolov5n.yaml", DetectionModel, tmp_path / "model.pt"))
    assert "CI" not in __import__("os").environ
    assert tm.Telemetry().consent is False and not any(consent for consent, _ in sent)


def test_yolo_takes_an_ir_folder_or_its_xml_and_reads_its_task_from_it(shapes_segment, tmp_path, monkeypatch):
    """YOLO(folder) as the scripts take --weights folder: the task is the IR's own (its name has no -seg), read
    without compiling the IR (the script that runs it compiles it, once), and val and predict run it at its fixed
    size."""
    from models.runtimes import OpenVINORunner
    from yolo import YOLO

    weights = save_checkpoint("yolov8n-seg.yaml", SegmentationModel, tmp_path / "masks.pt")
    folder = Path(YOLO(weights).export(format="openvino", imgsz=64))
    assert folder == tmp_path / "masks_openvino_model"
    with monkeypatch.context() as m:
        m.setattr(OpenVINORunner, "compile", lambda *a: pytest.fail("the IR was compiled to read its task"))
        for model in (YOLO(folder), YOLO(folder / "masks.xml")):
            assert model.task == "segment"
    metrics = YOLO(folder).val(data=str(shapes_segment), imgsz=96, project=str(tmp_path / "runs"))
    assert set(metrics.results_dict) >= {"metrics/mAP50(B)", "metrics/mAP50(M)"}
    image = next((shapes_segment.parent / "images" / "val").iterdir())
    (result,) = YOLO(folder).predict(source=str(image), conf=0.001, save=False)
    assert result.masks is not None and result.masks.data.shape[1:] == result.orig_shape


def test_torch_hub_custom_takes_an_ir_folder_as_the_yolo_class_does(tmp_path):
    """hubconf.custom(path=folder) runs the IR (it said 'weights file not found' of the folder): on a non-square
    image, letterboxed square to the IR's size, the masks are the image's size and the rows are YOLO(folder)'s."""
    from yolo import YOLO

    weights = save_checkpoint("yolov8n-seg.yaml", SegmentationModel, tmp_path / "hub.pt")
    (folder,) = export(weights)
    im = (np.random.default_rng(0).random((90, 70, 3)) * 255).astype(np.uint8)
    hub = torch.hub.load(str(ROOT), "custom", path=str(folder), source="local")
    hub.conf = 0.001
    (got,) = hub(im[..., ::-1])  # torch.hub takes RGB arrays, YOLO.predict BGR ones (as cv2 reads them)
    (want,) = YOLO(folder).predict(source=im, conf=0.001)
    assert got.orig_shape == want.orig_shape == (90, 70) and got.masks.shape[1:] == (90, 70)
    assert len(got.boxes) > 0 and torch.equal(got.boxes.data, want.boxes.data)
    assert torch.equal(got.masks.data, want.masks.data)
