"""evaluation/metrics.py: matching and AP by hand and against pycocotools; containers; confusion matrix; and the
drawing helpers of evaluation/plots.py (boxes, masks, batch mosaics, the confusion-matrix image)."""

import cv2
import numpy as np
import pytest
import torch
import torchvision

from evaluation import metrics
from evaluation.coco import (
    box_to_coco_json,
    eval_coco_json,
    labels_to_coco_json,
    masks_to_rle,
)
from evaluation.metrics import (
    ClassifyMetrics,
    ConfusionMatrix,
    DetMetrics,
    ap_per_class,
    compute_ap,
    iou_vector,
    mask_iou,
    match_predictions,
    process_batch,
    process_mask_batch,
)
from evaluation.plots import Annotator, colors, plot_images
from utils.ops import xyxy2xywhn

pytest.importorskip("pycocotools")


# ----------------------------------------------------------------------------------------------- matching by hand
def test_one_label_two_predictions_per_threshold():
    gt = torch.tensor([[0.0, 0.0, 0.0, 10.0, 10.0]])  # cls, xyxy
    det = torch.tensor(
        [
            [0.0, 0.0, 10.0, 6.0, 0.9, 0.0],  # IoU 0.60, more confident
            [0.0, 0.0, 10.0, 9.0, 0.8, 0.0],  # IoU 0.90
        ]
    )
    iouv = torch.tensor([0.5, 0.6, 0.65, 0.9, 0.95])
    correct = process_batch(det, gt, iouv)
    expected = torch.tensor(
        [
            [True, True, False, False, False],  # both qualify at 0.5 and 0.6: the label goes to the earlier one
            [False, False, True, True, False],  # only this one reaches 0.65 and 0.9; nobody reaches 0.95
        ]
    )
    assert torch.equal(correct, expected)


def test_prediction_keeps_its_best_label_and_classes_must_agree():
    gt = torch.tensor([[1.0, 0.0, 0.0, 10.0, 10.0], [1.0, 0.0, 0.0, 10.0, 8.0], [2.0, 20.0, 20.0, 30.0, 30.0]])
    det = torch.tensor(
        [
            [0.0, 0.0, 10.0, 10.0, 0.9, 1.0],  # IoU 1.0 with label 0, 0.8 with label 1
            [0.0, 0.0, 10.0, 8.0, 0.8, 1.0],  # IoU 1.0 with label 1
            [20.0, 20.0, 30.0, 30.0, 0.7, 0.0],  # perfect box, wrong class
        ]
    )
    correct = process_batch(det, gt, iou_vector())
    assert correct[0].all() and correct[1].all() and not correct[2].any()


def test_match_predictions_empty_and_device():
    iouv = iou_vector()
    out = match_predictions(torch.zeros(0), torch.tensor([1.0]), torch.zeros(1, 0), iouv)
    assert out.shape == (0, 10) and out.dtype == torch.bool
    out = match_predictions(torch.tensor([1.0, 2.0]), torch.zeros(0), torch.zeros(0, 2), iouv)
    assert out.shape == (2, 10) and not out.any()


def test_mask_iou_and_mask_batch():
    a = torch.zeros(2, 4, 4)
    a[0, :2] = 1  # 8 pixels
    a[1, :, :1] = 1  # 4 pixels
    b = torch.zeros(1, 4, 4)
    b[0, :1] = 1  # 4 pixels, inside a[0]
    torch.testing.assert_close(mask_iou(a.flatten(1), b.flatten(1)), torch.tensor([[0.5], [1 / 7]]))
    det = torch.tensor([[0.0, 0, 4, 2, 0.9, 0], [0.0, 0, 1, 4, 0.8, 0]])
    labels = torch.tensor([[0.0, 0, 0, 4, 1]])
    big = b.repeat_interleave(2, 1).repeat_interleave(2, 2)  # ground truth at twice the size: resized down
    correct = process_mask_batch(det, labels, a, big, torch.tensor([0.5, 0.6]))
    assert correct.tolist() == [[True, False], [False, False]]


def test_instance_masks_from_overlap_map():
    m = torch.tensor([[0, 1, 1], [2, 2, 0]])
    out = metrics.instance_masks(m, 2)
    assert out.tolist() == [[[False, True, True], [False, False, False]], [[False, False, False], [True, True, False]]]


# ---------------------------------------------------------------------------------------------------- AP by hand
def test_compute_ap_known_curves():
    # Perfect detector: the official tail sentinel (recall 1.0, precision 0) ramps the last 1 % interval to 0.
    assert compute_ap(np.array([0.5, 1.0]), np.array([1.0, 1.0])) == pytest.approx(0.995)
    # One point (R 0.3, P 1): flat to 0.3, then a linear ramp to (1.0, 0): 0.3 + 0.7 / 2.
    assert compute_ap(np.array([0.3]), np.array([1.0])) == pytest.approx(0.65)
    # Envelope: the P 0.5 point at R 0.2 is lifted to 1 by the later (0.4, 1.0) point.
    ap = compute_ap(np.array([0.2, 0.4, 0.6]), np.array([0.5, 1.0, 0.6]))
    assert ap == pytest.approx(0.4 + (1.0 + 0.6) / 2 * 0.2 + 0.6 / 2 * 0.4)
    assert compute_ap(np.array([0.0]), np.array([0.0])) == pytest.approx(0.0, abs=0.01)


def test_ap_per_class_against_hand_curves():
    # class 0: 3 labels; predictions (conf, tp): (0.9, 1) (0.8, 0) (0.7, 1). class 1: 1 label, no prediction.
    # class 5: predictions but no labels: not evaluated.
    conf = np.array([0.7, 0.9, 0.8, 0.95])
    pred_cls = np.array([0, 0, 0, 5])
    tp = np.array([[1, 1], [1, 0], [0, 0], [0, 0]], dtype=bool)  # two IoU thresholds
    target_cls = np.array([0, 0, 0, 1])
    p, r, f1, ap, classes = ap_per_class(tp, conf, pred_cls, target_cls)
    assert classes.tolist() == [0, 1]
    ap0_t0 = compute_ap(np.array([1, 1, 2]) / 3, np.array([1, 1 / 2, 2 / 3]))
    ap0_t1 = compute_ap(np.array([0, 0, 1]) / 3, np.array([0, 0, 1 / 3]))
    np.testing.assert_allclose(ap, [[ap0_t0, ap0_t1], [0.0, 0.0]])
    assert p.shape == r.shape == f1.shape == (2,)
    assert r[1] == 0 and 0 < r[0] <= 2 / 3 + 1e-6 and 0 < p[0] <= 1


def test_ap_per_class_without_predictions_or_labels():
    p, r, f1, ap, classes = ap_per_class(np.zeros((0, 10), bool), np.zeros(0), np.zeros(0), np.array([1, 1, 4]))
    assert classes.tolist() == [1, 4] and ap.shape == (2, 10) and not ap.any() and not p.any() and not r.any()
    p, r, f1, ap, classes = ap_per_class(np.ones((2, 10), bool), np.array([0.5, 0.4]), np.zeros(2), np.zeros(0))
    assert ap.shape == (0, 10) and len(p) == len(classes) == 0


def test_ap_per_class_operating_point():
    conf = np.array([0.9, 0.6, 0.3])
    tp = np.array([[1], [1], [0]], dtype=bool)
    p, r, f1, _, _ = ap_per_class(tp, conf, np.zeros(3), np.zeros(2))
    assert 0.85 < p[0] <= 1 and 0.85 < r[0] <= 1 and f1[0] > 0.85  # near the conf 0.6 point where P = R = 1


# ------------------------------------------------------------------------------------------ against pycocotools
def _ellipse_mask(h, w, cx, cy, a, b, angle):
    m = np.zeros((h, w), np.uint8)
    cv2.ellipse(m, (round(cx), round(cy)), (max(round(a), 1), max(round(b), 1)), angle, 0, 360, 1, -1)
    return m.astype(bool)


def _mask_box(m):
    ys, xs = np.nonzero(m)
    return [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] if len(xs) else [0, 0, 1, 1]


def _synthetic_case(seed, with_masks, n_img=20, nc=3):
    """Ground truth and post-NMS predictions modelled on a val run at conf 0.001: jittered true objects (10 %
    missed, 5 % with a wrong class, 15 % duplicated at lower score), a few confident false positives and many
    low-score background boxes. Boxes in pixels; masks (optional) are filled ellipses."""
    rng = np.random.default_rng(seed)
    images = []
    for k in range(n_img):
        h, w = (int(v) for v in rng.integers(72, 112, 2)) if with_masks else (int(v) for v in rng.integers(200, 320, 2))
        size = (8, 30) if with_masks else (20, 120)
        m = int(rng.integers(1, 8))
        objs = [(rng.uniform(size[1] / 2, w - size[1] / 2), rng.uniform(size[1] / 2, h - size[1] / 2),
                 *rng.uniform(size[0], size[1], 2) / 2, rng.uniform(0, 180)) for _ in range(m)]  # fmt: skip
        gt_cls = rng.integers(0, nc, m)
        preds = []  # (ellipse or box params, score, class)
        for (cx, cy, a, b, ang), c in zip(objs, gt_cls):
            if rng.random() < 0.1:
                continue
            for dup in range(1 + (rng.random() < 0.15)):
                j = rng.normal(0, 0.06, 5) * (a, b, a, b, 60)
                cc = c if rng.random() > 0.05 else rng.integers(0, nc)
                preds.append(((cx + j[0], cy + j[1], a * (1 + j[2] / a), b * (1 + j[3] / b), ang + j[4]),
                              rng.uniform(0.2, 1.0) * (0.5 if dup else 1.0), cc))  # fmt: skip
        for n, lo, hi in ((int(rng.integers(0, 4)), 0.0, 0.7), (50, 0.001, 0.2)):
            for _ in range(n):
                a, b = rng.uniform(size[0] / 2, size[1] / 2, 2)
                e = (rng.uniform(a, w - a), rng.uniform(b, h - b), a, b, rng.uniform(0, 180))
                preds.append((e, rng.uniform(lo, hi), rng.integers(0, nc)))
        images.append(_render(k, h, w, objs, gt_cls, preds, with_masks))
    return images


def _render(k, h, w, objs, gt_cls, preds, with_masks):
    def shape(e):
        if with_masks:
            mk = _ellipse_mask(h, w, *e)
            return mk, _mask_box(mk)
        cx, cy, a, b, _ = e
        return None, [cx - a, cy - b, cx + a, cy + b]

    gt = [shape(e) for e in objs]
    pr = [shape(e) for e, _, _ in preds]
    det = torch.tensor([[*box, s, c] for (_, box), (_, s, c) in zip(pr, preds)], dtype=torch.float64).view(-1, 6)
    det[:, [0, 2]] = det[:, [0, 2]].clamp(0, w)
    det[:, [1, 3]] = det[:, [1, 3]].clamp(0, h)
    keep = torchvision.ops.batched_nms(det[:, :4], det[:, 4], det[:, 5].long(), 0.6)  # sorted by score
    img = {
        "im_file": f"/data/images/{k + 1}.jpg",
        "shape": (h, w),
        "gt": torch.tensor([[c, *box] for c, (_, box) in zip(gt_cls, gt)], dtype=torch.float32).view(-1, 5),
        "det": det[keep].float(),
    }
    if with_masks:
        img["gt_masks"] = torch.from_numpy(np.stack([mk for mk, _ in gt]))
        img["pred_masks"] = torch.from_numpy(np.stack([pr[i][0] for i in keep.tolist()]))
    return img


def _our_map(images, with_masks):
    iouv = iou_vector()
    tp, conf, pred_cls, target_cls = [], [], [], []
    for im in images:
        if with_masks:
            tp.append(process_mask_batch(im["det"], im["gt"], im["pred_masks"], im["gt_masks"], iouv))
        else:
            tp.append(process_batch(im["det"], im["gt"], iouv))
        conf.append(im["det"][:, 4])
        pred_cls.append(im["det"][:, 5])
        target_cls.append(im["gt"][:, 0])
    tp, conf, pred_cls, target_cls = (torch.cat(x).numpy() for x in (tp, conf, pred_cls, target_cls))
    _, _, _, ap, _ = ap_per_class(tp, conf, pred_cls, target_cls)
    return ap.mean(), ap[:, 0].mean(), (tp, conf, pred_cls, target_cls)


def _coco_map(images, with_masks):
    labels, results = [], []
    for i, im in enumerate(images):
        h, w = im["shape"]
        lb = {"im_file": im["im_file"], "shape": (h, w), "cls": im["gt"][:, :1].numpy()}
        lb["bboxes"] = xyxy2xywhn(im["gt"][:, 1:].numpy(), w=w, h=h)
        if with_masks:
            lb["masks"] = im["gt_masks"].numpy()
        labels.append(lb)
        rows = box_to_coco_json(im["det"], i + 1)
        results += [{**r, "segmentation": s} for r, s in zip(rows, masks_to_rle(im["pred_masks"]))] if with_masks \
            else rows
    anno = labels_to_coco_json(labels, ["a", "b", "c"])
    return eval_coco_json(anno, results, iou_type="segm" if with_masks else "bbox", max_dets=300)


def _coco_integration(tp, conf, pred_cls, target_cls):
    """mAP of given matches with pycocotools' integration: 101 recall points, step lookup, plain mean."""
    aps = []
    for c in np.unique(target_cls):
        sel = pred_cls == c
        x = tp[sel][np.argsort(-conf[sel], kind="stable")].astype(float)
        tpc, fpc = x.cumsum(0), (1 - x).cumsum(0)
        rec, prec = tpc / (target_cls == c).sum(), tpc / np.maximum(tpc + fpc, 1e-16)
        prec = np.flip(np.maximum.accumulate(np.flip(prec, 0), 0), 0)
        row = []
        for t in range(tp.shape[1]):
            idx = np.searchsorted(rec[:, t], np.linspace(0, 1, 101), side="left")
            row.append(np.where(idx < len(rec), prec[np.minimum(idx, len(rec) - 1), t], 0).mean())
        aps.append(row)
    aps = np.array(aps)
    return aps.mean(), aps[:, 0].mean()


@pytest.mark.parametrize("with_masks", [False, True], ids=["bbox", "segm"])
def test_map_agrees_with_pycocotools(with_masks):
    images = _synthetic_case(0, with_masks)
    ours, ours50, matches = _our_map(images, with_masks)
    coco, coco50 = _coco_map(images, with_masks)
    assert 0.3 < coco < 0.9, "the case should be neither trivial nor hopeless"
    # The official integration (sentinel recall 1.0 + trapezoid) reads a little above COCO's; see the report.
    assert abs(ours - coco) < 0.01, (ours, coco)
    assert abs(ours50 - coco50) < 0.02, (ours50, coco50)
    # Our matches integrated COCO's way must reproduce pycocotools: this checks matching and the JSON export.
    same, same50 = _coco_integration(*matches)
    assert same == pytest.approx(coco, abs=2e-3) and same50 == pytest.approx(coco50, abs=2e-3)


# ------------------------------------------------------------------------------------------------- containers
def test_det_and_segment_metrics_containers():
    tp = np.array([[1, 1], [0, 0], [1, 0]], dtype=bool).repeat(5, 1)
    conf, pred_cls, target_cls = np.array([0.9, 0.8, 0.7]), np.array([0, 0, 1]), np.array([0, 1, 1])
    dm = DetMetrics(names={0: "a", 1: "b"})
    dm.process(tp, conf, pred_cls, target_cls)
    rd = dm.results_dict
    assert list(rd) == dm.keys + ["fitness"]
    assert dm.keys == [f"metrics/{k}(B)" for k in ("precision", "recall", "mAP50", "mAP50-95")]
    _, _, _, ap, _ = ap_per_class(tp, conf, pred_cls, target_cls)
    assert rd["metrics/mAP50(B)"] == pytest.approx(ap[:, 0].mean())
    assert rd["metrics/mAP50-95(B)"] == pytest.approx(ap.mean())
    assert dm.fitness == pytest.approx(0.1 * ap[:, 0].mean() + 0.9 * ap.mean())
    assert dm.class_result(1)[2] == pytest.approx(ap[1, 0])
    np.testing.assert_allclose(dm.maps(3), [ap[0].mean(), ap[1].mean(), ap.mean()])
    sm = DetMetrics(parts=(("box", "B"), ("seg", "M")))
    sm.process(tp, np.zeros_like(tp), conf, pred_cls, target_cls)
    assert len(sm.keys) == 8 and sm.keys[4] == "metrics/precision(M)"
    assert sm.fitness == pytest.approx(dm.fitness)  # mask part is all zeros
    assert len(sm.mean_results()) == 8 and len(sm.class_result(0)) == 8
    assert DetMetrics().results_dict["fitness"] == 0.0


def test_classify_metrics_topk_by_hand():
    targets = torch.tensor([0, 1, 2, 3])
    scores = torch.tensor(
        [
            [0.9, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0],  # top1 right
            [0.0, 0.8, 0.2, 0.0, 0.0, 0.0, 0.0],  # top1 right
            [0.7, 0.0, 0.2, 0.1, 0.0, 0.0, 0.0],  # third best: top5 only
            [0.3, 0.2, 0.15, 0.1, 0.09, 0.08, 0.0],  # fourth best: top5 only
        ]
    )
    cm = ClassifyMetrics()
    cm.process(targets, scores)
    assert (cm.top1, cm.top5) == (0.5, 1.0)
    assert cm.fitness == 0.75
    assert cm.results_dict == {"metrics/accuracy_top1": 0.5, "metrics/accuracy_top5": 1.0, "fitness": 0.75}
    cm.process(targets, scores.argsort(1, descending=True)[:, :5])  # the top-5 indices give the same
    assert (cm.top1, cm.top5) == (0.5, 1.0)
    scores[3] = torch.tensor([0.3, 0.2, 0.15, 0.05, 0.14, 0.13, 0.12])  # class 3 now last of seven
    cm.process(targets, scores)
    assert cm.top5 == 0.75


# ------------------------------------------------------------------------------------------- confusion matrix
def test_confusion_matrix_detection_counts():
    labels = torch.tensor([[0.0, 0, 0, 10, 10], [1.0, 20, 20, 30, 30], [2.0, 40, 40, 50, 50]])
    det = torch.tensor(
        [
            [0.0, 0, 10, 10, 0.9, 0],  # right
            [20.0, 20, 30, 30, 0.8, 2],  # class 1 taken for 2
            [60.0, 60, 70, 70, 0.7, 1],  # nothing there: FP
            [40.0, 40, 50, 50, 0.1, 2],  # below conf: ignored, so label 2 is missed
        ]
    )
    cm = ConfusionMatrix(nc=3, conf=0.25, iou_thres=0.45)
    cm.process_batch(det, labels)
    expected = np.zeros((4, 4), dtype=int)
    expected[0, 0] = 1
    expected[2, 1] = 1
    expected[1, 3] = 1  # predicted class 1, background truth
    expected[3, 2] = 1  # background prediction, true class 2
    np.testing.assert_array_equal(cm.matrix, expected)
    cm.process_batch(None, labels[:1])
    cm.process_batch(det[:1], labels[:0])
    assert cm.matrix[3, 0] == 1 and cm.matrix[0, 3] == 1


def test_confusion_matrix_classify_and_plot(tmp_path):
    cm = ConfusionMatrix(nc=3, background=False)
    cm.process_cls_preds(torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]]), torch.tensor([1, 2]))
    cm.process_cls_preds(torch.tensor([[1, 0, 2]]), torch.tensor([1]))  # top-k indices: the first counts
    np.testing.assert_array_equal(cm.matrix, [[0, 0, 1], [0, 2, 0], [0, 0, 0]])
    for normalize in (True, False):
        path = cm.plot(tmp_path, names=["cat", "dog", "bird"], normalize=normalize)
        im = cv2.imread(str(path))
        assert im is not None and im.shape[0] > 100 and im.shape[1] > 100
        assert (im < 128).any(), "text and dark cells must be drawn"


# ---------------------------------------------------------------------------------------- drawing (plots.py)
def test_box_label_draws_outline_not_centre():
    im = np.full((100, 120, 3), 50, np.uint8)
    ann = Annotator(im.copy(), line_width=2)
    ann.box_label((20, 30, 80, 90), "", color=(0, 0, 255))
    out = ann.result()
    assert (out[30, 50] != 50).any() and (out[60, 20] != 50).any() and (out[89, 50] != 50).any()
    assert (out[60, 50] == 50).all()
    ann.box_label((20, 30, 80, 90), "dog 0.9", color=colors(3, bgr=True))
    assert (ann.result()[15:29, 22:40] != 50).any(), "the label sits above the box"
    assert colors(0) == (255, 56, 56) and colors(0, bgr=True) == (56, 56, 255) and colors(20) == colors(0)


def test_annotator_masks_and_text():
    ann = Annotator(np.zeros((40, 40, 3), np.uint8))
    m = torch.zeros(1, 40, 40, dtype=torch.bool)
    m[0, 10:20, 10:20] = True
    ann.masks(m, [(0, 0, 200)], alpha=0.5)
    out = ann.result()
    assert out[15, 15].tolist() == [0, 0, 100] and out[30, 30].tolist() == [0, 0, 0]
    ann.text((2, 2), "a\nb")
    assert ann.result()[:12].any() and ann.result()[12:24, :10].any(), "two lines of text"


def test_plot_images_mosaic(tmp_path):
    imgs = torch.zeros(3, 3, 64, 96, dtype=torch.uint8)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.5, 0.5], [2, 1, 0.25, 0.25, 0.2, 0.2], [2, 2, 0.7, 0.7, 0.2, 0.3]])
    masks = torch.zeros(3, 16, 24)
    masks[2, 2:6, 2:6] = 1
    masks[2, 10:14, 14:20] = 2  # overlap mode: value k is the k-th target of image 2
    f = plot_images(imgs, targets, ["a.jpg", "b.jpg", "c.jpg"], tmp_path / "batch.jpg", {0: "x", 1: "y", 2: "z"},
                    masks=masks)  # fmt: skip
    im = cv2.imread(str(f))
    assert im.shape == (128, 192, 3)  # 2 x 2 grid of 64 x 96 tiles
    assert im[76:84, 10:22].mean() > 40, "the first mask of the third tile is drawn"
    assert im[:64, :96].max() > 100, "box and file name drawn on the first tile"
    assert im[64:, 96:].min() > 200, "the empty fourth tile stays white"


def test_plot_images_converts_only_the_drawn_images(tmp_path, monkeypatch):
    """A validation batch of 128 float images at 640 px: converting all of them to uint8 cost about 2 s per chart on
    the GPU machine; only max_subplots are drawn, so only those may be converted."""
    from evaluation import plots

    seen = []
    convert = plots._to_uint8_hwc
    monkeypatch.setattr(plots, "_to_uint8_hwc", lambda images: seen.append(len(images)) or convert(images))
    imgs = torch.rand(40, 3, 32, 32)
    f = plot_images(imgs, torch.zeros(0, 6), None, tmp_path / "b.jpg", max_subplots=9)
    assert seen == [9] and cv2.imread(str(f)).shape == (96, 96, 3)


def test_iou_vector_is_the_official_linspace():
    """The validators match at these thresholds: they must be the float32 values of the official
    torch.linspace(0.5, 0.95, 10) to the bit, or a match at exactly a threshold would flip."""
    assert torch.equal(iou_vector(), torch.linspace(0.5, 0.95, 10))
