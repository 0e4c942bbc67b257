"""Heads of models/heads.py: output layouts (docs/design.md), decoding against hand-written formulas, bias priors."""

import math

import pytest
import torch
import torch.nn as nn
from models_testutil import randomise_bn

from models.heads import (
    AnchorFreeDetect,
    AnchorFreeSegment,
    Classify,
    Detect,
    IDetect,
    Pose,
    Segment,
)

ANCHORS = ([10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119])
STRIDES = (8.0, 16.0)
CH = (8, 16)


def feats(bs=2, h=32, w=48):
    torch.manual_seed(1)
    return [torch.randn(bs, c, int(h / s), int(w / s)) for c, s in zip(CH, STRIDES)]


def anchor_head(cls, **kw):
    torch.manual_seed(0)
    m = cls(nc=3, anchors=ANCHORS, ch=CH, **kw)
    m.stride.copy_(torch.tensor(STRIDES))
    m.anchors /= m.stride.view(-1, 1, 1)
    return m


def manual_anchor_decode(raw, head, i):
    """Decode one level's raw logits (B, na, ny, nx, no) the long way, cell by cell formulas."""
    bs, na, ny, nx, no = raw.shape
    s = head.stride[i]
    out = torch.empty_like(raw)
    gy, gx = torch.meshgrid(torch.arange(ny).float(), torch.arange(nx).float(), indexing="ij")
    sig = raw.sigmoid()
    out[..., 0] = (sig[..., 0] * 2 - 0.5 + gx) * s
    out[..., 1] = (sig[..., 1] * 2 - 0.5 + gy) * s
    for a in range(na):
        out[:, a, ..., 2] = (sig[:, a, ..., 2] * 2) ** 2 * head.anchors[i, a, 0] * s
        out[:, a, ..., 3] = (sig[:, a, ..., 3] * 2) ** 2 * head.anchors[i, a, 1] * s
    out[..., 4 : 5 + head.nc] = sig[..., 4 : 5 + head.nc]
    out[..., 5 + head.nc :] = raw[..., 5 + head.nc :]  # mask coefficients stay raw
    return out.view(bs, -1, no)


def test_detect_train_and_eval_layout():
    m = anchor_head(Detect)
    assert m.default_loss == "v5" and (m.nl, m.na, m.no) == (2, 3, 8)
    assert "stride" not in m.state_dict() and "anchors" in m.state_dict()
    x = m.train()(feats())
    assert [tuple(t.shape) for t in x] == [(2, 3, 4, 6, 8), (2, 3, 2, 3, 8)]
    y, raw = m.eval()(feats())
    assert y.shape == (2, 3 * (24 + 6), 8)
    torch.testing.assert_close(raw[0], x[0])
    expected = torch.cat([manual_anchor_decode(r, m, i) for i, r in enumerate(raw)], 1)
    torch.testing.assert_close(y, expected)


def test_v5_segment_layout_and_raw_mask_coefficients():
    m = anchor_head(Segment, nm=4, npr=16)
    assert m.default_loss == "v5seg" and m.no == 5 + 3 + 4
    assert isinstance(m.proto.upsample, nn.Upsample)
    x, proto = m.train()(feats())
    assert x[0].shape == (2, 3, 4, 6, 12) and proto.shape == (2, 4, 8, 12)
    y, proto, raw = m.eval()(feats())
    assert y.shape == (2, 90, 12) and proto.shape == (2, 4, 8, 12)
    expected = torch.cat([manual_anchor_decode(r, m, i) for i, r in enumerate(raw)], 1)
    torch.testing.assert_close(y, expected)


def test_anchor_bias_prior():
    torch.manual_seed(0)
    m = Detect(nc=3, anchors=ANCHORS, ch=CH)
    m.stride.copy_(torch.tensor(STRIDES))
    before = [mi.bias.detach().clone().view(3, -1) for mi in m.m]
    m.bias_init()
    for mi, b0, s in zip(m.m, before, STRIDES):
        b = mi.bias.view(3, -1)
        torch.testing.assert_close(b[:, 4] - b0[:, 4], torch.full((3,), math.log(8 / (640 / s) ** 2)))
        torch.testing.assert_close(b[:, 5:] - b0[:, 5:], torch.full((3, 3), math.log(0.6 / (3 - 0.99))))
        torch.testing.assert_close(b[:, :4], b0[:, :4])


def test_idetect_layout_fuse_and_keys():
    m = anchor_head(IDetect)
    assert m.default_loss == "ota"
    assert list(m.state_dict())[:2] == ["anchors", "anchor_grid"]
    assert m.anchor_grid.shape == (2, 1, 3, 1, 1, 2)
    g = torch.Generator().manual_seed(3)
    for ia, im in zip(m.ia, m.im):  # far from the 0 / 1 defaults so folding errors show
        ia.implicit.data = torch.randn(ia.implicit.shape, generator=g)
        im.implicit.data = torch.rand(im.implicit.shape, generator=g) + 0.5
    m.eval()
    y, raw = m(feats())
    expected = torch.cat([manual_anchor_decode(r, m, i) for i, r in enumerate(raw)], 1)
    torch.testing.assert_close(y, expected)
    m.fuse()
    assert all(isinstance(a, nn.Identity) for a in (*m.ia, *m.im))
    y2, _ = m(feats())
    torch.testing.assert_close(y2, y, atol=1e-4, rtol=1e-4)


def free_head(cls, **kw):
    torch.manual_seed(0)
    m = cls(nc=3, ch=CH, **kw)
    m.stride.copy_(torch.tensor(STRIDES))
    return randomise_bn(m)


def manual_free_decode(raw, head):
    """Anchor-free decode written per level without make_anchors/dist2bbox."""
    out = []
    for x, s in zip(raw, STRIDES):
        bs, _, ny, nx = x.shape
        box, cls = x[:, :64], x[:, 64:]
        bins = box.view(bs, 4, 16, ny, nx).softmax(2)
        dist = (bins * torch.arange(16.0).view(1, 1, 16, 1, 1)).sum(2)  # (bs, 4, ny, nx): l, t, r, b
        gy, gx = torch.meshgrid(torch.arange(ny).float() + 0.5, torch.arange(nx).float() + 0.5, indexing="ij")
        x1, y1, x2, y2 = gx - dist[:, 0], gy - dist[:, 1], gx + dist[:, 2], gy + dist[:, 3]
        xywh = torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), 1) * s
        out.append(torch.cat((xywh, cls.sigmoid()), 1).view(bs, 4 + head.nc, -1))
    return torch.cat(out, 2)


def test_anchor_free_detect_layout_and_decode():
    m = free_head(AnchorFreeDetect)
    assert m.default_loss == "v8" and m.no == 3 + 64
    x = m.train()(feats())
    assert [tuple(t.shape) for t in x] == [(2, 67, 4, 6), (2, 67, 2, 3)]
    y, raw = m.eval()(feats())
    assert y.shape == (2, 7, 30)
    torch.testing.assert_close(y, manual_free_decode(raw, m), atol=1e-4, rtol=1e-4)


def test_anchor_free_bias_prior():
    m = free_head(AnchorFreeDetect)
    m.bias_init()
    for a, b, s in zip(m.cv2, m.cv3, STRIDES):
        assert torch.all(a[-1].bias == 1.0)
        torch.testing.assert_close(b[-1].bias, torch.full((3,), math.log(5 / 3 / (640 / s) ** 2)))


def test_anchor_free_segment_layout():
    m = free_head(AnchorFreeSegment, nm=4, npr=16)
    assert m.default_loss == "v8seg" and isinstance(m.proto.upsample, nn.ConvTranspose2d)
    x, mc, p = m.train()(feats())
    assert x[0].shape == (2, 67, 4, 6) and mc.shape == (2, 4, 30) and p.shape == (2, 4, 8, 12)
    y, (raw, mc, p) = m.eval()(feats())
    assert y.shape == (2, 4 + 3 + 4, 30)
    torch.testing.assert_close(y[:, :7], manual_free_decode(raw, m), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y[:, 7:], mc)


def manual_keypoint_decode(kpt, head, feats_):
    """Keypoints (B, K * ndim, A) decoded cell by cell: x = (2 dx + column) * stride, y = (2 dy + row) * stride in
    input pixels, visibility = sigmoid(v), levels in order."""
    k, ndim = head.kpt_shape
    out, start = [], 0
    for f, s in zip(feats_, STRIDES):
        bs, _, ny, nx = f.shape
        raw = kpt[:, :, start : start + ny * nx].reshape(bs, k, ndim, ny, nx)
        start += ny * nx
        dec = torch.empty_like(raw)
        for r in range(ny):
            for c in range(nx):
                dec[..., 0, r, c] = (raw[..., 0, r, c] * 2 + c) * s
                dec[..., 1, r, c] = (raw[..., 1, r, c] * 2 + r) * s
                if ndim == 3:
                    dec[..., 2, r, c] = torch.sigmoid(raw[..., 2, r, c])
        out.append(dec.reshape(bs, k * ndim, ny * nx))
    return torch.cat(out, 2)


@pytest.mark.parametrize("kpt_shape", [(5, 3), (4, 2)])
def test_pose_layout_and_keypoint_decode(kpt_shape):
    m = free_head(Pose, kpt_shape=kpt_shape)
    k, ndim = kpt_shape
    assert m.default_loss == "v8pose" and m.nk == k * ndim
    x, kpt = m.train()(feats())
    assert x[0].shape == (2, 67, 4, 6) and kpt.shape == (2, k * ndim, 30)
    y, (raw, kpt) = m.eval()(feats())
    layout = m.output_layout
    assert y.shape == (2, 4 + 3 + k * ndim, 30) and layout.kpt_shape == kpt_shape and layout.nm == 0
    rows = layout.rows(y)
    assert rows.shape[-1] == layout.width
    torch.testing.assert_close(y[:, :7], manual_free_decode(raw, m), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows[..., layout.kpts].transpose(1, 2), manual_keypoint_decode(kpt, m, feats()),
                               atol=1e-4, rtol=1e-4)
    # NMS rows carry the keypoints after xyxy, conf, cls, and det_keypoints reads them back
    det = torch.cat([rows[0, :2, :6], rows[0, :2, layout.kpts]], 1)
    torch.testing.assert_close(layout.det_keypoints(det), rows[0, :2, layout.kpts].reshape(2, k, ndim))


@pytest.mark.parametrize("kpt_shape", [(0, 3), (17, 4), (17,), "17x3", (17.0, 3)])
def test_pose_refuses_bad_kpt_shape(kpt_shape):
    with pytest.raises(ValueError, match="kpt_shape"):
        Pose(nc=1, kpt_shape=kpt_shape, ch=CH)


@pytest.mark.parametrize("as_list", [False, True])
def test_classify(as_list):
    torch.manual_seed(0)
    m = Classify(8, 5)
    assert m.default_loss == "cls" and set(dict(m.named_children())) == {"conv", "pool", "drop", "linear"}
    assert m.drop.p == 0.0 and m.linear.in_features == 1280
    x = torch.randn(3, 8, 4, 4)
    x = [x[:, :4], x[:, 4:]] if as_list else x
    logits = m.train()(x)
    probs = m.eval()(x)
    assert logits.shape == probs.shape == (3, 5)
    torch.testing.assert_close(probs.sum(1), torch.ones(3))
    torch.testing.assert_close(probs, m.linear(m.pool(m.conv(torch.cat(x, 1) if as_list else x)).flatten(1)).softmax(1))


@pytest.mark.parametrize("cls", [Detect, IDetect, Segment, AnchorFreeDetect, AnchorFreeSegment])
def test_output_layout_locates_boxes_scores_masks_and_protos(cls):
    """Each head's declared layout, applied to its real eval output, finds the columns its decode formula wrote."""
    seg = cls in (Segment, AnchorFreeSegment)
    kw = dict(nm=4, npr=16) if seg else {}
    m = (anchor_head if cls.anchor_based else free_head)(cls, **kw).eval()
    out = m(feats())
    layout = m.output_layout
    pred, proto = layout.split(out)
    rows = layout.rows(pred)
    if cls.anchor_based:
        raw = out[-1]
        expected = torch.cat([manual_anchor_decode(r, m, i) for i, r in enumerate(raw)], 1)
        torch.testing.assert_close(rows[..., 4], expected[..., 4])  # objectness column
    else:
        raw = out[1][0] if seg else out[1]
        expected = manual_free_decode(raw, m).transpose(1, 2)
        assert not layout.objectness
    assert rows.shape[-1] == layout.mask.stop and layout.nc == 3
    torch.testing.assert_close(rows[..., :4], expected[..., :4], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows[..., layout.cls], expected[..., layout.cls], atol=1e-4, rtol=1e-4)
    if seg:
        assert proto.shape == (2, 4, 8, 12) and layout.nm == 4
        if cls is AnchorFreeSegment:
            torch.testing.assert_close(rows[..., layout.mask], out[1][1].transpose(1, 2))
        else:
            torch.testing.assert_close(rows[..., layout.mask], expected[..., layout.mask])
        torch.testing.assert_close(proto, m.proto(feats()[0]))
    else:
        assert proto is None and layout.nm == 0


@pytest.mark.parametrize("cls", [Detect, IDetect, Segment, AnchorFreeDetect, AnchorFreeSegment, Pose])
def test_output_layout_finds_the_train_output_in_the_eval_output(cls):
    """What the criterion takes (the train-mode output) is declared, so validators find it without testing types."""
    kw = dict(nm=4, npr=16) if cls in (Segment, AnchorFreeSegment) else dict(kpt_shape=(5, 3)) if cls is Pose else {}
    m = (anchor_head if cls.anchor_based else free_head)(cls, **kw)
    found = m.output_layout.train_output(m.eval()(feats()))
    m.train()
    for bn in (x for x in m.modules() if isinstance(x, torch.nn.BatchNorm2d)):
        bn.eval()  # the same statistics as in eval mode: only the head's own train/eval switch differs
    train_out = m(feats())
    assert type(found) is type(train_out) and len(found) == len(train_out)
    for a, b in zip(found, train_out):
        for x, y in zip(a if isinstance(a, (list, tuple)) else [a], b if isinstance(b, (list, tuple)) else [b]):
            torch.testing.assert_close(x, y)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls", [Detect, IDetect, Segment, AnchorFreeDetect, AnchorFreeSegment])
def test_autocast_outputs_are_decoded_in_fp32(cls, dtype):
    """Under bf16 autocast (predict --amp bf16, validation in bf16 training) or fp16 autocast (validation in CUDA
    training; torch runs it on CPU too) the convs run in half precision but boxes and scores are decoded in fp32 from
    their maps: at 640 px a bf16 decode would be off by up to 2-4 px, far outside the tolerance here, and the DFL
    conv refuses fp16 maps with its fp32 weights."""
    seg = cls in (Segment, AnchorFreeSegment)
    m = (anchor_head if cls.anchor_based else free_head)(cls, **(dict(nm=4, npr=16) if seg else {})).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        out = m(feats(bs=1, h=640, w=640))
    y = out[0]
    raw = out[-1] if cls.anchor_based else (out[1][0] if seg else out[1])
    assert y.dtype == torch.float32
    # the convs did run in half precision (IDetect's implicit scale, an fp32 parameter, promotes its maps to fp32)
    assert raw[0].dtype == (torch.float32 if cls is IDetect else dtype)
    raw = [r.float() for r in raw]
    if cls.anchor_based:
        expected = torch.cat([manual_anchor_decode(r, m, i) for i, r in enumerate(raw)], 1)
        assert y[..., :4].abs().max() > 500  # coordinates large enough for bf16 steps of 4 px
        torch.testing.assert_close(y, expected, atol=2e-3, rtol=1e-5)
    else:
        expected = manual_free_decode(raw, m)
        assert y[:, :4].abs().max() > 500
        torch.testing.assert_close(y[:, : 4 + m.nc], expected, atol=2e-3, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_class_probabilities_sum_to_one(dtype):
    torch.manual_seed(0)
    m = Classify(8, 5).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        probs = m(torch.randn(3, 8, 4, 4))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(1), torch.ones(3))  # a bf16 softmax sums to 1 +- 0.004


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_keypoints_are_decoded_in_fp32(dtype):
    """As the boxes: in fp32 from the half-precision maps. 1280 px wide: cell centres past 128 (159.5 at stride 8) have
    no bf16 value, so a grid made in the maps' dtype would move keypoints by whole strides."""
    m = free_head(Pose, kpt_shape=(5, 3)).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        y, (raw, kpt) = m(feats(bs=1, h=64, w=1280))
    assert y.dtype == torch.float32 and kpt.dtype == dtype
    expected = manual_keypoint_decode(kpt.float(), m, feats(bs=1, h=64, w=1280))
    assert y[:, 7:].abs().max() > 1000
    torch.testing.assert_close(y[:, 7:], expected, atol=2e-3, rtol=1e-5)
