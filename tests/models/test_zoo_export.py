"""export.py on the model zoo: YOLO11 (seg: its detect head and more), a P6 model, and a model holding the attention
series and the transformer (C3TR) export to ONNX and TorchScript that give the PyTorch outputs at other batch and
image sizes; Swin V2 exports at its one size."""

import pytest
import torch
from models_testutil import NAMES, assert_close_per_channel, assert_same_inference_outputs, save_checkpoint
from test_export import export
from test_graphs import _same_shapes_as_onnxruntime

from models.backend import InferenceBackend
from models.checkpoints import attempt_load
from models.yolo import DetectionModel, SegmentationModel, yaml_model_load
from utils.errors import BadOption


def _series():
    """yolov5n with each block of the attention series and a C3TR after SPPF."""
    d = yaml_model_load("yolov5n.yaml")
    blocks = ["SE", "CBAM", "ECA", "CoordAtt", "SimAM", "C3TR"]
    d["backbone"] += [[-1, 1, b, [1024]] for b in blocks]
    d["head"] = [[[x + len(blocks) if isinstance(x, int) and x > 9 else x for x in r[0]]
                  if isinstance(r[0], list) else r[0], *r[1:]] for r in d["head"]]
    return d


MODELS = {  # name: (cfg, class, two input sizes (h, w): the export's own and another)
    "yolo11n-seg": ("yolo11n-seg.yaml", SegmentationModel, ((64, 64), (96, 128))),
    "yolov5n6": ("yolov5n6.yaml", DetectionModel, ((64, 64), (128, 192))),
    "attention-series": (_series(), DetectionModel, ((64, 64), (96, 128))),
    # the lead head alone: the auxiliary head is dropped
    "yolov7-w6": ({**yaml_model_load("yolov7-w6.yaml"), "width_multiple": 0.125}, DetectionModel,
                  ((64, 64), (128, 192))),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_exports_match_pytorch(name, tmp_path):
    cfg, cls, sizes = MODELS[name]
    weights = save_checkpoint(cfg, cls, tmp_path / "model.pt")
    files = export(weights, ["onnx", "torchscript"], imgsz=sizes[0])
    ref_model = attempt_load(weights, fuse=False)
    g = torch.Generator().manual_seed(1)
    assert _same_shapes_as_onnxruntime(files[0], (2, 3, *sizes[1]))  # the ONNX dry run of the new operators
    for f in files:
        backend = InferenceBackend(f)
        assert backend.names == NAMES and backend.dynamic
        for batch, (h, w) in zip((1, 2), sizes):
            x = torch.rand(batch, 3, h, w, generator=g)
            assert_same_inference_outputs(backend, ref_model, x)


def test_swin_exports_at_its_one_size(tmp_path):
    """C3STR chooses its windows from the map size in Python, which a traced graph keeps: a dynamic export is
    refused naming the block, a --no-dynamic one gives the PyTorch outputs at its size."""
    weights = save_checkpoint("yolov8n-swinv2.yaml", DetectionModel, tmp_path / "swin.pt")
    with pytest.raises(BadOption, match="C3STR.*--no-dynamic"):
        export(weights, ["onnx"], imgsz=(96, 128))  # --dynamic asked
    files = export(weights, ["onnx", "torchscript"], imgsz=(96, 128), dynamic=None)  # each format's default: fixed
    assert not any(InferenceBackend(f).dynamic for f in files)
    files = export(weights, ["onnx", "torchscript"], imgsz=(96, 128), dynamic=False)
    assert _same_shapes_as_onnxruntime(files[0], (1, 3, 96, 128))
    x = torch.rand(1, 3, 96, 128, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = attempt_load(weights, fuse=False)(x)[0]
    for f in files:
        assert_close_per_channel(InferenceBackend(f)(x)[0], ref)
