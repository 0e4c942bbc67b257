import math

import torch
import torch.nn.functional as F

from losses import ClassificationLoss


def test_sum_over_nominal_batch_and_mean_items():
    torch.manual_seed(0)
    logits, cls = torch.randn(5, 4), torch.tensor([0, 3, 1, 1, 2])
    loss, items = ClassificationLoss(None, {"label_smoothing": 0.1})(logits, {"cls": cls})
    ce = F.cross_entropy(logits, cls, label_smoothing=0.1, reduction="none")
    assert torch.allclose(loss, ce.sum() / 64)
    assert items.shape == (1,) and torch.allclose(items, ce.mean().view(1)) and not items.requires_grad
    assert ClassificationLoss.loss_names == ("cls",)


def test_label_smoothing_value():
    logits, cls = torch.zeros(1, 4), torch.tensor([2])
    logits[0, 2] = 10.0
    loss, _ = ClassificationLoss(None, {"label_smoothing": 0.2})(logits, {"cls": cls})
    logp = logits.log_softmax(1)[0]
    want = -(0.8 + 0.2 / 4) * logp[2] - (0.2 / 4) * (logp.sum() - logp[2])
    assert math.isclose(loss.item() * 64, want.item(), rel_tol=1e-5)
    assert ClassificationLoss(None, {}).label_smoothing == 0.0


def test_gradient_on_concatenated_batch_is_sum_over_ranks():
    """DDP rule: the engine's loss * W with averaged gradients = sum of the per-rank gradients; that must equal
    the single-process gradient on the whole batch."""
    torch.manual_seed(0)
    head = torch.nn.Linear(6, 3)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    crit = ClassificationLoss(None, {"label_smoothing": 0.1})
    crit(head(x), {"cls": y})[0].backward()
    whole = head.weight.grad.clone()
    head.zero_grad()
    world = 2
    for r in range(world):
        part = slice(4 * r, 4 * r + 4)
        (crit(head(x[part]), {"cls": y[part]})[0] * world).backward()
    assert torch.allclose(head.weight.grad / world, whole, atol=1e-6)
