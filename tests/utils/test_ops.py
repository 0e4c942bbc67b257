"""utils/ops.py against independent references: brute-force NMS, hand-computed boxes and IoUs, per-pixel masks."""

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from utils import ops


def _iou_xyxy(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def _reference_nms(rows, nc, nm, conf_thres, iou_thres, classes, agnostic, multi_label, max_det):
    """Plain-Python NMS over anchor rows (xywh, obj, nc scores, nm coefficients) of one image."""
    cands = []
    for r in rows.tolist():
        obj = r[4]
        if obj <= conf_thres:
            continue
        scores = [s * obj for s in r[5 : 5 + nc]]
        if multi_label and nc > 1:
            picks = [(j, s) for j, s in enumerate(scores) if s > conf_thres]
        else:
            j = max(range(nc), key=lambda k: scores[k])
            picks = [(j, scores[j])] if scores[j] > conf_thres else []
        x, y, w, h = r[:4]
        box = [x - w / 2, y - h / 2, x + w / 2, y + h / 2]
        for j, s in picks:
            if classes is None or j in classes:
                cands.append(box + [s, float(j)] + r[5 + nc :])
    cands.sort(key=lambda c: -c[4])
    kept = []
    for c in cands:
        if all((not agnostic and k[5] != c[5]) or _iou_xyxy(k, c) <= iou_thres for k in kept):
            kept.append(c)
    return torch.tensor(kept[:max_det], dtype=torch.float32).reshape(-1, 6 + nm)


def _random_rows(gen, b, a, nc, nm):
    """Clustered boxes so that suppression actually happens."""
    xy = torch.rand(b, a, 2, generator=gen) * 64
    wh = torch.rand(b, a, 2, generator=gen) * 25 + 5
    obj = torch.rand(b, a, 1, generator=gen)
    cls = torch.rand(b, a, nc, generator=gen)
    coef = torch.randn(b, a, nm, generator=gen)
    return torch.cat((xy, wh, obj, cls, coef), -1)


@pytest.mark.parametrize("layout", ["anchor_based", "anchor_free"])
@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(multi_label=True),
        dict(classes=[0, 2]),
        dict(agnostic=True),
        dict(max_det=7),
        dict(multi_label=True, agnostic=True, iou_thres=0.3),
    ],
)
def test_nms_matches_brute_force(layout, kw):
    gen = torch.Generator().manual_seed(len(str(kw)) + (layout == "anchor_free"))
    b, a, nc, nm = 2, 150, 3, 2
    rows = _random_rows(gen, b, a, nc, nm)
    if layout == "anchor_free":
        rows[..., 4] = 1.0  # anchor-free heads have no objectness: conf is the class score
        pred = torch.cat((rows[..., :4], rows[..., 5:]), -1).transpose(1, 2)  # (B, 4 + nc + nm, A)
        head_layout = ops.OutputLayout(nc, nm, objectness=False, channels_last=False)
    else:
        pred = rows
        head_layout = ops.OutputLayout(nc, nm, objectness=True, channels_last=True)
    args = dict(conf_thres=0.25, iou_thres=0.45, classes=None, agnostic=False, multi_label=False, max_det=300)
    args.update(kw)
    out = ops.non_max_suppression(pred, layout=head_layout, **args)
    assert len(out) == b
    for i in range(b):
        ref = _reference_nms(rows[i], nc, nm, **args)
        assert len(ref) > 2, "the case must keep several boxes to be meaningful"
        assert out[i].shape == ref.shape
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-5)


def test_nms_empty_and_tuple_input():
    pred = torch.zeros(2, 10, 5 + 3)  # every objectness 0: nothing passes
    layout = ops.OutputLayout(3, objectness=True, channels_last=True)
    out = ops.non_max_suppression((pred, None), conf_thres=0.25, layout=layout)
    assert [o.shape for o in out] == [(0, 6), (0, 6)]


def test_nms_reads_the_layout_not_the_shape():
    """A v8 tensor whose shape also fits the v5 layout (4 + nc rows, 5 + nc anchors) is read as the layout says."""
    gen = torch.Generator().manual_seed(5)
    nc = 3
    rows = _random_rows(gen, 1, 5 + nc, nc, 0)
    rows[..., 4] = 1.0
    rows[0, :3, :4] = torch.tensor([20.0, 20.0, 10.0, 10.0])  # three overlapping boxes so suppression happens
    pred = torch.cat((rows[..., :4], rows[..., 5:]), -1).transpose(1, 2)  # (1, 4 + nc, 5 + nc)
    out = ops.non_max_suppression(pred, conf_thres=0.1, layout=ops.OutputLayout(nc, channels_last=False))[0]
    ref = _reference_nms(rows[0], nc, 0, 0.1, 0.45, None, False, False, 300)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_nms_rejects_a_prediction_that_does_not_fit_the_layout():
    with pytest.raises(ValueError, match="columns"):
        ops.non_max_suppression(torch.rand(1, 7, 11), layout=ops.OutputLayout(80, objectness=True))


def test_output_layout_columns_and_split():
    v5 = ops.OutputLayout(3, 2, objectness=True, channels_last=True, proto=(1,))
    v8 = ops.OutputLayout(3, 2, objectness=False, channels_last=False, proto=(1, 2))
    assert (v5.cls, v5.mask) == (slice(5, 8), slice(8, 10))
    assert (v8.cls, v8.mask) == (slice(4, 7), slice(7, 9))
    y, proto, mc = torch.rand(2, 9, 6), torch.rand(2, 2, 4, 4), torch.rand(2, 2, 6)
    assert v8.rows(y).shape == (2, 6, 9) and torch.equal(v8.rows(y)[0, 5], y[0, :, 5])
    got_y, got_p = v8.split((y, ([], mc, proto)))
    assert got_y is y and got_p is proto
    got_y, got_p = v5.split((y, proto, []))
    assert got_y is y and got_p is proto
    assert ops.OutputLayout(3).split((y, [])) == (y, None) and ops.OutputLayout(3).split(y) == (y, None)


def test_box_conversions_by_hand():
    xywh = torch.tensor([[10.0, 20.0, 4.0, 6.0]])
    xyxy = torch.tensor([[8.0, 17.0, 12.0, 23.0]])
    torch.testing.assert_close(ops.xywh2xyxy(xywh), xyxy)
    torch.testing.assert_close(ops.xyxy2xywh(xyxy), xywh)
    np.testing.assert_allclose(ops.xywh2xyxy(xywh.numpy()), xyxy.numpy())
    n = np.array([[0.5, 0.25, 0.2, 0.1]])
    np.testing.assert_allclose(ops.xywhn2xyxy(n, w=200, h=100, padw=3, padh=4), [[83, 24, 123, 34]])
    np.testing.assert_allclose(ops.xyxy2xywhn(np.array([[80.0, 20, 120, 30]]), w=200, h=100), n)
    np.testing.assert_allclose(ops.xyn2xy(np.array([[0.5, 0.25]]), w=200, h=100, padw=1, padh=2), [[101, 27]])


def test_box_conversion_round_trips():
    gen = torch.Generator().manual_seed(0)
    b = torch.rand(50, 4, generator=gen) * 100
    torch.testing.assert_close(ops.xyxy2xywh(ops.xywh2xyxy(b)), b, atol=1e-4, rtol=0)
    bn = b.numpy() / 100
    out = ops.xyxy2xywhn(ops.xywhn2xyxy(bn, w=320, h=240), w=320, h=240)
    np.testing.assert_allclose(out, bn, atol=1e-6)


def test_xyxy2xywhn_clip_and_clip_boxes():
    box = np.array([[-10.0, 5.0, 110.0, 60.0]])
    out = ops.xyxy2xywhn(box, w=100, h=50, clip=True)
    np.testing.assert_allclose(out, [[0.5, 27.5 / 50, 1.0, 45 / 50]], atol=1e-6)
    assert box[0, 0] == -10.0, "clip=True must not modify the caller's array"
    t = torch.tensor([[-5.0, -5.0, 200.0, 30.0]])
    ops.clip_boxes(t, (20, 100))
    torch.testing.assert_close(t, torch.tensor([[0.0, 0.0, 100.0, 20.0]]))
    pts = torch.tensor([[-1.0, 50.0], [30.0, 5.0]])
    ops.clip_coords(pts, (20, 25))
    torch.testing.assert_close(pts, torch.tensor([[0.0, 20.0], [25.0, 5.0]]))


def test_scale_boxes_and_coords_undo_letterbox():
    h0, w0, s = 160, 240, 320
    gain = min(s / h0, s / w0)
    padw, padh = (s - w0 * gain) / 2, (s - h0 * gain) / 2
    orig = torch.tensor([[24.0, 30.0, 120.0, 90.0]])
    boxed = orig * gain + torch.tensor([padw, padh, padw, padh])
    torch.testing.assert_close(ops.scale_boxes((s, s), boxed.clone(), (h0, w0)), orig)
    ratio_pad = ((gain, gain), (padw, padh))
    torch.testing.assert_close(ops.scale_boxes((s, s), boxed.clone(), (h0, w0), ratio_pad), orig)
    pts = boxed[:, :2].clone()
    out = ops.scale_coords((s, s), pts, (h0, w0), normalize=True)
    torch.testing.assert_close(out, torch.tensor([[24.0 / w0, 30.0 / h0]]))


def test_scale_boxes_and_coords_use_each_axis_ratio_of_the_dataset():
    """An image of 97 x 61 drawn at 96 px: its sides round to 96 x 60, so x and y were scaled by 96/97 and 60/61.
    The batch's ratio_pad carries both (h / h0, w / w0); mapping back by one gain would misplace x."""
    h0, w0, w, h = 61, 97, 96, 60
    pad = (0.0, 18.0)
    ratio_pad = ((h / h0, w / w0), pad)
    orig = torch.tensor([[90.0, 10.0, 97.0, 50.0]])
    drawn = orig * torch.tensor([w / w0, h / h0, w / w0, h / h0]) + torch.tensor([*pad, *pad])
    torch.testing.assert_close(ops.scale_boxes((96, 96), drawn.clone(), (h0, w0), ratio_pad), orig)
    pts = drawn[:, 2:].clone()
    torch.testing.assert_close(ops.scale_coords((96, 96), pts, (h0, w0), ratio_pad), orig[:, 2:])


def test_box_iou_and_variants_by_hand():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[5.0, 5.0, 15.0, 15.0], [20.0, 20.0, 30.0, 30.0], [0.0, 0.0, 10.0, 10.0]])
    torch.testing.assert_close(ops.box_iou(a, b), torch.tensor([[25 / 175, 0.0, 1.0]]), atol=1e-6, rtol=0)
    iou = 25 / 175
    giou = iou - (225 - 175) / 225  # enclosing box 15 x 15
    diou = iou - 50 / 450  # centres (5, 5) and (10, 10); enclosing diagonal^2 = 15^2 + 15^2
    got = [ops.bbox_iou(a, b[:1], xywh=False, **{k: True}).item() for k in ("GIoU", "DIoU", "CIoU")]
    assert got == pytest.approx([giou, diou, diou], abs=1e-5)  # equal aspect ratios: CIoU == DIoU


def test_ciou_aspect_term_by_hand():
    b1 = torch.tensor([[2.0, 2.0, 4.0, 2.0]])  # xywh
    b2 = torch.tensor([[3.0, 2.0, 2.0, 4.0]])
    inter = 2.0 * 2.0  # x 0..4 vs 2..4, y 1..3 vs 0..4
    iou = inter / (8 + 8 - inter)
    rho2 = 1.0
    c2 = 4.0**2 + 4.0**2  # enclosing box x 0..4, y 0..4
    v = 4 / math.pi**2 * (math.atan(2 / 4) - math.atan(4 / 2)) ** 2
    alpha = v / (v - iou + 1)
    got = ops.bbox_iou(b1, b2, CIoU=True).item()
    assert got == pytest.approx(iou - (rho2 / c2 + v * alpha), abs=1e-5)
    xyxy1, xyxy2 = ops.xywh2xyxy(b1), ops.xywh2xyxy(b2)
    assert ops.bbox_iou(xyxy1, xyxy2, xywh=False).item() == pytest.approx(iou, abs=1e-6)


def test_anchors_and_distances_round_trip():
    feats = [torch.zeros(1, 8, 4, 6), torch.zeros(1, 8, 2, 3)]
    points, strides = ops.make_anchors(feats, [8, 16])
    assert points.shape == (4 * 6 + 2 * 3, 2) and strides.shape == (30, 1)
    torch.testing.assert_close(points[:2], torch.tensor([[0.5, 0.5], [1.5, 0.5]]))
    torch.testing.assert_close(points[6], torch.tensor([0.5, 1.5]))  # row-major: x varies fastest
    assert strides[23].item() == 8 and strides[24].item() == 16
    dist = torch.rand(30, 4) * 5
    xyxy = ops.dist2bbox(dist, points, xywh=False)
    torch.testing.assert_close(ops.bbox2dist(points, xyxy, reg_max=16), dist, atol=1e-5, rtol=0)
    xywh = ops.dist2bbox(dist, points, xywh=True)
    torch.testing.assert_close(ops.xywh2xyxy(xywh), xyxy, atol=1e-5, rtol=0)


def test_segment_helpers():
    seg = np.array([[10.0, 5.0], [50.0, 5.0], [50.0, 40.0], [-5.0, 40.0]])
    np.testing.assert_allclose(ops.segment2box(seg, width=100, height=100), [10, 5, 50, 40])
    out = ops.resample_segments([seg], n=9)[0]
    assert out.shape == (9, 2)
    np.testing.assert_allclose(out[0], seg[0])
    np.testing.assert_allclose(out[-1], seg[0])  # the outline is closed
    np.testing.assert_allclose(out[2], seg[1])  # 9 points over 4 edges: every second point is a vertex


def _crop_reference(masks, boxes):
    out = masks.clone()
    for m, (x1, y1, x2, y2) in zip(out, boxes.tolist()):
        for r in range(m.shape[0]):
            for c in range(m.shape[1]):
                if not (x1 <= c < x2 and y1 <= r < y2):
                    m[r, c] = 0
    return out


def test_crop_mask_against_loop():
    gen = torch.Generator().manual_seed(1)
    masks = torch.rand(3, 12, 16, generator=gen)
    boxes = torch.tensor([[2.0, 3.0, 9.5, 8.0], [0.0, 0.0, 16.0, 12.0], [5.2, 1.7, 6.1, 11.0]])
    torch.testing.assert_close(ops.crop_mask(masks, boxes), _crop_reference(masks, boxes))


def _protos_case():
    gen = torch.Generator().manual_seed(2)
    protos = torch.randn(4, 16, 20, generator=gen)
    coefs = torch.randn(3, 4, generator=gen)
    boxes = torch.tensor([[8.0, 4.0, 60.0, 50.0], [0.0, 0.0, 80.0, 64.0], [30.0, 20.0, 44.0, 40.0]])  # 64 x 80 px
    return protos, coefs, boxes


def test_process_mask_at_proto_resolution():
    protos, coefs, boxes = _protos_case()
    logits = (coefs @ protos.view(4, -1)).view(3, 16, 20)
    ref = _crop_reference(logits, boxes / 4).sigmoid() > 0.5
    out = ops.process_mask(protos, coefs, boxes, (64, 80))
    assert out.shape == (3, 16, 20)
    assert torch.equal(out.bool(), ref)


def test_process_mask_upsampled_uses_the_same_threshold():
    protos, coefs, boxes = _protos_case()
    logits = (coefs @ protos.view(4, -1)).view(3, 16, 20)
    up = _crop_reference(F.interpolate(logits[None], (64, 80), mode="bilinear", align_corners=False)[0], boxes)
    ref = up.sigmoid() > 0.5  # sigmoid(x) > 0.5 <=> x > 0, the same rule as at proto resolution
    out = ops.process_mask(protos, coefs, boxes, (64, 80), upsample=True)
    assert torch.equal(out.bool(), ref)


def test_process_mask_upsampled_crops_on_the_box_not_the_proto_grid():
    """A mask positive everywhere, cropped to a box whose sides fall between proto cells (stride 4): upsampled, it is
    exactly the box's pixels. Cropped at proto resolution first, its sides moved to the grid and blurred, which cost
    rectangles most of their mask mAP50-95 (0.145 against 0.184 on a validation set; pycocotools segm 0.21 against
    0.29 over all classes for the same model)."""
    protos, coefs = torch.ones(1, 16, 20), torch.ones(1, 1)
    box = torch.tensor([[5.0, 6.0, 23.0, 27.0]])
    out = ops.process_mask(protos, coefs, box, (64, 80), upsample=True)
    ref = torch.zeros(1, 64, 80, dtype=torch.bool)
    ref[0, 6:27, 5:23] = True
    assert torch.equal(out.bool(), ref)


def test_scale_masks_undoes_letterbox():
    h0, w0, s = 60, 90, 120
    orig = np.zeros((h0, w0), np.float32)
    orig[10:40, 20:70] = 1
    gain = s / w0
    nh = round(h0 * gain)
    top = (s - nh) // 2
    boxed = np.zeros((s, s), np.float32)
    boxed[top : top + nh] = cv2.resize(orig, (s, nh), interpolation=cv2.INTER_NEAREST)
    out = ops.scale_masks(torch.from_numpy(boxed)[None], (h0, w0))
    assert out.shape == (1, h0, w0)
    got = out[0].numpy() > 0.5
    iou = (got & (orig > 0)).sum() / (got | (orig > 0)).sum()
    assert iou > 0.95
    assert ops.scale_masks(torch.zeros(0, s, s), (h0, w0)).shape == (0, h0, w0)


def test_masks2segments_rectangle():
    m = torch.zeros(2, 20, 30)
    m[0, 5:12, 3:20] = 1
    segs = ops.masks2segments(m)
    assert segs[1].shape == (0, 2)
    xs, ys = segs[0][:, 0], segs[0][:, 1]
    assert (xs.min(), xs.max(), ys.min(), ys.max()) == (3, 19, 5, 11)


@pytest.mark.parametrize("ties", [False, True])
def test_first_kept_equals_full_nms_prefix(ties):
    """first_kept looks at only a prefix of the sorted boxes: it must return exactly full NMS's first n, also when
    most boxes are suppressed (the prefix grows) and when scores tie."""
    import torchvision

    gen = torch.Generator().manual_seed(int(ties))
    for trial in range(40):
        count = int(torch.randint(1, 3000, (1,), generator=gen))
        spread = 40.0 if trial % 2 else 320.0  # crowded boxes: few kept, the prefix must grow several times
        xy = torch.rand(count, 2, generator=gen) * spread
        boxes = torch.cat((xy, xy + torch.rand(count, 2, generator=gen) * 60 + 2), 1)
        scores = torch.rand(count, generator=gen)
        if ties:
            scores = (scores * 10).round() / 10
        order = scores.argsort(descending=True)
        boxes, scores = boxes[order], scores[order]
        n = int(torch.randint(1, 400, (1,), generator=gen))
        full = torchvision.ops.nms(boxes, scores, 0.5)
        assert torch.equal(ops.first_kept(boxes, scores, 0.5, n), full[:n]), (trial, count, n)


def test_the_nms_op_is_torchvisions_without_importing_torchvision():
    """The predict and val scripts get NMS without the 1.6 s torchvision import, and it is torchvision's own op."""
    import subprocess
    import sys

    code = ("import sys, torch; from utils.versions import torchvision_nms; "
            "g = torch.Generator().manual_seed(0); b = torch.rand(500, 4, generator=g) * 100; b[:, 2:] += b[:, :2]; "
            "keep = torchvision_nms()(b, torch.rand(500, generator=g), 0.5); "
            "print('torchvision' in sys.modules, keep.tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    imported, keep = out.stdout.split(" ", 1)
    assert imported == "False"
    import torchvision

    g = torch.Generator().manual_seed(0)
    b = torch.rand(500, 4, generator=g) * 100
    b[:, 2:] += b[:, :2]
    expected = torchvision.ops.nms(b, torch.rand(500, generator=g), 0.5)
    assert 10 < len(expected) < 500 and keep.strip() == str(expected.tolist())
