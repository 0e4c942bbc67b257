"""models/attention.py: the attention series against their papers' formulas written out element by element on
hand-sized tensors, and every block's shape and gradients."""

import math

import pytest
import torch
from models_testutil import randomise_bn, seeded_params

from models.attention import C2PSA, C3TR, CBAM, ECA, SE, CoordAtt, SimAM, eca_kernel
from models.yolo import DetectionModel, check_cost, yaml_model_load
from utils.errors import BadModelYaml


def sigmoid(v):
    return 1 / (1 + math.exp(-v))


X = torch.randn(2, 4, 3, 5, generator=torch.Generator().manual_seed(1))


def test_se_formula():
    m = seeded_params(SE(4, 4, r=2)).eval()
    out = m(X)
    for b in range(2):
        z = [X[b, c].mean().item() for c in range(4)]
        hidden = [max(0.0, sum(m.fc1.weight[j, c].item() * z[c] for c in range(4)) + m.fc1.bias[j].item())
                  for j in range(2)]
        for c in range(4):
            s = sigmoid(sum(m.fc2.weight[c, j].item() * hidden[j] for j in range(2)) + m.fc2.bias[c].item())
            torch.testing.assert_close(out[b, c], X[b, c] * s)


def test_cbam_formula():
    m = seeded_params(CBAM(4, 4, r=2, k=3)).eval()
    out = m(X)
    w1, b1, w2, b2 = (t.detach()[..., 0, 0] if t.dim() == 4 else t.detach()
                      for t in (m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias))
    k = m.spatial.weight.detach()[0]  # (2, 3, 3)
    for b in range(2):
        def mlp(v):
            return [sum(w2[c, j] * max(0.0, sum(w1[j, i] * v[i] for i in range(4)) + b1[j]) for j in range(2))
                    + b2[c] for c in range(4)]

        avg, mx = mlp([X[b, c].mean() for c in range(4)]), mlp([X[b, c].max() for c in range(4)])
        y = torch.stack([X[b, c] * sigmoid(avg[c] + mx[c]) for c in range(4)])  # channel attention
        pooled = torch.stack([y.mean(0), y.amax(0)])  # (2, 3, 5)
        for i in range(3):
            for j in range(5):
                a = sum(k[p, di + 1, dj + 1] * pooled[p, i + di, j + dj] for p in range(2) for di in (-1, 0, 1)
                        for dj in (-1, 0, 1) if 0 <= i + di < 3 and 0 <= j + dj < 5)
                torch.testing.assert_close(out[b, :, i, j], y[:, i, j] * sigmoid(a))


def test_eca_kernel_and_formula():
    assert [eca_kernel(c) for c in (16, 64, 128, 256, 1024)] == [3, 3, 5, 5, 5]
    m = seeded_params(ECA(4, 4, k=3)).eval()
    out = m(X)
    w = m.conv.weight.detach()[0, 0]
    for b in range(2):
        z = [X[b, c].mean().item() for c in range(4)]
        for c in range(4):
            a = sum(w[t + 1].item() * z[c + t] for t in (-1, 0, 1) if 0 <= c + t < 4)
            torch.testing.assert_close(out[b, c], X[b, c] * sigmoid(a))


def test_coordatt_formula():
    m = randomise_bn(seeded_params(CoordAtt(4, 4, r=32))).eval()  # mip = max(8, 4 // 32) = 8
    out = m(X)
    bn = m.bn1

    def encode(v):  # conv1 + BatchNorm + hard swish of one pooled position, v of 4 channels -> 8
        z = m.conv1.weight[:, :, 0, 0] @ v + m.conv1.bias
        z = (z - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
        return z * torch.clamp(z + 3, 0, 6) / 6

    with torch.no_grad():
        for b in range(2):
            a_h = [torch.sigmoid(m.conv_h.weight[:, :, 0, 0] @ encode(X[b, :, i, :].mean(1)) + m.conv_h.bias)
                   for i in range(3)]
            a_w = [torch.sigmoid(m.conv_w.weight[:, :, 0, 0] @ encode(X[b, :, :, j].mean(1)) + m.conv_w.bias)
                   for j in range(5)]
            for i in range(3):
                for j in range(5):
                    torch.testing.assert_close(out[b, :, i, j], X[b, :, i, j] * a_h[i] * a_w[j])


def test_simam_formula():
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    mean, n = 2.5, 3
    d = [(v - mean) ** 2 for v in (1.0, 2.0, 3.0, 4.0)]
    var = sum(d) / n
    expected = [v * sigmoid(di / (4 * (var + 1e-4)) + 0.5) for v, di in zip((1.0, 2.0, 3.0, 4.0), d)]
    torch.testing.assert_close(SimAM(1, 1)(x).flatten(), torch.tensor(expected))
    assert torch.isfinite(SimAM(2, 2)(torch.randn(1, 2, 1, 1))).all()  # a 1 x 1 map (P6 of a small image)


@pytest.mark.parametrize("make, c1, c2", [(SE, 16, 16), (CBAM, 16, 16), (ECA, 16, 16), (CoordAtt, 16, 16),
                                          (SimAM, 16, 16), (C3TR, 16, 24), (C2PSA, 64, 64)])
def test_shape_and_gradients(make, c1, c2):
    torch.manual_seed(0)
    m = make(c1, c2, 2) if make in (C3TR, C2PSA) else make(c1, c2)
    x = torch.randn(2, c1, 6, 10, requires_grad=True)
    y = m.train()(x)
    assert y.shape == (2, c2, 6, 10)
    y.square().mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("block", ["SE", "CBAM", "ECA", "CoordAtt", "SimAM"])
def test_series_rows_after_any_layer(block):
    """A row `[-1, 1, NAME, [channels]]` after a layer of the same (scaled) width builds; another width is refused
    naming the row."""
    d = yaml_model_load("yolov5n.yaml")
    d["backbone"].insert(10, [-1, 1, block, [1024]])  # after SPPF (1024 x 0.25 = 256 channels); later layers +1
    d["head"] = [[[x + 1 if isinstance(x, int) and x > 9 else x for x in r[0]] if isinstance(r[0], list) else r[0],
                  *r[1:]] for r in d["head"]]
    m = DetectionModel(d, nc=3)
    assert type(m.model[10]).__name__ == block
    with torch.no_grad():
        assert m.eval()(torch.zeros(1, 3, 64, 64))[0].shape[-1] == 8
    d["backbone"][10] = [-1, 1, block, [512]]
    with pytest.raises(BadModelYaml, match=rf"backbone\[10\].*{block} keeps the channels of its input \(256\)"):
        DetectionModel(d, nc=3)


def test_coordatt_fuse_folds_its_batchnorm():
    m = randomise_bn(seeded_params(CoordAtt(16, 16))).eval()
    x = torch.randn(2, 16, 5, 7)
    with torch.no_grad():
        ref = m(x)
        m.fuse()
        m.fuse()  # twice: nothing left to fold
        assert not any(isinstance(t, torch.nn.BatchNorm2d) for t in m.modules())
        torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=1e-5)


def test_a_checkpoints_attention_model_passes_the_cost_dry_run():
    """A checkpoint's YAML is a dict, built only after a dry run of its whole cost (utils/dry_run.py): ECA's 1-D
    convolution must size there as torch sizes it, or no yolov5n-eca checkpoint loads."""
    d = {k: v for k, v in yaml_model_load("yolov5n-eca.yaml").items() if k != "yaml_file"}
    model = DetectionModel(d)  # the YAML's 80 classes, as check_cost counts them
    assert check_cost(d, 3) == sum(t.numel() for t in model.model.state_dict().values())
