"""YOLOv5 anchor-based detection criterion: anchor-ratio matching with neighbour cells, CIoU, objectness, BCE."""

from typing import NamedTuple

import torch

from losses.common import bce, detection_head, level_balance, smooth_labels
from utils.ops import bbox_iou

# Grid offsets (in units of the bias g) to the centre cell and its left, upper, right and lower neighbours.
_NEIGHBOURS = ((0, 0), (1, 0), (0, 1), (-1, 0), (0, -1))
# g: how near (in cells) a target's centre must be to a cell's edge for the neighbour across it to be a candidate;
# YOLOv5's 0.5 takes the two nearest neighbours, YOLOv7's auxiliary head's 1.0 all four
NEIGHBOUR_BIAS = 0.5


class AnchorTargets(NamedTuple):
    """The positives of one level, one row per (target, anchor, cell) triple."""

    b: torch.Tensor  # (n,) image index
    a: torch.Tensor  # (n,) anchor index
    gj: torch.Tensor  # (n,) cell row
    gi: torch.Tensor  # (n,) cell column
    tbox: torch.Tensor  # (n, 4) target xywh in grid units, xy relative to the cell corner (gi, gj)
    anchors: torch.Tensor  # (n, 2) anchor wh in grid units
    tcls: torch.Tensor  # (n,) class
    row: torch.Tensor  # (n,) row of the batch `targets` the positive was made from


def decode_anchor_box(ps, anchors):
    """Raw (n, >=4) predictions at their cells -> xywh in grid units relative to the cell corner (v5 decoding)."""
    pxy = ps[:, :2].sigmoid() * 2 - 0.5
    pwh = (ps[:, 2:4].sigmoid() * 2) ** 2 * anchors
    return torch.cat((pxy, pwh), 1)


def scale_xy(xy, sx, sy):
    """(n, 2) x, y times the host numbers (sx, sy), each column by its own: a tensor of them would be a copy to the
    device, which waits for it."""
    return torch.stack((xy[:, 0] * sx, xy[:, 1] * sy), 1)


def neighbour_offsets(kind, g=NEIGHBOUR_BIAS):
    """(n, 2) offsets, in cells, of `_NEIGHBOURS[kind]` times g for kinds (n,) long, computed on the device (a table
    from the host would be a copy to it)."""
    dx = (kind == 1).float() - (kind == 3).float()
    dy = (kind == 2).float() - (kind == 4).float()
    return torch.stack((dx, dy), 1) * g


def match_anchors(level_shapes, anchors, targets, anchor_t, g=NEIGHBOUR_BIAS):
    """The v5 assignment rule over all levels.

    level_shapes: (ny, nx) per level; anchors (nl, na, 2) grid units; targets a batch's `Targets`. A target is matched
    to every anchor whose width and height ratios to it are all within [1/anchor_t, anchor_t], at its centre cell and
    at the neighbour cells whose edge its centre is nearer than g cells to (skipping the border): with g = 0.5 the two
    nearest, so one target yields up to 3 cells per anchor; with g = 1 (YOLOv7's auxiliary head) all four, up to 5.
    Returns one `AnchorTargets` per level, its rows ordered by neighbour kind, then anchor, then target.

    Every level's (kind, anchor, target) triples are found in one `nonzero` and split by the levels' counts: those
    two are the values read back from the device (one `nonzero` per level and step would wait for it twice each).
    """
    xywhn = targets.boxes.convert("cxcywh").normalize().data.float()
    xy, wh = [], []
    chosen = []  # per level (5, na, N): the target's cell or neighbour `kind` is a positive of anchor a
    for (ny, nx), anc in zip(level_shapes, anchors):
        gwh = scale_xy(xywhn[:, 2:4], nx, ny)
        r = gwh[None] / anc[:, None]
        fits = torch.max(r, 1 / r).amax(2) < anchor_t  # (na, N)
        gxy = scale_xy(xywhn[:, :2], nx, ny)
        gxi = torch.stack((nx - gxy[:, 0], ny - gxy[:, 1]), 1)
        near_low = (gxy % 1 < g) & (gxy > 1)  # centre within g of its cell's left/upper edge
        near_high = (gxi % 1 < g) & (gxi > 1)  # of the right/lower edge
        use = torch.stack((torch.ones_like(near_low[:, 0]), near_low[:, 0], near_low[:, 1],
                           near_high[:, 0], near_high[:, 1]))
        chosen.append(use[:, None] & fits[None])
        xy.append(gxy)
        wh.append(gwh)
    chosen = torch.stack(chosen)
    counts = chosen.flatten(1).sum(1).tolist()
    kinds, a_all, rows = chosen.nonzero(as_tuple=True)[1:]
    out, start = [], 0
    for (ny, nx), anc, gxy_all, gwh_all, n in zip(level_shapes, anchors, xy, wh, counts):
        kind, a, row = (t[start : start + n] for t in (kinds, a_all, rows))
        start += n
        gxy = gxy_all[row]
        cell = (gxy - neighbour_offsets(kind, g)).long()
        gi, gj = cell[:, 0].clamp(0, nx - 1), cell[:, 1].clamp(0, ny - 1)
        tbox = torch.cat((gxy - torch.stack((gi, gj), 1), gwh_all[row]), 1)
        out.append(AnchorTargets(targets.image[row], a, gj, gi, tbox, anc[a], targets.cls[row].long(), row))
    return out


class V5DetectionLoss:
    """YOLOv5 detection loss over the anchor `Detect` head's train output: list of (B, na, ny, nx, 5 + nc)."""

    name = "v5"  # what `hyp loss:` and a head's `default_loss` call it (losses.REGISTRY)
    trains = ("v5", "ota")  # the heads it fits, by their default_loss: v7's have the v5 layout
    loss_names = ("box", "obj", "cls")
    # the hyp keys it reads (engine/hyp.py checks files against them) and the defaults of those a file may leave out
    hyp_keys = {"box": "[0, inf)", "cls": "[0, inf)", "obj": "[0, inf)", "anchor_t": "(1, inf)", "cls_pw": "(0, inf)",
                "obj_pw": "(0, inf)", "fl_gamma": "[0, inf)", "label_smoothing": "[0, 1)"}
    hyp_defaults = {"cls_pw": 1.0, "obj_pw": 1.0, "fl_gamma": 0.0, "label_smoothing": 0.0}
    # the family's hyp file (YOLOv5's), for a model whose YAML names none and whose layers no YAML here has
    hyp_file = "hyp.scratch-low.yaml"

    def __init__(self, model, hyp, imgsz=640):
        hyp = {**self.hyp_defaults, **hyp}
        self.head = detection_head(model)
        nl, nc = self.head.nl, self.head.nc
        self.nl, self.nc = nl, nc
        # Official scaling: gains were tuned for 3 levels, 80 classes and 640 px.
        self.box_gain = hyp["box"] * 3 / nl
        self.cls_gain = hyp["cls"] * nc / 80 * 3 / nl
        self.obj_gain = hyp["obj"] * (imgsz / 640) ** 2 * 3 / nl
        self.anchor_t = hyp["anchor_t"]
        self.cls_pw, self.obj_pw, self.fl_gamma = hyp["cls_pw"], hyp["obj_pw"], hyp["fl_gamma"]
        self.cp, self.cn = smooth_labels(hyp["label_smoothing"])
        self.balance = level_balance(nl)
        self.strides = self.head.stride.tolist()  # host numbers: read from a device tensor, each would wait for it

    def anchors(self, device):
        """The head's anchors (nl, na, 2) in grid units, read each call so that `model.to()` is followed."""
        return self.head.anchors.detach().to(device=device, dtype=torch.float32)

    def assign(self, preds, targets, g=NEIGHBOUR_BIAS):
        shapes = [p.shape[2:4] for p in preds]
        return match_anchors(shapes, self.anchors(targets.device), targets, self.anchor_t, g)

    def __call__(self, preds, batch):
        assigned = self.assign(preds, batch["targets"])
        lbox, lobj, lcls = self.detection_terms(preds, assigned)
        bs = preds[0].shape[0]
        return (lbox + lobj + lcls) * bs, torch.stack((lbox, lobj, lcls)).detach()

    def class_loss(self, pcls, tcls):
        t = torch.full_like(pcls, self.cn)
        t[torch.arange(len(tcls), device=pcls.device), tcls] = self.cp
        return bce(pcls, t, self.cls_pw, self.fl_gamma)

    def detection_terms(self, preds, assigned):
        """Weighted (box, obj, cls) terms: box and cls are means over positives, obj a mean over all cells."""
        lbox = lobj = lcls = preds[0].new_zeros((), dtype=torch.float32)
        for pi, t, w in zip(preds, assigned, self.balance):
            tobj = torch.zeros_like(pi[..., 4])
            if len(t.b):
                ps = pi[t.b, t.a, t.gj, t.gi]
                iou = bbox_iou(decode_anchor_box(ps, t.anchors), t.tbox, CIoU=True).squeeze(-1)
                lbox = lbox + (1.0 - iou).mean()
                # Objectness target = detached IoU (official gr = 1), so obj learns to predict box quality.
                tobj[t.b, t.a, t.gj, t.gi] = iou.detach().clamp(0).to(tobj.dtype)
                if self.nc > 1:
                    lcls = lcls + self.class_loss(ps[:, 5 : 5 + self.nc], t.tcls)
            lobj = lobj + bce(pi[..., 4], tobj, self.obj_pw, self.fl_gamma) * w
        return lbox * self.box_gain, lobj * self.obj_gain, lcls * self.cls_gain
