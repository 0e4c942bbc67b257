"""Instance segmentation on CPU: the mask metric path of SegmentationValidator checked against ground truth and
pycocotools, segment/train.py -> val.py -> predict.py for YOLOv5-seg and YOLOv8-seg, a 2-rank torchrun run, and
a short run that must learn masks."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import val as detect_val
from utils.data.dataset_yaml import check_det_dataset
from utils.tasks.segment import SegmentationValidator

NC = 3


# ------------------------------------------------------------------------------ the validator on known predictions
class _Replay(nn.Module):
    """Stands in for a YOLOv5-seg model in eval mode: returns prepared outputs `(y, proto, x)`, one per batch."""

    def __init__(self, outputs, nm):
        super().__init__()
        self.outputs = list(outputs)
        self.anchor = nn.Parameter(torch.zeros(1))  # the validator takes the device from the parameters
        self.model = nn.ModuleList([nn.Identity()])
        self.model[-1].nm = nm

    def forward(self, x):
        y, proto = self.outputs.pop(0)
        assert len(y) == len(x)
        return y, proto, []


def _outputs_from_labels(batch, nm, mask_fn, gen, pad=0.0):
    """One prediction per label of the batch: its box grown by `pad` pixels on every side, its class, a random
    distinct confidence, and a one-hot mask coefficient choosing a prototype that holds mask_fn(ground-truth mask at
    1/4 size, image index). An image without labels gets one low-confidence false positive instead."""
    b, _, h, w = batch["img"].shape
    proto = torch.full((b, nm, h // 4, w // 4), -10.0)
    y = torch.zeros(b, nm, 5 + NC + nm)
    t = batch["targets"]
    for i in range(b):
        ti = t[t[:, 0] == i]
        for k, (_, c, cx, cy, bw, bh) in enumerate(ti.tolist()):
            gt = batch["masks"][i] == k + 1  # overlap map: value k + 1 marks the image's k-th label
            proto[i, k] = torch.where(mask_fn(gt, i), 10.0, -10.0)
            y[i, k, :4] = torch.tensor([cx * w, cy * h, bw * w + 2 * pad, bh * h + 2 * pad])
            y[i, k, 4] = 0.3 + 0.6 * torch.rand(1, generator=gen).item()
            y[i, k, 5 + int(c)] = 1.0
            y[i, k, 5 + NC + k] = 1.0
        if not len(ti):
            proto[i, 0, 4:8, 4:8] = 10.0
            y[i, 0, :5] = torch.tensor([24.0, 24.0, 16.0, 16.0, 0.1])
            y[i, 0, 5] = y[i, 0, 5 + NC] = 1.0
    return y, proto


def _rectangles_dataset(root, n_objects=(1, 2, 3, 4, 2, 0)):
    """128 x 96 images labelled with non-overlapping axis-aligned rectangles whose corners lie on a 4-pixel grid:
    at imgsz 128 the 1/4-size masks and their upsampling are exact, so a prediction equal to its label is perfect
    at every step, for the validator and for pycocotools alike."""
    import cv2
    import numpy as np
    import yaml

    rng = np.random.default_rng(0)
    for d in ("images", "labels"):
        (root / d / "val").mkdir(parents=True)
    for k, n in enumerate(n_objects):
        cv2.imwrite(str(root / "images" / "val" / f"{k}.jpg"), np.full((96, 128, 3), 90, np.uint8))
        lines = []
        for cell in rng.permutation(12)[:n]:  # a 4 x 3 grid of 32-pixel cells, one rectangle per chosen cell
            x1, y1 = 32 * (cell % 4) + 4 * rng.integers(0, 2), 32 * (cell // 4) + 4 * rng.integers(0, 2)
            x2, y2 = x1 + 4 * rng.integers(4, 7), y1 + 4 * rng.integers(4, 7)
            xy = np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], float) / [128, 96]
            lines.append(f"{rng.integers(0, NC)} " + " ".join(f"{v:.6f}" for v in xy.reshape(-1)))
        (root / "labels" / "val" / f"{k}.txt").write_text("".join(f"{line}\n" for line in lines))
    names = {0: "circle", 1: "rectangle", 2: "triangle"}
    f = root / "data.yaml"
    f.write_text(yaml.safe_dump({"path": str(root), "train": "images/val", "val": "images/val", "names": names}))
    return f


@pytest.fixture(scope="module")
def rectangles(tmp_path_factory):
    data = check_det_dataset(_rectangles_dataset(tmp_path_factory.mktemp("rectangles")))
    opt = SimpleNamespace(imgsz=128, batch_size=4, workers=0)
    return detect_val.build_loader(opt, data, "val", 32, task="segment"), data["names"]


def _validate(rectangles, save_dir, mask_fn, pad=0.0):
    loader, names = rectangles
    gen = torch.Generator().manual_seed(0)
    nm = 8  # more than the most labels of an image
    outputs = [_outputs_from_labels(b, nm, mask_fn, gen, pad) for b in loader]
    # NMS at IoU 0.9: neighbouring labels of one class must not suppress each other's exact boxes
    args = SimpleNamespace(conf_thres=0.001, iou_thres=0.9, max_det=300, save_json=True, imgsz=128)
    save_dir.mkdir(parents=True, exist_ok=True)
    validator = SegmentationValidator(loader, save_dir, args, names)
    return validator, validator(model=_Replay(outputs, nm))


PAD = 6.0  # 1.5 prototype pixels (4 input pixels each): the crop then keeps a whole prototype pixel around the mask


def test_validator_perfect_masks_agree_with_pycocotools(rectangles, tmp_path):
    # process_mask crops the logits to the box with zeros, and bilinear upsampling then carries a mask that touches
    # its box half a prototype pixel beyond it (as Ultralytics' crop-then-upsample does); a larger box keeps the
    # crop off the mask, so that the masks come out exact
    _, stats = _validate(rectangles, tmp_path, lambda gt, i: gt, pad=PAD)
    # the official 101-point trapezoid with its recall-1.0 sentinel gives 0.995 for a perfect ranking
    assert stats["metrics/mAP50(M)"] == pytest.approx(0.995, abs=1e-3)
    assert stats["metrics/mAP50-95(M)"] == pytest.approx(0.995, abs=1e-3)
    # pycocotools compares the masks in original-image pixels with the polygon labels, integrating by steps
    for k in ("mAP50(M)", "mAP50-95(M)"):
        assert stats[f"coco/{k}"] == pytest.approx(stats[f"metrics/{k}"], abs=0.01), k
    assert (tmp_path / "predictions.json").is_file()


def test_validator_exact_boxes(rectangles, tmp_path):
    _, stats = _validate(rectangles, tmp_path, lambda gt, i: gt)
    assert stats["metrics/mAP50(B)"] == pytest.approx(0.995, abs=1e-3)
    assert stats["metrics/mAP50-95(B)"] == pytest.approx(0.995, abs=1e-3)
    # the 2-pixel halo of the crop leaves these 16-24 px rectangles an IoU of 0.64-0.73
    assert stats["metrics/mAP50(M)"] == pytest.approx(0.995, abs=1e-3)
    assert 0.2 < stats["metrics/mAP50-95(M)"] < 0.6
    for k in ("mAP50(B)", "mAP50-95(B)", "mAP50(M)"):
        assert stats[f"coco/{k}"] == pytest.approx(stats[f"metrics/{k}"], abs=0.01), k


def test_validator_shifted_masks_score_lower(rectangles, tmp_path):
    _, perfect = _validate(rectangles, tmp_path / "perfect", lambda gt, i: gt, pad=PAD)
    # one prototype pixel is 4 input pixels: IoU (w - 4) / (w + 4), 0.6-0.71 for these rectangles
    _, shifted = _validate(rectangles, tmp_path / "shifted", lambda gt, i: gt.roll(1, dims=1), pad=PAD)
    assert shifted["metrics/mAP50-95(B)"] == pytest.approx(perfect["metrics/mAP50-95(B)"])  # boxes untouched
    assert shifted["metrics/mAP50(M)"] == pytest.approx(0.995, abs=1e-3)
    assert shifted["metrics/mAP50-95(M)"] < perfect["metrics/mAP50-95(M)"] - 0.4
    assert shifted["coco/mAP50-95(M)"] < perfect["coco/mAP50-95(M)"] - 0.4


def test_validator_keeps_box_and_mask_matches_of_each_image_together(rectangles, tmp_path):
    """Odd images get empty masks and even ones their labels' masks, with exact boxes everywhere: the mask matches
    of each image must sit in the rows of that image's box matches."""
    validator, stats = _validate(rectangles, tmp_path, lambda gt, i: gt & (i % 2 == 0))
    tp, tp_m = validator.stats["tp"], validator.stats["tp_m"]
    n_labels = [len(lb["cls"]) for lb in rectangles[0].dataset.labels]
    assert len(tp) == len(tp_m) == len(n_labels)  # every image has predictions (the label-less one a false one)
    for k, (box, mask, n) in enumerate(zip(tp, tp_m, n_labels)):
        assert box.shape == mask.shape == (max(n, 1), 10)
        assert box[:, 0].all() if n else not box.any()
        assert mask[:, 0].all() if n and k % 2 == 0 else not mask.any(), f"image {k}"
    assert 0.2 < stats["metrics/mAP50(M)"] < 0.9
