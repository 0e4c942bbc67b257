"""Keypoint metrics of evaluation/metrics.py: OKS by hand, and pose mAP against pycocotools' keypoint evaluation."""

import math

import numpy as np
import pytest
import torch

from evaluation.coco import box_to_coco_json, coco_keypoints, eval_coco_json, labels_to_coco_json
from evaluation.metrics import (
    OKS_AREA_SCALE,
    DetMetrics,
    ap_per_class,
    iou_vector,
    keypoint_oks,
    keypoint_sigmas,
    process_keypoint_batch,
)

pytest.importorskip("pycocotools")


def test_oks_by_hand():
    """OKS = mean over visible label keypoints of exp(-d^2 / (2 area (2 sigma)^2))."""
    gt = torch.tensor([[[10.0, 10.0, 2], [20.0, 10.0, 1], [0.0, 0.0, 0]]])
    pred = torch.tensor([[[13.0, 14.0, 0.9], [20.0, 10.0, 0.9], [50.0, 50.0, 0.9]]])
    sigmas = np.array([0.1, 0.2, 0.3])
    area = torch.tensor([100.0])
    expected = (math.exp(-25 / (2 * 100 * 0.2**2)) + 1.0) / 2
    assert keypoint_oks(gt, pred, area, sigmas).item() == pytest.approx(expected, rel=1e-6)
    invisible = gt.clone()
    invisible[..., 2] = 0
    assert keypoint_oks(invisible, pred, area, sigmas).item() == 0.0  # nothing to match on


def _pose_case(seed, n_img=20, k=5):
    """Labels with k keypoints (about 20 % not labelled, never all) and post-NMS-like predictions: jittered labels
    (10 % missed, 15 % duplicated at a lower score, keypoint noise growing with the object), confident strays and
    many low-score background predictions. Pixels."""
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n_img):
        h, w = (int(v) for v in rng.integers(200, 320, 2))
        gts, preds = [], []
        for _ in range(int(rng.integers(1, 6))):
            bw, bh = rng.uniform(30, 120, 2)
            x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            xy = np.stack([rng.uniform(x1, x1 + bw, k), rng.uniform(y1, y1 + bh, k)], 1)
            v = np.where(rng.random(k) < 0.2, 0, 2)
            v[0] = 2
            gts.append(([x1, y1, x1 + bw, y1 + bh], np.concatenate([xy, v[:, None]], 1)))
            if rng.random() < 0.1:
                continue
            for dup in range(1 + (rng.random() < 0.15)):
                noise = rng.normal(0, rng.uniform(0.02, 0.15) * math.sqrt(bw * bh), (k, 2))
                box = np.array([x1, y1, x1 + bw, y1 + bh]) + rng.normal(0, 3, 4)
                preds.append((box, np.concatenate([xy + noise, rng.random((k, 1))], 1),
                              rng.uniform(0.2, 1.0) * (0.5 if dup else 1.0)))
        for n, lo, hi in ((int(rng.integers(0, 3)), 0.0, 0.7), (30, 0.001, 0.2)):
            for _ in range(n):
                x1, y1 = rng.uniform(0, w - 40), rng.uniform(0, h - 40)
                xy = np.stack([rng.uniform(x1, x1 + 40, k), rng.uniform(y1, y1 + 40, k)], 1)
                preds.append((np.array([x1, y1, x1 + 40, y1 + 40]), np.concatenate([xy, rng.random((k, 1))], 1),
                              rng.uniform(lo, hi)))
        preds.sort(key=lambda p: -p[2])
        images.append({"im_file": f"/data/images/{i + 1}.jpg", "shape": (h, w), "gts": gts, "preds": preds})
    return images


def _tensors(im):
    gt = torch.tensor([[0, *b] for b, _ in im["gts"]], dtype=torch.float32)
    gt_k = torch.tensor(np.stack([kp for _, kp in im["gts"]]), dtype=torch.float32)
    det = torch.tensor([[*b, s, 0] for b, _, s in im["preds"]], dtype=torch.float32)
    pred_k = torch.tensor(np.stack([kp for _, kp, _ in im["preds"]]), dtype=torch.float32)
    return gt, gt_k, det, pred_k


def test_pose_map_agrees_with_pycocotools():
    """The same predictions scored by our OKS matching + AP and by pycocotools iouType='keypoints' with the same
    sigmas and the same label areas (box x 0.53): within 0.01, as the box mAP."""
    k = 5
    sigmas = keypoint_sigmas(k)
    images = _pose_case(0, k=k)
    tp, conf, labels, results = [], [], [], []
    for i, im in enumerate(images):
        gt, gt_k, det, pred_k = _tensors(im)
        tp.append(process_keypoint_batch(det, gt, pred_k, gt_k, sigmas, iou_vector()))
        conf.append(det[:, 4])
        h, w = im["shape"]
        xyxy = gt[:, 1:].numpy()
        xywhn = np.stack([(xyxy[:, 0] + xyxy[:, 2]) / 2 / w, (xyxy[:, 1] + xyxy[:, 3]) / 2 / h,
                          (xyxy[:, 2] - xyxy[:, 0]) / w, (xyxy[:, 3] - xyxy[:, 1]) / h], 1)
        labels.append({"im_file": im["im_file"], "shape": (h, w), "cls": np.zeros((len(gt), 1)), "bboxes": xywhn,
                       "keypoints": gt_k.numpy() / [w, h, 1]})
        results += [{**r, "keypoints": k} for r, k in zip(box_to_coco_json(det, i + 1), coco_keypoints(pred_k))]
    n_labels = sum(len(im["gts"]) for im in images)
    tp, conf = torch.cat(tp).numpy(), torch.cat(conf).numpy()
    _, _, _, ap, _ = ap_per_class(tp, conf, np.zeros(len(conf)), np.zeros(n_labels))
    anno = labels_to_coco_json(labels, ["thing"])
    assert anno["annotations"][0]["area"] == pytest.approx(
        (labels[0]["bboxes"][0, 2] * 1.0) * labels[0]["shape"][1] * labels[0]["bboxes"][0, 3] * labels[0]["shape"][0]
        * OKS_AREA_SCALE, rel=1e-5)
    coco, coco50 = eval_coco_json(anno, results, iou_type="keypoints", kpt_sigmas=sigmas, max_dets=300)
    assert 0.3 < coco < 0.9, "the case should be neither trivial nor hopeless"
    assert abs(ap.mean() - coco) < 0.01, (ap.mean(), coco)
    assert abs(ap[:, 0].mean() - coco50) < 0.02, (ap[:, 0].mean(), coco50)


def test_pose_metrics_container():
    tp = np.array([[1], [0], [1]], dtype=bool).repeat(10, 1)
    conf, cls = np.array([0.9, 0.8, 0.7]), np.array([0, 0, 0])
    m = DetMetrics(parts=(("box", "B"), ("pose", "P")))
    m.process(tp, np.zeros_like(tp), conf, cls, np.array([0, 0]))
    assert m.keys[4:] == [f"metrics/{k}(P)" for k in ("precision", "recall", "mAP50", "mAP50-95")]
    assert m.pose.map == 0.0 and m.box.map > 0 and m.fitness == pytest.approx(m.box.fitness())
