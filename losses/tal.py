"""Task-aligned assignment (TOOD), as used by the YOLOv8 criterion."""

from typing import NamedTuple

import torch

from utils.ops import bbox_iou, xywh2xyxy, xyxy2xywh


class Assignment(NamedTuple):
    """Per-anchor targets; rows of background anchors hold zeros (use `fg_mask`)."""

    labels: torch.Tensor  # (B, A) long: class of the assigned GT
    bboxes: torch.Tensor  # (B, A, 4) xyxy of the assigned GT, in the units of the input boxes
    scores: torch.Tensor  # (B, A, nc) one-hot class times the normalised alignment (soft classification target)
    fg_mask: torch.Tensor  # (B, A) bool: anchor is a positive
    gt_idx: torch.Tensor  # (B, A) long: index of the assigned GT along the padded GT axis


def anchors_in_boxes(points, boxes, eps=1e-9):
    """(A, 2) points, (B, M, 4) xyxy boxes -> (B, M, A) bool: point strictly inside the box."""
    x, y = points[:, 0], points[:, 1]
    x1, y1, x2, y2 = (boxes[..., None, k] for k in range(4))
    # four (B, M, A) comparisons: a (B, M, A, 4) stack of the distances and its min cost several times as much on CPU
    return (x - x1 > eps) & (y - y1 > eps) & (x2 - x > eps) & (y2 - y > eps)


def widen_small_boxes(boxes, side):
    """(..., 4) xyxy boxes with each side shorter than `side` widened to `side` about the box's centre."""
    xywh = xyxy2xywh(boxes)
    xywh[..., 2:] = xywh[..., 2:].clamp(min=side)
    return xywh2xyxy(xywh)


class TaskAlignedAssigner:
    """Assign anchors to ground-truth boxes by the alignment metric t = s^alpha * IoU^beta.

    s is the predicted probability of the GT's class and IoU the (CIoU, clamped at 0, as official) overlap of the
    predicted box with the GT. Candidates of a GT are the anchors whose centres lie inside it; it takes the `topk`
    of them with the largest t. An anchor taken by several GTs goes to the containing GT of highest IoU. The soft
    class target of a positive is t rescaled so that, per GT, the largest t over its positives equals the largest
    IoU over them.

    `min_side` (pixels, or 0): a GT side shorter than it is widened to it about the box's centre when its candidate
    anchors are chosen (the v8 criterion passes its second stride, 16 px, as Ultralytics 8.4 does). Without it, a GT
    that holds no anchor centre is never learned: letterboxed to 320 px, 7.5 % of COCO128's training boxes hold none
    at any stride and 44 % have a side under 16 px (docs/recipes.md, "Real photos").
    """

    def __init__(self, topk=10, num_classes=80, alpha=0.5, beta=6.0, eps=1e-9, min_side=0.0):
        self.topk, self.num_classes, self.alpha, self.beta, self.eps = topk, num_classes, alpha, beta, eps
        self.min_side = min_side

    @torch.no_grad()
    def __call__(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt):
        """Inputs: pd_scores (B, A, nc) probabilities; pd_bboxes (B, A, 4) xyxy; anc_points (A, 2) in the same
        units; gt_labels (B, M, 1); gt_bboxes (B, M, 4) xyxy; mask_gt (B, M, 1), true for real (not padded) GTs.
        Returns an `Assignment`."""
        if gt_bboxes.shape[1] == 0:
            return self._empty(pd_scores, pd_bboxes)
        inside = self.candidates(anc_points, gt_bboxes) & mask_gt.bool()
        metric, overlaps = self._alignment(pd_scores, pd_bboxes, gt_labels, gt_bboxes, inside)
        pos = self._topk(metric) & inside
        pos = self._resolve_conflicts(pos, overlaps, inside)
        fg = pos.any(1)
        # max(1).indices is argmax (the first maximum), at a fifth of argmax's time along a middle dim on CPU
        gt_idx = pos.to(torch.uint8).max(1).indices
        labels = gt_labels[..., 0].long().gather(1, gt_idx)
        bboxes = gt_bboxes.gather(1, gt_idx[..., None].expand(-1, -1, gt_bboxes.shape[-1]))
        metric, overlaps = metric * pos, overlaps * pos
        scale = overlaps.amax(-1, keepdim=True) / (metric.amax(-1, keepdim=True) + self.eps)
        norm = (metric * scale).amax(1)
        # the one-hot class times the normalised alignment, scattered: F.one_hot reads the labels' range on the host
        value = (norm * fg)[..., None].to(pd_scores.dtype)
        scores = torch.zeros_like(pd_scores).scatter_(-1, labels[..., None], value)
        return Assignment(labels, bboxes, scores, fg, gt_idx)

    def candidates(self, anc_points, gt_bboxes):
        """(B, M, A) bool: the anchors each GT may take, those whose centres lie inside it (`min_side` applied)."""
        candidates = widen_small_boxes(gt_bboxes, self.min_side) if self.min_side else gt_bboxes
        return anchors_in_boxes(anc_points, candidates, self.eps)

    @staticmethod
    def iou(gt_bboxes, pd_bboxes):
        """(n,) overlap of paired GT and predicted boxes: CIoU, as official."""
        return bbox_iou(gt_bboxes, pd_bboxes, xywh=False, CIoU=True).squeeze(-1)

    def _empty(self, pd_scores, pd_bboxes):
        bs, na, _ = pd_scores.shape
        zeros = torch.zeros(bs, na, dtype=torch.long, device=pd_scores.device)
        return Assignment(zeros, torch.zeros_like(pd_bboxes), torch.zeros_like(pd_scores), zeros.bool(), zeros)

    def _alignment(self, pd_scores, pd_bboxes, gt_labels, gt_bboxes, inside):
        """Alignment metric and IoU, (B, M, A), computed only for anchors inside their GT (zero elsewhere)."""
        na = inside.shape[-1]
        labels = gt_labels[..., 0].long().clamp(0, pd_scores.shape[-1] - 1)
        cls_scores = pd_scores.gather(2, labels[:, None, :].expand(-1, na, -1)).transpose(1, 2)
        overlaps = torch.zeros(inside.shape, dtype=pd_bboxes.dtype, device=pd_bboxes.device)
        # the pairs' indices once (the one wait for the device here), then gathers: a boolean-mask index or
        # assignment would wait once each
        b, g, a = inside.nonzero(as_tuple=True)
        overlaps[b, g, a] = self.iou(gt_bboxes[b, g], pd_bboxes[b, a]).clamp(0).to(overlaps.dtype)
        metric = cls_scores.pow(self.alpha) * overlaps.pow(self.beta) * inside
        return metric, overlaps

    def _topk(self, metric):
        """(B, M, A) bool: each GT's topk anchors by metric. As official, zero-metric anchors (outside the GT, or
        with no overlap) may fill the k places and are then dropped, so a GT can get fewer than k positives."""
        idx = metric.topk(min(self.topk, metric.shape[-1]), dim=-1).indices
        return torch.zeros(metric.shape, dtype=torch.bool, device=metric.device).scatter_(-1, idx, True)

    @staticmethod
    def _resolve_conflicts(pos, overlaps, inside):
        """An anchor positive for several GTs is given, as official, to the GT it overlaps most among all GTs that
        contain it (which may be one that did not rank it in its top-k). Computed whether or not any anchor is
        contested: asking would wait for the device."""
        multi = pos.sum(1, keepdim=True) > 1
        best = torch.where(inside, overlaps, torch.full_like(overlaps, -1.0)).max(1, keepdim=True).indices
        only_best = torch.zeros_like(pos).scatter_(1, best, True)
        return torch.where(multi, only_best, pos)
