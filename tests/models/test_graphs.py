"""Exported graphs judged before onnxruntime or torch.jit runs them (models/graphs.py, the dry run of
utils/dry_run.py in models/backend.py): the exports of every family and task pass at every opset export.py offers,
with the shapes onnxruntime computes; files of a few hundred bytes that would cost gigabytes or never end are one
`error:` line, in a process whose memory is capped."""

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
import untrusted_corpus as corpus
from models_testutil import save_checkpoint
from onnx import helper

from engine.exporter import Exporter
from models.backend import InferenceBackend
from models.graphs import ONNX_OPS, UnsafeOnnx, onnx_dry_run, read_onnx
from models.yolo import ClassificationModel, DetectionModel, OBBModel, PoseModel, SegmentationModel
from tests.capped import refused_once, run_capped
from utils.errors import BadFile

FAMILIES = [("yolov5n.yaml", DetectionModel), ("yolov5n-seg.yaml", SegmentationModel),
            ("yolov5n-cls.yaml", ClassificationModel), ("yolov7-tiny.yaml", DetectionModel),
            ("yolov8n.yaml", DetectionModel), ("yolov8n-seg.yaml", SegmentationModel),
            ("yolov8n-cls.yaml", ClassificationModel), ("yolov8n-pose.yaml", PoseModel),
            ("yolov5nu.yaml", DetectionModel), ("yolo11n-seg.yaml", SegmentationModel),
            ("yolo11n-cls.yaml", ClassificationModel), ("yolov3-tiny.yaml", DetectionModel),
            ("yolov5s-transformer.yaml", DetectionModel), ("yolov8n-ghost.yaml", DetectionModel),
            ("yolov8n-p2.yaml", DetectionModel), ("yolov8n-obb.yaml", OBBModel)]


def _export(weights, opset=17, dynamic=True):
    opt = SimpleNamespace(weights=str(weights), include=["onnx"], imgsz=[64], batch_size=1, device="cpu", half=False,
                          dynamic=dynamic, simplify=False, opset=opset)
    return Exporter(opt)()[0]


def _same_shapes_as_onnxruntime(path, shape):
    """The dry run's output shapes for an input of `shape` are onnxruntime's."""
    import onnxruntime

    _, out = onnx_dry_run(read_onnx(path.read_bytes(), path), shape, path)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    real = session.run(None, {"images": np.zeros(shape, dtype=np.float32)})
    return [tuple(o.shape) for o in out] == [r.shape for r in real]


@pytest.mark.slow
@pytest.mark.parametrize("cfg,cls", FAMILIES, ids=[c.removesuffix(".yaml") for c, _ in FAMILIES])
def test_every_family_passes_with_onnxruntime_shapes(tmp_path, cfg, cls):
    """Fails when the exporter starts writing an operator ONNX_OPS lacks, or the dry run computes another shape."""
    onnx_file = _export(save_checkpoint(cfg, cls, tmp_path / "m.pt"))
    assert {n.op_type for n in onnx.load(str(onnx_file)).graph.node} <= ONNX_OPS
    assert _same_shapes_as_onnxruntime(onnx_file, (2, 3, 96, 64))
    backend = InferenceBackend(onnx_file)
    backend(torch.zeros(1, 3, 64, 96))
    assert set(backend.limits) == {(1, 3, 64, 64), (1, 3, 64, 96)}  # the exported size at load, then the new one


@pytest.mark.slow
@pytest.mark.parametrize("opset", [9, 10, 11, 13, 18, 20])
def test_the_opsets_export_py_offers_pass(tmp_path, opset):
    """Where the operators change with the opset (Upsample, Resize, Slice, Split and Squeeze inputs, arange written as
    NonZero at 9-10): the families with the most of them, detect and segment heads of v5 and v8."""
    for cfg, cls in [("yolov5n-seg.yaml", SegmentationModel), ("yolov8n-seg.yaml", SegmentationModel)]:
        onnx_file = _export(save_checkpoint(cfg, cls, tmp_path / f"{cfg}.pt"), opset)
        assert _same_shapes_as_onnxruntime(onnx_file, (1, 3, 64, 96)), (cfg, opset)


# ------------------------------------------------------------------ what export.py never writes
def _if_node():
    branch = helper.make_graph([helper.make_node("Identity", ["images"], ["o"])], "b", [],
                               [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, None)])
    cond = onnx.numpy_helper.from_array(np.array(True), "cond")
    return [helper.make_node("If", ["cond"], ["scores"], then_branch=branch, else_branch=branch)], [cond]


def _pixel_sized():
    """A ConstantOfShape whose size is the first pixel's value, through operators export.py writes."""
    return [helper.make_node("Flatten", ["images"], ["f"], axis=0),
            helper.make_node("Gather", ["f", "i"], ["g"], axis=1), helper.make_node("Reshape", ["g", "one"], ["r"]),
            helper.make_node("Cast", ["r"], ["n"], to=7), helper.make_node("ConstantOfShape", ["n"], ["big"])]


def _hostile():
    cond_nodes, cond_inits = _if_node()
    custom = helper.make_node("Gelu", ["images"], ["scores"], domain="com.microsoft")
    short = onnx.numpy_helper.from_array(np.ones(4, dtype=np.float32), "scale")
    short.dims[:] = [1 << 28]  # declares 256 M floats, holds 4
    return {
        "a Loop of 2^62 trips": (corpus.onnx_loop(1 << 62), "Loop, which export.py never writes"),
        "an If with subgraphs": (corpus.onnx_model(cond_nodes, [("scores", 4)], cond_inits),
                                 "If, which export.py never writes"),
        "another domain": (corpus.onnx_model([custom], [("scores", 4)]), "com.microsoft Gelu"),
        "external data": (corpus.onnx_pooled(external=True), "lives in another file (external data)"),
        "a tensor holding less than it declares": (
            corpus.onnx_model([helper.make_node("Mul", ["images", "scale"], ["scores"])], [("scores", 4)], [short]),
            "declares 1073741824 bytes but holds 16"),
        "ConstantOfShape of 2 GiB": (corpus.onnx_constant_of_shape(1 << 29), "constants of more than"),
        "outputs unlike the metadata": (corpus.onnx_pooled(meta={**corpus.CLASSIFY_META, "task": "detect",
                                                                 "layout": {"nc": 80}}),
                                        "its prediction has shape (1, 3), not rows of 84 columns"),
        "a Resize by 1000": (corpus.onnx_model([helper.make_node("Resize", ["images", "", "scales"], ["scores"])],
                                               [("scores", 4)], [onnx.numpy_helper.from_array(
                                                   np.array([1, 1, 1000, 1000], dtype=np.float32), "scales")]),
                             "activations of more than"),
        "an operator export.py never writes": (corpus.onnx_model(
            [helper.make_node("ReduceProd", ["images"], ["m"], keepdims=0)], [("m", 0)]), "ReduceProd"),
        "a size from the pixels": (corpus.onnx_model(_pixel_sized(), [("big", 1)], [
            onnx.numpy_helper.from_array(np.array([0], dtype=np.int64), "i"),
            onnx.numpy_helper.from_array(np.array([1], dtype=np.int64), "one")]), "values of the input"),
    }


@pytest.mark.parametrize("kind", list(_hostile()))
def test_hostile_graphs_are_refused_before_onnxruntime(tmp_path, monkeypatch, kind):
    import onnxruntime

    data, words = _hostile()[kind]
    assert len(data) < 1024
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    monkeypatch.setattr(onnxruntime, "InferenceSession", lambda *a, **k: pytest.fail("onnxruntime reached"))
    with pytest.raises(BadFile) as e:
        InferenceBackend(path)
    assert words in str(e.value) and str(e.value).count("\n") == 0


def test_an_honest_graph_of_the_same_kind_runs(tmp_path):
    """The hand-made classifier the attacks are variations of: loaded, run, its size checked (so the refusals above
    are the variations', not the harness's)."""
    path = tmp_path / "m.onnx"
    path.write_bytes(corpus.onnx_pooled())
    assert InferenceBackend(path)(torch.ones(1, 3, 64, 64)).shape == (1, 3)
    meta = json.loads(next(p.value for p in onnx.load(str(path)).metadata_props))
    assert meta == corpus.CLASSIFY_META


def test_scripts_refuse_in_one_line_with_memory_capped(tmp_path):
    """detect.py on the 497-byte ConstantOfShape (onnxruntime would allocate 2 GiB while loading) and on the Loop
    (it would never end): one `error:` line each, exit 2, peak memory far under the 2 GiB cap."""
    for name, data, words in [("cos", corpus.onnx_constant_of_shape(1 << 29), "constants of more than"),
                              ("loop", corpus.onnx_loop(1 << 62), "Loop, which export.py never writes")]:
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(data)
        r = run_capped(["detect.py", "--weights", str(path), "--source", "data/images", "--device", "cpu",
                        "--project", str(tmp_path / "runs")], timeout=240)
        assert refused_once(r, words), r.stderr[-2000:]
        assert r.peak < 1 << 30, f"peak {r.peak / 2 ** 20:.0f} MiB"
    with pytest.raises(UnsafeOnnx):
        read_onnx(corpus.onnx_loop(3), "loop")


def test_a_run_past_its_limit_is_stopped_by_onnxruntime(tmp_path):
    """What the dry run cannot see is stopped by the wall clock: onnxruntime's own stop (RunOptions.terminate), here
    with the limit of the shape set far below what the run takes."""
    onnx_file = _export(save_checkpoint("yolov5n.yaml", DetectionModel, tmp_path / "m.pt"))
    backend = InferenceBackend(onnx_file)
    x = torch.zeros(1, 3, 320, 320)
    backend(x)  # the dry run of this size sets its limit
    backend.limits[tuple(x.shape)] = 1e-4
    with pytest.raises(BadFile, match=r"inference stopped after 0 s, far beyond what its dry run counted"):
        backend(x)
