"""Oriented-box criterion (Ultralytics' v8OBBLoss): the v8 detection loss on xywhr boxes over the `OBB` head's train
output `(x_list, angle (B, ne, A))`, the angle already in radians.

Assignment is task-aligned with probabilistic IoU (an anchor may take a GT when its centre lies inside the rotated
box); the box term is 1 - probiou, DFL learns the distances along the box's own axes, and the angle term is
sin^2(2 (pred - target)) weighted down for near-square boxes, whose angle hardly matters.
"""

import math

import torch
import torch.nn.functional as F

from losses.common import pad_targets
from losses.tal import TaskAlignedAssigner
from losses.v8 import V8DetectionLoss, V8State, distribution_focal_loss
from utils.rotated import dist_to_rbox, probiou, rbox_to_dist, xywhr_to_corners

MIN_SIDE = 2.0  # px: labels with a shorter side are left out of the loss, as Ultralytics does (unstable angles)
FLOOR = 0.01  # grid units^2 added to the box variances in the box term (Ultralytics 8.4), bounding tiny boxes' pull


def angle_loss(pred, target, lam=3.0):
    """(n,) angle term of predicted and target xywhr boxes: sin^2(2 delta), delta wrapped to [-pi/2, pi/2) (a box
    turned by pi is the same box), times exp(-ln(w/h)^2 / lam^2), so a square's angle counts least."""
    delta = pred[:, 4] - target[:, 4]
    delta = delta - torch.round(delta / math.pi) * math.pi
    aspect = torch.log((target[:, 2] + 1e-9) / (target[:, 3] + 1e-9))
    return torch.exp(-(aspect**2) / lam**2) * torch.sin(2 * delta) ** 2


class RotatedTaskAlignedAssigner(TaskAlignedAssigner):
    """Task-aligned assignment of xywhr boxes: probiou as the overlap, candidates inside the rotated GT (a side
    shorter than `min_side` widened to it, about the centre)."""

    def candidates(self, anc_points, gt_bboxes):
        boxes = gt_bboxes.clone()
        boxes[..., 2:4] = boxes[..., 2:4].clamp(min=self.min_side)
        a, b, _, d = xywhr_to_corners(boxes).unbind(-2)  # (B, M, 2) each: one corner and its two neighbours
        ab, ad = (b - a)[..., None, :], (d - a)[..., None, :]
        ap = anc_points - a[..., None, :]  # (B, M, A, 2)
        along_ab, along_ad = (ap * ab).sum(-1), (ap * ad).sum(-1)
        return ((along_ab >= 0) & (along_ab <= (ab * ab).sum(-1)) & (along_ad >= 0)
                & (along_ad <= (ad * ad).sum(-1)))

    @staticmethod
    def iou(gt_bboxes, pd_bboxes):
        return probiou(gt_bboxes, pd_bboxes)


class V8OBBLoss(V8DetectionLoss):
    """v8 terms on oriented boxes plus the angle term (gain `angle`). Labels: `batch['targets']`, whose boxes are
    cxcywhr (data/targets.py: w, h the box's own sides, the angle in radians)."""

    name = "v8obb"
    loss_names = ("box", "cls", "dfl", "angle")
    hyp_keys = {**V8DetectionLoss.hyp_keys, "angle": "[0, inf)"}
    hyp_defaults = {"angle": 1.0}  # Ultralytics' default; the v8 hyp files do not name it

    def __init__(self, model, hyp, imgsz=640):
        super().__init__(model, hyp, imgsz)
        self.angle_gain = hyp.get("angle", self.hyp_defaults["angle"])
        self.assigner = RotatedTaskAlignedAssigner(topk=10, num_classes=self.nc, alpha=0.5, beta=6.0,
                                                   min_side=self.assigner.min_side)

    def __call__(self, preds, batch):
        feats, angle = preds
        state = self.assign_rotated(feats, angle, batch["targets"])
        parts = self.rotated_terms(state, angle)
        return sum(parts) * angle.shape[0], torch.stack(parts).detach()

    def assign_rotated(self, feats, angle, targets):
        """As `V8DetectionLoss.assign`, with xywhr boxes (xywh in grid units, the angle in radians)."""
        bs = feats[0].shape[0]
        x = torch.cat([f.view(bs, self.no, -1) for f in feats], 2).permute(0, 2, 1).contiguous()
        pred_distri, pred_scores = x.split((4 * self.reg_max, self.nc), 2)
        anchor_points, stride_tensor, whwh = self.grid(feats)
        # (B, M, 5) xywhr in pixels, zeros for padding
        labels, gt, valid, gt_row = pad_targets(targets, bs, targets.boxes.pixels().data)
        valid = valid & (gt[..., 2:4] >= MIN_SIDE).all(-1, keepdim=True)
        proj = torch.arange(self.reg_max, device=x.device, dtype=x.dtype)
        dist = pred_distri.view(bs, -1, 4, self.reg_max).softmax(3).matmul(proj)
        pred_angle = angle.permute(0, 2, 1)
        pred_bboxes = torch.cat((dist_to_rbox(dist, pred_angle, anchor_points), pred_angle), -1)
        for_assigner = pred_bboxes.detach().clone()
        for_assigner[..., :4] *= stride_tensor
        assignment = self.assigner(pred_scores.detach().sigmoid(), for_assigner.to(gt.dtype),
                                   anchor_points * stride_tensor, labels, gt, valid)
        fg = assignment.fg_mask.nonzero(as_tuple=True)
        return V8State(pred_distri, pred_scores, pred_bboxes, anchor_points, stride_tensor, whwh, assignment,
                       assignment.scores.sum().clamp(min=1), gt_row, fg)

    def rotated_terms(self, s, angle):
        """Weighted (box, cls, dfl, angle) terms; without positives each sum is over none, and the angle branch is
        kept in the graph by a zero-weight term (DDP waits for every parameter's gradient)."""
        a = s.assignment
        lcls = F.binary_cross_entropy_with_logits(s.pred_scores, a.scores.to(s.pred_scores.dtype),
                                                  reduction="none").sum() / s.score_sum
        b, i = s.fg
        target = a.bboxes[b, i].clone()
        target[:, :4] /= s.stride_tensor[i]
        pred = s.pred_bboxes[b, i]
        weight = a.scores.sum(-1)[b, i]
        lbox = ((1.0 - probiou(pred, target, floor=FLOOR)) * weight).sum() / s.score_sum
        ltrb = rbox_to_dist(target[:, :4], target[:, 4:], s.anchor_points[i], self.reg_max - 1)
        dfl = distribution_focal_loss(s.pred_distri[b, i].reshape(-1, self.reg_max), ltrb.reshape(-1))
        ldfl = (dfl.view(-1, 4).mean(1) * weight).sum() / s.score_sum
        langle = (angle_loss(pred, target) * weight).sum() / s.score_sum + (angle * 0).sum()
        return (lbox * self.box_gain, lcls * self.cls_gain, ldfl * self.dfl_gain, langle * self.angle_gain)
