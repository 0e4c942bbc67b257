"""Run by test_int8_scope.py, in a process of its own (OpenVINO's runtime and onnxruntime do not share one well).
What an OpenVINO --int8 export quantises, read from the IR's graph: every convolution's weights are int8 and its
input passes a FakeQuantize, but for the first convolution (the image's), whose weights stay fp32 and whose input
is the image itself; nothing of the head's own arithmetic (box decoding, sigmoids, the DFL's softmax and
convolution) is quantised."""

from types import SimpleNamespace

import pytest
from models_testutil import save_checkpoint

from engine.exporter import Exporter
from engine.tasks import TASKS
from models.yolo import DetectionModel

ov = pytest.importorskip("openvino")
pytest.importorskip("nncf")


@pytest.fixture(scope="module")
def calib_data(tmp_path_factory):
    """A dataset YAML whose train split holds the 32 images INT8 calibration needs at least."""
    from data.synthetic import generate_dataset
    from tests.conftest import write_yaml

    root = tmp_path_factory.mktemp("calib")
    generate_dataset(root, task="detect", n_train=32, n_val=2, seed=2, min_side=64, max_side=96)
    return write_yaml(root, "detect")


def weight_type(conv):
    """The element type a convolution's weights are stored in: its weight input read back through NNCF's
    dequantisation (a Multiply of a Convert of the stored constant)."""
    node = conv.input(1).get_source_output().get_node()
    while node.get_type_name() in ("Multiply", "Convert", "Subtract"):
        node = node.input(0).get_source_output().get_node()
    assert node.get_type_name() == "Constant", node
    return str(node.get_output_element_type(0))


def quantised(node):
    """Whether the tensor `node` makes passes a FakeQuantize: itself, or all it joins (Concat), or what it pools or
    splits (MaxPool, VariadicSplit: they keep their input's grid)."""
    kind = node.get_type_name()
    if kind in ("Concat", "MaxPool", "VariadicSplit"):
        sources = node.inputs() if kind == "Concat" else node.inputs()[:1]
        return all(quantised(i.get_source_output().get_node()) for i in sources)
    return kind == "FakeQuantize"


@pytest.mark.parametrize("cfg,head", [("yolov5n.yaml", 24), ("yolov8n.yaml", 22)])
def test_int8_leaves_the_first_convolution_and_the_head_s_arithmetic_in_float(cfg, head, calib_data, tmp_path):
    weights = save_checkpoint(cfg, DetectionModel, tmp_path / "m.pt")
    opt = SimpleNamespace(weights=str(weights), include=["openvino"], imgsz=[64], batch_size=1, device="cpu",
                          int8=True, data=str(calib_data), calib_images=32)
    (folder,) = Exporter(opt, {name: task.inputs for name, task in TASKS.items()})()
    ops = ov.Core().read_model(str(folder / "m.xml")).get_ordered_ops()
    head_ops = (f"__module.model.model.{head}/", f"__module.model.model.{head}.dfl/",
                f"__module.model.model.{head}.dfl.conv/")
    decode = [op for op in ops if op.get_friendly_name().startswith(head_ops)]
    convs = [op for op in ops if op.get_type_name() == "Convolution" and op not in decode]
    first, rest = convs[0], convs[1:]
    assert first.get_friendly_name().startswith("__module.model.model.0.conv/")
    assert weight_type(first) == "<Type: 'float32'>"
    assert first.input(0).get_source_output().get_node().get_type_name() == "Parameter"
    assert len(rest) > 20 and {weight_type(c) for c in rest} == {"<Type: 'int8_t'>"}
    assert [c.get_friendly_name() for c in rest if not quantised(c.input(0).get_source_output().get_node())] == []
    assert any(op.get_type_name() == "Sigmoid" for op in decode)
    assert all(weight_type(op) == "<Type: 'float32'>" for op in decode if op.get_type_name() == "Convolution")
    assert [op.get_friendly_name() for op in decode if op.get_type_name() == "FakeQuantize" or any(
        i.get_source_output().get_node().get_type_name() == "FakeQuantize" for i in op.inputs())] == []
