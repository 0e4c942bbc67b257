"""Test-time augmentation (--augment): the model runs on the image at three scales, one of them mirrored, and the
predictions of all passes, mapped back to the original image, go into one NMS.

YOLOv5's passes: scale 1, scale 0.83 flipped left-right, scale 0.67. Every head declares its eval output
(`output_layout`), which is all that is needed to undo a pass: boxes are xywh input pixels, so they are divided by
the pass's scale and mirrored back. Segmentation heads predict mask coefficients against their own pass's
prototypes; so the prototypes of every pass are un-mirrored, resized to the first pass's and stacked along the
channel axis, and each prediction's coefficients are placed in its own pass's block with zeros elsewhere: the
coefficient-prototype product of each prediction is then exactly its own pass's mask.

YOLOv5 additionally drops the coarsest level's predictions of the smallest pass and the finest level's of the
largest; that needs the level boundaries inside the prediction rows, which the layout does not carry, so all
predictions are kept here (NMS merges the duplicates).
"""

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from utils.errors import BadOption

SCALES = (1.0, 0.83, 0.67)
FLIPS = (False, True, False)  # left-right
PAD = 114 / 255  # the letterbox grey


def scale_img(img, ratio, gs=32):
    """(B, 3, H, W) resized by `ratio`, padded right and bottom to a multiple of gs. Returns (img, (h, w) resized)."""
    if ratio == 1.0:
        return img, tuple(img.shape[2:])
    h, w = (int(x * ratio) for x in img.shape[2:])
    img = F.interpolate(img, size=(h, w), mode="bilinear", align_corners=False)
    ph, pw = (-h) % gs, (-w) % gs
    return F.pad(img, (0, pw, 0, ph), value=PAD), (h, w)


# the layout fields a pass is undone for (boxes, scores, mask coefficients and prototypes): any other set, such as a
# new task's columns, is refused rather than left mirrored, so a new task need not add a refusal here
UNDONE = {"nc", "nm", "objectness", "channels_last", "proto", "train"}
WHY_NOT = {  # what a refusal says of the columns known not to be undone
    "kpt_shape": "keypoint models is not supported (its mirrored pass would need the dataset's flip_idx to rename "
                 "left and right keypoints)",
    "angle": "oriented-box (OBB) models is not supported (a mirrored pass's angles would need turning back)",
}


def tta_layout(layout, n=len(SCALES)):
    """The layout of `augmented_forward`'s output: rows channels-last, n blocks of mask coefficients, the stacked
    prototypes second. A layout with columns no pass is undone for (keypoints, angles, ...) is refused."""
    for f in dataclasses.fields(layout):
        if f.name not in UNDONE and getattr(layout, f.name) != f.default:
            raise BadOption("--augment: test-time augmentation of "
                            + WHY_NOT.get(f.name, f"models whose predictions hold {f.name} is not supported"))
    return dataclasses.replace(layout, nm=layout.nm * n, channels_last=True, proto=(1,) if layout.nm else ())


def _unaugment_rows(rows, layout, scale_hw, size_hw, flip, block, n):
    """Pass rows (B, A, C) -> original-image boxes, mask coefficients moved into block `block` of n."""
    rows = rows.clone()
    (h, w), (H, W) = scale_hw, size_hw
    rows[..., 0] *= W / w
    rows[..., 2] *= W / w
    rows[..., 1] *= H / h
    rows[..., 3] *= H / h
    if flip:
        rows[..., 0] = W - rows[..., 0]
    if not layout.nm:
        return rows
    head, mc = rows[..., : layout.mask.start], rows[..., layout.mask]
    z = rows.new_zeros(*rows.shape[:2], layout.nm)
    return torch.cat([head, *([z] * block), mc, *([z] * (n - 1 - block))], -1)


def _unaugment_proto(proto, scale_hw, padded_hw, flip, base_hw):
    """Prototypes of a pass -> the first pass's grid: crop the padding, un-mirror, resize."""
    ph, pw = proto.shape[2:]
    ch, cw = round(ph * scale_hw[0] / padded_hw[0]), round(pw * scale_hw[1] / padded_hw[1])
    proto = proto[..., :ch, :cw]
    if flip:
        proto = proto.flip(3)
    return F.interpolate(proto, size=base_hw, mode="bilinear", align_corners=False) if proto.shape[2:] != base_hw \
        else proto


def augmented_forward(forward, x, layout, gs=32):
    """`forward(x)` -> eval output; returns the merged eval output, laid out as `tta_layout(layout)`."""
    size_hw, n = tuple(x.shape[2:]), len(SCALES)
    rows, protos = [], []
    for i, (s, flip) in enumerate(zip(SCALES, FLIPS)):
        xi, scale_hw = scale_img(x.flip(3) if flip else x, s, gs)
        pred, proto = layout.split(forward(xi))
        rows.append(_unaugment_rows(layout.rows(pred), layout, scale_hw, size_hw, flip, i, n))
        if layout.nm:
            base_hw = protos[0].shape[2:] if protos else proto.shape[2:]
            protos.append(_unaugment_proto(proto, scale_hw, xi.shape[2:], flip, tuple(base_hw)))
    y = torch.cat(rows, 1)
    return (y, torch.cat(protos, 1)) if layout.nm else y


class TTAModel(nn.Module):
    """A detection or segmentation model whose forward is `augmented_forward`; it declares the merged output's
    layout, so validators and predictors use it as they use the model itself."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.names, self.yaml = model.names, getattr(model, "yaml", None)

    @property
    def output_layout(self):
        return tta_layout(self.model.output_layout)

    @property
    def stride(self):
        return self.model.stride

    @property
    def nc(self):
        return self.model.nc

    def forward(self, x):
        return augmented_forward(self.model, x, self.model.output_layout, int(max(self.model.stride)))


def augment_backend(backend):
    """Switch a predictor's InferenceBackend to TTA; only .pt weights can (exports take one input size)."""
    if backend.format != "pytorch" or backend.output_layout is None:
        raise BadOption(f"--augment needs detection or segmentation .pt weights, not {backend.weights}")
    backend.model = TTAModel(backend.model)
    backend.output_layout = backend.model.output_layout
