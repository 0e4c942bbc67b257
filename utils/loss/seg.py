"""Instance-segmentation criteria: the v5 and v8 detection losses plus a prototype-mask BCE term."""

import torch
import torch.nn.functional as F

from utils.loss.common import per_image_index
from utils.loss.v5 import V5DetectionLoss
from utils.loss.v8 import V8DetectionLoss
from utils.ops import crop_mask, xywh2xyxy


def mask_loss(gt_masks, coeffs, proto, xyxy, area):
    """Mask term of one image.

    gt_masks (n, h, w) in {0, 1}; coeffs (n, nm); proto (nm, h, w); xyxy (n, 4) boxes in mask pixels; area (n,) box
    areas as a fraction of the image. The per-pixel BCE of the logits coeffs @ proto is zeroed outside the box,
    averaged over the whole mask and divided by the box's area fraction (so it is about the mean BCE inside the
    box, whatever the object size); the result is the mean over the n instances.
    """
    nm, h, w = proto.shape
    logits = (coeffs @ proto.reshape(nm, -1)).view(-1, h, w)
    loss = F.binary_cross_entropy_with_logits(logits, gt_masks.to(logits.dtype), reduction="none")
    return (crop_mask(loss, xyxy).mean(dim=(1, 2)) / area.clamp_min(1e-9)).mean()


def prepare_masks(masks, size):
    """GT masks as float at the proto size `(h, w)`: the batch's overlap maps (B, h', w') holding 1-based instance
    indices in targets order, or its per-target masks (N, h', w'), as its `overlap` says."""
    masks = masks.float()
    if tuple(masks.shape[-2:]) != tuple(size):
        masks = F.interpolate(masks[None], size, mode="nearest")[0]
    return masks


def _gt_masks(masks, overlap, image, instance, rows):
    """Binary GT masks of the given targets of one image (1-based `instance` index, batch `rows`)."""
    if overlap:
        return (masks[image][None] == instance.view(-1, 1, 1).to(masks.dtype)).to(masks.dtype)
    return masks[rows]


class V5SegmentationLoss(V5DetectionLoss):
    """v5 detection loss + mask BCE for every v5 positive, over `Segment` train output `(x_list, proto)`.

    Each x has 5 + nc + nm columns, the last nm being mask coefficients. The mask term is summed over images
    (mean over an image's positives per level) and scaled by the (scaled) box gain / B, as official.
    """

    loss_names = ("box", "seg", "obj", "cls")

    def __call__(self, preds, batch):
        feats, proto = preds
        targets = batch["targets"]
        bs = proto.shape[0]
        assigned = self.assign(feats, targets)
        lbox, lobj, lcls = self.detection_terms(feats, assigned)
        lseg = self.mask_terms(feats, proto, assigned, targets, batch["masks"], batch["overlap"]) * (self.box_gain / bs)
        return (lbox + lseg + lobj + lcls) * bs, torch.stack((lbox, lseg, lobj, lcls)).detach()

    def mask_terms(self, feats, proto, assigned, targets, masks, overlap):
        bs, nm, mh, mw = proto.shape
        # Zero-weight term: Proto gets a (zero) gradient even when no image has a positive, for DDP.
        total = (proto * 0).sum()
        if not len(targets):
            return total
        masks = prepare_masks(masks, (mh, mw))
        instance = per_image_index(targets[:, 0], bs)[0] + 1
        scale = torch.tensor([mw, mh, mw, mh], device=proto.device, dtype=torch.float32)
        for pi, t in zip(feats, assigned):
            if not len(t.b):
                continue
            coeffs = pi[t.b, t.a, t.gj, t.gi][:, 5 + self.nc :]
            xywhn = targets[t.row, 2:6].float()
            area = xywhn[:, 2:].prod(1)
            mxyxy = xywh2xyxy(xywhn * scale)
            for bi in t.b.unique():
                j = t.b == bi
                gt = _gt_masks(masks, overlap, bi, instance[t.row[j]], t.row[j])
                total = total + mask_loss(gt, coeffs[j], proto[bi], mxyxy[j], area[j])
        return total


class V8SegmentationLoss(V8DetectionLoss):
    """v8 detection loss + mask BCE for the task-aligned positives, over `Segment` train output
    `(x_list, mc (B, nm, A), proto (B, nm, h, w))`; the mask term is summed over images and scaled by box / B."""

    loss_names = ("box", "seg", "cls", "dfl")

    def __call__(self, preds, batch):
        feats, mc, proto = preds
        bs = proto.shape[0]
        state = self.assign(feats, batch["targets"])
        lbox, lcls, ldfl = self.detection_terms(state)
        masks, overlap = batch["masks"], batch["overlap"]
        lseg = self.mask_terms(state, mc, proto, batch["targets"], masks, overlap) * (self.box_gain / bs)
        return (lbox + lseg + lcls + ldfl) * bs, torch.stack((lbox, lseg, lcls, ldfl)).detach()

    def mask_terms(self, state, mc, proto, targets, masks, overlap):
        bs, nm, mh, mw = proto.shape
        # Zero-weight terms: Proto and the coefficient branch get a gradient even without positives, for DDP.
        total = (proto * 0).sum() + (mc * 0).sum()
        fg = state.assignment.fg_mask
        if not fg.any():
            return total
        masks = prepare_masks(masks, (mh, mw))
        coeffs = mc.permute(0, 2, 1)
        boxes_n = state.assignment.bboxes / state.imgsz[[1, 0, 1, 0]]
        scale = torch.tensor([mw, mh, mw, mh], device=proto.device, dtype=torch.float32)
        for i in range(bs):
            f = fg[i]
            if not f.any():
                continue
            gt_idx = state.assignment.gt_idx[i][f]
            gt = _gt_masks(masks, overlap, i, gt_idx + 1, state.gt_row[i, gt_idx])
            xyxyn = boxes_n[i][f]
            area = (xyxyn[:, 2:] - xyxyn[:, :2]).prod(1)
            total = total + mask_loss(gt, coeffs[i][f], proto[i], xyxyn * scale, area)
        return total
