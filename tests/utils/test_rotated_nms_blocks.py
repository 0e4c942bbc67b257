"""rotated_nms computes its overlaps a block of rows at a time: the boxes it keeps are those of the whole-matrix rule
(a box goes when any higher-scoring box overlaps it by probiou > iou_thres), whatever the block size."""

import pytest
import torch

from utils import rotated
from utils.rotated import probiou, rotated_nms


def _whole_matrix(boxes, scores, iou_thres):
    order = scores.argsort(descending=True, stable=True)
    iou = probiou(boxes[order, None], boxes[None, order]).triu_(diagonal=1)
    return order[(iou > iou_thres).sum(0) == 0]


@pytest.mark.parametrize("pairs", [1, 7 * 300, 1 << 22])  # a row a block, 7 rows, all at once
def test_blocks_keep_what_the_whole_matrix_keeps(pairs, monkeypatch):
    g = torch.Generator().manual_seed(0)
    n = 300
    boxes = torch.cat((torch.rand(n, 2, generator=g) * 200, torch.rand(n, 2, generator=g) * 40 + 4,
                       torch.rand(n, 1, generator=g) * 3.14), 1)
    scores = torch.rand(n, generator=g).round(decimals=2)  # ties: kept in their order
    monkeypatch.setattr(rotated, "PAIRS_PER_BLOCK", pairs)
    kept = rotated_nms(boxes, scores, 0.3)
    assert torch.equal(kept, _whole_matrix(boxes, scores, 0.3))
    assert 10 < len(kept) < n  # the rule did drop boxes and keep some


def test_no_boxes():
    assert rotated_nms(torch.zeros((0, 5)), torch.zeros(0), 0.5).shape == (0,)
