"""The validation stages made faster for issue 60 (matching at all thresholds at once, AP per class in blocks, NMS
picking its passing rows first, letterbox undone on views) give exactly what their rules, read literally, give."""

import numpy as np
import pytest
import torch

from evaluation.metrics import IOU_THRESHOLDS, ap_per_class, iou_vector, match_predictions
from utils import ops


def _reference_matches(pred_cls, true_cls, iou, thresholds):
    """The matching rule one threshold at a time, in loops: the candidates are the same-class pairs with IoU >= t;
    each prediction keeps its highest-IoU candidate label (the lowest label index among equal IoUs), then each label
    keeps the earliest prediction that kept it. IoU and threshold compare in the IoU's dtype."""
    n_true, n_pred = iou.shape
    correct = np.zeros((n_pred, len(thresholds)), dtype=bool)
    for k, t in enumerate(thresholds):
        t = iou.dtype.type(t)
        best = {}
        for p in range(n_pred):
            for lab in range(n_true):
                v = iou[lab, p]
                if true_cls[lab] == pred_cls[p] and v >= t and (p not in best or v > iou[best[p], p]):
                    best[p] = lab
        taken = set()
        for p in sorted(best):
            if best[p] not in taken:
                taken.add(best[p])
                correct[p, k] = True
    return correct


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matching_equals_the_rule_read_literally(dtype):
    """Random cases with many equal IoUs (ties between labels, between predictions, values on the thresholds), NaN
    overlaps and several classes: the all-thresholds matching marks exactly what the rule marks."""
    rng = np.random.default_rng(3)
    iouv = iou_vector()
    on_thresholds = [0.0, 0.5, 0.55, 0.6, 0.7, 0.85, 0.95, 1.0]
    for trial in range(300):
        m, n = int(rng.integers(0, 9)), int(rng.integers(0, 25))
        values = rng.choice(on_thresholds, (m, n)) if trial % 2 else rng.random((m, n))
        iou = torch.from_numpy(values).to(dtype)
        if trial % 5 == 0 and iou.numel():
            iou[int(rng.integers(0, m)), int(rng.integers(0, n))] = float("nan")
        pred_cls = torch.from_numpy(rng.integers(0, 3, n)).float()
        true_cls = torch.from_numpy(rng.integers(0, 3, m)).float()
        out = match_predictions(pred_cls, true_cls, iou, iouv)
        masked = (iou * (true_cls[:, None] == pred_cls[None, :])).numpy()
        ref = _reference_matches(pred_cls.numpy(), true_cls.numpy(), masked, iouv.tolist())
        assert out.dtype == torch.bool and np.array_equal(out.numpy(), ref), trial


def test_matching_at_a_threshold_compares_in_the_overlaps_dtype():
    """A float32 IoU of exactly float32(0.7) matches at a float64 threshold 0.7, as `iou >= 0.7` compares (in the
    array's dtype; in float64 it would read below 0.7), and the earlier of two predictions that tie for a label gets
    it at every threshold."""
    iou = torch.tensor([[0.7, 0.7]], dtype=torch.float32)
    iouv = torch.tensor(IOU_THRESHOLDS, dtype=torch.float64)
    out = match_predictions(torch.tensor([1.0, 1.0]), torch.tensor([1.0]), iou, iouv)
    assert out[0].tolist() == [True] * 5 + [False] * 5 and not out[1].any()


def _reference_ap_per_class(tp, conf, pred_cls, target_cls, eps=1e-16):
    """AP per class with each class's rows picked by a mask of the whole array (the rule before the blocks)."""
    order = np.argsort(-conf, kind="stable")
    tp, conf, pred_cls = tp[order].astype(float), conf[order], pred_cls[order]
    classes, n_labels = np.unique(target_cls, return_counts=True)
    ap = np.zeros((len(classes), tp.shape[1]))
    x = np.linspace(0, 1, 101)
    for ci, c in enumerate(classes):
        sel = pred_cls == c
        if not sel.any():
            continue
        tpc, fpc = tp[sel].cumsum(0), (1 - tp[sel]).cumsum(0)
        recall, precision = tpc / (n_labels[ci] + eps), tpc / (tpc + fpc)
        for j in range(tp.shape[1]):
            mrec = np.concatenate(([0.0], recall[:, j], [1.0]))
            mpre = np.flip(np.maximum.accumulate(np.flip(np.concatenate(([1.0], precision[:, j], [0.0])))))
            y = np.interp(x, mrec, mpre)
            ap[ci, j] = float(((y[1:] + y[:-1]) / 2 * np.diff(x)).sum())
    return ap


def test_ap_per_class_in_blocks_equals_masks_per_class():
    """Classes with no prediction, predictions of classes without labels, tied confidences across classes: every
    class's AP as the per-class masks give it."""
    rng = np.random.default_rng(5)
    for trial in range(100):
        n, m = int(rng.integers(1, 80)), int(rng.integers(1, 30))
        tp = rng.random((n, 10)) < 0.4
        conf = rng.choice([0.2, 0.5, 0.9], n) if trial % 2 else rng.random(n)
        pred_cls, target_cls = rng.integers(0, 6, n).astype(np.float32), rng.integers(0, 8, m).astype(np.float32)
        ap = ap_per_class(tp, conf, pred_cls, target_cls)[3]
        np.testing.assert_allclose(ap, _reference_ap_per_class(tp, conf, pred_cls, target_cls), rtol=0, atol=1e-12)


def test_nms_keeps_a_rows_other_classes_when_one_score_is_nan():
    """Rows are picked by their best score before the per-row steps; a row whose scores hold a NaN (its best is NaN)
    still gives its other passing classes under multi_label, and nothing as one label (whose max is NaN), as the
    per-row steps alone decide. A sparse output (most anchors at 0, as at val's conf 0.001) keeps the same rows."""
    nan = float("nan")
    layout = ops.OutputLayout(3, channels_last=False)
    rows = torch.zeros(1, 6, 7)  # (B, anchors, xywh + 3 scores)
    rows[0, :, :4] = torch.tensor([[20.0 * i + 10, 10.0, 8.0, 8.0] for i in range(6)])  # apart: none suppressed
    rows[0, 1, 4:] = torch.tensor([nan, 0.9, 0.0])
    rows[0, 3, 4:] = torch.tensor([0.0, 0.0, 0.4])
    rows[0, 4, 4:] = torch.tensor([0.3, 0.0005, 0.2])
    pred = rows.transpose(1, 2)
    multi = ops.non_max_suppression(pred, conf_thres=0.001, multi_label=True, layout=layout)[0]
    torch.testing.assert_close(multi[:, 4:], torch.tensor([[0.9, 1], [0.4, 2], [0.3, 0], [0.2, 2]]))
    single = ops.non_max_suppression(pred, conf_thres=0.001, layout=layout)[0]
    torch.testing.assert_close(single[:, 4:], torch.tensor([[0.4, 2], [0.3, 0]]))


def test_scale_boxes_on_views_equals_index_lists():
    """The letterbox undone on column views gives, bit for bit, the arithmetic on index lists it replaced."""
    gen = torch.Generator().manual_seed(2)
    boxes = torch.rand(50, 4, generator=gen) * 700 - 30
    ratio_pad = ((0.5625, 0.5621), (3.5, 80.0))
    ref = boxes.clone()
    ref[:, [0, 2]] -= 3.5
    ref[:, [1, 3]] -= 80.0
    ref[:, [0, 2]] /= 0.5621
    ref[:, [1, 3]] /= 0.5625
    ref[:, [0, 2]] = ref[:, [0, 2]].clamp(0, 1137)
    ref[:, [1, 3]] = ref[:, [1, 3]].clamp(0, 841)
    out = ops.scale_boxes((640, 640), boxes.clone(), (841, 1137), ratio_pad=ratio_pad)
    assert torch.equal(out, ref)
    assert np.array_equal(ops.scale_boxes((640, 640), boxes.numpy().copy(), (841, 1137), ratio_pad), ref.numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int32])
def test_xywh2xyxy_in_one_operation_per_corner_equals_per_column(dtype):
    """Both axes at once give, bit for bit, each column's own arithmetic (x - w / 2 ...), extra columns kept."""
    x = (torch.rand(40, 6, generator=torch.Generator().manual_seed(4)) * 600).to(dtype)
    ref = x.clone()
    ref[:, 0], ref[:, 1] = x[:, 0] - x[:, 2] / 2, x[:, 1] - x[:, 3] / 2
    ref[:, 2], ref[:, 3] = x[:, 0] + x[:, 2] / 2, x[:, 1] + x[:, 3] / 2
    assert torch.equal(ops.xywh2xyxy(x), ref)
    assert np.array_equal(ops.xywh2xyxy(x.numpy()), ref.numpy())
