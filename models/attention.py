"""Attention blocks: YOLOv5's transformer (C3TR), YOLO11's position-sensitive attention (C2PSA), and the attention
series the YOLO research projects add to any layer (SE, CBAM, ECA, CoordAtt, SimAM).

Declared for `models.model_yaml.parse_model` as the blocks of models/common.py are. The series keep the channels
they are given: a row `[-1, 1, SE, [1024]]` names the width of the layer before it (scaled like every row), and a
row whose width differs from its input's is refused, naming it. Attribute names of C3TR and C2PSA follow the
official implementations, so official state_dicts load by key.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import C3, Conv, batchnorm, fuse_conv_and_bn


def _same_width(c1, c2, name):
    if c1 != c2:
        raise ValueError(f"{name} keeps the channels of its input ({c1}), the row asks for {c2}")


# ------------------------------------------------------------------------------------------------ YOLOv5 transformer
class TransformerLayer(nn.Module):
    """Multi-head self-attention over the tokens and a two-layer linear map, each with a residual (no LayerNorm, as
    the official layer)."""

    def __init__(self, c, num_heads):
        super().__init__()
        self.q = nn.Linear(c, c, bias=False)
        self.k = nn.Linear(c, c, bias=False)
        self.v = nn.Linear(c, c, bias=False)
        self.ma = nn.MultiheadAttention(embed_dim=c, num_heads=num_heads)
        self.fc1 = nn.Linear(c, c, bias=False)
        self.fc2 = nn.Linear(c, c, bias=False)

    def forward(self, x):  # x (tokens, batch, c)
        x = self.ma(self.q(x), self.k(x), self.v(x))[0] + x
        return self.fc2(self.fc1(x)) + x


class TransformerBlock(nn.Module):
    """Feature map -> tokens (one per pixel) plus a learned linear position embedding -> transformer layers -> map."""

    def __init__(self, c1, c2, num_heads, num_layers):
        super().__init__()
        self.conv = Conv(c1, c2) if c1 != c2 else None
        self.linear = nn.Linear(c2, c2)
        self.tr = nn.Sequential(*(TransformerLayer(c2, num_heads) for _ in range(num_layers)))
        self.c2 = c2

    def forward(self, x):
        if self.conv is not None:
            x = self.conv(x)
        b, _, h, w = x.shape
        p = x.flatten(2).permute(2, 0, 1)
        return self.tr(p + self.linear(p)).permute(1, 2, 0).reshape(b, self.c2, h, w)


class C3TR(C3):
    """C3 whose bottlenecks are one transformer block of n layers, 4 heads (yolov5s-transformer.yaml)."""

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__(c1, c2, n, shortcut, g, e)
        c_ = int(c2 * e)
        self.m = TransformerBlock(c_, c_, 4, n)


# ------------------------------------------------------------------------------------------------ YOLO11 PSA
class Attention(nn.Module):
    """Multi-head self-attention over the pixels of a map, from 1x1 convolutions (keys and queries at `attn_ratio` of
    a head's width), plus a 3x3 depthwise positional encoding of the values."""

    def __init__(self, dim, num_heads=8, attn_ratio=0.5):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim**-0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, g=dim, act=False)

    def forward(self, x):
        b, c, h, w = x.shape
        qkv = self.qkv(x).view(b, self.num_heads, 2 * self.key_dim + self.head_dim, h * w)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q * self.scale).transpose(-2, -1) @ k).softmax(dim=-1)  # (b, heads, pixels, pixels)
        out = (v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
        return self.proj(out)


class PSABlock(nn.Module):
    """Attention, then a two-convolution feed-forward, each with a residual."""

    def __init__(self, c, attn_ratio=0.5, num_heads=4, shortcut=True):
        super().__init__()
        self.attn = Attention(c, attn_ratio=attn_ratio, num_heads=num_heads)
        self.ffn = nn.Sequential(Conv(c, c * 2, 1), Conv(c * 2, c, 1, act=False))
        self.add = shortcut

    def forward(self, x):
        x = x + self.attn(x) if self.add else self.attn(x)
        return x + self.ffn(x) if self.add else self.ffn(x)


class C2PSA(nn.Module):
    """YOLO11's last backbone block: half the channels through n PSA blocks (a head per 64 channels), half around."""

    channel_rule = "width"
    repeat_arg = True

    def __init__(self, c1, c2, n=1, e=0.5):
        super().__init__()
        _same_width(c1, c2, "C2PSA")
        self.c = int(c1 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv(2 * self.c, c1, 1)
        self.m = nn.Sequential(*(PSABlock(self.c, attn_ratio=0.5, num_heads=max(self.c // 64, 1)) for _ in range(n)))

    def forward(self, x):
        a, b = self.cv1(x).split((self.c, self.c), dim=1)
        return self.cv2(torch.cat((a, self.m(b)), 1))


# ------------------------------------------------------------------------------------------------ the attention series
class SE(nn.Module):
    """Squeeze-and-excitation (Hu et al. 2018): x * sigmoid(W2 relu(W1 mean_hw(x) + b1) + b2), W1 reducing the
    channels by `r`."""

    channel_rule = "width"

    def __init__(self, c1, c2, r=16):
        super().__init__()
        _same_width(c1, c2, "SE")
        self.fc1 = nn.Linear(c1, max(c1 // r, 1))
        self.fc2 = nn.Linear(max(c1 // r, 1), c1)

    def forward(self, x):
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(x.mean((2, 3))))))
        return x * s[:, :, None, None]


class CBAM(nn.Module):
    """Convolutional block attention (Woo et al. 2018): channel attention sigmoid(MLP(avg) + MLP(max)) with one
    MLP for both poolings, then spatial attention sigmoid(conv_k([mean_c; max_c]))."""

    channel_rule = "width"

    def __init__(self, c1, c2, r=16, k=7):
        super().__init__()
        _same_width(c1, c2, "CBAM")
        self.fc1 = nn.Conv2d(c1, max(c1 // r, 1), 1)
        self.fc2 = nn.Conv2d(max(c1 // r, 1), c1, 1)
        self.spatial = nn.Conv2d(2, 1, k, padding=k // 2, bias=False)

    def forward(self, x):
        def mlp(t):
            return self.fc2(F.relu(self.fc1(t)))

        x = x * torch.sigmoid(mlp(x.mean((2, 3), keepdim=True)) + mlp(x.amax((2, 3), keepdim=True)))
        pooled = torch.cat((x.mean(1, keepdim=True), x.amax(1, keepdim=True)), 1)
        return x * torch.sigmoid(self.spatial(pooled))


def eca_kernel(c, gamma=2, b=1):
    """ECA's adaptive kernel size: |log2(c) / gamma + b / gamma| rounded to the odd number at or above it."""
    t = int(abs(math.log2(c) / gamma + b / gamma))
    return t if t % 2 else t + 1


class ECA(nn.Module):
    """Efficient channel attention (Wang et al. 2020): x * sigmoid(conv1d_k(mean_hw(x))) along the channels, with
    the kernel size adapted to the channel count (`eca_kernel`) unless given."""

    channel_rule = "width"

    def __init__(self, c1, c2, k=None):
        super().__init__()
        _same_width(c1, c2, "ECA")
        k = k or eca_kernel(c1)
        self.conv = nn.Conv1d(1, 1, k, padding=k // 2, bias=False)

    def forward(self, x):
        s = torch.sigmoid(self.conv(x.mean((2, 3))[:, None, :]))  # (b, 1, c)
        return x * s[:, 0, :, None, None]


class CoordAtt(nn.Module):
    """Coordinate attention (Hou et al. 2021): the map averaged along each axis, the two profiles encoded together
    (1x1 conv to max(8, c / r) channels, BatchNorm, hard swish), then one sigmoid gate per row and per column."""

    channel_rule = "width"

    def __init__(self, c1, c2, r=32):
        super().__init__()
        _same_width(c1, c2, "CoordAtt")
        mip = max(8, c1 // r)
        self.conv1 = nn.Conv2d(c1, mip, 1)
        self.bn1 = batchnorm(mip)
        self.act = nn.Hardswish()
        self.conv_h = nn.Conv2d(mip, c1, 1)
        self.conv_w = nn.Conv2d(mip, c1, 1)

    def fuse(self):
        """Fold bn1 into conv1 (inference)."""
        if isinstance(self.bn1, nn.BatchNorm2d):
            self.conv1 = fuse_conv_and_bn(self.conv1, self.bn1)
            self.bn1 = nn.Identity()

    def forward(self, x):
        h, w = x.shape[2:]
        profiles = torch.cat((x.mean(3, keepdim=True), x.mean(2, keepdim=True).transpose(2, 3)), 2)  # (b, c, h+w, 1)
        y_h, y_w = self.act(self.bn1(self.conv1(profiles))).split((h, w), 2)
        return x * torch.sigmoid(self.conv_h(y_h)) * torch.sigmoid(self.conv_w(y_w.transpose(2, 3)))


class SimAM(nn.Module):
    """Parameter-free attention (Yang et al. 2021): each value gated by sigmoid of its inverse energy
    (x - mean)^2 / (4 (var + lambda)) + 0.5, the mean and variance (over n - 1) of its channel's map."""

    channel_rule = "width"

    def __init__(self, c1, c2, e_lambda=1e-4):
        super().__init__()
        _same_width(c1, c2, "SimAM")
        self.e_lambda = e_lambda

    def forward(self, x):
        # n counted by a tensor, not from x.shape in Python: an exported graph then divides by its input's n
        n = torch.ones_like(x[:1, :1]).sum((2, 3), keepdim=True) - 1
        d = (x - x.mean((2, 3), keepdim=True)).pow(2)
        v = d.sum((2, 3), keepdim=True) / n.clamp(min=1)
        return x * torch.sigmoid(d / (4 * (v + self.e_lambda)) + 0.5)
