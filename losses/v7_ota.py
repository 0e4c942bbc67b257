"""YOLOv7 OTA criterion: v5 candidates re-assigned per image by a dynamic-k, cost-based (SimOTA-style) matching."""

import math

import torch

from losses.v5 import NEIGHBOUR_BIAS, AnchorTargets, V5DetectionLoss, decode_anchor_box, scale_xy
from utils.ops import box_iou, xywh2xyxy


def dynamic_k_match(iou, cost, n_top=10):
    """Dynamic-k matching of T targets to C candidates.

    iou, cost: (T, C). Each target takes k = max(1, floor(sum of its n_top largest IoUs)) lowest-cost candidates;
    a candidate claimed by several targets goes to the target of lowest cost for it. A pair of infinite cost is never
    matched (a target and a candidate of different images, when one matrix holds a whole batch). Returns (C,) long:
    the matched target of each candidate, -1 where none.
    """
    t, c = iou.shape
    if t == 0 or c == 0:
        return torch.full((c,), -1, dtype=torch.long, device=iou.device)
    k = iou.topk(min(n_top, c), dim=1).values.sum(1).int().clamp(min=1)
    # k <= n_top (a sum of n_top IoUs, each <= 1): the n_top cheapest, so that no k is read back from the device
    cheapest = cost.topk(min(n_top, c), dim=1, largest=False)
    take = (torch.arange(cheapest.indices.shape[1], device=iou.device)[None] < k[:, None]) & cheapest.values.isfinite()
    claims = torch.zeros_like(cost, dtype=torch.bool).scatter_(1, cheapest.indices, take)
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


# the most (target, candidate) pairs matched at once: the matrices of a crowded batch of 64 (mosaics of about 30
# targets, some 10 candidates each) would hold 36 M pairs, each in about 8 tensors
MAX_PAIRS = 2**24


def image_blocks(target_b, cand_b, batch_size, max_pairs=None):
    """[(target indices, candidate indices)], (n,) long each, of blocks of whole images whose targets x candidates
    matrix has at most `max_pairs` (MAX_PAIRS) pairs, or one image's where that alone has more. A batch within the
    limit is one block, found from the shapes alone; only a larger one reads its images' counts from the device."""
    max_pairs = MAX_PAIRS if max_pairs is None else max_pairs
    device = cand_b.device
    t, c = len(target_b), len(cand_b)
    if t * c <= max_pairs:
        return [(torch.arange(t, device=device), torch.arange(c, device=device))]
    images = torch.arange(batch_size, device=device)[:, None]
    n_t, n_c = torch.stack(((target_b[None] == images).sum(1), (cand_b[None] == images).sum(1))).tolist()
    by_t, by_c = torch.argsort(target_b, stable=True), torch.argsort(cand_b, stable=True)
    bounds, t0, c0, t1, c1 = [], 0, 0, 0, 0  # the block [t0, t1) x [c0, c1) in image order
    for nt, nc in zip(n_t, n_c):
        if t1 > t0 and (t1 + nt - t0) * (c1 + nc - c0) > max_pairs:  # the block ends before this image
            bounds.append((t0, t1, c0, c1))
            t0, c0 = t1, c1
        t1, c1 = t1 + nt, c1 + nc
    bounds.append((t0, t1, c0, c1))
    # an image's candidates come from its targets: a block without candidates has nothing to match
    return [(by_t[a:b], by_c[c:d]) for a, b, c, d in bounds if d > c]


class OTADetectionLoss(V5DetectionLoss):
    """v5 loss terms (CIoU box, IoU-target objectness, BCE class) over OTA-assigned positives.

    Works on any head with the v5 train layout, including v7 `IDetect`. Candidates are the v5 anchor/neighbour
    cells of every target; per image, each candidate's cost against each target is its class BCE (probability
    sqrt(sigmoid(cls) * sigmoid(obj)), as official) plus 3 * -log IoU of its decoded box.
    """

    name = "ota"
    trains = ("v5", "ota")
    hyp_file = "hyp.v7.yaml"  # YOLOv7's (yolov7-tiny's own file is named by its YAML, and found by its layers)
    n_top = 10  # a target's dynamic k: the sum of its n_top best candidate IoUs

    def assign(self, preds, targets, g=NEIGHBOUR_BIAS):
        """The v5 candidates (neighbour bias g) matched to the targets of their image, by the costs of the predictions
        `preds` at them; many images in one (targets x candidates) matrix whose pairs across images cost infinity: a
        loop over images would read each image's counts back from the device. A batch whose matrix would exceed
        MAX_PAIRS is matched in blocks of whole images (`image_blocks`)."""
        candidates = super().assign(preds, targets, g)
        if not len(targets):
            return candidates
        boxes, probs = self._candidate_boxes(preds, candidates)
        txyxy = targets.boxes.pixels().convert("xyxy").data
        cand_b = torch.cat([c.b for c in candidates])
        target_b = targets.image
        matched = torch.full_like(cand_b, -1)
        for ti, ci in image_blocks(target_b, cand_b, preds[0].shape[0]):
            apart = target_b[ti, None] != cand_b[None, ci]
            iou = box_iou(txyxy[ti], boxes[ci]).masked_fill(apart, 0.0)
            cost = _class_cost(probs[ci], targets.cls[ti].long()) - 3.0 * torch.log(iou + 1e-8)
            m = dynamic_k_match(iou, cost.masked_fill(apart, math.inf), self.n_top)
            matched[ci] = torch.where(m >= 0, ti[m.clamp(min=0)], m)
        return self._select(preds, candidates, matched, targets)

    @torch.no_grad()
    def _candidate_boxes(self, preds, candidates):
        """Decoded xyxy pixel boxes (C, 4) and class probabilities (C, nc) of all candidates, levels concatenated."""
        boxes, probs = [], []
        for pi, t, s in zip(preds, candidates, self.strides):
            ps = pi[t.b, t.a, t.gj, t.gi].detach().float()
            xywh = decode_anchor_box(ps, t.anchors)
            xywh[:, :2] += torch.stack((t.gi, t.gj), 1)
            boxes.append(xywh2xyxy(xywh * s))
            probs.append((ps[:, 5 : 5 + self.nc].sigmoid() * ps[:, 4:5].sigmoid()).sqrt())
        return torch.cat(boxes), torch.cat(probs)

    @staticmethod
    def _select(preds, candidates, matched, targets):
        """Keep the matched candidates, with box and class taken from the target each was matched to. The kept
        candidates are found by one stable sort (kept first, in order, so level by level) and the levels' kept
        counts, the one value read back here."""
        keep = matched >= 0
        sizes = [len(t.b) for t in candidates]
        kept = torch.stack([k.sum() for k in keep.split(sizes)]).tolist()
        order = torch.argsort((~keep).to(torch.uint8), stable=True)
        out, start, offset = [], 0, 0
        for pi, t, size, n in zip(preds, candidates, sizes, kept):
            pick = order[start : start + n]
            row = matched[pick]
            pick = pick - offset
            start, offset = start + n, offset + size
            ny, nx = pi.shape[2:4]
            gi, gj = t.gi[pick], t.gj[pick]
            xywhn = targets.boxes.convert("cxcywh").normalize().data[row].float()
            gxy = scale_xy(xywhn[:, :2], nx, ny) - torch.stack((gi, gj), 1)
            tbox = torch.cat((gxy, scale_xy(xywhn[:, 2:], nx, ny)), 1)
            out.append(AnchorTargets(t.b[pick], t.a[pick], gj, gi, tbox, t.anchors[pick], targets.cls[row].long(), row))
        return out


class AuxOTADetectionLoss(OTADetectionLoss):
    """YOLOv7 P6 criterion (`IAuxDetect`): the OTA loss of the lead head plus 0.25 x that of the auxiliary head.

    Lead-guided assignment, as official: both heads' positives are chosen by the lead head's predictions, the lead's
    among the v5 candidates (neighbour bias 0.5), the auxiliary's among the wider ones of bias 1 (all four neighbour
    cells), each with dynamic k from a target's 20 best IoUs. The auxiliary's box, objectness and class terms are
    weighted 0.25 and summed into the lead's. Given the lead maps alone (validation: the head's eval output), it is
    the lead's loss.
    """

    name = "aux_ota"
    hyp_file = "hyp.v7-p6.yaml"
    n_top = 20
    aux_bias, aux_weight = 1.0, 0.25

    def __call__(self, preds, batch):
        lead, aux = preds[: self.nl], preds[self.nl :]
        targets = batch["targets"]
        terms = self.detection_terms(lead, self.assign(lead, targets))
        if aux:
            aux_terms = self.detection_terms(aux, self.assign(lead, targets, self.aux_bias))
            terms = [t + self.aux_weight * a for t, a in zip(terms, aux_terms)]
        lbox, lobj, lcls = terms
        return (lbox + lobj + lcls) * lead[0].shape[0], torch.stack(terms).detach()
