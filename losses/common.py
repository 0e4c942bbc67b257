"""Pieces shared by the criteria: finding the head, the balanced BCE, level weights, padded targets."""

import torch
import torch.nn.functional as F

from utils.dist import de_parallel


def detection_head(model):
    return de_parallel(model).model[-1]


def level_balance(nl):
    """Objectness weight per pyramid level, as official: small-stride levels see more cells, so more weight."""
    if nl == 3:
        return [4.0, 1.0, 0.4]
    weights = [4.0, 1.0, 0.25, 0.06, 0.02]
    if nl > len(weights):
        raise ValueError(f"no objectness balance is defined for {nl} detection levels (at most {len(weights)})")
    return weights[:nl]


def smooth_labels(eps):
    """Positive and negative BCE targets for label smoothing eps (eps=0 gives 1 and 0)."""
    return 1.0 - 0.5 * eps, 0.5 * eps


def bce(logits, target, pos_weight=1.0, gamma=0.0, alpha=0.25):
    """Mean BCE-with-logits with a positive-class weight, turned into the focal loss when gamma > 0."""
    pw = None if pos_weight == 1.0 else logits.new_full((), pos_weight)  # filled on the device, not copied to it
    loss = F.binary_cross_entropy_with_logits(logits, target, pos_weight=pw, reduction="none")
    if gamma > 0:
        p = logits.sigmoid()
        p_t = target * p + (1 - target) * (1 - p)
        alpha_t = target * alpha + (1 - target) * (1 - alpha)
        loss = loss * alpha_t * (1.0 - p_t) ** gamma
    return loss.mean()


def per_image_index(batch_idx, batch_size):
    """For targets tagged with their image, the 0-based rank of each among its image's targets (in row order)."""
    b = batch_idx.long()
    # counted by comparison into a tensor of known size: bincount's size depends on the values, so it would wait for
    # the device
    counts = (b == torch.arange(batch_size, device=b.device)[:, None]).sum(1)
    order = torch.argsort(b, stable=True)
    starts = counts.cumsum(0) - counts
    rank = torch.empty_like(b)
    rank[order] = torch.arange(len(b), device=b.device) - starts[b[order]]
    return rank, counts


def pad_targets(targets, batch_size, boxes):
    """A batch's `Targets` (data/targets.py) and their `boxes` (N, k) in the form the caller asked of them -> per-image
    padded GT tensors.

    Returns `labels` (B, M, 1), `boxes` (B, M, k) (zeros for padding), `valid` (B, M, 1) bool and `row` (B, M) long,
    the row of `targets` each GT came from (-1 for padding); M is the most targets in one image.
    """
    device = targets.device
    rank, counts = per_image_index(targets.image, batch_size)
    m = int(counts.max()) if len(targets) else 0  # the padded size: the one value read back to the host
    labels = torch.zeros(batch_size, m, 1, device=device)
    padded = torch.zeros(batch_size, m, boxes.shape[1], device=device)
    row = torch.full((batch_size, m), -1, dtype=torch.long, device=device)
    b = targets.image
    labels[b, rank, 0] = targets.cls.float()
    padded[b, rank] = boxes.float()
    row[b, rank] = torch.arange(len(targets), device=device)
    return labels, padded, (row >= 0).unsqueeze(-1), row
