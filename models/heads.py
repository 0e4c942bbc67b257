"""Output heads: anchor-based (YOLOv5, YOLOv7), anchor-free DFL (YOLOv8), their segmentation variants, the YOLOv8 pose
head, the oriented-box (OBB) head, classification.

Output layouts are the official ones (docs/design.md, "Model outputs"); each detection head declares its eval output
as `output_layout` (a `utils.ops.OutputLayout`), which NMS, validators and predictors read instead of guessing. Each
head also names the criterion that trains it (`default_loss`) and tells the parser how to build it: `channel_rule`
(models/common.py), `anchor_based`, for segment heads `proto_arg`, the index of the width-scaled prototype channel
count in its args, and `inputs_per_level` where a head reads more than one map per level (IAuxDetect: 2). The model
sets `stride` (a non-persistent buffer, so it follows `.to()` but stays out of the state_dict, as in the official key
lists) before calling `bias_init()`.
"""

import contextlib
import math

import torch
import torch.nn as nn

from models.common import DFL, Conv, DWConv, ImplicitA, ImplicitM, Proto
from utils.ops import OutputLayout, dist2bbox, make_anchors
from utils.rotated import dist_to_rbox


def head_precision(t, like):
    """An autocast output (bf16 or fp16: `--amp` inference, validation inside training) back in the head's own
    precision, that of its tensor `like`, before it is decoded: bf16's 8-bit significand would put 2-4 px steps into
    the box coordinates of a 640 px image and round scores to 0.4 %, and the DFL conv takes only its weights' dtype.
    A `--half` model's head is fp16 itself and decodes in fp16, as the official heads do (10 bits: 0.25-0.5 px)."""
    return t.to(like.dtype)


def no_autocast(t):
    """Decoding runs as written, in its inputs' precision (autocast would put the DFL conv back in bf16). The meta
    device (shapes only: benchmarks/zoo.py counts a model's FLOPs there) has no autocast to leave."""
    return contextlib.nullcontext() if t.device.type == "meta" else torch.autocast(t.device.type, enabled=False)


class Detect(nn.Module):
    """Anchor-based head (YOLOv5; also YOLOv7's deploy head): one 1x1 conv per level predicting na x (5 + nc + nm)."""

    default_loss = "v5"
    task = "detect"  # the task a model ending in this head serves
    anchor_based = True
    channel_rule = "levels"

    def __init__(self, nc=80, anchors=(), ch=(), nm=0):
        super().__init__()
        self.nc, self.nm = nc, nm
        self.no = nc + 5 + nm  # outputs per anchor
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        # in pixels until the model divides them by the stride; grid units from then on
        self.register_buffer("anchors", torch.tensor(anchors, dtype=torch.float32).view(self.nl, -1, 2))
        self.register_buffer("stride", torch.zeros(self.nl), persistent=False)
        self.m = nn.ModuleList(nn.Conv2d(x, self.no * self.na, 1) for x in ch)

    def class_rows(self):
        """The parameters that hold one slice per class: {name under this head: (dim, class -> its indices along
        dim, the indices along dim that mean the same for any class count)}; `models.checkpoints.transfer_weights`
        carries classes over by name with it. Here each anchor's box, objectness and mask coefficients are the same
        for any class count."""
        def rows(c):  # class c's output channel for each anchor
            return [a * self.no + 5 + c for a in range(self.na)]

        fixed = [a * self.no + k for a in range(self.na) for k in (*range(5), *range(5 + self.nc, self.no))]
        return {f"m.{i}.{p}": (0, rows, fixed) for i in range(self.nl) for p in ("weight", "bias")}

    def forward(self, x):
        for i in range(self.nl):
            x[i] = self._level(x[i], i)
        if self.training:
            return x
        with no_autocast(x[0]):
            return torch.cat([self._decode(head_precision(p, self.anchors), i) for i, p in enumerate(x)], 1), x

    def _level(self, x, i):
        """Raw logits of level i reshaped to (B, na, ny, nx, no)."""
        return self._rows(self.m[i](x))

    def _rows(self, y):
        """A conv's (B, na * no, ny, nx) output as (B, na, ny, nx, no)."""
        bs, _, ny, nx = y.shape
        return y.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()

    def _decode(self, p, i):
        """(B, na, ny, nx, no) logits -> (B, na*ny*nx, no): xywh pixels, sigmoid obj/cls, raw mask coefficients."""
        bs, _, ny, nx, _ = p.shape
        # ranges in int64, then cast: the ONNX exporter has no fp16 `arange` (`export.py --half`)
        yv, xv = torch.meshgrid(torch.arange(ny, device=p.device).to(p.dtype),
                                torch.arange(nx, device=p.device).to(p.dtype), indexing="ij")
        grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2) - 0.5  # the -0.5 of xy * 2 - 0.5 lives here
        anchor_grid = (self.anchors[i] * self.stride[i]).view(1, self.na, 1, 1, 2).to(p.dtype)
        # one sigmoid over box and scores, then the split: an exported graph runs one op where three cost 0-5% of
        # a 640 px OpenVINO inference of yolov5n (the same values to one ulp: on the contiguous block PyTorch's
        # sigmoid takes its vector path, on the split's strided views its scalar one)
        scores, mask = p.split((5 + self.nc, self.nm), 4)
        xy, wh, conf = scores.sigmoid().split((2, 2, self.nc + 1), 4)
        xy = (xy * 2 + grid) * self.stride[i]
        wh = (wh * 2) ** 2 * anchor_grid
        return torch.cat((xy, wh, conf, mask), 4).view(bs, -1, self.no)

    @property
    def output_layout(self):
        """Eval output `(y, x)`: y (B, anchors, 5 + nc + nm) rows with objectness."""
        return OutputLayout(self.nc, self.nm, objectness=True, channels_last=True)

    def bias_init(self):
        """Objectness prior of ~8 objects per 640 px image, class prior 0.6 / nc (YOLOv5)."""
        self._prior_biases(self.m)

    @torch.no_grad()
    def _prior_biases(self, convs):
        for mi, s in zip(convs, self.stride):
            b = mi.bias.view(self.na, -1)
            b[:, 4] += math.log(8 / (640 / s) ** 2)
            b[:, 5 : 5 + self.nc] += math.log(0.6 / (self.nc - 0.99))


class Segment(Detect):
    """YOLOv5 segmentation head: Detect with nm mask coefficients per anchor plus a nearest-upsampling Proto."""

    default_loss = "v5seg"
    task = "segment"
    proto_arg = 3

    def __init__(self, nc=80, anchors=(), nm=32, npr=256, ch=()):
        super().__init__(nc, anchors, ch, nm=nm)
        self.npr = npr
        self.proto = Proto(ch[0], npr, nm, transpose=False)

    def forward(self, x):
        p = self.proto(x[0])
        out = super().forward(x)
        return (out, p) if self.training else (out[0], p, out[1])

    @property
    def output_layout(self):
        """Eval output `(y, proto, x)`; the criterion takes the train output `(x, proto)`."""
        return OutputLayout(self.nc, self.nm, objectness=True, channels_last=True, proto=(1,), train=((2,), (1,)))


class IDetect(Detect):
    """YOLOv7 training head: Detect with an implicit offset before and an implicit scale after each conv.

    `anchor_grid` (pixels, per level) is kept as a buffer only so that official YOLOv7 state_dicts load by key;
    decoding uses anchors * stride, which equals it, so the two can never disagree.
    """

    default_loss = "ota"

    def __init__(self, nc=80, anchors=(), ch=()):
        super().__init__(nc, anchors, ch)
        self.register_buffer("anchor_grid", self.anchors.clone().view(self.nl, 1, -1, 1, 1, 2))
        self.ia = nn.ModuleList(ImplicitA(x) for x in ch)
        self.im = nn.ModuleList(ImplicitM(self.no * self.na) for _ in ch)

    def class_rows(self):
        rows = super().class_rows()
        rows.update({f"im.{i}.implicit": (1, *rows["m.0.bias"][1:]) for i in range(self.nl)})  # (1, no * na, 1, 1)
        return rows

    def _level(self, x, i):
        return self._rows(self.im[i](self.m[i](self.ia[i](x))))

    @torch.no_grad()
    def fuse(self):
        """Fold ImplicitA into each conv's bias and ImplicitM into its weight and bias (eval-equivalent)."""
        if isinstance(self.ia[0], nn.Identity):
            return  # already folded
        for conv, ia, im in zip(self.m, self.ia, self.im):
            w = conv.weight.view(conv.out_channels, -1)
            conv.bias += (w @ ia.implicit.view(-1, 1)).view(-1)
            scale = im.implicit.view(-1)
            conv.bias *= scale
            conv.weight *= scale.view(-1, 1, 1, 1)
        self.ia = nn.ModuleList(nn.Identity() for _ in self.ia)
        self.im = nn.ModuleList(nn.Identity() for _ in self.im)


class IAuxDetect(IDetect):
    """YOLOv7 P6 training head: an IDetect lead head on the first `nl` inputs and an auxiliary head (one plain 1x1
    conv per level, `m2`) on the other `nl`, coarser-assigned feature maps of the same sizes.

    Train output: the lead maps, then the auxiliary ones (2 x nl); the criterion trains both. Eval output: the lead
    head's alone, as official, so validation, prediction and export drop the auxiliary head: neither its convs nor
    the layers that feed only them run (`eval_inputs`), which makes the eval model the official deploy model.
    """

    default_loss = "aux_ota"
    inputs_per_level = 2  # for the parser: `anchors: 3` gives len(inputs) / 2 levels

    def __init__(self, nc=80, anchors=(), ch=()):
        nl = len(anchors)
        if len(ch) != 2 * nl:
            raise ValueError(f"IAuxDetect takes 2 x {nl} inputs (lead, then auxiliary), got {len(ch)}")
        super().__init__(nc, anchors, ch[:nl])
        implicit = {k: self._modules.pop(k) for k in ("ia", "im")}  # the official key order: m, m2, ia, im
        self.m2 = nn.ModuleList(nn.Conv2d(x, self.no * self.na, 1) for x in ch[nl:])
        self._modules.update(implicit)

    @property
    def eval_inputs(self):
        """The inputs eval mode reads (the lead maps): the model skips the layers that feed only the others."""
        return self.nl

    def class_rows(self):
        rows = super().class_rows()
        rows.update({f"m2.{k[2:]}": v for k, v in rows.items() if k.startswith("m.")})
        return rows

    def forward(self, x):
        aux = [self._rows(m(xi)) for m, xi in zip(self.m2, x[self.nl :])] if self.training else []
        out = super().forward(x[: self.nl])
        return out + aux if self.training else out

    def bias_init(self):
        """The lead head's priors, and the same on the auxiliary convs (official)."""
        super().bias_init()
        self._prior_biases(self.m2)


class AnchorFreeDetect(nn.Module):
    """YOLOv8 decoupled head: per level a box branch (4 x reg_max DFL bins) and a class branch. With `dw` (YOLO11:
    the parser sets it for a model with a block declaring `dw_head`) each 3x3 convolution of the class branch is a
    depthwise 3x3 followed by a 1x1."""

    default_loss = "v8"
    task = "detect"
    anchor_based = False
    channel_rule = "levels"
    reg_max = 16

    def __init__(self, nc=80, ch=(), dw=False):
        super().__init__()
        self.nc = nc
        self.nl = len(ch)
        self.no = nc + self.reg_max * 4
        self.register_buffer("stride", torch.zeros(self.nl), persistent=False)
        c2, c3 = max(16, ch[0] // 4, self.reg_max * 4), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * self.reg_max, 1)) for x in ch
        )
        if dw:
            self.cv3 = nn.ModuleList(nn.Sequential(nn.Sequential(DWConv(x, x, 3), Conv(x, c3, 1)),
                                                   nn.Sequential(DWConv(c3, c3, 3), Conv(c3, c3, 1)),
                                                   nn.Conv2d(c3, nc, 1)) for x in ch)
        else:
            self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
        self.dfl = DFL(self.reg_max)

    def class_rows(self):
        """As `Detect.class_rows`: the last conv of each level's class branch."""
        return {f"cv3.{i}.2.{p}": (0, lambda c: [c], []) for i in range(self.nl) for p in ("weight", "bias")}

    def forward(self, x):
        box, cls, maps = self._branches(x)
        if self.training:
            return maps
        with no_autocast(maps[0]):
            return self._decode(box, cls), maps

    def _branches(self, x):
        """Per level: the box branch's DFL logits, the class branch's logits, and both joined (the maps the loss
        reads). The decode reads the branches apart, so an export, which keeps only what the decode reads, never
        joins them: joining and splitting 144 channels cost 3-4 % of a bf16 OpenVINO inference of YOLOv8n."""
        box = [self.cv2[i](x[i]) for i in range(self.nl)]
        cls = [self.cv3[i](x[i]) for i in range(self.nl)]
        return box, cls, [torch.cat(bc, 1) for bc in zip(box, cls)]

    def _decode(self, box, cls):
        """Per-level box and class logits -> (B, 4 + nc, A): xywh pixels, sigmoid class scores."""
        dist, cls, anchors, strides = self._distances(box, cls)
        dbox = dist2bbox(dist, anchors, xywh=True, dim=1) * strides
        return torch.cat((dbox, cls.sigmoid()), 1)

    def _distances(self, box, cls):
        """Per-level box and class logits, in the head's precision -> DFL distances (B, 4, A) in grid units, class
        logits (B, nc, A), anchor centres (1, 2, A) in grid units and strides (1, A)."""
        w = self.dfl.conv.weight
        box, cls = [head_precision(b, w) for b in box], [head_precision(c, w) for c in cls]
        bs = box[0].shape[0]
        anchors, strides = (t.transpose(0, 1) for t in make_anchors(box, self.stride, 0.5))
        box = torch.cat([b.view(bs, self.reg_max * 4, -1) for b in box], 2)
        cls = torch.cat([c.view(bs, self.nc, -1) for c in cls], 2)
        return self.dfl(box), cls, anchors.unsqueeze(0), strides

    @property
    def output_layout(self):
        """Eval output `(y, x)`: y (B, 4 + nc, anchors), no objectness."""
        return OutputLayout(self.nc, objectness=False, channels_last=False)

    @torch.no_grad()
    def bias_init(self):
        """Box logits start at 1.0; class prior ~5 objects per 640 px image over nc classes (YOLOv8)."""
        for a, b, s in zip(self.cv2, self.cv3, self.stride):
            a[-1].bias[:] = 1.0
            b[-1].bias[: self.nc] = math.log(5 / self.nc / (640 / s) ** 2)


class AnchorFreeSegment(AnchorFreeDetect):
    """YOLOv8 segmentation head: AnchorFreeDetect + mask-coefficient branch cv4 + transposed-conv Proto."""

    default_loss = "v8seg"
    task = "segment"
    proto_arg = 2

    def __init__(self, nc=80, nm=32, npr=256, ch=(), dw=False):
        super().__init__(nc, ch, dw)
        self.nm, self.npr = nm, npr
        self.proto = Proto(ch[0], npr, nm, transpose=True)
        c4 = max(ch[0] // 4, nm)
        self.cv4 = nn.ModuleList(nn.Sequential(Conv(x, c4, 3), Conv(c4, c4, 3), nn.Conv2d(c4, nm, 1)) for x in ch)

    def forward(self, x):
        p = self.proto(x[0])
        bs = p.shape[0]
        mc = torch.cat([self.cv4[i](x[i]).view(bs, self.nm, -1) for i in range(self.nl)], 2)
        out = super().forward(x)
        if self.training:
            return out, mc, p
        return torch.cat((out[0], head_precision(mc, out[0])), 1), (out[1], mc, p)

    @property
    def output_layout(self):
        """Eval output `(cat(y, mc), (x, mc, proto))`: y (B, 4 + nc + nm, anchors)."""
        return OutputLayout(self.nc, self.nm, objectness=False, channels_last=False, proto=(1, 2))


def check_kpt_shape(kpt_shape):
    """(K, ndim) as a tuple of ints, or ValueError: K >= 1 keypoints of 2 (x, y) or 3 (x, y, visibility) values."""
    ok = isinstance(kpt_shape, (list, tuple)) and len(kpt_shape) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in kpt_shape)
    if not ok or kpt_shape[0] < 1 or kpt_shape[1] not in (2, 3):
        raise ValueError(f"kpt_shape must be [K, 2] or [K, 3] with K >= 1 keypoints, got {kpt_shape!r:.60}")
    return tuple(kpt_shape)


class Pose(AnchorFreeDetect):
    """YOLOv8 pose head: AnchorFreeDetect + a keypoint branch cv4 of K x ndim values per anchor.

    A keypoint's raw (dx, dy) is decoded as (2 d + cell index) x stride, in input pixels, so one anchor reaches about
    its own cell's neighbourhood scaled by the box level; a third value is the visibility logit, a sigmoid in eval."""

    default_loss = "v8pose"
    task = "pose"

    def __init__(self, nc=80, kpt_shape=(17, 3), ch=(), dw=False):
        super().__init__(nc, ch, dw)
        self.kpt_shape = check_kpt_shape(kpt_shape)
        self.nk = self.kpt_shape[0] * self.kpt_shape[1]
        c4 = max(ch[0] // 4, self.nk)
        self.cv4 = nn.ModuleList(nn.Sequential(Conv(x, c4, 3), Conv(c4, c4, 3), nn.Conv2d(c4, self.nk, 1)) for x in ch)

    def forward(self, x):
        bs = x[0].shape[0]
        kpt = torch.cat([self.cv4[i](x[i]).view(bs, self.nk, -1) for i in range(self.nl)], 2)
        out = super().forward(x)
        if self.training:
            return out, kpt
        with no_autocast(kpt):
            # the maps only give the grid's shape, but make_anchors builds it in their dtype: the decode's, not bf16's
            maps = [head_precision(xi, out[0]) for xi in out[1]]
            decoded = self.decode_keypoints(head_precision(kpt, out[0]), maps)
        return torch.cat((out[0], decoded), 1), (out[1], kpt)

    def decode_keypoints(self, kpt, feats):
        """Raw (B, nk, A) -> (B, nk, A): x, y in input pixels, visibility as a probability (ndim 3)."""
        bs, (k, ndim) = kpt.shape[0], self.kpt_shape
        anchors, strides = (t.transpose(0, 1) for t in make_anchors(feats, self.stride, 0.5))
        y = kpt.view(bs, k, ndim, -1)
        xy = (y[:, :, :2] * 2.0 + (anchors - 0.5)) * strides
        parts = (xy, y[:, :, 2:].sigmoid()) if ndim == 3 else (xy,)
        return torch.cat(parts, 2).view(bs, self.nk, -1)

    @property
    def output_layout(self):
        """Eval output `(cat(y, kpts), (x, kpt))`: y (B, 4 + nc, anchors), then nk keypoint values per anchor."""
        return OutputLayout(self.nc, objectness=False, channels_last=False, kpt_shape=self.kpt_shape)


class OBB(AnchorFreeDetect):
    """Oriented-box head (Ultralytics' `OBB`): AnchorFreeDetect + an angle branch cv4 of `ne` values per anchor.

    The angle is (sigmoid - 0.25) x pi, in [-pi/4, 3pi/4): the range canonical labels use (utils/rotated.py), a
    quarter turn either side of the longer side lying along x. The DFL distances are measured along the box's own
    axes, so the decoded centre is the anchor plus the rotated offset; the row is xywh, class scores, then the angle
    in radians."""

    default_loss = "v8obb"
    task = "obb"

    def __init__(self, nc=80, ne=1, ch=(), dw=False):
        super().__init__(nc, ch, dw)
        self.ne = ne
        c4 = max(ch[0] // 4, ne)
        self.cv4 = nn.ModuleList(nn.Sequential(Conv(x, c4, 3), Conv(c4, c4, 3), nn.Conv2d(c4, ne, 1)) for x in ch)

    def forward(self, x):
        bs = x[0].shape[0]
        logits = torch.cat([self.cv4[i](x[i]).view(bs, self.ne, -1) for i in range(self.nl)], 2)
        angle = (logits.sigmoid() - 0.25) * math.pi
        box, cls, maps = self._branches(x)
        if self.training:
            return maps, angle
        with no_autocast(maps[0]):
            angle_ = head_precision(angle, self.dfl.conv.weight)
            dist, cls, anchors, strides = self._distances(box, cls)
            rbox = dist_to_rbox(dist, angle_, anchors, dim=1) * strides
            return torch.cat((rbox, cls.sigmoid(), angle_), 1), (maps, angle)

    @property
    def output_layout(self):
        """Eval output `(cat(y, angle), (x, angle))`: y (B, 4 + nc, anchors), then the angle (radians) per anchor."""
        return OutputLayout(self.nc, objectness=False, channels_last=False, angle=True)


class Classify(nn.Module):
    """Conv to 1280 channels, global average pool, dropout, linear: logits in train, softmax in eval."""

    default_loss = "cls"
    task = "classify"
    channel_rule = "fixed"

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, dropout=0.0):
        super().__init__()
        c_ = 1280  # efficientnet_b0 width
        self.conv = Conv(c1, c_, k, s, p, g)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(p=dropout, inplace=True)
        self.linear = nn.Linear(c_, c2)

    def class_rows(self):
        """As `Detect.class_rows`: the linear layer's rows."""
        return {f"linear.{p}": (0, lambda c: [c], []) for p in ("weight", "bias")}

    def forward(self, x):
        if isinstance(x, list):
            x = torch.cat(x, 1)
        x = self.linear(self.drop(self.pool(self.conv(x)).flatten(1)))
        return x if self.training else head_precision(x, self.linear.weight).softmax(1)
