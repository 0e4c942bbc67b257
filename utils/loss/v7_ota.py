"""YOLOv7 OTA criterion: v5 candidates re-assigned per image by a dynamic-k, cost-based (SimOTA-style) matching."""

import torch

from utils.loss.v5 import AnchorTargets, V5DetectionLoss, decode_anchor_box
from utils.ops import box_iou, xywh2xyxy


def dynamic_k_match(iou, cost, n_top=10):
    """Dynamic-k matching of T targets to C candidates.

    iou, cost: (T, C). Each target takes k = max(1, floor(sum of its n_top largest IoUs)) lowest-cost candidates;
    a candidate claimed by several targets goes to the target of lowest cost for it. Returns (C,) long: the
    matched target of each candidate, -1 where none.
    """
    t, c = iou.shape
    if t == 0 or c == 0:
        return torch.full((c,), -1, dtype=torch.long, device=iou.device)
    k = iou.topk(min(n_top, c), dim=1).values.sum(1).int().clamp(min=1)
    idx = cost.topk(int(k.max()), dim=1, largest=False).indices
    take = torch.arange(idx.shape[1], device=idx.device)[None] < k[:, None]
    claims = torch.zeros_like(cost, dtype=torch.bool).scatter_(1, idx, take)
    n_claims = claims.sum(0)
    # as official, a contested candidate goes to the cheapest target overall, which is almost always a claimant
    owner = torch.where(n_claims > 1, cost.argmin(0), claims.to(torch.uint8).argmax(0))
    return torch.where(n_claims > 0, owner, torch.full_like(owner, -1))


def _class_cost(prob, labels, eps=1e-12):
    """Summed BCE between candidate probabilities (C, nc) and each target's one-hot class: (T, C).

    Written with logs rather than F.binary_cross_entropy, which refuses to run under CUDA autocast.
    """
    log_p, log_q = prob.clamp_min(eps).log(), (1 - prob).clamp_min(eps).log()
    return -log_q.sum(1)[None] - (log_p - log_q)[:, labels].T


class OTADetectionLoss(V5DetectionLoss):
    """v5 loss terms (CIoU box, IoU-target objectness, BCE class) over OTA-assigned positives.

    Works on any head with the v5 train layout, including v7 `IDetect`. Candidates are the v5 anchor/neighbour
    cells of every target; per image, each candidate's cost against each target is its class BCE (probability
    sqrt(sigmoid(cls) * sigmoid(obj)), as official) plus 3 * -log IoU of its decoded box.
    """

    hyp_file = "hyp.v7.yaml"  # YOLOv7's (yolov7-tiny's own file is named by its YAML, and found by its layers)

    def assign(self, preds, targets):
        candidates = super().assign(preds, targets)
        if not len(targets):
            return candidates
        device = targets.device
        strides = self.head.stride.detach().to(device=device, dtype=torch.float32)
        boxes, probs = self._candidate_boxes(preds, candidates, strides)
        ny, nx = preds[0].shape[2:4]
        img_wh = torch.tensor([nx, ny, nx, ny], device=device, dtype=torch.float32) * strides[0]
        txyxy = xywh2xyxy(targets[:, 2:6].float() * img_wh)
        cand_b = torch.cat([c.b for c in candidates])
        matched = torch.full_like(cand_b, -1)
        for bi in cand_b.unique():
            ci = (cand_b == bi).nonzero().squeeze(1)
            ti = (targets[:, 0].long() == bi).nonzero().squeeze(1)
            iou = box_iou(txyxy[ti], boxes[ci])
            cost = _class_cost(probs[ci], targets[ti, 1].long()) - 3.0 * torch.log(iou + 1e-8)
            m = dynamic_k_match(iou, cost)
            keep = m >= 0
            matched[ci[keep]] = ti[m[keep]]
        return self._select(preds, candidates, matched, targets)

    @torch.no_grad()
    def _candidate_boxes(self, preds, candidates, strides):
        """Decoded xyxy pixel boxes (C, 4) and class probabilities (C, nc) of all candidates, levels concatenated."""
        boxes, probs = [], []
        for pi, t, s in zip(preds, candidates, strides):
            ps = pi[t.b, t.a, t.gj, t.gi].detach().float()
            xywh = decode_anchor_box(ps, t.anchors)
            xywh[:, :2] += torch.stack((t.gi, t.gj), 1)
            boxes.append(xywh2xyxy(xywh * s))
            probs.append((ps[:, 5 : 5 + self.nc].sigmoid() * ps[:, 4:5].sigmoid()).sqrt())
        return torch.cat(boxes), torch.cat(probs)

    @staticmethod
    def _select(preds, candidates, matched, targets):
        """Keep the matched candidates, with box and class taken from the target each was matched to."""
        out, start = [], 0
        for pi, t in zip(preds, candidates):
            m = matched[start : start + len(t.b)]
            start += len(t.b)
            keep = m >= 0
            row = m[keep]
            ny, nx = pi.shape[2:4]
            size = torch.tensor([nx, ny], device=targets.device, dtype=torch.float32)
            gi, gj = t.gi[keep], t.gj[keep]
            gxy = targets[row, 2:4].float() * size - torch.stack((gi, gj), 1)
            tbox = torch.cat((gxy, targets[row, 4:6].float() * size), 1)
            out.append(AnchorTargets(t.b[keep], t.a[keep], gj, gi, tbox, t.anchors[keep],
                                     targets[row, 1].long(), row))
        return out
