"""The v8 pose criterion's keypoint terms against hand-written formulas, and its loss items against Ultralytics'."""

import math
import sys
from pathlib import Path

import torch

from data.targets import Targets
from evaluation.metrics import COCO_KPT_SIGMAS, keypoint_sigmas
from losses.v8pose import V8PoseLoss, keypoint_location_loss
from models.yolo import PoseModel


def test_keypoint_location_loss_by_hand():
    """One instance, 2 keypoints labelled and 1 not: e = d^2 / (2 area (2 sigma)^2); the loss is
    K / labelled x sum over labelled of (1 - exp(-e)), averaged over the K keypoints."""
    pred = torch.tensor([[[1.0, 1.0], [4.0, 2.0], [9.0, 9.0]]])
    gt = torch.tensor([[[1.0, 2.0, 2], [1.0, 2.0, 1], [0.0, 0.0, 0]]])
    visible = gt[..., 2] != 0
    sigmas = torch.tensor([0.1, 0.2, 0.3])
    area = torch.tensor([[4.0]])
    e = [1.0 / (2 * 4.0 * 0.2**2), 9.0 / (2 * 4.0 * 0.4**2)]
    expected = 3 / 2 * sum(1 - math.exp(-v) for v in e) / 3
    assert math.isclose(keypoint_location_loss(pred, gt, visible, area, sigmas).item(), expected, rel_tol=1e-6)
    # a perfect prediction costs nothing, and an unlabelled keypoint never counts
    assert keypoint_location_loss(gt[..., :2], gt, visible, area, sigmas).item() == 0.0


def test_sigmas_coco_for_17_uniform_otherwise():
    assert (keypoint_sigmas(17) == COCO_KPT_SIGMAS).all() and math.isclose(COCO_KPT_SIGMAS[0], 0.026)
    assert (keypoint_sigmas(4) == 0.25).all()


def test_decoded_keypoints_in_grid_units():
    """The criterion decodes as the head does before the stride: (2 d + cell centre - 0.5) per axis."""
    crit = V8PoseLoss.__new__(V8PoseLoss)
    crit.kpt_shape = (1, 3)
    anchors = torch.tensor([[0.5, 0.5], [3.5, 1.5]])
    kpt = torch.tensor([[[0.25, -1.0], [0.5, 2.0], [0.7, -0.7]]])  # (B, K * ndim, A)
    out = crit.decode_keypoints(anchors, kpt)
    torch.testing.assert_close(out[0, :, 0], torch.tensor([[0.5, 1.0, 0.7], [1.0, 5.0, -0.7]]))


def test_loss_items_equal_ultralytics_v8_pose_loss():
    """The same model, weights and batch as tests/models/fixtures/make_pose_loss.py gave Ultralytics' v8PoseLoss:
    the five loss items agree (box, pose, kobj, cls, dfl at the official gains)."""
    fixtures = Path(__file__).resolve().parents[2] / "models" / "fixtures"
    sys.path.insert(0, str(fixtures))
    sys.path.insert(0, str(fixtures.parent))
    try:
        from make_pose_loss import batch
        from parity_weights import seeded_state
    finally:
        del sys.path[:2]
    ref = torch.load(fixtures / "yolov8n-pose_loss.pt", weights_only=True)
    torch.manual_seed(0)
    model = PoseModel("yolov8n-pose.yaml", nc=2)
    model.load_state_dict(seeded_state(model.state_dict()))
    x, bi, cls, boxes, kpts = batch()
    torch.testing.assert_close(kpts, ref["kpts"])
    crit = model.init_criterion({"box": 7.5, "cls": 0.5, "dfl": 1.5, "pose": 12.0, "kobj": 1.0})
    targets = Targets.from_rows(torch.cat([bi[:, None], cls, boxes], 1), x.shape[2:], keypoints=kpts)
    _, items = crit(model.train()(x), {"targets": targets})
    torch.testing.assert_close(items, ref["items"], rtol=1e-4, atol=1e-5)
