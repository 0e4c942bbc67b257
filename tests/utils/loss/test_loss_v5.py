import copy
import math

import torch
import torch.nn.functional as F
from loss_fakes import HYP_V5, alone, det_batch, fake_model, make_targets

from losses import V5DetectionLoss
from losses.common import bce, level_balance
from losses.v5 import match_anchors

# Grid-unit anchors of two levels (8x8 and 4x4 cells); the third of each is too big (ratio 4, not < anchor_t).
ANCHORS = torch.tensor([[[1.0, 1.0], [2.0, 2.0], [8.0, 8.0]], [[0.5, 0.5], [3.0, 3.0], [5.0, 5.0]]])


def positives(level):
    return sorted(zip(level.b.tolist(), level.a.tolist(), level.gj.tolist(), level.gi.tolist()))


def test_anchor_matching_hand_case():
    # centre (0.3, 0.7), size 0.25: on 8x8 -> xy (2.4, 5.6), wh (2, 2); on 4x4 -> xy (1.2, 2.8), wh (1, 1)
    targets = make_targets([[1, 2, 0.3, 0.7, 0.25, 0.25]])
    lv0, lv1 = match_anchors([(8, 8), (4, 4)], ANCHORS, targets, anchor_t=4.0)
    # x = 2.4 sits in the left half of cell 2 -> left neighbour 1; y = 5.6 in the lower half -> neighbour row 6
    want0 = [(1, a, gj, gi) for a in (0, 1) for gj, gi in ((5, 2), (5, 1), (6, 2))]
    assert positives(lv0) == sorted(want0)
    want1 = [(1, a, gj, gi) for a in (0, 1) for gj, gi in ((2, 1), (2, 0), (3, 1))]
    assert positives(lv1) == sorted(want1)
    assert lv0.tcls.tolist() == [2] * 6 and lv0.row.tolist() == [0] * 6
    # box targets are relative to the cell each positive sits in: offsets in [-0.5, 1.5]
    for b, a, gj, gi, tb, anc in zip(lv0.b, lv0.a, lv0.gj, lv0.gi, lv0.tbox, lv0.anchors):
        assert torch.allclose(tb, torch.tensor([2.4 - gi, 5.6 - gj, 2.0, 2.0]))
        assert torch.equal(anc, ANCHORS[0, a])


def test_anchor_matching_border_and_ratio():
    # x = 0.4 cells from the left border: no left neighbour (x <= 1); right half? no (frac 0.4) -> centre only in x
    # y = 4.0 exactly: frac 0 -> upper neighbour (row 3); gxi = 4.0 also frac 0 -> "lower" cell 4 = the centre again
    targets = make_targets([[0, 0, 0.05, 0.5, 0.125, 0.125], [0, 1, 0.5, 0.5, 0.9, 0.05]])
    (lv0,) = match_anchors([(8, 8)], ANCHORS[:1], targets, anchor_t=4.0)
    first = sorted((a, gj, gi) for a, gj, gi, r in zip(lv0.a.tolist(), lv0.gj.tolist(), lv0.gi.tolist(),
                                                        lv0.row.tolist()) if r == 0)
    assert first == sorted((a, gj, 0) for a in (0, 1) for gj in (4, 3, 4))
    # the second target (7.2 x 0.4 cells) has a w/h ratio beyond 4 to every square anchor: no positive
    assert 1 not in lv0.row.tolist()


def test_no_targets_gives_empty_levels():
    levels = match_anchors([(8, 8), (4, 4)], ANCHORS, make_targets([]), anchor_t=4.0)
    assert all(len(lv.b) == 0 for lv in levels)


def test_gains_scaled_without_mutating_hyp():
    model = fake_model("anchor", nc=3)
    hyp = copy.deepcopy(HYP_V5)
    crit = V5DetectionLoss(model, hyp, imgsz=320)
    assert hyp == HYP_V5
    assert math.isclose(crit.box_gain, 0.05)
    assert math.isclose(crit.cls_gain, 0.5 * 3 / 80)
    assert math.isclose(crit.obj_gain, (320 / 640) ** 2)


def test_loss_is_components_times_batch():
    model = fake_model("anchor")
    batch = det_batch()
    loss, items = V5DetectionLoss(model, HYP_V5, imgsz=64)(model(batch["img"]), batch)
    assert loss.dim() == 0 and items.shape == (3,) and not items.requires_grad
    assert torch.allclose(loss, items.sum() * 2)
    assert (items > 0).all()


def test_objectness_without_targets_is_balanced_bce_to_zero():
    model = fake_model("anchor")
    img = torch.rand(2, 3, 64, 64)
    preds = model(img)
    crit = V5DetectionLoss(model, HYP_V5, imgsz=64)
    _, items = crit(preds, {"img": img, "targets": make_targets([])})
    want = sum(w * F.binary_cross_entropy_with_logits(p[..., 4], torch.zeros_like(p[..., 4]))
               for p, w in zip(preds, level_balance(3)))
    assert torch.allclose(items[1], want.detach() * crit.obj_gain)
    assert items[0] == 0 and items[2] == 0


def test_objectness_term_is_additive_over_images():
    model = fake_model("anchor")
    batch = det_batch()
    crit = V5DetectionLoss(model, HYP_V5, imgsz=64)
    _, both = crit(model(batch["img"]), batch)
    parts = 0.0
    for i in range(2):
        t = alone(batch["targets"].of_image(i))
        parts = parts + crit(model(batch["img"][i : i + 1]), {"img": None, "targets": t})[1][1]
    assert torch.allclose(both[1] * 2, parts, rtol=1e-5)


def test_focal_bce_formula():
    x = torch.tensor([-2.0, 0.5, 3.0])
    t = torch.tensor([0.0, 1.0, 1.0])
    p = x.sigmoid()
    p_t = t * p + (1 - t) * (1 - p)
    alpha = t * 0.25 + (1 - t) * 0.75
    want = (F.binary_cross_entropy_with_logits(x, t, reduction="none") * alpha * (1 - p_t) ** 1.5).mean()
    assert torch.allclose(bce(x, t, gamma=1.5), want)
    assert torch.allclose(bce(x, t), F.binary_cross_entropy_with_logits(x, t))
    pw = F.binary_cross_entropy_with_logits(x, t, pos_weight=torch.tensor(2.0))
    assert torch.allclose(bce(x, t, pos_weight=2.0), pw)


def test_label_smoothing_targets():
    model = fake_model("anchor", nc=3)
    crit = V5DetectionLoss(model, dict(HYP_V5, label_smoothing=0.1))
    assert math.isclose(crit.cp, 0.95) and math.isclose(crit.cn, 0.05)
