"""YOLOv8 pose criterion: the v8 detection loss plus an OKS-shaped keypoint location term and a keypoint visibility
BCE, over the `Pose` head's train output `(x_list, kpt (B, K * ndim, A))`."""

import torch
import torch.nn.functional as F

from evaluation.metrics import keypoint_sigmas
from losses.v8 import V8DetectionLoss


def keypoint_location_loss(pred, gt, visible, area, sigmas):
    """1 - exp(-e) per labelled keypoint, where e = d^2 / (2 (2 sigma)^2 area) is COCO's OKS exponent; each instance's
    sum is scaled by K / (its labelled keypoints), so an instance with few labelled keypoints weighs as much as one with
    all, and the result is the mean over instances and keypoints (as official).

    pred, gt (n, K, >= 2) in one unit (grid cells), visible (n, K) bool, area (n, 1) box area in that unit squared."""
    d = (pred[..., 0] - gt[..., 0]).pow(2) + (pred[..., 1] - gt[..., 1]).pow(2)
    factor = visible.shape[1] / (visible.sum(1) + 1e-9)
    e = d / ((2 * sigmas).pow(2) * (area + 1e-9) * 2)
    return (factor.view(-1, 1) * (1 - torch.exp(-e)) * visible).mean()


class V8PoseLoss(V8DetectionLoss):
    """v8 detection terms + pose (keypoint location, gain `pose`) and kobj (visibility BCE, gain `kobj`, only for
    ndim 3) over the task-aligned positives. Labels come as the targets' `keypoints` (N, K, 3): x, y normalised to the
    image, visibility (0: not labelled, or outside the image after augmentation)."""

    name = "v8pose"
    loss_names = ("box", "pose", "kobj", "cls", "dfl")
    hyp_keys = {**V8DetectionLoss.hyp_keys, "pose": "[0, inf)", "kobj": "[0, inf)"}
    hyp_defaults = {}

    def __init__(self, model, hyp, imgsz=640):
        super().__init__(model, hyp, imgsz)
        self.kpt_shape = tuple(self.head.kpt_shape)
        self.sigmas = torch.as_tensor(keypoint_sigmas(self.kpt_shape[0]), dtype=torch.float32)
        self.pose_gain, self.kobj_gain = hyp["pose"], hyp["kobj"]

    def __call__(self, preds, batch):
        feats, kpt = preds
        bs = kpt.shape[0]
        targets = batch["targets"]
        state = self.assign(feats, targets)
        lbox, lcls, ldfl = self.detection_terms(state)
        lpose, lkobj = self.keypoint_terms(state, kpt, targets.keypoints)
        parts = (lbox, lpose * self.pose_gain, lkobj * self.kobj_gain, lcls, ldfl)
        return sum(parts) * bs, torch.stack(parts).detach()

    def decode_keypoints(self, anchor_points, kpt):
        """Raw (B, K * ndim, A) -> (B, A, K, ndim) with x, y in grid units (the head's decode before the stride)."""
        b, _, a = kpt.shape
        y = kpt.permute(0, 2, 1).reshape(b, a, *self.kpt_shape)
        xy = y[..., :2] * 2.0 + (anchor_points - 0.5)[None, :, None, :]
        return torch.cat((xy, y[..., 2:]), -1)

    def keypoint_terms(self, s, kpt, keypoints):
        """(location, visibility) losses, unweighted; zero-weight terms keep the keypoint branch in the graph (DDP)."""
        zero = (kpt * 0).sum()
        b, i = s.fg
        if not len(b):  # a shape, known on the host; the means below would be over nothing
            return zero, zero.detach().clone()
        if self.sigmas.device != kpt.device:  # moved once: a copy from the host each step would wait for the device
            self.sigmas = self.sigmas.to(kpt.device)
        pred = self.decode_keypoints(s.anchor_points, kpt)[b, i]
        rows = s.gt_row.gather(1, s.assignment.gt_idx)[b, i]
        stride = s.stride_tensor[i]  # (n, 1): each positive's level
        gt = keypoints[rows].to(pred.dtype).clone()
        gt[..., :2] *= s.whwh[:2] / stride.view(-1, 1, 1)  # normalised -> grid units
        boxes = s.assignment.bboxes[b, i] / stride
        area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).unsqueeze(1)
        visible = gt[..., 2] != 0
        lpose = keypoint_location_loss(pred, gt, visible, area, self.sigmas) + zero
        if self.kpt_shape[1] == 3:
            lkobj = F.binary_cross_entropy_with_logits(pred[..., 2], visible.to(pred.dtype))
        else:
            lkobj = zero.detach().clone()
        return lpose, lkobj
