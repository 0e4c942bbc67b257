"""Instance-segmentation criteria: the v5 and v8 detection losses plus a prototype-mask BCE term."""

import torch
import torch.nn.functional as F

from losses.common import per_image_index
from losses.v5 import V5DetectionLoss, scale_xy
from losses.v8 import V8DetectionLoss
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

    name = "v5seg"
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
        """Sum over levels and images of the mean mask loss of the image's positives at that level. The positives of
        each level are grouped by image with a stable sort (so each group keeps its order); the groups' sizes, every
        level's at once, are the one value read back to the host here."""
        bs, nm, mh, mw = proto.shape
        # Zero-weight term: Proto gets a (zero) gradient even when no image has a positive, for DDP.
        total = (proto * 0).sum()
        if not len(targets):
            return total
        masks = prepare_masks(masks, (mh, mw))
        instance = per_image_index(targets.image, bs)[0] + 1
        images = torch.arange(bs, device=proto.device)[:, None]
        counts = torch.stack([(t.b[None] == images).sum(1) for t in assigned]).tolist()
        for pi, t, per_image in zip(feats, assigned, counts):
            order = torch.argsort(t.b, stable=True)
            coeffs = pi[t.b[order], t.a[order], t.gj[order], t.gi[order]][:, 5 + self.nc :]
            row = t.row[order]
            xywhn = targets.boxes.convert("cxcywh").normalize().data[row].float()
            area = xywhn[:, 2:].prod(1)
            mxyxy = xywh2xyxy(torch.cat((scale_xy(xywhn[:, :2], mw, mh), scale_xy(xywhn[:, 2:], mw, mh)), 1))
            start = 0
            for bi, n in enumerate(per_image):
                j = slice(start, start + n)
                start += n
                if n:
                    gt = _gt_masks(masks, overlap, bi, instance[row[j]], row[j])
                    total = total + mask_loss(gt, coeffs[j], proto[bi], mxyxy[j], area[j])
        return total


class V8SegmentationLoss(V8DetectionLoss):
    """v8 detection loss + mask BCE for the task-aligned positives, over `Segment` train output
    `(x_list, mc (B, nm, A), proto (B, nm, h, w))`; the mask term is summed over images and scaled by box / B."""

    name = "v8seg"
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
        b, i = state.fg
        if not len(b):  # a shape, known on the host
            return total
        masks = prepare_masks(masks, (mh, mw))
        gt_idx = state.assignment.gt_idx[b, i]
        rows = state.gt_row[b, gt_idx]
        coeffs = mc[b, :, i]
        xyxyn = state.assignment.bboxes[b, i] / state.whwh
        area = (xyxyn[:, 2:] - xyxyn[:, :2]).prod(1)
        mxyxy = torch.stack((xyxyn[:, 0] * mw, xyxyn[:, 1] * mh, xyxyn[:, 2] * mw, xyxyn[:, 3] * mh), 1)
        # one image at a time (a batch's logits would hold every positive's full mask at once); its positives are one
        # run of `fg`, image-major: the counts per image are the one value read back to the host here
        start = 0
        for k, n in enumerate(state.assignment.fg_mask.sum(1).tolist()):
            j = slice(start, start + n)
            start += n
            if n:
                gt = _gt_masks(masks, overlap, k, gt_idx[j] + 1, rows[j])
                total = total + mask_loss(gt, coeffs[j], proto[k], mxyxy[j], area[j])
        return total
