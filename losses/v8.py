"""YOLOv8 anchor-free detection criterion: task-aligned assignment, BCE classes, CIoU boxes and DFL."""

from collections import OrderedDict
from typing import NamedTuple

import torch
import torch.nn.functional as F

from losses.common import detection_head, pad_targets
from losses.tal import Assignment, TaskAlignedAssigner
from utils.ops import bbox2dist, bbox_iou, dist2bbox, make_anchors

GRIDS = 16  # input shapes whose anchors a criterion keeps


def distribution_focal_loss(pred_dist, target):
    """DFL: pred_dist (n, R) logits over bins 0..R-1, target (n,) distances in [0, R-1) -> (n,).

    The target lies between bins floor(t) and floor(t) + 1; the loss is the cross-entropy at each, weighted by how
    close t is to it, so the softmax expectation is pulled to t.
    """
    left = target.long()
    right = left + 1
    w_left = right.to(target.dtype) - target
    return (F.cross_entropy(pred_dist, left, reduction="none") * w_left
            + F.cross_entropy(pred_dist, right, reduction="none") * (1 - w_left))


class V8State(NamedTuple):
    """What the v8 terms need from one forward pass and its assignment (boxes in grid units unless noted)."""

    pred_distri: torch.Tensor  # (B, A, 4 * reg_max) logits
    pred_scores: torch.Tensor  # (B, A, nc) logits
    pred_bboxes: torch.Tensor  # (B, A, 4) decoded xyxy
    anchor_points: torch.Tensor  # (A, 2)
    stride_tensor: torch.Tensor  # (A, 1)
    whwh: torch.Tensor  # (4,) image (w, h, w, h) in pixels
    assignment: Assignment  # boxes in pixels
    score_sum: torch.Tensor  # 0-d, max(sum of target scores, 1): the normaliser of every term
    gt_row: torch.Tensor  # (B, M) row of the batch targets behind each padded GT (-1 for padding)
    fg: tuple  # (image, anchor) indices of the positives, (n,) long each, in `assignment.fg_mask` order


class V8DetectionLoss:
    """YOLOv8 detection loss over the anchor-free `Detect` train output: list of (B, 4 * reg_max + nc, ny, nx).

    cls = BCE summed over all anchors and classes / S, box = sum of (1 - CIoU) * w / S, dfl = sum of DFL * w / S,
    where w is a positive's target-score mass and S = max(total target score, 1); gains box, cls, dfl from the hyp.
    """

    name = "v8"  # what `hyp loss:` and a head's `default_loss` call it (losses.REGISTRY)
    loss_names = ("box", "cls", "dfl")
    hyp_keys = {"box": "[0, inf)", "cls": "[0, inf)", "dfl": "[0, inf)"}  # what engine/hyp.py checks files against
    hyp_defaults = {}
    hyp_file = "hyp.v8.yaml"  # the anchor-free family's (YOLOv8, YOLOv5u, YOLO11; -seg and -pose too)

    def __init__(self, model, hyp, imgsz=640):
        self.head = detection_head(model)
        self.nc, self.reg_max = self.head.nc, self.head.reg_max
        if self.reg_max < 2:
            raise ValueError(f"the v8 criterion needs a DFL head (reg_max > 1), got reg_max={self.reg_max}")
        self.no = self.nc + 4 * self.reg_max
        self.box_gain, self.cls_gain, self.dfl_gain = hyp["box"], hyp["cls"], hyp["dfl"]
        self.strides = self.head.stride.tolist()  # host numbers: read from a device tensor, each would wait for it
        self.assigner = TaskAlignedAssigner(topk=10, num_classes=self.nc, alpha=0.5, beta=6.0,
                                            min_side=self.strides[min(1, len(self.strides) - 1)])
        self.grids = OrderedDict()  # the last GRIDS input shapes' anchors (`grid`)

    def __call__(self, preds, batch):
        state = self.assign(preds, batch["targets"])
        lbox, lcls, ldfl = self.detection_terms(state)
        bs = preds[0].shape[0]
        return (lbox + lcls + ldfl) * bs, torch.stack((lbox, lcls, ldfl)).detach()

    def decode(self, anchor_points, pred_distri):
        """Expected distance per side under the softmax over bins -> xyxy boxes in grid units."""
        proj = torch.arange(self.reg_max, device=pred_distri.device, dtype=pred_distri.dtype)
        b, a, _ = pred_distri.shape
        dist = pred_distri.view(b, a, 4, self.reg_max).softmax(3).matmul(proj)
        return dist2bbox(dist, anchor_points, xywh=False)

    def grid(self, feats):
        """(anchor points (A, 2) and their strides (A, 1) as `make_anchors` gives them, the image's (w, h, w, h) in
        pixels) for these feature maps, built once per input shape: the pixel size is a tensor of host values, a copy
        to the device that waits for it."""
        key = (tuple(f.shape[2:] for f in feats), feats[0].dtype, feats[0].device)
        if key in self.grids:
            self.grids.move_to_end(key)
            return self.grids[key]
        anchor_points, stride_tensor = make_anchors(feats, self.strides, 0.5)
        h, w = (n * self.strides[0] for n in feats[0].shape[2:])
        whwh = torch.tensor([w, h, w, h], device=feats[0].device, dtype=torch.float32)
        self.grids[key] = anchor_points, stride_tensor, whwh
        if len(self.grids) > GRIDS:  # multi-scale training and rectangular validation batches vary the shape
            self.grids.popitem(last=False)
        return self.grids[key]

    def assign(self, feats, targets):
        bs = feats[0].shape[0]
        if feats[0].shape[1] != self.no:
            raise ValueError(f"v8 criterion expects {self.no} channels per level (nc={self.nc}, "
                             f"reg_max={self.reg_max}), got {feats[0].shape[1]}")
        # contiguous (anchors, channels) rows: the DFL's softmax over bins then reads adjacent values, where over the
        # permuted view neighbouring bins lie a whole row of anchors apart
        x = torch.cat([f.view(bs, self.no, -1) for f in feats], 2).permute(0, 2, 1).contiguous()
        pred_distri, pred_scores = x.split((4 * self.reg_max, self.nc), 2)
        anchor_points, stride_tensor, whwh = self.grid(feats)
        gt_xyxy = targets.boxes.pixels().convert("xyxy").data
        labels, gt_bboxes, valid, gt_row = pad_targets(targets, bs, gt_xyxy)
        pred_bboxes = self.decode(anchor_points, pred_distri)
        assignment = self.assigner(pred_scores.detach().sigmoid(),
                                   (pred_bboxes.detach() * stride_tensor).to(gt_bboxes.dtype),
                                   anchor_points * stride_tensor, labels, gt_bboxes, valid)
        score_sum = assignment.scores.sum().clamp(min=1)
        # the positives' indices once, for every term (detection, masks, keypoints): each boolean-mask index would
        # wait for the device again
        fg = assignment.fg_mask.nonzero(as_tuple=True)
        return V8State(pred_distri, pred_scores, pred_bboxes, anchor_points, stride_tensor, whwh, assignment,
                       score_sum, gt_row, fg)

    def detection_terms(self, s):
        """Weighted (box, cls, dfl) terms of one forward pass. Without positives the box and DFL terms are sums over
        none: zero, with a zero gradient for the box branch, which keeps it in the graph (DDP waits for every
        parameter's gradient)."""
        a = s.assignment
        lcls = F.binary_cross_entropy_with_logits(s.pred_scores, a.scores.to(s.pred_scores.dtype),
                                                  reduction="none").sum() / s.score_sum
        b, i = s.fg
        stride = s.stride_tensor[i]
        target_bboxes = a.bboxes[b, i] / stride
        weight = a.scores.sum(-1)[b, i]
        iou = bbox_iou(s.pred_bboxes[b, i], target_bboxes, xywh=False, CIoU=True).squeeze(-1)
        lbox = ((1.0 - iou) * weight).sum() / s.score_sum
        ltrb = bbox2dist(s.anchor_points[i], target_bboxes, self.reg_max - 1)
        dfl = distribution_focal_loss(s.pred_distri[b, i].reshape(-1, self.reg_max), ltrb.reshape(-1))
        ldfl = (dfl.view(-1, 4).mean(1) * weight).sum() / s.score_sum
        return lbox * self.box_gain, lcls * self.cls_gain, ldfl * self.dfl_gain
