"""The oriented-box criterion (losses/obb.py): its terms at their minimum, the rotated assigner's candidates, gradients
to every head branch, and a tiny overfit."""

import math

import pytest
import torch

from data.targets import Targets
from losses import REGISTRY, build_criterion
from losses.obb import RotatedTaskAlignedAssigner, V8OBBLoss, angle_loss
from models.yolo import OBBModel
from utils.rotated import dist_to_rbox, probiou, rbox_to_dist

HYP = {"box": 7.5, "cls": 0.5, "dfl": 1.5, "angle": 1.0}


def test_angle_term_is_zero_at_the_target_and_for_the_same_box_turned_by_pi():
    target = torch.tensor([[10.0, 10, 8, 2, 0.3]] * 3)
    pred = target.clone()
    pred[1, 4] += math.pi
    pred[2, 4] -= math.pi
    assert angle_loss(pred, target).abs().max() < 1e-10
    turned = target.clone()
    turned[:, 4] += 0.4
    assert (angle_loss(turned, target) > 0.1).all()
    square = torch.tensor([[10.0, 10, 4, 4, 0.3]])
    assert angle_loss(square + torch.tensor([0, 0, 0, 0, 0.4]), square) > angle_loss(turned[:1], target[:1]) * 0.99


def test_box_and_dfl_targets_invert_the_decode():
    g = torch.Generator().manual_seed(0)
    anchors = torch.rand(20, 2, generator=g) * 8
    dist = torch.rand(20, 4, generator=g) * 6 + 0.5
    angle = (torch.rand(20, 1, generator=g) - 0.25) * math.pi
    box = dist_to_rbox(dist, angle, anchors)
    torch.testing.assert_close(rbox_to_dist(box, angle, anchors, reg_max=15), dist)
    rbox = torch.cat((box, angle), 1)
    assert (1 - probiou(rbox, rbox, floor=0.01)).max() < 1e-3  # the box term's minimum: 1 - probiou of equal boxes


def test_candidates_are_anchors_inside_the_rotated_box():
    assigner = RotatedTaskAlignedAssigner(num_classes=1, min_side=0.0)
    gt = torch.tensor([[[16.0, 16, 20, 6, 0.6]]])
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    points = torch.stack((xs, ys), -1).view(-1, 2) + 0.5
    got = assigner.candidates(points, gt)[0, 0]
    d = points - gt[0, 0, :2]
    cos, sin = math.cos(0.6), math.sin(0.6)
    u, v = d[:, 0] * cos + d[:, 1] * sin, -d[:, 0] * sin + d[:, 1] * cos  # the points in the box's own axes
    want = (u.abs() <= 10) & (v.abs() <= 3)
    assert want.sum() > 50 and torch.equal(got, want)


def batch(n_images=2):
    """Two images of 64 px: rotated boxes of two classes (normalised xywh and angles)."""
    rows = torch.tensor([[0, 0, 0.5, 0.5, 0.5, 0.2], [0, 1, 0.25, 0.3, 0.3, 0.15], [1, 1, 0.6, 0.4, 0.4, 0.25]])
    angles = torch.tensor([0.5, -0.3, 1.2])
    return {"img": torch.rand(n_images, 3, 64, 64, generator=torch.Generator().manual_seed(1)),
            "targets": Targets.from_rows(rows, (64, 64), angles)}


@pytest.fixture
def model():
    torch.manual_seed(0)
    return OBBModel("yolov8n-obb.yaml", nc=2).train()


def test_registered_and_built_by_the_head(model):
    crit = build_criterion(model, HYP, imgsz=64)
    assert type(crit) is V8OBBLoss is REGISTRY["v8obb"] and crit.loss_names == ("box", "cls", "dfl", "angle")
    assert build_criterion(model, {k: v for k, v in HYP.items() if k != "angle"}).angle_gain == 1.0  # its default


@pytest.mark.parametrize("empty", [False, True])
def test_every_head_branch_gets_a_gradient(model, empty):
    b = batch()
    if empty:
        b["targets"] = b["targets"][:0]
    crit = build_criterion(model, HYP, imgsz=64)
    loss, items = crit(model(b["img"]), b)
    assert loss.ndim == 0 and torch.isfinite(loss) and items.shape == (4,)
    loss.backward()
    head = model.model[-1]
    missing = [n for n, p in head.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing
    angle_grad = sum(p.grad.abs().sum() for p in head.cv4.parameters())
    assert (angle_grad == 0) if empty else (angle_grad > 0)
    if empty:
        assert items[[0, 2, 3]].abs().max() == 0


def test_tiny_overfit_lowers_every_term(model):
    b = batch()
    crit = build_criterion(model, HYP, imgsz=64)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    first = None
    for _ in range(40):
        loss, items = crit(model(b["img"]), b)
        first = items if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert items.sum() < 0.5 * first.sum(), (first, items)
    assert items[3] < first[3] and items[0] < first[0]
