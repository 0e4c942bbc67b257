"""Building blocks shared by the YOLOv5, YOLOv7 and YOLOv8 architectures.

Attribute names follow the official implementations so that official state_dicts load by key. Every BatchNorm uses
the official eps=0.001, momentum=0.03.

Blocks declare how `models.model_yaml.parse_model` builds them from a YAML row, as class attributes:
- `channel_rule`: "width" - args[0] is the output channel count, scaled by the width multiple and capped at
  max_channels; the input channel count is prepended. "fixed" - the same, unscaled (Classify). "concat" - the output
  has the inputs' channels summed. "add" - the output has the channels of its first input (inputs summed
  elementwise). "space_to_depth" - four times its input's channels. "levels" - a head: the list of its inputs'
  channels is appended to the args. None (the default, also for torch modules such as nn.Upsample) - the output
  keeps the input's channels.
- `repeat_arg = True`: the block takes the depth-scaled repeat count as its third argument instead of being stacked.
- a `fuse()` method: `BaseModel.fuse()` calls it on every module that has one (BatchNorm folding, re-parameterising).
"""

import contextlib
import contextvars
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BN_EPS, BN_MOMENTUM = 0.001, 0.03
# what `Conv(..., act=True)` builds: SiLU, unless a model YAML's `activation:` key names another for the whole model
# while it is parsed (yolov5s-LeakyReLU.yaml); a factory, so each convolution gets its own module
_MODEL_ACTIVATION = contextvars.ContextVar("model_activation", default=nn.SiLU)


def autopad(k, p=None, d=1):
    """'same' padding for a (possibly dilated) kernel when p is None."""
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


def batchnorm(c):
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


def make_activation(act):
    """True -> SiLU (the default of every YOLO since v5), a module -> itself, False/None -> identity."""
    if act is True:
        return nn.SiLU()
    if isinstance(act, nn.Module):
        return act
    return nn.Identity()


@contextlib.contextmanager
def model_activation(factory):
    """Inside the block, `Conv(..., act=True)` activates with `factory()` (a model-wide `activation:` key)."""
    token = _MODEL_ACTIVATION.set(factory)
    try:
        yield
    finally:
        _MODEL_ACTIVATION.reset(token)


@torch.no_grad()
def fold_bn(weight, bias, bn):
    """Fold BatchNorm statistics into a convolution kernel and bias; returns the new (weight, bias)."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    if bias is None:
        bias = torch.zeros_like(bn.running_mean)
    return weight * scale.view(-1, 1, 1, 1), bn.bias + (bias - bn.running_mean) * scale


def fuse_conv_and_bn(conv, bn):
    """A single biased Conv2d equal (in eval mode) to conv followed by bn."""
    fused = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        bias=True,
    ).to(device=conv.weight.device, dtype=conv.weight.dtype)
    weight, bias = fold_bn(conv.weight, conv.bias, bn)
    fused.weight.data.copy_(weight)
    fused.bias.data.copy_(bias)
    return fused.requires_grad_(False)


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm2d + activation."""

    channel_rule = "width"

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, d=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = batchnorm(c2)
        self.act = _MODEL_ACTIVATION.get()() if act is True else make_activation(act)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))

    def forward_fuse(self, x):
        return self.act(self.conv(x))

    def fuse(self):
        if "bn" not in self._modules:
            return  # already fused
        self.conv = fuse_conv_and_bn(self.conv, self.bn)
        del self.bn
        self.forward = self.forward_fuse


class DWConv(Conv):
    """Depthwise convolution: groups = gcd(c1, c2), one group per channel when c1 == c2."""

    def __init__(self, c1, c2, k=1, s=1, d=1, act=True):
        super().__init__(c1, c2, k, s, g=math.gcd(c1, c2), d=d, act=act)


class GhostConv(nn.Module):
    """Ghost convolution (GhostNet): half the output from a convolution, the other half a cheap 5x5 depthwise
    convolution of that half."""

    channel_rule = "width"

    def __init__(self, c1, c2, k=1, s=1, g=1, act=True):
        super().__init__()
        c_ = c2 // 2
        self.cv1 = Conv(c1, c_, k, s, None, g, act=act)
        self.cv2 = Conv(c_, c_, 5, 1, None, c_, act=act)

    def forward(self, x):
        y = self.cv1(x)
        return torch.cat((y, self.cv2(y)), 1)


class GhostBottleneck(nn.Module):
    """Two ghost convolutions (the second linear) with a residual; stride 2 adds depthwise downsampling to both
    paths."""

    channel_rule = "width"

    def __init__(self, c1, c2, k=3, s=1):
        super().__init__()
        c_ = c2 // 2
        down = DWConv(c_, c_, k, s, act=False) if s == 2 else nn.Identity()
        self.conv = nn.Sequential(GhostConv(c1, c_, 1, 1), down, GhostConv(c_, c2, 1, 1, act=False))
        self.shortcut = (nn.Sequential(DWConv(c1, c1, k, s, act=False), Conv(c1, c2, 1, 1, act=False)) if s == 2
                         else nn.Identity())

    def forward(self, x):
        return self.conv(x) + self.shortcut(x)


class Bottleneck(nn.Module):
    """Two convolutions with an optional residual; v5 uses kernels (1, 3), v8's C2f uses (3, 3)."""

    channel_rule = "width"

    def __init__(self, c1, c2, shortcut=True, g=1, k=(1, 3), e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, k[0], 1)
        self.cv2 = Conv(c_, c2, k[1], 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP block with 3 convolutions (YOLOv5)."""

    channel_rule = "width"
    repeat_arg = True

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, k=(1, 3), e=1.0) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3Ghost(C3):
    """C3 whose bottlenecks are ghost bottlenecks."""

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__(c1, c2, n, shortcut, g, e)
        c_ = int(c2 * e)
        self.m = nn.Sequential(*(GhostBottleneck(c_, c_) for _ in range(n)))


class C3k(C3):
    """C3 with k x k kernels in both convolutions of its bottlenecks (inside YOLO11's C3k2)."""

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5, k=3):
        super().__init__(c1, c2, n, shortcut, g, e)
        c_ = int(c2 * e)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, k=(k, k), e=1.0) for _ in range(n)))


class C2(nn.Module):
    """CSP block with 2 convolutions: half the channels through the bottlenecks, half around them (YOLOv8-p6)."""

    channel_rule = "width"
    repeat_arg = True

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv(2 * self.c, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(self.c, self.c, shortcut, g, k=(3, 3), e=1.0) for _ in range(n)))

    def forward(self, x):
        a, b = self.cv1(x).chunk(2, 1)
        return self.cv2(torch.cat((self.m(a), b), 1))


class C2f(nn.Module):
    """CSP block with 2 convolutions whose every bottleneck output is concatenated (YOLOv8)."""

    channel_rule = "width"
    repeat_arg = True

    def __init__(self, c1, c2, n=1, shortcut=False, g=1, e=0.5):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, g, k=(3, 3), e=1.0) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class C3k2(C2f):
    """YOLO11's C2f: each of its n blocks a bottleneck with 3x3 kernels (half width), or with `c3k` a C3k of two.

    Ultralytics builds the m, l and x scales with `c3k` whatever the row says (`scale_args`). A model with this block
    has YOLO11's head: depthwise convolutions in the class branch of an anchor-free head (`dw_head`)."""

    scale_args = {"mlx": (3, True)}
    dw_head = True

    def __init__(self, c1, c2, n=1, c3k=False, e=0.5, attn=False, g=1, shortcut=True):
        if attn:  # the argument keeps the official positions; its attention variant is YOLO26's, not built here
            raise ValueError("C3k2 with attn=True (YOLO26) is not available")
        super().__init__(c1, c2, n, shortcut, g, e)
        self.m = nn.ModuleList(C3k(self.c, self.c, 2, shortcut, g) if c3k else
                               Bottleneck(self.c, self.c, shortcut, g, k=(3, 3), e=0.5) for _ in range(n))


class SPP(nn.Module):
    """Spatial pyramid pooling (YOLOv3-SPP): the input beside its k x k max-pools, for each k."""

    channel_rule = "width"

    def __init__(self, c1, c2, k=(5, 9, 13)):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * (len(k) + 1), c2, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(kernel_size=x, stride=1, padding=x // 2) for x in k)

    def forward(self, x):
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [m(x) for m in self.m], 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained k x k max-pools equal SPP's k, 2k-1, 3k-2 pools."""

    channel_rule = "width"

    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Concat(nn.Module):
    channel_rule = "concat"

    def __init__(self, dimension=1):
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)


class DFL(nn.Module):
    """Distribution focal loss integral: expected value of a softmax over reg_max bins, as a fixed 1x1 conv."""

    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        # the bins made on the CPU whatever the default device: on the meta device (checkpoints' size check) arange
        # runs through torch._refs, which imports torch._dynamo, most of a second at every model load
        self.conv.weight.data.copy_(torch.arange(c1, dtype=torch.float, device="cpu").view(1, c1, 1, 1))
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape  # (batch, 4 * c1, anchors)
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class Proto(nn.Module):
    """Mask prototypes at stride 4 from the P3 features; v5 upsamples by nearest, v8 by a transposed conv."""

    def __init__(self, c1, c_=256, c2=32, transpose=False):
        super().__init__()
        self.cv1 = Conv(c1, c_, k=3)
        if transpose:
            self.upsample = nn.ConvTranspose2d(c_, c_, 2, 2, 0, bias=True)
        else:
            self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.cv2 = Conv(c_, c_, k=3)
        self.cv3 = Conv(c_, c2)

    def forward(self, x):
        return self.cv3(self.cv2(self.upsample(self.cv1(x))))


class MP(nn.Module):
    """Stride-k max-pool (YOLOv7 downsampling branch)."""

    def __init__(self, k=2):
        super().__init__()
        self.m = nn.MaxPool2d(kernel_size=k, stride=k)

    def forward(self, x):
        return self.m(x)


class SP(nn.Module):
    """Size-preserving max-pool (YOLOv7-tiny SPP branches)."""

    def __init__(self, k=3, s=1):
        super().__init__()
        self.m = nn.MaxPool2d(kernel_size=k, stride=s, padding=k // 2)

    def forward(self, x):
        return self.m(x)


class ReOrg(nn.Module):
    """Space to depth (YOLOv7 P6 stem): each 2x2 pixel block becomes 4 channels, in the official order (even rows and
    columns, odd rows, odd columns, both odd), so the first convolution sees full resolution at half the size."""

    channel_rule = "space_to_depth"

    def forward(self, x):
        return torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1)


class DownC(nn.Module):
    """YOLOv7 P6 downsampling by k: half the output channels from a 1x1 then a stride-k 3x3 convolution, half from
    a k x k max-pool then a 1x1 convolution, concatenated. `n` is the official parser's repeat slot, unused."""

    channel_rule = "width"
    repeat_arg = True

    def __init__(self, c1, c2, n=1, k=2):
        super().__init__()
        self.cv1 = Conv(c1, c1, 1, 1)
        self.cv2 = Conv(c1, c2 // 2, 3, k)
        self.cv3 = Conv(c1, c2 // 2, 1, 1)
        self.mp = nn.MaxPool2d(kernel_size=k, stride=k)

    def forward(self, x):
        return torch.cat((self.cv2(self.cv1(x)), self.cv3(self.mp(x))), 1)


class Shortcut(nn.Module):
    """The sum of two equal-shaped inputs (YOLOv7-E6E, merging its two ELAN branches). The YAML's argument (a
    dimension, in the official rows) changes nothing."""

    channel_rule = "add"

    def __init__(self, dimension=0):
        super().__init__()

    def forward(self, x):
        return x[0] + x[1]


class SPPCSPC(nn.Module):
    """CSP spatial pyramid pooling (YOLOv7)."""

    channel_rule = "width"

    def __init__(self, c1, c2, n=1, shortcut=False, g=1, e=0.5, k=(5, 9, 13)):
        super().__init__()
        c_ = int(2 * c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(c_, c_, 3, 1)
        self.cv4 = Conv(c_, c_, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(kernel_size=x, stride=1, padding=x // 2) for x in k)
        self.cv5 = Conv(4 * c_, c_, 1, 1)
        self.cv6 = Conv(c_, c_, 3, 1)
        self.cv7 = Conv(2 * c_, c2, 1, 1)

    def forward(self, x):
        x1 = self.cv4(self.cv3(self.cv1(x)))
        y1 = self.cv6(self.cv5(torch.cat([x1] + [m(x1) for m in self.m], 1)))
        return self.cv7(torch.cat((y1, self.cv2(x)), 1))


class RepConv(nn.Module):
    """RepVGG block: 3x3+BN, 1x1+BN and (when shapes allow) identity BN branches, summed, then activated.

    `fuse()` re-parameterises the three branches into the single biased conv `rbr_reparam`.
    """

    channel_rule = "width"

    def __init__(self, c1, c2, k=3, s=1, p=None, g=1, act=True):
        super().__init__()
        assert k == 3 and autopad(k, p) == 1, "RepConv re-parameterisation assumes a 3x3 kernel with padding 1"
        self.groups, self.in_channels = g, c1
        self.act = make_activation(act)
        self.rbr_identity = batchnorm(c1) if c2 == c1 and s == 1 else None
        self.rbr_dense = nn.Sequential(nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False), batchnorm(c2))
        self.rbr_1x1 = nn.Sequential(nn.Conv2d(c1, c2, 1, s, 0, groups=g, bias=False), batchnorm(c2))

    def forward(self, x):
        identity = 0 if self.rbr_identity is None else self.rbr_identity(x)
        return self.act(self.rbr_dense(x) + self.rbr_1x1(x) + identity)

    def forward_fuse(self, x):
        return self.act(self.rbr_reparam(x))

    @torch.no_grad()
    def _equivalent_kernel_bias(self):
        w3, b3 = fold_bn(self.rbr_dense[0].weight, None, self.rbr_dense[1])
        w1, b1 = fold_bn(self.rbr_1x1[0].weight, None, self.rbr_1x1[1])
        weight, bias = w3 + F.pad(w1, [1, 1, 1, 1]), b3 + b1
        if self.rbr_identity is not None:
            per_group = self.in_channels // self.groups
            eye = torch.zeros_like(w3)
            idx = torch.arange(self.in_channels, device=eye.device)
            eye[idx, idx % per_group, 1, 1] = 1.0  # each output channel passes its own input channel through
            wi, bi = fold_bn(eye, None, self.rbr_identity)
            weight, bias = weight + wi, bias + bi
        return weight, bias

    def fuse(self):
        if "rbr_dense" not in self._modules:
            return  # already fused
        weight, bias = self._equivalent_kernel_bias()
        dense = self.rbr_dense[0]
        self.rbr_reparam = nn.Conv2d(
            dense.in_channels, dense.out_channels, 3, dense.stride, 1, groups=dense.groups, bias=True
        ).to(device=weight.device, dtype=weight.dtype)
        self.rbr_reparam.weight.data.copy_(weight)
        self.rbr_reparam.bias.data.copy_(bias)
        self.rbr_reparam.requires_grad_(False)
        del self.rbr_dense, self.rbr_1x1, self.rbr_identity
        self.forward = self.forward_fuse


class ImplicitA(nn.Module):
    """Learned per-channel offset added to the input (YOLOv7 implicit knowledge)."""

    def __init__(self, channel, mean=0.0, std=0.02):
        super().__init__()
        self.implicit = nn.Parameter(torch.zeros(1, channel, 1, 1))
        nn.init.normal_(self.implicit, mean=mean, std=std)

    def forward(self, x):
        return self.implicit + x


class ImplicitM(nn.Module):
    """Learned per-channel factor multiplied with the input (YOLOv7 implicit knowledge)."""

    def __init__(self, channel, mean=1.0, std=0.02):
        super().__init__()
        self.implicit = nn.Parameter(torch.ones(1, channel, 1, 1))
        nn.init.normal_(self.implicit, mean=mean, std=std)

    def forward(self, x):
        return self.implicit * x
