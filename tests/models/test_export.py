"""export.py: ONNX and TorchScript files give the PyTorch outputs, and the predict scripts run them."""

import dataclasses
import json
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
from engine.exporter import OPSETS, Exporter
from models.backend import ExportWrapper, InferenceBackend, flatten_outputs
from models.checkpoints import attempt_load, load_model
from models.yolo import ClassificationModel, DetectionModel, SegmentationModel
from utils.errors import BadFile, BadOption

ROOT = Path(__file__).resolve().parents[2]
MODELS = [
    ("yolov5n.yaml", DetectionModel),
    ("yolov7-tiny.yaml", DetectionModel),
    ("yolov8n.yaml", DetectionModel),
    ("yolov8n-seg.yaml", SegmentationModel),
    ("yolov8n-cls.yaml", ClassificationModel),
]


def export(weights, include, imgsz=(64,), batch=1, dynamic=True):
    opt = SimpleNamespace(weights=str(weights), include=list(include), imgsz=list(imgsz), batch_size=batch,
                          device="cpu", half=False, dynamic=dynamic, simplify=False, opset=17)
    return Exporter(opt)()


@pytest.mark.parametrize("cfg,cls", MODELS, ids=[m[0].removesuffix(".yaml") for m in MODELS])
def test_onnx_and_torchscript_match_pytorch(cfg, cls, tmp_path):
    weights = save_checkpoint(cfg, cls, tmp_path / "model.pt")
    files = export(weights, ["onnx", "torchscript"], dynamic=None)  # their default: any batch and size
    assert [f.suffix for f in files] == [".onnx", ".torchscript"] and all(f.stat().st_size > 1e5 for f in files)
    ref_model = attempt_load(weights, fuse=False)  # unfused: the export must also fold BatchNorm correctly
    g = torch.Generator().manual_seed(1)
    inputs = [torch.rand(1, 3, 64, 64, generator=g), torch.rand(2, 3, 96, 128, generator=g)]  # --dynamic
    for f in files:
        backend = InferenceBackend(f)
        assert backend.names == NAMES and backend.nc == 3 and backend.dynamic
        assert backend.stride == int(max(ref_model.stride)) and backend.task == InferenceBackend(weights).task
        layout = getattr(ref_model, "output_layout", None)  # None for classifiers
        assert layout == InferenceBackend(weights).output_layout
        if layout is not None:  # the prototypes, where there are some, are the export's second output
            assert backend.output_layout == dataclasses.replace(layout, proto=(1,) if layout.nm else ())
        for x in inputs:
            assert_same_inference_outputs(backend, ref_model, x)


@pytest.mark.parametrize("cfg,cls,nm", [("yolov8n.yaml", DetectionModel, 0),
                                        ("yolov5n-seg.yaml", SegmentationModel, 32),
                                        ("yolov8n-seg.yaml", SegmentationModel, 32)],
                         ids=["yolov8n", "yolov5n-seg", "yolov8n-seg"])
def test_an_export_holds_only_the_prediction_and_prototypes(cfg, cls, nm, tmp_path):
    """Not the head's raw per-level maps (the training loss's): the ONNX graph's outputs are the .pt's prediction,
    then its prototypes where the head has them, and the metadata says so."""
    import onnx

    weights = save_checkpoint(cfg, cls, tmp_path / "model.pt")
    (f,) = export(weights, ["onnx"], dynamic=False)
    model = attempt_load(weights)
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 64, 64))
    assert isinstance(out, tuple) and len(flatten_outputs(out)[0]) > 2  # the eval output holds the raw maps too
    pred, proto = model.output_layout.split(out)
    graph = onnx.load(str(f)).graph
    shapes = [tuple(d.dim_value for d in o.type.tensor_type.shape.dim) for o in graph.output]
    assert shapes == [tuple(pred.shape)] + ([(1, nm, 16, 16)] if nm else [])
    meta = json.loads(next(p.value for p in onnx.load(str(f)).metadata_props if p.key == "yolo"))
    assert meta["outputs"] == ([0, 1] if nm else [0]) and meta["layout"]["proto"] == ([1] if nm else [])


@pytest.mark.parametrize("cfg,cls", [("yolov8n-seg.yaml", SegmentationModel), ("yolov5n.yaml", DetectionModel)],
                         ids=["yolov8n-seg", "yolov5n"])
def test_an_export_made_with_the_raw_maps_still_runs(cfg, cls, tmp_path, monkeypatch):
    """Exports made before the exporter kept only what inference reads hold the whole eval output, and their metadata
    declares its nesting (prototypes at their path in it): they still load and give the .pt's prediction."""
    weights = save_checkpoint(cfg, cls, tmp_path / "model.pt")
    monkeypatch.setattr(ExportWrapper, "kept", lambda self, out: out)  # the exporter as it was
    monkeypatch.setattr(backend_module, "export_layout", lambda layout: layout)
    files = export(weights, ["onnx", "torchscript"])
    ref_model = attempt_load(weights, fuse=False)
    x = torch.rand(2, 3, 96, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        n_raw = len(flatten_outputs(ref_model(x))[0])
    for f in files:
        backend = InferenceBackend(f)
        assert backend.output_layout == ref_model.output_layout and len(flatten_outputs(backend(x))[0]) == n_raw
        assert_same_inference_outputs(backend, ref_model, x)


def test_static_export_pads_batch_and_rejects_other_sizes(tmp_path):
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    (f,) = export(weights, ["onnx"], imgsz=(64,), batch=2, dynamic=False)
    backend = InferenceBackend(f)
    assert not backend.dynamic and backend.imgsz == (64, 64)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        ref = attempt_load(weights)(x)
    out = backend(x)  # one image fed to a batch-2 graph: padded, and the padding's rows dropped
    assert out.shape == ref.shape
    assert_close_per_channel(out, ref)
    with pytest.raises(BadOption, match="exported for 64x64"):
        backend(torch.rand(1, 3, 96, 96))


@pytest.mark.parametrize("cfg", ["yolov8n.yaml", "yolov5n.yaml"])
def test_half_onnx_exports_and_gives_the_fp32_boxes_to_fp16_rounding(cfg, tmp_path):
    """--half to ONNX (the graph export.py traces on CUDA, traced here on the CPU): it exports (torch's ONNX `arange`
    has no fp16), its input and outputs are fp16, and onnxruntime's CPU gives the fp32 model's boxes to within what
    fp16's 11-bit significand leaves after the network (about 1e-3 of each value)."""
    ort = pytest.importorskip("onnxruntime")
    weights = save_checkpoint(cfg, DetectionModel, tmp_path / "model.pt")
    opt = SimpleNamespace(weights=str(weights), include=["onnx"], imgsz=[64], batch_size=1, device="cpu", half=True,
                          dynamic=False, simplify=False, opset=17)
    (f,) = Exporter(opt).export(*load_model(weights, fuse=True))
    session = ort.InferenceSession(str(f), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(float16)"
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    out = session.run(None, {"images": x.half().numpy()})[0]
    assert out.dtype == np.float16
    model = attempt_load(weights)
    with torch.no_grad():
        ref = model.output_layout.rows(flatten_outputs(model(x))[0][0])[..., :4]
    boxes = model.output_layout.rows(torch.from_numpy(out).float())[..., :4]
    torch.testing.assert_close(boxes, ref, rtol=2e-3, atol=2e-3 * ref.abs().max().item())


def test_onnx_without_onnxruntime_says_what_to_install(tmp_path, monkeypatch):
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    (f,) = export(weights, ["onnx"])
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(BadOption, match="pip install onnxruntime"):
        InferenceBackend(f)


@pytest.mark.parametrize("opset", [3, 999, -1, OPSETS.stop])
def test_an_opset_the_exporter_lacks_is_refused_before_the_model_is_loaded(opset, tmp_path):
    opt = SimpleNamespace(weights=str(tmp_path / "absent.pt"), include=["onnx"], opset=opset)
    with pytest.raises(BadOption, match=rf"^--opset {opset}: torch .* exports ONNX opsets {OPSETS.start}\.\."):
        Exporter(opt)


def test_a_namespace_without_imgsz_exports_at_the_run_s_size_else_640(tmp_path):
    """The exporter takes a namespace naming some of export.py's options; an --img it does not name is the weights'
    run's, else 640, as on the command line (not None reaching the example input)."""
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    (f,) = Exporter(SimpleNamespace(weights=str(weights), include=["torchscript"]))()
    assert InferenceBackend(f).imgsz == (640, 640)
    ckpt = torch.load(weights, weights_only=True)
    torch.save({**ckpt, "opt": {"train_imgsz": 64}}, weights)
    (f,) = Exporter(SimpleNamespace(weights=str(weights), include=["torchscript"], dynamic=False))()
    assert InferenceBackend(f).imgsz == (64, 64)


def test_exporting_an_export_is_one_error_naming_what_it_is(tmp_path):
    """An export given to export.py (or YOLO(export).export()) was read as a pickle: 'not a readable checkpoint (at
    position 0, opcode b'\\x08' unknown)' of an .onnx, the same of an IR's .xml."""
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    files = export(weights, ["onnx", "torchscript"])
    xml = tmp_path / "cls_openvino_model" / "cls.xml"  # an IR by its name: refused before anything reads it
    for f, made in [*zip(files, ("onnx", "torchscript")), (xml, "openvino")]:
        with pytest.raises(BadFile, match=rf"^refusing --weights {re.escape(str(f))}: an export \({made}\), not "
                                          "a checkpoint: export.py converts the .pt it was made from"):
            export(f, ["onnx"])


def test_exports_in_threads_each_give_the_pt_outputs(tmp_path):
    """Two YOLO(...).export() calls in threads traced at once: torch's tracer is process-wide, and one failed with
    'Tracing failed sanity checks! Graphs differed across invocations'."""
    import threading

    files, errors = {}, []
    for i in range(3):
        save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / f"m{i}.pt", seed=i)

    def run(i):
        try:
            files[i] = export(tmp_path / f"m{i}.pt", ["torchscript", "onnx"])
        except Exception as e:  # a thread's failure is the test's
            errors.append(repr(e)[:300])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    for i, exported in files.items():
        ref = attempt_load(tmp_path / f"m{i}.pt", fuse=False)
        for f in exported:
            assert_same_inference_outputs(InferenceBackend(f), ref, x)


def test_format_names_are_read_in_any_case_and_tensorrt_is_the_engine(tmp_path):
    """yolo export format=ONNX (Ultralytics lowercases it, and takes tensorrt/trt for engine) was refused:
    '--include ONNX: supported formats are onnx, ...'."""
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    assert export(weights, ["ONNX", "TorchScript"]) == [tmp_path / "cls.onnx", tmp_path / "cls.torchscript"]
    assert Exporter(SimpleNamespace(weights=str(weights), include=["TensorRT", "trt"])).opt.include == ["engine"] * 2
    with pytest.raises(BadOption, match="^--include tflite: supported formats are onnx, torchscript"):
        Exporter(SimpleNamespace(weights=str(weights), include=["TFLite"]))


def test_an_export_whose_names_miss_a_class_is_refused_when_loaded(tmp_path):
    """Metadata naming fewer classes than nc (edited, or from another tool) loaded, and detect.py ended in
    KeyError: 50 when it named a predicted class; a checkpoint's names must cover 0..nc-1 (class_names), so must an
    export's."""
    import onnx

    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "m.pt")
    (f,) = export(weights, ["onnx"])
    model = onnx.load(str(f))
    prop = next(p for p in model.metadata_props if p.key == "yolo")
    for names in ({"0": "circle", "1": "rectangle"}, {"0": "a", "1": "b", "3": "c"}):
        prop.value = json.dumps({**json.loads(prop.value), "names": names})
        onnx.save(model, str(f))
        with pytest.raises(BadFile, match=r"its 'yolo' metadata lacks or mistypes \['names'\]"):
            InferenceBackend(f)


def test_a_fixed_onnx_beside_an_engine_is_refused_not_replaced(tmp_path):
    """--include onnx engine --no-dynamic wrote the fixed ONNX, logged it as taking one input only, then wrote the
    engine's dynamic graph over it under the same name."""
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    with pytest.raises(BadOption, match=r"^--include onnx engine: the engine is built from a dynamic cls.onnx"):
        export(weights, ["onnx", "engine"], dynamic=False)
    assert not (tmp_path / "cls.onnx").exists()


def test_an_opset_that_cannot_express_the_model_is_one_error_naming_it(tmp_path):
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "v8n.pt")
    opt = SimpleNamespace(weights=str(weights), include=["onnx"], imgsz=[64], batch_size=1, device="cpu", half=False,
                          dynamic=True, simplify=False, opset=8)  # in the range, but Upsample there is not torch's
    with pytest.raises(BadOption, match=r"^--opset 8: Unsupported: ONNX export of operator upsample"):
        Exporter(opt)()


def test_a_damaged_onnx_file_is_one_error_naming_it_and_the_reason(tmp_path):
    weights = save_checkpoint("yolov8n-cls.yaml", ClassificationModel, tmp_path / "cls.pt")
    (good,) = export(weights, ["onnx"])
    # read by the onnx package's protobuf parser before onnxruntime sees the file (models/untrusted.py); an empty
    # file parses as an empty model, which names no export
    damaged = {"garbage.onnx": (b"garbage\n", r": not a loadable ONNX file \(DecodeError: .* Wire format was corrupt"),
               "truncated.onnx": (good.read_bytes()[:20_000], r": not a loadable ONNX file \(DecodeError: "),
               "empty.onnx": (b"", " has no 'yolo' metadata: export it with export.py$")}
    for name, (data, why) in damaged.items():
        f = tmp_path / name
        f.write_bytes(data)
        with pytest.raises(BadFile, match=rf"^--weights {re.escape(str(f))}{why}"):
            InferenceBackend(f)


def _labels(folder):
    """{image stem: [(cls, cx, cy, w, h, conf)]} of a --save-txt --save-conf run."""
    return {p.stem: [tuple(map(float, line.split())) for line in p.read_text().splitlines()]
            for p in sorted(Path(folder).glob("*.txt"))}


def test_detect_script_gives_the_pt_boxes_from_onnx_and_torchscript(shapes_detect, tmp_path):
    import detect

    weights = save_checkpoint("yolov5n.yaml", DetectionModel, tmp_path / "v5n.pt")
    ckpt = torch.load(weights, weights_only=True)
    for k, v in ckpt["model"]["state_dict"].items():  # spread the confidences so that boxes pass 0.25
        if k.startswith("model.24.m.") and k.endswith("bias"):
            v.copy_(torch.randn(v.shape, generator=torch.Generator().manual_seed(2)) * 2)
    torch.save(ckpt, weights)
    # export.py's defaults: the README promises the .pt's boxes at the same --img, on images that are not square
    cmd = [sys.executable, str(ROOT / "export.py"), "--weights", str(weights), "--include", "onnx", "torchscript"]
    r = subprocess.run(cmd, check=True, timeout=300, cwd=tmp_path, capture_output=True, text=True)
    assert f"Results saved to {tmp_path}" in r.stdout
    source = tmp_path / "images"
    source.mkdir()
    val = sorted((Path(shapes_detect).parent / "images" / "val").glob("*.jpg"))
    for f in val:
        (source / f.name).write_bytes(f.read_bytes())
    # a wide image: letterboxed for the .pt to 96 x 64 (the stride's multiple), where a fixed-size export pads to 96
    wide = np.hstack([cv2.resize(cv2.imread(str(f)), (128, 128)) for f in val[:2]])
    cv2.imwrite(str(source / "wide.jpg"), wide)
    runs = {}
    for suffix in (".pt", ".onnx", ".torchscript"):
        opt = detect.parse_opt(["--weights", str(weights.with_suffix(suffix)), "--source", str(source), "--imgsz",
                                "96", "--device", "cpu", "--save-txt", "--save-conf", "--nosave", "--project",
                                str(tmp_path / "runs"), "--name", suffix[1:]])  # the defaults: fp32, as exports run
        detect.main(opt)
        runs[suffix] = _labels(tmp_path / "runs" / suffix[1:] / "labels")
    ref = runs[".pt"]
    assert sum(len(v) for v in ref.values()) >= 8  # enough boxes for the comparison to mean something
    for suffix in (".onnx", ".torchscript"):
        assert runs[suffix].keys() == ref.keys()
        for stem, rows in ref.items():
            got = runs[suffix][stem]
            assert len(got) == len(rows)
            for a, b in zip(got, rows):
                assert a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1:], b[1:])) < 1e-4


def test_simplified_onnx_matches_pytorch(tmp_path):
    pytest.importorskip("onnxslim")
    weights = save_checkpoint("yolov8n.yaml", DetectionModel, tmp_path / "v8n.pt")
    opt = SimpleNamespace(weights=str(weights), include=["onnx"], imgsz=[64], batch_size=1, device="cpu", half=False,
                          dynamic=True, simplify=True, opset=17)
    (f,) = Exporter(opt)()
    ref_model, backend = attempt_load(weights), InferenceBackend(f)
    x = torch.rand(2, 3, 96, 64, generator=torch.Generator().manual_seed(3))
    assert_same_inference_outputs(backend, ref_model, x)


def test_val_script_gives_the_pt_metrics_from_onnx_and_torchscript(shapes_detect, tmp_path):
    import val

    weights = save_checkpoint("yolov5n.yaml", DetectionModel, tmp_path / "v5n.pt")
    ckpt = torch.load(weights, weights_only=True)
    for k, v in ckpt["model"]["state_dict"].items():  # objectness raised, class scores spread: detections to score
        if k.startswith("model.24.m.") and k.endswith("bias"):
            b = v.view(3, -1)
            b[:, 4] = 0.0
            b[:, 5:] = torch.randn(b[:, 5:].shape, generator=torch.Generator().manual_seed(2)).half() * 2
    torch.save(ckpt, weights)
    export(weights, ["onnx", "torchscript"], imgsz=(96,))
    stats = {}
    for suffix in (".pt", ".onnx", ".torchscript"):
        opt = val.parse_opt(["--weights", str(weights.with_suffix(suffix)), "--data", str(shapes_detect), "--imgsz",
                             "96", "--batch-size", "4", "--device", "cpu", "--workers", "0", "--project",
                             str(tmp_path / "val"), "--name", suffix[1:]])
        stats[suffix] = val.main(opt)
    ref = stats[".pt"]
    assert ref["metrics/mAP50(B)"] > 0 and ref["metrics/recall(B)"] > 0
    for suffix in (".onnx", ".torchscript"):
        for k, v in ref.items():
            assert stats[suffix][k] == pytest.approx(v, abs=1e-4), (suffix, k)
