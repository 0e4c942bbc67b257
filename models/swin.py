"""Swin Transformer V2 blocks (Liu et al. 2022) as a YOLO block: C3STR, a C3 whose bottlenecks are Swin V2 layers.

A layer attends within non-overlapping windows of `window_size` pixels; every second layer shifts the windows by half
a window so that information crosses window borders. V2's changes over V1, all here: scaled cosine attention
(cosine similarity of queries and keys times a learned per-head temperature, capped at 100), a continuous position
bias (a small MLP of the log-spaced relative coordinates, so any window size has one) and residual post-norm
(LayerNorm on each branch's output before it is added). Windows never exceed the map: a map smaller than the window
is one window, and a map that is not a multiple of it is padded, the padded pixels masked out of every attention.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.common import C3

MASKED = -100.0  # added to the logits of pairs that must not attend (after softmax: e^-100 of the others)


def _windows(t, ws):
    """(B, H, W, C) -> (B * windows, ws * ws, C), windows in row-major order."""
    b, h, w, c = t.shape
    t = t.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return t.reshape(-1, ws * ws, c)


def _unwindows(t, ws, b, h, w):
    """Inverse of `_windows`."""
    c = t.shape[-1]
    t = t.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return t.reshape(b, h, w, c)


def window_mask(h, w, hp, wp, ws, shift, device):
    """(windows, ws*ws, ws*ws) of 0 and MASKED for an h x w map padded to hp x wp and rolled by -shift: pixels attend
    only to pixels of their own region (shifted windows join parts of the map that are not neighbours) and never to
    padding. None when nothing needs masking. Built by comparisons, not slice assignments: an exporter cannot take
    the empty slices of a map that needs no padding on one side."""
    if not shift and (hp, wp) == (h, w):
        return None
    rows, cols = torch.arange(hp, device=device), torch.arange(wp, device=device)

    def region(i, n):  # 0, 1, 2: the parts of a rolled axis that came from different places
        return (i >= n - ws).long() + (i >= n - shift).long() if shift else torch.zeros_like(i)

    label = 3 * region(rows, hp)[:, None] + region(cols, wp)[None, :]
    pad = ((rows >= h)[:, None] | (cols >= w)[None, :]).roll((-shift, -shift), (0, 1))
    label = torch.where(pad, -1, label)
    lw = _windows(label.view(1, hp, wp, 1), ws)[..., 0]  # (windows, ws*ws)
    return torch.where(lw[:, :, None] != lw[:, None, :], MASKED, 0.0)


def log_coords(ws, scale_ws):
    """Relative offsets (-(ws-1)..ws-1 on each axis) as Swin V2 feeds its position MLP: normalised by the
    configured window (scale_ws - 1) to +-8, then sign(x) log2(1 + |x|) / log2(8)."""
    r = torch.arange(-(ws - 1), ws, dtype=torch.float32)
    table = torch.stack(torch.meshgrid(r, r, indexing="ij"), -1) * (8 / max(scale_ws - 1, 1))
    return torch.sign(table) * torch.log2(table.abs() + 1) / math.log2(8)


class WindowAttentionV2(nn.Module):
    """Multi-head scaled cosine attention within windows, plus the continuous position bias."""

    def __init__(self, dim, num_heads, window_size):
        super().__init__()
        self.num_heads, self.window_size = num_heads, window_size
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(num_heads, 1, 1)))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 512), nn.ReLU(inplace=True), nn.Linear(512, num_heads, bias=False))
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim))  # V2: biases for queries and values, none for keys
        self.v_bias = nn.Parameter(torch.zeros(dim))
        self.proj = nn.Linear(dim, dim)

    def position_bias(self, ws, like):
        """(heads, ws*ws, ws*ws): 16 sigmoid(MLP(log-spaced offset)) for every pair of pixels in a window."""
        table = self.cpb_mlp(log_coords(ws, self.window_size).to(like).view(-1, 2))  # ((2ws-1)^2, heads)
        idx = torch.arange(ws, device=like.device)
        yy, xx = torch.meshgrid(idx, idx, indexing="ij")
        yy, xx = yy.flatten(), xx.flatten()
        index = (yy[:, None] - yy[None, :] + ws - 1) * (2 * ws - 1) + (xx[:, None] - xx[None, :] + ws - 1)
        return 16 * torch.sigmoid(table[index].permute(2, 0, 1))

    def forward(self, x, ws, mask=None):
        """x (B * windows, ws*ws, C); mask (windows, ws*ws, ws*ws) or None."""
        bw, n, c = x.shape
        bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias), self.v_bias))
        q, k, v = F.linear(x, self.qkv.weight, bias).view(bw, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(self.logit_scale, max=math.log(100.0)).exp() + self.position_bias(ws, x)
        if mask is not None:
            nw = mask.shape[0]
            attn = (attn.view(bw // nw, nw, self.num_heads, n, n) + mask[None, :, None]).view(bw, self.num_heads, n, n)
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(bw, n, c))


class SwinV2Layer(nn.Module):
    """(B, C, H, W) -> same: x + LN(window attention(x)), then x + LN(MLP(x)), MLP of 4x width with GELU."""

    def __init__(self, dim, num_heads, window_size=8, shifted=False, mlp_ratio=4.0):
        super().__init__()
        self.window_size, self.shifted = window_size, shifted
        self.attn = WindowAttentionV2(dim, num_heads, window_size)
        self.norm1 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x):
        b, c = x.shape[:2]
        h, w = int(x.shape[2]), int(x.shape[3])  # sizes as numbers: the windows are chosen in Python
        ws = min(self.window_size, max(h, w))
        hp, wp = math.ceil(h / ws) * ws, math.ceil(w / ws) * ws
        shift = ws // 2 if self.shifted and (hp > ws or wp > ws) else 0  # one window: nothing to shift across
        tokens = x.permute(0, 2, 3, 1)
        t = F.pad(tokens, (0, 0, 0, wp - w, 0, hp - h))
        if shift:
            t = t.roll((-shift, -shift), (1, 2))
        y = self.attn(_windows(t, ws), ws, window_mask(h, w, hp, wp, ws, shift, x.device))
        y = _unwindows(y, ws, b, hp, wp)
        if shift:
            y = y.roll((shift, shift), (1, 2))
        tokens = tokens + self.norm1(y[:, :h, :w])
        tokens = tokens + self.norm2(self.mlp(tokens))
        return tokens.permute(0, 3, 1, 2).contiguous()


def swin_heads(c, width=32):
    """Heads of about `width` channels that divide c."""
    heads = max(c // width, 1)
    while c % heads:
        heads -= 1
    return heads


class C3STR(C3):
    """C3 whose bottlenecks are n Swin V2 layers (windows of 8, every second one shifted), heads of ~32 channels.

    `dynamic_export = False`: the windows, padding and shift are chosen from the map's size in Python, which a traced
    graph keeps as constants, so an export is valid at its own input size only (engine/exporter.py refuses
    --dynamic)."""

    dynamic_export = False

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5, window_size=8):
        super().__init__(c1, c2, n, shortcut, g, e)
        c_ = int(c2 * e)
        self.m = nn.Sequential(*(SwinV2Layer(c_, swin_heads(c_), window_size, shifted=i % 2 == 1) for i in range(n)))
