"""AutoAnchor: check that an anchor-based head's anchors fit the training labels, and refit them when they do not.

The fit is measured the YOLOv5 way, at the training image size: a label is recallable when some anchor is within a
factor `anchor_t` (the hyp key the loss matches with) of it in both width and height. Best possible recall (BPR) is
the share of recallable labels; anchors-above-threshold (AAT) the mean number of such anchors per label. Below
BPR 0.98, new anchors come from k-means on the label sizes followed by a short genetic refinement, and are kept only
if their BPR is higher. Under DDP rank 0 computes and broadcasts: every rank must train with the same anchors, and
the ranks' random generators are seeded differently, so each computing its own would give different ones.
"""

import numpy as np
import torch

from utils import dist as du
from utils.log import LOGGER

PREFIX = "AutoAnchor: "
BPR_MIN = 0.98
MIN_PX = 2.0  # labels under 2 px are too small to cluster on (and cannot be recalled by any sane anchor)


def label_sizes(labels, imgsz, rng):
    """(n, 2) label widths and heights in pixels as training sees them: each image resized so that its long side
    is `imgsz`, times a random factor in [0.9, 1.1] for the spread that scale augmentation gives."""
    hw = np.array([lb["shape"] for lb in labels], dtype=np.float64)
    wh_img = hw[:, ::-1] * imgsz / hw.max(1, keepdims=True)
    wh_img *= rng.uniform(0.9, 1.1, size=(len(hw), 1))
    sizes = [lb["bboxes"][:, 2:4] * s for lb, s in zip(labels, wh_img) if len(lb["bboxes"])]
    return np.concatenate(sizes, 0) if sizes else np.zeros((0, 2))


def _ratios(wh, anchors):
    """(n, k): for each label and anchor, the worse of the two side ratios, folded into (0, 1]."""
    with np.errstate(divide="ignore"):  # the placeholders of `anchors: 3` (0 px) fit nothing: ratio 0
        r = wh[:, None] / anchors[None]
        return np.minimum(r, 1 / r).min(2)


def anchor_fit(wh, anchors, thr):
    """(BPR, AAT) of pixel `anchors` (k, 2) for label sizes `wh` (n, 2) with ratio threshold `thr`."""
    if len(wh) == 0:
        return 1.0, 0.0
    x = _ratios(wh, anchors)
    return float((x.max(1) > 1 / thr).mean()), float((x > 1 / thr).sum(1).mean())


def _fitness(wh, anchors, thr):
    """What the search maximises: the mean best ratio over recallable labels (rewards tight fits, not just BPR)."""
    best = _ratios(wh, anchors).max(1)
    return float((best * (best > 1 / thr)).mean())


def kmeans(x, k, rng, iters=30):
    """Lloyd's k-means with k-means++ seeding; returns (k, d) centres."""
    centres = [x[rng.integers(len(x))]]
    for _ in range(1, k):
        d2 = ((x[:, None] - np.array(centres)[None]) ** 2).sum(2).min(1)
        p = d2 / d2.sum() if d2.sum() > 0 else None
        centres.append(x[rng.choice(len(x), p=p)])
    c = np.array(centres)
    for _ in range(iters):
        assign = ((x[:, None] - c[None]) ** 2).sum(2).argmin(1)
        c = np.array([x[assign == j].mean(0) if (assign == j).any() else c[j] for j in range(k)])
    return c


def fit_anchors(wh, n, thr, rng, gens=1000, mutation=(0.9, 0.1)):
    """n anchors (n, 2) in pixels, sorted by area: k-means on whitened sizes, then `gens` rounds of mutation that
    keep a candidate only when it raises `_fitness`."""
    wh = wh[(wh >= MIN_PX).all(1)]
    if len(wh) < n:
        raise ValueError(f"{PREFIX}only {len(wh)} labels of at least {MIN_PX} px: cannot fit {n} anchors")
    s = wh.std(0) + 1e-9  # whitening: k-means on raw pixels would cluster by the wider axis only
    k = kmeans(wh / s, n, rng) * s
    f = _fitness(wh, k, thr)
    p, sigma = mutation
    for _ in range(gens):
        v = np.ones_like(k)
        while (v == 1).all():  # a mutation that changes nothing would waste the round
            v = ((rng.random(k.shape) < p) * rng.random() * rng.standard_normal(k.shape) * sigma + 1).clip(0.3, 3.0)
        kg = (k * v).clip(min=MIN_PX)
        fg = _fitness(wh, kg, thr)
        if fg > f:
            f, k = fg, kg
    return k[np.argsort(k.prod(1))]


def head_anchors_px(head):
    """The head's anchors (nl * na, 2) in pixels (the head keeps them in grid units of each level's stride)."""
    return (head.anchors * head.stride.view(-1, 1, 1)).view(-1, 2).cpu().double().numpy()


def set_anchors(model, anchors_px):
    """Write pixel anchors (nl * na, 2), smallest first, into the head: grid units per level, the smallest to the
    finest stride; YOLOv7's `anchor_grid` copy and the model YAML follow, so checkpoints and rebuilt models agree."""
    head = model.model[-1]
    order = torch.argsort(head.stride)  # levels from finest to coarsest
    a = torch.as_tensor(np.asarray(anchors_px), dtype=torch.float32).view(head.nl, head.na, 2).to(head.anchors.device)
    px = torch.empty_like(a)
    px[order] = a
    head.anchors.copy_(px / head.stride.view(-1, 1, 1))
    if hasattr(head, "anchor_grid"):
        head.anchor_grid.copy_(px.view_as(head.anchor_grid))
    model.yaml["anchors"] = [[round(v, 2) for v in level.flatten().tolist()] for level in px.cpu()]


def _refit(head, labels, thr, imgsz):
    """Rank 0's part: new pixel anchors when they raise BPR, else None; logs the figures either way."""
    rng = np.random.default_rng(np.random.randint(2**31))  # from the rank's seeded global state: see module doc
    wh = label_sizes(labels, imgsz, rng)
    old = head_anchors_px(head)
    bpr, aat = anchor_fit(wh, old, thr)
    msg = f"{PREFIX}{aat:.2f} anchors/target, {bpr:.3f} Best Possible Recall (BPR) at anchor_t {thr}. "
    if bpr >= BPR_MIN:
        LOGGER.info(msg + "Current anchors are a good fit to the dataset")
        return None
    LOGGER.info(msg + f"Anchors are a poor fit (BPR < {BPR_MIN}), refitting them to the labels...")
    try:
        new = fit_anchors(wh, len(old), thr, rng)
    except ValueError as e:
        LOGGER.warning(f"{e}; keeping the original anchors")
        return None
    new_bpr, new_aat = anchor_fit(wh, new, thr)
    if new_bpr <= bpr:
        LOGGER.info(f"{PREFIX}refit reached BPR {new_bpr:.3f}, no better: keeping the original anchors")
        return None
    shown = ", ".join(f"{w:.0f},{h:.0f}" for w, h in new)
    LOGGER.info(f"{PREFIX}new anchors {new_aat:.2f} anchors/target, BPR {bpr:.3f} -> {new_bpr:.3f} "
                f"(saved with the model): {shown}")
    return new


HYP_KEYS = {"anchor_t": "(1, inf)"}  # the hyp key it reads: no label fits an anchor ratio limit of 1 or less
HYP_DEFAULTS = {}


def check_anchors(model, labels, hyp, imgsz):
    """Refit an anchor-based head's anchors to `labels` (dataset label dicts) if they fit poorly; no-op for
    anchor-free heads. Collective under DDP: every rank must call it."""
    head = model.model[-1]
    if not getattr(head, "anchor_based", False):
        return
    new = _refit(head, labels, hyp["anchor_t"], imgsz) if du.is_main_process() else None
    new = du.broadcast_object(new)
    if new is not None:
        set_anchors(model, new)
