"""plot_images draws an oriented-box batch (its `angles`) as the boxes' outlines: the turned rectangle's edges are
drawn and its upright envelope's corners are not."""

import math

import cv2
import numpy as np
import torch

from evaluation.plots import plot_images
from utils.rotated import xywhr_to_corners


def _drawn(tmp_path, angles, targets):
    f = plot_images(torch.zeros(1, 3, 128, 128), targets, None, tmp_path / "b.jpg", {0: "x"}, angles=angles)
    return cv2.imread(str(f)).max(2) > 60  # drawn pixels (the colour of class 0 on black)


def _near(mask, xy, r=2):
    x, y = int(round(xy[0])), int(round(xy[1]))
    return mask[max(y - r, 0): y + r + 1, max(x - r, 0): x + r + 1].any()


def test_an_oriented_target_is_drawn_turned(tmp_path):
    targets = torch.tensor([[0, 0, 0.5, 0.55, 0.6, 0.2]])  # normalised, as a training batch holds them
    angle = math.pi / 6
    mask = _drawn(tmp_path, torch.tensor([angle]), targets)
    corners = xywhr_to_corners(torch.tensor([[64.0, 70.4, 76.8, 25.6, angle]]))[0].numpy()
    for a, b in zip(corners, np.roll(corners, -1, 0)):  # every edge, at its quarter points
        for s in (0.25, 0.5, 0.75):
            assert _near(mask, a + s * (b - a)), (a, b, s)
    lo, hi = corners.min(0), corners.max(0)
    for xy in ((lo[0], hi[1]), (hi[0], hi[1])):  # the envelope's lower corners: no box there
        assert not _near(mask, xy, r=3), xy
    upright = _drawn(tmp_path, None, targets)  # without angles: the upright box, whose corners are there
    assert _near(upright, (64 - 38.4, 70.4 + 12.8)) and not _near(upright, corners[0], r=1)


def test_oriented_predictions_in_pixels_and_below_the_shown_confidence(tmp_path):
    """Rows in pixels with a confidence (a val batch's predictions): the one under 0.25 is not drawn."""
    targets = torch.tensor([[0, 0, 40.0, 40.0, 40.0, 12.0, 0.9], [0, 0, 90.0, 90.0, 40.0, 12.0, 0.1]])
    mask = _drawn(tmp_path, torch.tensor([1.0, 1.0]), targets)
    c = xywhr_to_corners(torch.tensor([[40.0, 40.0, 40.0, 12.0, 1.0], [90.0, 90.0, 40.0, 12.0, 1.0]])).numpy()
    assert all(_near(mask, (a + b) / 2) for a, b in zip(c[0], np.roll(c[0], -1, 0)))
    assert not any(_near(mask, (a + b) / 2) for a, b in zip(c[1], np.roll(c[1], -1, 0)))
