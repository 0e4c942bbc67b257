"""The pictures of a run: every plot written by a short segmentation run, readable and not blank, and in TensorBoard."""

import logging
import re

import cv2
import numpy as np
import pytest
import torch
import yaml

from evaluation.charts import _smooth
from evaluation.metrics import ap_per_class
from models.yolo import SegmentationModel
from utils.log import LOGGER

EXPECTED = [
    "results.png", "labels.jpg", "confusion_matrix.png", "confusion_matrix_normalized.png",
    *[f"val_batch{i}_{k}.jpg" for i in range(3) for k in ("labels", "pred")],
    *[f"{m}{c}_curve.png" for m in ("", "Mask") for c in ("PR", "F1", "P", "R")],
]  # fmt: skip


def assert_picture(path, min_side=200, min_std=8.0):
    im = cv2.imread(str(path))
    assert im is not None, f"{path.name} is not a readable image"
    assert min(im.shape[:2]) >= min_side, f"{path.name} is only {im.shape[1]}x{im.shape[0]}"
    assert im.std() > min_std, f"{path.name} looks blank (pixel std {im.std():.1f})"
    return im


@pytest.fixture(scope="module")
def seg_run(tmp_path_factory):
    """YOLOv8n-seg, 2 epochs at 64 px; 12 val images in batches of 4, so three val batches are drawn."""
    import segment.train as seg_train
    from data.synthetic import generate_dataset

    root = tmp_path_factory.mktemp("plots-data")
    generate_dataset(root, task="segment", n_train=8, n_val=12, seed=3, min_side=64, max_side=96)
    data = root / "data.yaml"
    names = {0: "circle", 1: "rectangle", 2: "triangle"}
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": names}))
    args = ["--cfg", "yolov8n-seg.yaml", "--data", str(data), "--imgsz", "64", "--batch-size", "2", "--epochs", "2",
            "--workers", "0", "--device", "cpu", "--project", str(tmp_path_factory.mktemp("plots")), "--name", "exp",
            "--loggers", "csv,tensorboard-graph"]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    LOGGER.addHandler(handler)
    try:
        trainer, _ = seg_train.main(seg_train.parse_opt(args))
    finally:
        LOGGER.removeHandler(handler)
        torch.set_num_threads(n)
    return trainer.save_dir, records


def test_run_writes_every_plot(seg_run):
    seg_run, _ = seg_run
    for name in EXPECTED:
        assert (seg_run / name).is_file(), f"missing {name}"
        assert_picture(seg_run / name, min_side=64 if name.startswith("val_batch") else 200)


def test_tensorboard_holds_the_images_and_the_graph(seg_run):
    seg_run, _ = seg_run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(seg_run), size_guidance={"images": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {n.rsplit(".", 1)[0] for n in EXPECTED} <= set(tags["images"])
    assert tags["graph"], "the model graph"
    event = acc.Images("results")[0]
    im = cv2.imdecode(np.frombuffer(event.encoded_image_string, np.uint8), cv2.IMREAD_COLOR)
    ref = cv2.imread(str(seg_run / "results.png"))
    assert im.shape == ref.shape and np.abs(im.astype(int) - ref).mean() < 2  # the same picture (PNG, lossless)
    labels = acc.Images("labels")[0]  # a JPEG goes in as it is (TensorBoard shows JPEG too)
    assert labels.encoded_image_string == (seg_run / "labels.jpg").read_bytes()
    assert (labels.width, labels.height) == cv2.imread(str(seg_run / "labels.jpg")).shape[1::-1]


def test_pr_curve_is_the_precision_envelope():
    # class 0: 2 labels; predictions by confidence: hit, miss, hit -> recall .5 .5 1, precision 1 .5 .667
    tp = np.array([[1], [0], [1]], dtype=bool)
    *_, curves = ap_per_class(tp, np.array([0.9, 0.8, 0.7]), np.zeros(3), np.zeros(2), curves=True)
    px, pr = curves["px"], curves["pr"][0]
    assert np.allclose(pr[px < 0.5], 1.0)  # the envelope keeps precision 1 up to recall .5
    assert np.allclose(pr[(px > 0.5) & (px < 1)], 2 / 3)  # and the best precision at any larger recall after it
    assert curves["classes"].tolist() == [0]
    # by confidence: above every prediction nothing is kept (P 1, R 0); below the last all are (R 1, P 2/3)
    assert np.allclose(curves["p"][0, px > 0.9], 1) and np.allclose(curves["r"][0, px > 0.9], 0)
    assert np.allclose(curves["r"][0, px < 0.7], 1) and np.allclose(curves["p"][0, px < 0.7], 2 / 3)


def test_classification_val_batch_grid(tmp_path):
    from engine.tasks import TASKS
    ClassificationValidator = TASKS["classify"].validator
    from engine.validator import ValOptions

    names = {0: "circle", 1: "rectangle", 2: "triangle"}
    v = ClassificationValidator(ValOptions(imgsz=64), tmp_path, names)
    g = torch.Generator().manual_seed(0)
    batch = {"img": torch.rand(4, 3, 64, 64, generator=g), "cls": torch.tensor([0, 1, 2, 1])}
    probs = torch.softmax(torch.randn(4, 3, generator=g), 1)
    v.plot_val_batch(batch, probs, 0)
    labels = assert_picture(tmp_path / "val_batch0_labels.jpg", min_side=100)
    pred = assert_picture(tmp_path / "val_batch0_pred.jpg", min_side=100)
    assert labels.shape == pred.shape and np.abs(labels.astype(int) - pred).max() > 50, "captions differ"


def test_model_summary_printed_once_before_training(seg_run):
    _, records = seg_run
    pattern = r"SegmentationModel: (\d+) layers, (\d+) parameters \((\d+) trainable\), ([\d.]+) GFLOPs at 64 px"
    found = [(i, re.match(pattern, m)) for i, m in enumerate(records) if re.match(pattern, m)]
    assert len(found) == 1, "one summary, at the start"
    i, m = found[0]
    first_epoch = next(j for j, r in enumerate(records) if r.strip().startswith("Epoch"))
    assert i < first_epoch
    model = SegmentationModel("yolov8n-seg.yaml", nc=3)
    n_params = sum(p.numel() for p in model.parameters())
    n_grads = sum(p.numel() for p in model.parameters() if p.requires_grad)  # the fixed DFL conv has none
    assert int(m.group(1)) == len(model.model) and int(m.group(2)) == n_params and int(m.group(3)) == n_grads
    assert 0 < float(m.group(4)) < 1.0  # yolov8n-seg: 12.6 GFLOPs at 640, so ~0.1 at 64 px


@pytest.mark.parametrize("f", [0.05, 0.1])
def test_smooth_keeps_the_length_and_a_constant(f):
    # an even window once made 30 epochs smooth to 31 points and results.png failed at the end of a 30-epoch run
    for n in range(1, 1201, 7):
        y = np.linspace(0.0, 1.0, n)
        out = _smooth(y, f)
        assert out.shape == (n,), n
        assert np.allclose(_smooth(np.full(n, 0.3), f), 0.3)
        assert out[0] >= 0.0 and out[-1] <= 1.0
    assert np.allclose(_smooth(np.r_[np.zeros(50), np.ones(50)], 0.1)[45:55], np.arange(1, 11) / 11, atol=1e-9)
