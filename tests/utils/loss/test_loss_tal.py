import math

import torch

from losses.tal import TaskAlignedAssigner, anchors_in_boxes, widen_small_boxes

ROW = torch.tensor([[x + 0.5, 0.5] for x in range(6)])  # six anchor centres along one row


def assign(assigner, scores, pd_boxes, gt_boxes, gt_labels, valid=None, points=ROW):
    gt_boxes = torch.tensor(gt_boxes, dtype=torch.float32)[None]
    labels = torch.tensor(gt_labels, dtype=torch.float32).view(1, -1, 1)
    valid = torch.ones_like(labels, dtype=torch.bool) if valid is None else torch.tensor(valid).view(1, -1, 1)
    return assigner(scores[None], pd_boxes[None], points, labels, gt_boxes, valid)


def test_anchors_in_boxes_is_strict_inside():
    boxes = torch.tensor([[[0.0, 0.0, 2.0, 1.0], [1.5, 0.0, 3.0, 1.0]]])
    got = anchors_in_boxes(ROW, boxes)
    want = torch.tensor([[[True, True, False, False, False, False], [False, False, True, False, False, False]]])
    assert torch.equal(got, want)


def test_topk_positives_and_normalised_scores():
    a = TaskAlignedAssigner(topk=2, num_classes=3)
    gt = [0.0, 0.0, 4.0, 1.0]  # covers anchors 0..3
    scores = torch.zeros(6, 3)
    scores[:, 1] = torch.tensor([0.9, 0.1, 0.8, 0.5, 0.99, 0.99])  # 4 and 5 score high but lie outside
    pd = torch.tensor(gt).repeat(6, 1)  # every predicted box equals the GT: IoU 1, metric = sqrt(score)
    r = assign(a, scores, pd, [gt], [1])
    assert r.fg_mask[0].tolist() == [True, False, True, False, False, False]
    assert r.labels[0, [0, 2]].tolist() == [1, 1]
    assert torch.allclose(r.bboxes[0, 0], torch.tensor(gt))
    # per GT the largest metric maps to the largest IoU (1): anchor 0 -> 1, anchor 2 -> sqrt(.8) / sqrt(.9)
    want = torch.zeros(6, 3)
    want[0, 1], want[2, 1] = 1.0, math.sqrt(0.8 / 0.9)
    assert torch.allclose(r.scores[0], want, atol=1e-5)


def test_scores_scale_to_max_iou():
    a = TaskAlignedAssigner(topk=10, num_classes=1)
    gt = [0.0, 0.0, 2.0, 1.0]
    pd = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]] + [[0.0, 0.0, 2.0, 1.0]] * 4)
    scores = torch.full((6, 1), 0.5)
    r = assign(a, scores, pd, [gt], [0])
    assert r.fg_mask[0].tolist() == [True, True, False, False, False, False]
    # both positives have the same metric; their IoU with the GT is about 0.5 (CIoU a bit lower), so the top
    # normalised score equals that IoU rather than 1
    assert torch.allclose(r.scores[0, 0], r.scores[0, 1])
    assert 0.3 < r.scores[0, 0, 0].item() <= 0.5 + 1e-6


def test_contested_anchor_goes_to_higher_iou_gt():
    a = TaskAlignedAssigner(topk=10, num_classes=2)
    gt1, gt2 = [0.0, 0.0, 3.0, 1.0], [1.0, 0.0, 4.0, 1.0]  # anchors 1 and 2 lie in both
    pd = torch.tensor([gt1, gt2, gt1, gt2, gt2, gt2])
    scores = torch.full((6, 2), 0.6)
    r = assign(a, scores, pd, [gt1, gt2], [0, 1])
    assert r.fg_mask[0, :4].all() and not r.fg_mask[0, 4:].any()
    assert r.gt_idx[0, :4].tolist() == [0, 1, 0, 1]
    assert r.labels[0, :4].tolist() == [0, 1, 0, 1]
    assert (r.scores[0].gt(0).sum(-1) <= 1).all()  # one class target per anchor


def test_gt_without_anchor_inside_gets_nothing_and_padding_is_ignored():
    a = TaskAlignedAssigner(topk=10, num_classes=2)
    tiny = [1.6, 0.1, 1.9, 0.4]  # between anchor centres 1.5 and 2.5
    padded = [0.0, 0.0, 6.0, 1.0]  # would cover everything, but is marked invalid
    pd = torch.tensor([[0.0, 0.0, 6.0, 1.0]] * 6)
    r = assign(a, torch.full((6, 2), 0.9), pd, [tiny, padded], [1, 0], valid=[True, False])
    assert not r.fg_mask.any()
    assert r.scores.abs().sum() == 0


def test_small_boxes_are_widened_about_their_centre_side_by_side():
    boxes = torch.tensor([[1.6, 0.1, 1.9, 0.4], [0.0, 0.0, 4.0, 0.5], [1.0, 1.0, 5.0, 6.0]])
    got = widen_small_boxes(boxes, 2.0)
    # a 0.3 x 0.3 box becomes 2 x 2 about (1.75, 0.25); a 4 x 0.5 box only grows in height; a large one stays
    want = torch.tensor([[0.75, -0.75, 2.75, 1.25], [0.0, -0.75, 4.0, 1.25], [1.0, 1.0, 5.0, 6.0]])
    assert torch.allclose(got, want)


def test_a_gt_smaller_than_min_side_takes_the_anchors_of_its_widened_box():
    a = TaskAlignedAssigner(topk=10, num_classes=2, min_side=2.0)
    tiny = [1.6, 0.1, 1.9, 0.4]  # between anchor centres 1.5 and 2.5: no centre inside it
    padded = [0.0, 0.0, 6.0, 1.0]
    pd = torch.tensor([[1.5, 0.0, 2.0, 0.5]] * 6)  # overlaps the tiny box, so the alignment metric is not zero
    r = assign(a, torch.full((6, 2), 0.9), pd, [tiny, padded], [1, 0], valid=[True, False])
    # widened to 0.75..2.75 (x) and -0.75..1.25 (y): anchor centres 1.5 and 2.5 lie inside; padding still ignored
    assert r.fg_mask[0].tolist() == [False, True, True, False, False, False]
    assert r.labels[0, [1, 2]].tolist() == [1, 1]
    assert torch.allclose(r.bboxes[0, 1], torch.tensor(tiny))  # the target stays the real box


def test_no_gt_at_all():
    a = TaskAlignedAssigner(num_classes=4)
    r = a(torch.rand(2, 6, 4), torch.rand(2, 6, 4), ROW, torch.zeros(2, 0, 1), torch.zeros(2, 0, 4),
          torch.zeros(2, 0, 1, dtype=torch.bool))
    assert r.scores.shape == (2, 6, 4) and not r.fg_mask.any() and r.bboxes.shape == (2, 6, 4)


def test_topk_larger_than_anchor_count():
    a = TaskAlignedAssigner(topk=10, num_classes=1)
    points = ROW[:3]
    gt = [0.0, 0.0, 3.0, 1.0]
    r = assign(a, torch.full((3, 1), 0.5), torch.tensor([gt] * 3), [gt], [0], points=points)
    assert r.fg_mask.all()


def test_images_are_assigned_independently():
    torch.manual_seed(0)
    a = TaskAlignedAssigner(topk=3, num_classes=2)
    points = torch.stack(torch.meshgrid(torch.arange(8) + 0.5, torch.arange(8) + 0.5, indexing="xy"), -1).view(-1, 2)
    scores, pd = torch.rand(2, 64, 2), torch.rand(2, 64, 4) * 4
    pd[..., 2:] += 4
    gt = torch.tensor([[[1.0, 1.0, 5.0, 6.0], [0.0, 0.0, 0.0, 0.0]], [[2.0, 0.0, 8.0, 3.0], [0.5, 4.0, 4.0, 8.0]]])
    labels = torch.tensor([[[1.0], [0.0]], [[0.0], [1.0]]])
    valid = torch.tensor([[[True], [False]], [[True], [True]]])
    both = a(scores, pd, points, labels, gt, valid)
    for i, m in ((0, 1), (1, 2)):
        k = slice(i, i + 1)
        one = a(scores[k], pd[k], points, labels[k, :m], gt[k, :m], valid[k, :m])
        assert torch.equal(one.fg_mask[0], both.fg_mask[i]) and one.fg_mask.any()
        assert torch.allclose(one.scores[0], both.scores[i]) and torch.equal(one.labels[0], both.labels[i])


def test_anchors_in_boxes_matches_the_smallest_distance_rule_at_scale():
    """The four-comparison form against its definition: the smallest of the four distances to the sides exceeds
    eps. Points on a grid land exactly on many box sides, so the strict edge is exercised."""
    g = torch.Generator().manual_seed(0)
    points = torch.stack(torch.meshgrid(torch.arange(40.0), torch.arange(40.0), indexing="xy"), -1).view(-1, 2)
    xy = torch.randint(0, 30, (3, 9, 2), generator=g).float()
    boxes = torch.cat((xy, xy + torch.randint(1, 12, (3, 9, 2), generator=g)), -1)
    lt, rb = boxes[..., None, :2], boxes[..., None, 2:]
    want = torch.cat((points - lt, rb - points), -1).amin(-1) > 1e-9
    assert want.any() and not want.all()
    assert torch.equal(anchors_in_boxes(points, boxes), want)


def test_gt_index_is_the_gt_holding_each_positive_and_zero_elsewhere():
    g = torch.Generator().manual_seed(1)
    points = torch.stack(torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="xy"), -1).view(-1, 2) + 0.5
    xy = torch.rand(2, 7, 2, generator=g) * 20
    gt = torch.cat((xy, xy + 4 + torch.rand(2, 7, 2, generator=g) * 8), -1)
    pd = (gt[:, :, None] + torch.randn(2, 7, 150, 4, generator=g)).view(2, -1, 4)[:, : len(points)]
    scores = torch.rand(2, len(points), 3, generator=g)
    labels = torch.randint(0, 3, (2, 7, 1), generator=g).float()
    valid = torch.ones(2, 7, 1, dtype=torch.bool)
    r = TaskAlignedAssigner(topk=10, num_classes=3)(scores, pd, points, labels, gt, valid)
    assert r.fg_mask.sum() > 20
    assert (r.gt_idx[~r.fg_mask] == 0).all()
    held = gt.gather(1, r.gt_idx[..., None].expand(-1, -1, 4))[r.fg_mask]
    p = points.expand(2, -1, -1)[r.fg_mask]
    assert ((p > held[:, :2]) & (p < held[:, 2:])).all()
    assert torch.equal(r.bboxes[r.fg_mask], held)
