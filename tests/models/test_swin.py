"""models/swin.py: Swin V2's coordinates and position bias by hand, what windows see (shifted windows stay within
their regions, padding is never attended to), against attention written out over the real pixels only."""

import math

import torch
import torch.nn.functional as F
from models_testutil import seeded_params

from models.swin import C3STR, SwinV2Layer, WindowAttentionV2, log_coords, swin_heads


def test_log_spaced_coordinates():
    """Offsets normalised to +-8 by the configured window, then sign(x) log2(1 + |x|) / log2(8)."""
    t = log_coords(8, 8)
    assert t.shape == (15, 15, 2)
    far = math.log2(1 + 7 * 8 / 7) / 3
    torch.testing.assert_close(t[0, 0], torch.tensor([-far, -far]))
    torch.testing.assert_close(t[7, 14], torch.tensor([0.0, far]))
    torch.testing.assert_close(log_coords(3, 8)[2, 1], torch.tensor([0.0, -math.log2(1 + 8 / 7) / 3]))  # (0, -1)


def test_position_bias_by_hand():
    """bias[h, i, j] = 16 sigmoid(MLP(offset of pixel i from pixel j)[h]) in a 2 x 2 window."""
    a = seeded_params(WindowAttentionV2(8, 2, window_size=8), scale=0.3)
    bias = a.position_bias(2, torch.zeros(1))
    table = a.cpb_mlp(log_coords(2, 8))  # (3, 3, heads), indexed by offset + 1
    pixels = [(0, 0), (0, 1), (1, 0), (1, 1)]
    for h in range(2):
        for i, (yi, xi) in enumerate(pixels):
            for j, (yj, xj) in enumerate(pixels):
                expected = 16 * torch.sigmoid(table[yi - yj + 1, xi - xj + 1, h])
                torch.testing.assert_close(bias[h, i, j], expected)


def _attention_over(layer, tokens, coords):
    """Swin V2 attention among `tokens` (n, C) at window coordinates `coords`, written out: cosine similarity times
    the capped temperature, plus the position bias of each pair's offset, softmax, values, projection."""
    a = layer.attn
    heads, c = a.num_heads, tokens.shape[1]
    qkv = F.linear(tokens, a.qkv.weight, torch.cat((a.q_bias, torch.zeros_like(a.v_bias), a.v_bias)))
    q, k, v = (t.view(-1, heads, c // heads).transpose(0, 1) for t in qkv.split(c, 1))
    ws = a.window_size
    table = a.cpb_mlp(log_coords(ws, ws))
    out = []
    for h in range(heads):
        logits = F.normalize(q[h], dim=-1) @ F.normalize(k[h], dim=-1).T
        logits = logits * a.logit_scale[h].clamp(max=math.log(100)).exp()
        bias = torch.stack([torch.stack([16 * torch.sigmoid(table[yi - yj + ws - 1, xi - xj + ws - 1, h])
                                         for yj, xj in coords]) for yi, xi in coords])
        out.append((logits + bias).softmax(-1) @ v[h])
    return a.proj(torch.stack(out, 1).reshape(len(tokens), c))


def test_padding_is_never_attended_to():
    """A 5 x 6 map in windows of 6: one window padded with a row; each real pixel's output is attention over the 30
    real pixels only, then the post-norm residual and MLP."""
    layer = seeded_params(SwinV2Layer(8, 2, window_size=6), scale=0.3).eval()
    x = torch.randn(1, 8, 5, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = layer(x)
        tokens = x[0].permute(1, 2, 0).reshape(30, 8)
        coords = [(i, j) for i in range(5) for j in range(6)]
        y = tokens + layer.norm1(_attention_over(layer, tokens, coords))
        y = y + layer.norm2(layer.mlp(y))
    torch.testing.assert_close(got[0].permute(1, 2, 0).reshape(30, 8), y, atol=1e-5, rtol=1e-4)


def test_windows_and_shifted_windows_stay_local():
    """On a 16 x 16 map in windows of 8, a change at pixel (0, 0) reaches only its own window; shifted by 4, the
    corner window that wraps around holds (0, 0) with pixels of the far edges, and the mask keeps it to the 4 x 4
    region it came from."""
    x = torch.randn(1, 8, 16, 16, generator=torch.Generator().manual_seed(2))
    x2 = x.clone()
    x2[0, :, 0, 0] += 1.0
    for shifted, region in ((False, 8), (True, 4)):
        layer = seeded_params(SwinV2Layer(8, 2, window_size=8, shifted=shifted), scale=0.3).eval()
        with torch.no_grad():
            changed = (layer(x) - layer(x2)).abs().amax(1)[0] > 1e-6
        inside = torch.zeros(16, 16, dtype=torch.bool)
        inside[:region, :region] = True
        assert changed[inside].sum() > 1 and not changed[~inside].any(), shifted


def test_c3str_shape_gradients_and_heads():
    assert [swin_heads(c) for c in (8, 64, 96, 112, 128)] == [1, 2, 3, 2, 4]
    torch.manual_seed(0)
    m = C3STR(16, 32, n=2).train()  # the second layer shifted
    assert [layer.shifted for layer in m.m] == [False, True]
    x = torch.randn(2, 16, 7, 9, requires_grad=True)  # not a multiple of any window
    y = m(x)
    assert y.shape == (2, 32, 7, 9)
    y.square().mean().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
