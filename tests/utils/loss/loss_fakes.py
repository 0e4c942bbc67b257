"""Small fake models with the head attributes of docs/design.md, so the criteria are tested without models/."""

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from data.targets import Targets

V5_ANCHORS_PX = ((10, 13, 16, 30, 33, 23), (30, 61, 62, 45, 59, 119), (116, 90, 156, 198, 373, 326))
STRIDES = (8, 16, 32)
HYP_V5 = {"box": 0.05, "cls": 0.5, "cls_pw": 1.0, "obj": 1.0, "obj_pw": 1.0, "anchor_t": 4.0, "fl_gamma": 0.0,
          "label_smoothing": 0.0}
HYP_V8 = {"box": 7.5, "cls": 0.5, "dfl": 1.5}


class Features(nn.Module):
    """Image -> one feature map per stride (average pooling + a 1x1 conv): no BatchNorm, so images are independent."""

    def __init__(self, ch=8):
        super().__init__()
        self.conv = nn.Conv2d(3, ch, 3, padding=1)

    def forward(self, img):
        x = self.conv(img)
        return [F.avg_pool2d(x, s) for s in STRIDES]


class AnchorHead(nn.Module):
    """v5/v7-style head: train output list of (B, na, ny, nx, 5 + nc + nm); v5-seg also returns proto."""

    def __init__(self, nc=3, ch=8, nm=0, default_loss="v5"):
        super().__init__()
        self.nc, self.nm, self.no, self.nl, self.na = nc, nm, 5 + nc + nm, 3, 3
        self.default_loss = default_loss
        self.register_buffer("stride", torch.tensor(STRIDES, dtype=torch.float32))
        anchors = torch.tensor(V5_ANCHORS_PX, dtype=torch.float32).view(3, 3, 2)
        self.register_buffer("anchors", anchors / self.stride.view(-1, 1, 1))
        self.m = nn.ModuleList(nn.Conv2d(ch, self.na * self.no, 1) for _ in STRIDES)
        self.proto = nn.Conv2d(ch, nm, 1) if nm else None

    def forward(self, feats):
        out = []
        for conv, f in zip(self.m, feats):
            b, _, ny, nx = f.shape
            out.append(conv(f).view(b, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous())
        if self.proto is None:
            return out
        return out, self.proto(F.interpolate(feats[0], scale_factor=2.0, mode="nearest"))


class AnchorFreeHead(nn.Module):
    """v8-style head: box branch cv2, class branch cv3; seg adds coefficient branch cv4 and a proto conv."""

    def __init__(self, nc=3, ch=8, nm=0, default_loss="v8"):
        super().__init__()
        self.nc, self.reg_max, self.nl, self.nm = nc, 16, 3, nm
        self.no = nc + 4 * self.reg_max
        self.default_loss = default_loss
        self.stride = torch.tensor(STRIDES, dtype=torch.float32)
        self.cv2 = nn.ModuleList(nn.Conv2d(ch, 4 * self.reg_max, 1) for _ in STRIDES)
        self.cv3 = nn.ModuleList(nn.Conv2d(ch, nc, 1) for _ in STRIDES)
        self.cv4 = nn.ModuleList(nn.Conv2d(ch, nm, 1) for _ in STRIDES) if nm else None
        self.proto = nn.Conv2d(ch, nm, 1) if nm else None

    def forward(self, feats):
        x = [torch.cat((a(f), c(f)), 1) for a, c, f in zip(self.cv2, self.cv3, feats)]
        if self.cv4 is None:
            return x
        b = feats[0].shape[0]
        mc = torch.cat([m(f).view(b, self.nm, -1) for m, f in zip(self.cv4, feats)], 2)
        return x, mc, self.proto(F.interpolate(feats[0], scale_factor=2.0, mode="nearest"))


class FakeModel(nn.Module):
    def __init__(self, head):
        super().__init__()
        self.model = nn.ModuleList([Features(), head])
        self.nc = head.nc

    def forward(self, img):
        return self.model[1](self.model[0](img))


def make_targets(rows, canvas=(64, 64), angles=None):
    """Typed targets (data/targets.Targets) from rows [image, cls, cx, cy, w, h] normalised on `canvas`."""
    return Targets.from_rows(torch.tensor(rows, dtype=torch.float32).view(-1, 6), canvas, angles)


def alone(targets):
    """Targets of one image as the only image of its batch."""
    return dataclasses.replace(targets, image=torch.zeros_like(targets.image))


def fake_model(kind, nc=3, nm=0, default_loss=None):
    """kind 'anchor' (v5/v7 layout) or 'free' (v8 layout); nm > 0 adds the segmentation outputs."""
    torch.manual_seed(0)
    if kind == "anchor":
        head = AnchorHead(nc, nm=nm, default_loss=default_loss or ("v5seg" if nm else "v5"))
    else:
        head = AnchorFreeHead(nc, nm=nm, default_loss=default_loss or ("v8seg" if nm else "v8"))
    return FakeModel(head)


def det_batch():
    """Two 64x64 images; image 0 has two objects, image 1 one (rows in image order, as the collate gives)."""
    torch.manual_seed(1)
    img = torch.rand(2, 3, 64, 64)
    targets = make_targets([[0, 0, 0.30, 0.40, 0.25, 0.30],
                            [0, 2, 0.70, 0.65, 0.40, 0.35],
                            [1, 1, 0.50, 0.50, 0.60, 0.50]])
    return {"img": img, "targets": targets}


def box_masks(targets, batch_size, size, overlap=True):
    """Rectangle masks of the targets at `size` (h, w): overlap (B, h, w) 1-based index, or (N, h, w) binary."""
    h, w = size
    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    per_target = []
    for cx, cy, bw, bh in targets.boxes.data[:, :4].tolist():
        inside = (abs(xs / w - cx) < bw / 2) & (abs(ys / h - cy) < bh / 2)
        per_target.append(inside.float())
    if not overlap:
        return torch.stack(per_target) if per_target else torch.zeros(0, h, w)
    masks = torch.zeros(batch_size, h, w)
    count = [0] * batch_size
    for bi, m in zip(targets.image.tolist(), per_target):
        count[int(bi)] += 1
        masks[int(bi)][m > 0] = count[int(bi)]
    return masks


def missing_grads(head):
    """Names of the head's trainable parameters that got no gradient."""
    return [n for n, p in head.named_parameters() if p.requires_grad and p.grad is None]
