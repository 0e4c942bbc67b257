"""Blocks of models/common.py against independent arithmetic."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from models_testutil import randomise_bn

from models.common import (
    C3,
    DFL,
    MP,
    SP,
    SPPCSPC,
    SPPF,
    Bottleneck,
    C2f,
    Concat,
    Conv,
    ImplicitA,
    ImplicitM,
    Proto,
    RepConv,
    autopad,
    fuse_conv_and_bn,
)


def test_autopad():
    assert autopad(3) == 1 and autopad(1) == 0 and autopad(6, 2) == 2
    assert autopad(3, d=2) == 2  # dilated 3x3 spans 5 pixels
    assert autopad((3, 5)) == [1, 2]


def test_conv_matches_manual_conv_bn_silu():
    torch.manual_seed(0)
    m = randomise_bn(Conv(4, 8, 3, 2)).eval()
    assert (m.bn.eps, m.bn.momentum) == (0.001, 0.03)
    assert m.conv.bias is None and isinstance(m.act, nn.SiLU)
    x = torch.randn(2, 4, 10, 10)
    bn = m.bn
    z = F.conv2d(x, m.conv.weight, stride=2, padding=1)
    z = (z - bn.running_mean.view(1, -1, 1, 1)) / torch.sqrt(bn.running_var.view(1, -1, 1, 1) + 0.001)
    z = z * bn.weight.view(1, -1, 1, 1) + bn.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(m(x), z * torch.sigmoid(z))


def test_conv_activation_argument():
    assert isinstance(Conv(3, 4, act=False).act, nn.Identity)
    leaky = nn.LeakyReLU(0.1)
    assert Conv(3, 4, act=leaky).act is leaky


def test_conv_fuse_keeps_output_and_switches_forward():
    torch.manual_seed(0)
    m = randomise_bn(Conv(4, 6, 3)).eval()
    x = torch.randn(1, 4, 8, 8)
    ref = m(x)
    m.fuse()
    assert not hasattr(m, "bn") and m.conv.bias is not None
    torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=1e-5)
    m.fuse()  # idempotent
    torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=1e-5)


def test_fuse_conv_and_bn_with_conv_bias():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(3, 5, 3, padding=1, bias=True), randomise_bn(nn.BatchNorm2d(5)).eval()
    x = torch.randn(2, 3, 7, 7)
    torch.testing.assert_close(fuse_conv_and_bn(conv, bn)(x), bn(conv(x)), atol=1e-5, rtol=1e-5)


def test_bottleneck_residual_only_when_shapes_allow():
    torch.manual_seed(0)
    x = torch.randn(1, 8, 6, 6)
    m = Bottleneck(8, 8).eval()
    torch.testing.assert_close(m(x), x + m.cv2(m.cv1(x)))
    assert not Bottleneck(8, 16).add and not Bottleneck(8, 8, shortcut=False).add
    assert Bottleneck(8, 8).cv1.conv.kernel_size == (1, 1)
    assert Bottleneck(8, 8, k=(3, 3)).cv1.conv.kernel_size == (3, 3)


def test_c3_and_c2f_structure():
    x = torch.randn(1, 16, 8, 8)
    c3 = C3(16, 32, n=2).eval()
    assert c3(x).shape == (1, 32, 8, 8) and len(c3.m) == 2
    assert c3.m[0].cv1.conv.kernel_size == (1, 1) and c3.m[0].cv2.conv.kernel_size == (3, 3)
    c2f = C2f(16, 32, n=3, shortcut=True).eval()
    assert c2f(x).shape == (1, 32, 8, 8)
    assert c2f.cv2.conv.in_channels == (2 + 3) * 16  # every bottleneck output is concatenated
    assert c2f.m[0].cv1.conv.kernel_size == (3, 3) and c2f.m[0].cv2.conv.kernel_size == (3, 3)
    y = list(c2f.cv1(x).chunk(2, 1))
    for b in c2f.m:
        y.append(b(y[-1]))
    torch.testing.assert_close(c2f(x), c2f.cv2(torch.cat(y, 1)))


def test_sppf_equals_spp_with_growing_pools():
    torch.manual_seed(0)
    m = SPPF(8, 8, k=5).eval()
    x = torch.randn(1, 8, 12, 12)
    a = m.cv1(x)
    pools = [F.max_pool2d(a, k, 1, k // 2) for k in (5, 9, 13)]
    torch.testing.assert_close(m(x), m.cv2(torch.cat([a, *pools], 1)))


def test_pools_and_concat():
    x = torch.randn(1, 3, 8, 8)
    assert MP()(x).shape == (1, 3, 4, 4)
    assert SP(5)(x).shape == (1, 3, 8, 8)
    assert Concat(1)([x, x]).shape == (1, 6, 8, 8)


def test_sppcspc_shape_and_keys():
    m = SPPCSPC(32, 16).eval()
    assert m(torch.randn(1, 32, 16, 16)).shape == (1, 16, 16, 16)
    assert {f"cv{i}" for i in range(1, 8)} <= set(dict(m.named_children()))


def test_dfl_is_the_expected_bin():
    torch.manual_seed(0)
    b, a, c1 = 2, 7, 16
    x = torch.randn(b, 4 * c1, a)
    probs = x.view(b, 4, c1, a).softmax(2)
    expected = (probs * torch.arange(c1, dtype=torch.float).view(1, 1, c1, 1)).sum(2)
    torch.testing.assert_close(DFL(c1)(x), expected)
    assert not DFL().conv.weight.requires_grad


@pytest.mark.parametrize("transpose", [False, True])
def test_proto(transpose):
    m = Proto(16, 8, 4, transpose=transpose)
    assert set(dict(m.named_children())) == {"cv1", "upsample", "cv2", "cv3"}
    assert isinstance(m.upsample, nn.ConvTranspose2d if transpose else nn.Upsample)
    assert m(torch.randn(1, 16, 5, 6)).shape == (1, 4, 10, 12)


@pytest.mark.parametrize("c1,c2,s", [(8, 8, 1), (8, 16, 1), (8, 16, 2)])
def test_repconv_fuse_equals_branches(c1, c2, s):
    torch.manual_seed(0)
    m = randomise_bn(RepConv(c1, c2, 3, s)).eval()
    assert (m.rbr_identity is not None) == (c1 == c2 and s == 1)
    x = torch.randn(2, c1, 9, 9)
    z = m.rbr_dense(x) + m.rbr_1x1(x) + (m.rbr_identity(x) if m.rbr_identity is not None else 0)
    ref = m(x)
    torch.testing.assert_close(ref, F.silu(z))
    m.fuse()
    assert set(dict(m.named_children())) == {"act", "rbr_reparam"}
    torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=1e-4)


def test_implicit_layers():
    torch.manual_seed(0)
    x = torch.randn(1, 4, 3, 3)
    a, m = ImplicitA(4), ImplicitM(4)
    assert a.implicit.shape == (1, 4, 1, 1)
    torch.testing.assert_close(a(x), x + a.implicit)
    torch.testing.assert_close(m(x), x * m.implicit)
    assert abs(float(m.implicit.detach().mean()) - 1) < 0.1 and abs(float(a.implicit.detach().mean())) < 0.1
