"""The model zoo: official names resolve, checkpoints the official packages saved load through the safe loader, and
whole module trees of the new blocks (as the official repositories pickle them) load without their code."""

from pathlib import Path

import pytest
import torch
from models_testutil import assert_close_per_channel, randomise_bn

from models.checkpoints import attempt_load
from models.yolo import ClassificationModel, DetectionModel, SegmentationModel, yaml_model_load
from utils.errors import BadModelYaml

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name, cls, nc", [("zoo-yolov5n6-tiny", DetectionModel, 1),
                                           ("zoo-yolo11-cls-tiny", ClassificationModel, 1),
                                           ("zoo-yolov7-p6-tiny", DetectionModel, 2)])
def test_peer_saved_zoo_checkpoints(name, cls, nc):
    """A P6 model saved by the yolov5 package's train.py, a YOLO11 model saved by Ultralytics (whole fp16 module
    trees, fixtures/make_zoo_checkpoints.py) and a YOLOv7 P6 model (ReOrg, DownC, Shortcut, IAuxDetect) as the
    YOLOv7 repository's train_aux.py saves one (fixtures/make_v7p6_parity.py) load through the safe loader as our
    models and give the official eval outputs, fused or not."""
    ref = torch.load(FIXTURES / f"{name}.out.pt", weights_only=True)
    x = ref["x"].float() / 255
    for fuse in (False, True):
        model = attempt_load(FIXTURES / f"{name}.pt", fuse=fuse)
        assert type(model) is cls and model.nc == nc
        with torch.no_grad():
            out = model(x)
        assert_close_per_channel(out[0] if isinstance(out, tuple) else out, ref["y"])


def _narrow(cfg, **scaling):
    d = yaml_model_load(cfg)
    d.update(scaling)
    return d


@pytest.mark.parametrize("cfg, scaling, cls, size", [
    ("yolov5s-transformer.yaml", {"width_multiple": 0.125}, DetectionModel, (64, 96)),  # torch's MultiheadAttention
    ("yolov3-tiny.yaml", {"width_multiple": 0.125}, DetectionModel, (64, 96)),  # ZeroPad2d
    # C3k2, C2PSA, depthwise head
    ("yolo11n-seg.yaml", {"scales": {"n": [0.5, 0.125, 1024]}}, SegmentationModel, (64, 96)),
    # ReOrg, DownC, Shortcut, IAuxDetect: sides a multiple of its largest stride, 64
    ("yolov7-e6e.yaml", {"width_multiple": 0.125}, DetectionModel, (64, 128)),
])
def test_module_trees_of_zoo_models_load_without_their_code(cfg, scaling, cls, size, tmp_path):
    """Official repositories pickle whole module trees; a tree of these blocks (pickled here under `models.*`, as
    YOLOv5's GitHub layout names them) loads through the allow-list as stand-ins and gives the same outputs."""
    torch.manual_seed(0)
    model = randomise_bn(cls(_narrow(cfg, **scaling), nc=3)).half().float().eval()
    torch.save({"model": model.half()}, tmp_path / "tree.pt")
    model.float()
    loaded = attempt_load(tmp_path / "tree.pt", fuse=False)
    x = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close_per_channel(loaded(x)[0], model(x)[0])


def test_official_names_resolve():
    """Each name picks its file and scale; a name implying a scale of a one-size file is refused, not built at the
    file's size."""
    assert yaml_model_load("yolo11s-seg.yaml")["scale"] == "s"
    assert yaml_model_load("yolov8x-ghost-p6.yaml")["scale"] == "x"
    assert yaml_model_load("yolov5n6.yaml")["width_multiple"] == 0.25
    with pytest.raises(BadModelYaml, match="one size"):
        yaml_model_load("yolov5n-p2.yaml")


def test_yolo11_scales_m_l_x_build_c3k():
    """Ultralytics builds YOLO11 m, l and x with C3k blocks inside every C3k2 whatever the row says, n and s with
    bottlenecks; the scale's name decides, not its numbers."""
    narrow = {"n": [0.5, 0.25, 1024], "m": [0.5, 0.25, 1024]}
    for scale, expected in (("n", "Bottleneck"), ("m", "C3k")):
        d = _narrow("yolo11n.yaml", scales=narrow)
        d["scale"] = scale
        c3k2 = DetectionModel(d).model[2]
        assert type(c3k2.m[0]).__name__ == expected
