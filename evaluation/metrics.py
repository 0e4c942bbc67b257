"""Evaluation metrics: prediction-to-label matching (boxes, masks, keypoints by OKS), AP per class, mAP containers,
confusion matrix, top-k accuracy.

The AP follows the YOLOv5/v8 convention (see yolo_facts.md section 5): recall sentinels 0 and 1.0, a precision
envelope, 101-point linear interpolation integrated with the trapezoid rule. It reads slightly above pycocotools
where recall never reaches 1, because the last segment to the sentinel adds area COCO does not count.
"""

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from evaluation.charts import draw_confusion_matrix
from utils.log import LOGGER
from utils.ops import CLS, CONF, box_iou
from utils.rotated import polygon_iou, xywhr_to_corners

_trapezoid = getattr(np, "trapezoid", None) or np.trapz  # renamed in numpy 2.0

IOU_THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def iou_vector(device=None):
    """The ten COCO IoU thresholds 0.50:0.05:0.95 as a tensor."""
    return torch.tensor(IOU_THRESHOLDS, device=device)


def smooth(y, f=0.05):
    """Moving average over a window of about 2*f*len(y) points (odd), ends padded with the end values."""
    nf = round(len(y) * f * 2) // 2 + 1
    pad = nf // 2
    yp = np.concatenate((np.full(pad, y[0]), y, np.full(pad, y[-1])))
    return np.convolve(yp, np.ones(nf) / nf, mode="valid")


def _unique_pairs(li, pi, iou):
    """Reduce candidate (label, prediction) pairs so each label and each prediction appears at most once (the
    confusion matrix's matching).

    Pairs are ranked by IoU; each prediction keeps its best label, then each label its best prediction.
    """
    order = np.argsort(-iou[li, pi], kind="stable")
    li, pi = li[order], pi[order]
    _, first = np.unique(pi, return_index=True)
    first = np.sort(first)
    li, pi = li[first], pi[first]
    _, first = np.unique(li, return_index=True)
    return li[first], pi[first]


def match_predictions(pred_classes, true_classes, iou, iouv):
    """Mark predictions that match a label at each IoU threshold.

    iou is (n_true, n_pred); predictions in descending confidence, as NMS returns them. At each threshold the
    candidate pairs (IoU >= t, same class) are ranked by IoU; every prediction keeps its best label, then every
    label keeps its earliest (most confident) prediction: the YOLOv5/v8 matching, which on NMS output agrees
    with pycocotools' confidence-ordered greedy match. Returns bool (n_pred, n_thresholds) on the CPU, where the
    validators keep the classes; an `iou` computed on a GPU (masks) comes over in one copy.

    All thresholds at once: a prediction's best label is the same at every threshold it passes (its highest IoU,
    the lowest label index among ties, as a stable ranking of the pairs gives), so only which thresholds it passes
    varies. The thresholds compare in the IoU's own dtype, as a scalar threshold does.
    """
    correct = np.zeros((pred_classes.shape[0], iouv.shape[0]), dtype=bool)
    same_class = (true_classes[:, None] == pred_classes[None, :]).cpu()
    iou = (iou.cpu() * same_class).numpy()
    if not iou.size:
        return torch.from_numpy(correct)
    n = iou.shape[1]
    cols = np.arange(n)
    best = np.where(np.isnan(iou), -np.inf, iou).argmax(0)  # a NaN is no candidate
    passes = iou[best, cols][:, None] >= np.asarray(iouv.tolist(), dtype=iou.dtype)  # (n_pred, n_thresholds)
    first = np.full((iou.shape[0], passes.shape[1]), n)  # each label's earliest passing prediction, n for none
    np.minimum.at(first, best, np.where(passes, cols[:, None], n))
    label, k = np.nonzero(first < n)
    correct[first[label, k], k] = True
    return torch.from_numpy(correct)


def process_batch(detections, labels, iouv):
    """Box matching for one image: detections (n, 6) xyxy conf cls, labels (m, 5) cls xyxy, same pixel space.

    Returns bool (n, len(iouv)).
    """
    iou = box_iou(labels[:, 1:], detections[:, :4])
    return match_predictions(detections[:, 5], labels[:, 0], iou, iouv)


def labels_box_iou(labels, detections):
    """(m, n) IoU of labels (cls, xyxy) and detection rows (xyxy, conf, cls, ...)."""
    return box_iou(labels[:, 1:5], detections[:, :4])


def labels_rotated_iou(labels, detections):
    """(m, n) polygon IoU of labels (cls, xywhr) and oriented-box rows (xywh, conf, cls, ..., angle)."""
    boxes = torch.cat((detections[:, :4], detections[:, -1:]), 1)
    return polygon_iou(xywhr_to_corners(labels[:, 1:6].double()), xywhr_to_corners(boxes.double()))


def process_rotated_batch(detections, angles, labels, iouv):
    """Oriented-box matching for one image by exact polygon IoU (as DOTA's evaluation): detections (n, 6) xywh conf
    cls and their angles (n,), labels (m, 6) cls xywhr, same pixel space. Returns bool (n, len(iouv))."""
    iou = labels_rotated_iou(labels, torch.cat((detections[:, :6], angles[:, None]), 1))
    return match_predictions(detections[:, 5], labels[:, 0], iou.to(detections.dtype), iouv)


def mask_iou(masks1, masks2, eps=1e-7):
    """Pairwise IoU of flattened binary masks: (n, hw) x (m, hw) -> (n, m)."""
    masks1, masks2 = masks1.float(), masks2.float()
    inter = masks1 @ masks2.T
    union = masks1.sum(1)[:, None] + masks2.sum(1)[None, :] - inter
    return inter / (union + eps)


def process_mask_batch(detections, labels, pred_masks, gt_masks, iouv):
    """Mask matching for one image: pred_masks (n, h, w) and gt_masks (m, H, W) binary.

    Ground-truth masks of another size are resized bilinearly to the prediction size and re-binarised.
    Returns bool (n, len(iouv)).
    """
    if gt_masks.shape[1:] != pred_masks.shape[1:]:
        gt_masks = F.interpolate(gt_masks[None].float(), pred_masks.shape[1:], mode="bilinear", align_corners=False)
        gt_masks = gt_masks[0].gt_(0.5)
    iou = mask_iou(gt_masks.flatten(1), pred_masks.flatten(1))
    return match_predictions(detections[:, 5], labels[:, 0], iou, iouv)


def instance_masks(overlap_mask, n):
    """Overlap-mode mask (h, w), value k marking the k-th instance (1-based) -> bool (n, h, w)."""
    ids = torch.arange(1, n + 1, device=overlap_mask.device).view(n, 1, 1)
    return overlap_mask[None] == ids


# COCO's per-keypoint OKS sigmas of its 17 person keypoints (nose, eyes, ears, shoulders, elbows, wrists, hips, knees,
# ankles): how far, relative to the object's scale, annotators placed each keypoint apart
COCO_KPT_SIGMAS = np.array([0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07, 0.87, 0.87,
                            0.89, 0.89]) / 10.0
OKS_AREA_SCALE = 0.53  # a box's area times this stands in for the object's segmented area (Ultralytics, COCO persons)


def keypoint_sigmas(k):
    """OKS sigmas of k keypoints: COCO's for 17 (person keypoints), else uniform 1 / k, as Ultralytics."""
    return COCO_KPT_SIGMAS.copy() if k == 17 else np.full(k, 1.0 / k)


def keypoint_oks(gt, pred, area, sigmas, eps=1e-7):
    """Pairwise OKS (n_gt, n_pred): gt (n, K, 3) with visibility, pred (m, K, >= 2), area (n,) per label, all in one
    pixel space. The mean of exp(-d^2 / (2 area (2 sigma)^2)) over the label's visible keypoints, as COCO's computeOks
    (a label without visible keypoints matches nothing)."""
    d = (gt[:, None, :, 0] - pred[None, :, :, 0]).pow(2) + (gt[:, None, :, 1] - pred[None, :, :, 1]).pow(2)
    sigmas = torch.as_tensor(sigmas, device=gt.device, dtype=gt.dtype)
    e = d / ((2 * sigmas).pow(2) * (area[:, None, None] + eps) * 2)
    visible = (gt[..., 2] > 0).to(gt.dtype)
    return ((-e).exp() * visible[:, None]).sum(-1) / (visible.sum(-1)[:, None] + eps)


def process_keypoint_batch(detections, labels, pred_kpts, gt_kpts, sigmas, iouv):
    """Keypoint matching for one image by OKS: detections (n, 6) xyxy conf cls, labels (m, 5) cls xyxy, keypoints in
    the same pixel space; each label's area is its box's times OKS_AREA_SCALE. Returns bool (n, len(iouv))."""
    area = (labels[:, 3] - labels[:, 1]) * (labels[:, 4] - labels[:, 2]) * OKS_AREA_SCALE
    oks = keypoint_oks(gt_kpts, pred_kpts, area, sigmas)
    return match_predictions(detections[:, 5], labels[:, 0], oks, iouv)


def _pr_envelope(recall, precision):
    """Recall and precision with the sentinels (0, 1) and (1, 0), precision made non-increasing in recall."""
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    return mrec, np.flip(np.maximum.accumulate(np.flip(mpre)))


AP_RECALLS = np.linspace(0, 1, 101)  # the recall points an AP integrates over


def compute_ap(recall, precision):
    """AP of one precision-recall curve (points in descending-confidence order), official YOLOv5 convention."""
    mrec, mpre = _pr_envelope(recall, precision)
    return float(_trapezoid(np.interp(AP_RECALLS, mrec, mpre), AP_RECALLS))


def ap_per_class(tp, conf, pred_cls, target_cls, eps=1e-16, curves=False):
    """AP per class from all predictions of a dataset.

    tp: bool (n, t) matches per IoU threshold, conf (n,), pred_cls (n,), target_cls (m,) numpy arrays.
    Classes are those present in target_cls (a class with labels and no predictions gets AP 0).
    Returns (p, r, f1, ap, classes): p, r, f1 (nc,) at the confidence that maximises the smoothed mean F1,
    ap (nc, t), classes (nc,) int. With curves=True a dict of the curves for plotting follows: `px` the grid,
    `p`, `r`, `f1` (nc, 1000) by confidence, `pr` (nc, 1000) precision by recall at IoU 0.5, `ap50`, `classes`.
    """
    tp = np.asarray(tp, dtype=float)
    tp = tp[:, None] if tp.ndim == 1 else tp
    order = np.argsort(-np.asarray(conf), kind="stable")
    # then grouped by class, each class's rows still in that order: one block per class, where a mask of the whole
    # array per class made the cost grow with rows x classes
    order = order[np.argsort(np.asarray(pred_cls)[order], kind="stable")]
    tp, conf, pred_cls = tp[order], np.asarray(conf)[order], np.asarray(pred_cls)[order]
    classes, n_labels = np.unique(np.asarray(target_cls), return_counts=True)
    starts, stops = np.searchsorted(pred_cls, classes, "left"), np.searchsorted(pred_cls, classes, "right")
    px = np.linspace(0, 1, 1000)  # confidence grid for P, R, F1
    ap = np.zeros((len(classes), tp.shape[1]))
    p_curve, r_curve = np.zeros((len(classes), len(px))), np.zeros((len(classes), len(px)))
    pr_curve = np.zeros((len(classes), len(px)))
    for ci, c in enumerate(classes):
        sel = slice(starts[ci], stops[ci])
        if starts[ci] == stops[ci] or not pred_cls[starts[ci]] == c:  # none, or a NaN class (equal to nothing)
            continue
        tpc = tp[sel].cumsum(0)
        fpc = (1 - tp[sel]).cumsum(0)
        recall = tpc / (n_labels[ci] + eps)
        precision = tpc / (tpc + fpc)
        # conf decreases along the curve: negate both axes for np.interp, which needs increasing x
        r_curve[ci] = np.interp(-px, -conf[sel], recall[:, 0], left=0)
        p_curve[ci] = np.interp(-px, -conf[sel], precision[:, 0], left=1)
        for j in range(tp.shape[1]):
            ap[ci, j] = compute_ap(recall[:, j], precision[:, j])
        pr_curve[ci] = np.interp(px, *_pr_envelope(recall[:, 0], precision[:, 0]))
    f1_curve = 2 * p_curve * r_curve / (p_curve + r_curve + eps)
    i = int(smooth(f1_curve.mean(0), 0.1).argmax()) if len(classes) else 0
    out = (p_curve[:, i], r_curve[:, i], f1_curve[:, i], ap, classes.astype(int))
    if not curves:
        return out
    return *out, {"px": px, "p": p_curve, "r": r_curve, "f1": f1_curve, "pr": pr_curve, "ap50": ap[:, 0],
                  "classes": classes.astype(int)}


class Metric:
    """AP results of one kind (boxes or masks): per-class P, R, F1, AP over thresholds and their means."""

    def __init__(self):
        self.p, self.r, self.f1 = np.zeros(0), np.zeros(0), np.zeros(0)
        self.all_ap = np.zeros((0, len(IOU_THRESHOLDS)))
        self.ap_class_index = np.zeros(0, dtype=int)
        self.curves = None  # ap_per_class's curves, for the plots

    def update(self, p, r, f1, ap, classes, curves=None):
        self.p, self.r, self.f1, self.all_ap, self.ap_class_index = p, r, f1, ap, classes
        self.curves = curves

    def _mean(self, x):
        return float(x.mean()) if len(x) else 0.0

    @property
    def ap50(self):
        return self.all_ap[:, 0] if len(self.all_ap) else np.zeros(0)

    @property
    def ap(self):
        """AP50-95 per class."""
        return self.all_ap.mean(1) if len(self.all_ap) else np.zeros(0)

    @property
    def mp(self):
        return self._mean(self.p)

    @property
    def mr(self):
        return self._mean(self.r)

    @property
    def map50(self):
        return self._mean(self.ap50)

    @property
    def map(self):
        return self._mean(self.ap)

    def mean_results(self):
        return [self.mp, self.mr, self.map50, self.map]

    def class_result(self, i):
        """(p, r, ap50, ap50-95) of the i-th evaluated class (index into ap_class_index)."""
        return float(self.p[i]), float(self.r[i]), float(self.ap50[i]), float(self.ap[i])

    def maps(self, nc):
        """AP50-95 per class id for nc classes; classes without labels get the mean."""
        out = np.full(nc, self.map)
        out[self.ap_class_index] = self.ap
        return out

    def fitness(self):
        return 0.1 * self.map50 + 0.9 * self.map


def _metric_keys(suffix):
    return [f"metrics/{k}({suffix})" for k in ("precision", "recall", "mAP50", "mAP50-95")]


class DetMetrics:
    """The metrics of a detection-family validation run, one `Metric` per part: an attribute name and its results.csv
    suffix, `box` ("B") and then each other field's (masks `seg` "M", keypoints `pose` "P"); the fitness is the sum of
    the parts', as official."""

    parts = (("box", "B"),)

    def __init__(self, names=None, parts=None):
        self.names = names or {}
        self.parts = tuple(parts or self.parts)
        for name, _ in self.parts:
            setattr(self, name, Metric())

    def _metrics(self):
        return [getattr(self, name) for name, _ in self.parts]

    def process(self, *args):
        """args: one tp (n, t) per part, in `parts` order, then conf (n,), pred_cls (n,) and target_cls (m,)."""
        *tps, conf, pred_cls, target_cls = args
        if len(tps) != len(self.parts):
            raise ValueError(f"{len(tps)} match arrays for the {len(self.parts)} parts {self.parts}")
        for metric, tp in zip(self._metrics(), tps):
            metric.update(*ap_per_class(tp, conf, pred_cls, target_cls, curves=True))

    @property
    def keys(self):
        return [k for _, suffix in self.parts for k in _metric_keys(suffix)]

    def mean_results(self):
        return [v for m in self._metrics() for v in m.mean_results()]

    def class_result(self, i):
        return tuple(v for m in self._metrics() for v in m.class_result(i))

    @property
    def ap_class_index(self):
        return self.box.ap_class_index

    def maps(self, nc):
        return sum(m.maps(nc) for m in self._metrics())

    @property
    def fitness(self):
        return sum(m.fitness() for m in self._metrics())

    @property
    def results_dict(self):
        return dict(zip(self.keys + ["fitness"], self.mean_results() + [self.fitness]))

class ClassifyMetrics:
    """Top-1 / top-5 accuracy, overall and per class."""

    def __init__(self, names=None):
        self.names = names or {}
        self.top1 = self.top5 = 0.0

    def process(self, targets, preds):
        """targets (n,) int; preds either scores (n, nc) float or class indices (n, k) int sorted best first."""
        targets = torch.as_tensor(targets).view(-1).cpu()
        preds = torch.as_tensor(preds).cpu()
        if preds.is_floating_point():
            preds = preds.argsort(1, descending=True)
        hits = targets[:, None] == preds[:, :5]
        top1, top5 = hits[:, 0].float(), hits.any(1).float()
        self.top1 = float(top1.mean()) if len(targets) else 0.0
        self.top5 = float(top5.mean()) if len(targets) else 0.0

    @property
    def keys(self):
        return ["metrics/accuracy_top1", "metrics/accuracy_top5"]

    def mean_results(self):
        return [self.top1, self.top5]

    @property
    def fitness(self):
        return (self.top1 + self.top5) / 2

    @property
    def results_dict(self):
        return dict(zip(self.keys + ["fitness"], self.mean_results() + [self.fitness]))


class ConfusionMatrix:
    """Confusion matrix indexed [predicted, true]; where objects are found (`background`, every task but whole-image
    classification) a background row/column at index nc counts the missed labels and the false detections."""

    def __init__(self, nc, conf=0.25, iou_thres=0.45, background=True, iou=None):
        """`iou(labels, detections)` -> (m, n) overlaps of an image's labels and detection rows; default box IoU of
        labels (cls, xyxy) and rows (xyxy, conf, cls)."""
        self.nc, self.conf, self.iou_thres, self.background = nc, conf, iou_thres, background
        self.iou = iou or labels_box_iou
        n = nc + 1 if background else nc
        self.matrix = np.zeros((n, n), dtype=np.int64)

    def process_cls_preds(self, preds, targets):
        """preds: scores (n, nc) float, class ids sorted best first (n, k) int, or top-1 ids (n,); targets (n,)."""
        preds = torch.as_tensor(preds)
        if preds.ndim == 2:
            preds = preds.argmax(1) if preds.is_floating_point() else preds[:, 0]
        np.add.at(self.matrix, (preds.cpu().long().numpy(), torch.as_tensor(targets).cpu().long().numpy()), 1)

    def process_batch(self, detections, labels):
        """One image: detections (n, 6) xyxy conf cls (may be None), labels (m, 5) cls xyxy.

        A label matched (class-agnostic, IoU > iou_thres, best IoU first on both sides) counts at [its detection's
        class, label class]; an unmatched label counts as missed [background, class]; an unmatched detection
        above conf counts as a false positive [class, background].
        """
        gt_cls = labels[:, 0].long().cpu().numpy()
        bg = self.nc
        dets = detections[detections[:, CONF] > self.conf] if detections is not None else None
        if dets is None or not len(dets):
            np.add.at(self.matrix, (bg, gt_cls), 1)
            return
        det_cls = dets[:, CLS].long().cpu().numpy()
        if not len(gt_cls):
            np.add.at(self.matrix, (det_cls, bg), 1)
            return
        iou = self.iou(labels, dets).cpu().numpy()
        li, di = _unique_pairs(*np.nonzero(iou > self.iou_thres), iou)
        np.add.at(self.matrix, (det_cls[di], gt_cls[li]), 1)
        np.add.at(self.matrix, (bg, np.delete(gt_cls, li)), 1)
        np.add.at(self.matrix, (np.delete(det_cls, di), bg), 1)

    def plot(self, save_dir, names=(), normalize=True):
        """Draw the matrix as a PNG (counts, or fractions of each true class); returns the file path."""
        array = self.matrix.astype(float)
        if normalize:
            array = array / (array.sum(0, keepdims=True) + 1e-9)  # fraction of each true class
        labels = list(names.values() if isinstance(names, dict) else names)
        if len(labels) != self.nc:
            labels = [str(i) for i in range(self.nc)]
        if self.background:
            labels.append("background")
        name = "confusion_matrix_normalized.png" if normalize else "confusion_matrix.png"
        path = Path(save_dir) / name
        draw_confusion_matrix(array, labels, path, normalize)
        return path

    def print(self):
        for row in self.matrix:
            LOGGER.info(" ".join(str(int(v)) for v in row))
