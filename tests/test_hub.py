"""hubconf.py through torch.hub.load(..., source='local'), offline: local checkpoints of each task, YAML-built
models, and every input type, checked against detect.py's predictor on the same image."""

import numpy as np
import pytest
import torch
from PIL import Image

import detect
import hubconf
from evaluation.results import Results
from models.checkpoints import model_to_ckpt
from models.yolo import ClassificationModel, DetectionModel, OBBModel, SegmentationModel
from utils.files import ROOT

IMAGE = ROOT / "data" / "images" / "shapes1.jpg"
NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}
CONF = 1e-4  # an untrained model's scores are tiny; this keeps plenty of boxes to compare


def checkpoint(tmp_path, model):
    torch.manual_seed(0)
    model.names = dict(NAMES)
    f = tmp_path / "best.pt"
    torch.save({"model": model_to_ckpt(model), "epoch": -1}, f)
    return f


def hub_load(*args, **kwargs):
    return torch.hub.load(str(ROOT), *args, source="local", **kwargs)


@pytest.mark.parametrize("cfg", ["yolov5n.yaml", "yolov8n.yaml"])
def test_custom_matches_predictor_for_every_input_type(tmp_path, cfg):
    weights = checkpoint(tmp_path, DetectionModel(cfg, nc=3))
    model = hub_load("custom", path=str(weights), device="cpu")
    model.conf = CONF
    rgb = np.asarray(Image.open(IMAGE).convert("RGB"))
    results = model([str(IMAGE), rgb, Image.open(IMAGE), Image.fromarray(rgb)], size=96)
    assert len(results) == 4 and len(results.xyxy[0]) > 0
    assert all(isinstance(r, Results) for r in results)  # a list of Results, as Ultralytics' predict returns
    assert torch.equal(results[0].boxes.data, results.xyxy[0]) and results[3].path == "image3"
    assert results.files == (IMAGE.name, "array1", IMAGE.name, "image3")  # what print(results) names them
    for det in results.xyxy[1:]:
        torch.testing.assert_close(det, results.xyxy[0], atol=0.05, rtol=0)  # JPEG decoders may differ slightly
    # --amp off: the hub model runs in fp32 (on a CPU with native bf16 the predict scripts would not)
    ref = detect.main(detect.parse_opt(["--weights", str(weights), "--source", str(IMAGE), "--imgsz", "96",
                                        "--device", "cpu", "--conf-thres", str(CONF), "--nosave",
                                        "--project", str(tmp_path / "det")]))[0]
    torch.testing.assert_close(results.xyxy[0], ref.boxes[:, :6].cpu(), atol=1e-3, rtol=1e-4)
    aug = model(str(IMAGE), size=96, augment=True).xyxy[0]
    ref = detect.main(detect.parse_opt(["--weights", str(weights), "--source", str(IMAGE), "--imgsz", "96",
                                        "--device", "cpu", "--conf-thres", str(CONF), "--nosave",
                                        "--augment", "--project", str(tmp_path / "det")]))[0]
    torch.testing.assert_close(aug, ref.boxes[:, :6].cpu(), atol=1e-3, rtol=1e-4)
    assert not torch.equal(aug, results.xyxy[0])
    rows = results.tolist()[0]
    assert {r["name"] for r in rows} <= set(NAMES.values()) and rows[0]["name"] == NAMES[rows[0]["class"]]


def test_segment_and_classify_checkpoints(tmp_path):
    seg = hub_load("custom", path=str(checkpoint(tmp_path, SegmentationModel("yolov8n-seg.yaml", nc=3))),
                   device="cpu")
    seg.conf = CONF
    res = seg(str(IMAGE), size=96)
    h, w = np.asarray(Image.open(IMAGE)).shape[:2]
    assert res.masks[0].shape == (len(res.xyxy[0]), h, w) and len(res.xyxy[0]) > 0
    (tmp_path / "cls").mkdir()
    cls = hub_load("custom", path=str(checkpoint(tmp_path / "cls", ClassificationModel("yolov8n-cls.yaml", nc=3))),
                   device="cpu")
    top = cls(str(IMAGE), size=64).tolist()[0]
    assert [r["name"] for r in top] and abs(sum(r["conf"] for r in top) - 1) < 1e-4  # 3 classes: all of them


def test_an_oriented_box_checkpoint_gives_its_boxes_through_the_hub(tmp_path):
    """An OBB model's results have `obb` and no `boxes`: `xyxy` gives each rotated box's upright bounds with its
    confidence and class, `obb` Ultralytics' (n, 7) table, `tolist()` the rotated box and its corners."""
    model = hub_load("custom", path=str(checkpoint(tmp_path, OBBModel("yolov8n-obb.yaml", nc=3))), device="cpu")
    model.conf = CONF
    res = model(str(IMAGE), size=96)
    (xyxy,), (table,), (rows,) = res.xyxy, res.obb, res.tolist()
    assert len(table) > 0 and res[0].boxes is None and table.shape[1] == 7
    corners = res[0].obb.xyxyxyxy
    torch.testing.assert_close(xyxy[:, :2], corners.min(1).values)
    torch.testing.assert_close(xyxy[:, 2:4], corners.max(1).values)
    assert torch.equal(xyxy[:, 4:], table[:, 5:])
    assert [r["xywhr"] for r in rows] == table[:, :5].tolist()
    assert [r["class"] for r in rows] == table[:, 6].int().tolist()
    assert rows[0]["name"] == NAMES[rows[0]["class"]] and len(rows[0]["corners"]) == 4


def test_named_entry_points_build_offline():
    model = hub_load("yolov5n", pretrained=False, classes=3, device="cpu")
    assert model.names == {i: str(i) for i in range(3)} and len(model(str(IMAGE), size=64)) == 1
    for n in ("yolov7_tiny", "yolov8n_seg", "yolov5s_cls"):
        assert callable(getattr(hubconf, n))
    v5u = hub_load("yolov5nu", pretrained=False, classes=3, device="cpu")  # anchor-free head on the v5 body
    assert type(v5u.model.model[-1]).__name__ == "AnchorFreeDetect"


def test_pose_entry_points_build_offline_with_keypoints():
    """yolov8{n..x}_pose: the official pose layout (one class, 17 keypoints) unless told otherwise; results carry each
    detection's keypoints in the image's pixels, with the predictor's boxes."""
    for s in "nsmlx":
        assert callable(getattr(hubconf, f"yolov8{s}_pose"))
    model = hub_load("yolov8n_pose", pretrained=False, device="cpu")
    assert model.names == {0: "0"} and model.layout.kpt_shape == (17, 3)
    model.conf = CONF
    r = model(str(IMAGE), size=64)
    assert r.keypoints[0].shape == (len(r.xyxy[0]), 17, 3) and len(r.xyxy[0]) > 0
    h, w = Image.open(IMAGE).size[::-1]
    xy = r.keypoints[0][..., :2]
    assert (xy[..., 0] >= 0).all() and (xy[..., 0] <= w).all() and (xy[..., 1] <= h).all()


@pytest.mark.parametrize("hw", [(1, 200), (200, 1)])
def test_an_image_a_pixel_thin_gives_boxes_and_masks_of_its_size(hw):
    """letterbox keeps a row (column) of a 1 x 200 image at 64 px, where its side rounds to 0 (an OpenCV assertion
    before), and the masks come back to the image through that one row."""
    model = hub_load("yolov8n_seg", pretrained=False, classes=3, device="cpu")
    model.conf = CONF
    r = model(np.full((*hw, 3), 128, np.uint8), size=64)
    boxes, masks = r.xyxy[0], r.masks[0]
    assert len(boxes) > 0 and masks.shape == (len(boxes), *hw)
    assert (boxes[:, [0, 2]] <= hw[1]).all() and (boxes[:, [1, 3]] <= hw[0]).all() and (boxes[:, :4] >= 0).all()


def test_device_is_named_as_the_scripts_take_it(tmp_path, monkeypatch):
    """device='cpu ', 'CPU' or '0' (yolov5's hub takes what its --device takes) reached torch.device as they were:
    'Invalid device string' and the like, tracebacks; YOLO.predict on an array did the same."""
    from utils.dist import api_device
    from utils.errors import BadOption
    from yolo import YOLO

    f = checkpoint(tmp_path, DetectionModel("yolov8n.yaml", nc=3))
    ref = hub_load("custom", path=str(f), device="cpu")(str(IMAGE)).xyxy[0]
    for device in ("CPU", " cpu ", torch.device("cpu"), ""):  # '': the scripts' default, here the CPU's
        assert torch.equal(hub_load("custom", path=str(f), device=device)(str(IMAGE)).xyxy[0], ref)
        assert len(YOLO(f).predict(np.asarray(Image.open(IMAGE)), device=device, verbose=False)) == 1
    for device, why in [("gpu", "give 'cpu', a GPU index"), ("0,1", "give 'cpu', a GPU index")]:
        with pytest.raises(BadOption, match=f"^device={device!r}: {why}"):
            hub_load("custom", path=str(f), device=device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the names a machine with a GPU takes
    assert [api_device(d) for d in (0, "0", "cuda:1", "cuda", None)] == [
        torch.device("cuda:0"), torch.device("cuda:0"), torch.device("cuda:1"), torch.device("cuda"),
        torch.device("cuda")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BadOption, match="^device='0' requested but CUDA is not available; use device='cpu'"):
        YOLO(f).predict(np.asarray(Image.open(IMAGE)), device="0")
