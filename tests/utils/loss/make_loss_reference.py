"""Build tests/utils/loss/loss_reference.pt: each criterion's loss, loss items and gradient with respect to the model
output, on one fixed batch, as computed by the criteria of a given commit (from the repo root):

    PYTHONPATH=$PWD python tests/utils/loss/make_loss_reference.py

The stored file came from commit 9842094, before the criteria were rewritten to avoid host-device synchronisations
(boolean-mask indexing, `.any()` branches, one_hot, bincount): test_loss_reference.py checks that the rewritten
criteria give the same numbers. The model outputs are stored too (the real models' train output at nc=3, 64 px, from
seeded weights and images), so later changes to models/ do not move the reference.
"""

from pathlib import Path

import torch
from torch.utils._pytree import tree_map

from data.targets import Targets
from models.yolo import DetectionModel, PoseModel, SegmentationModel

OUT = Path(__file__).with_name("loss_reference.pt")
HYP_V5 = {"box": 0.05, "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}
HYP_V8 = {"box": 7.5, "cls": 0.5, "dfl": 1.5}
CASES = {  # name: (model class, yaml, hyp)
    "v5": (DetectionModel, "yolov5n.yaml", HYP_V5),
    "ota": (DetectionModel, "yolov7-tiny.yaml", HYP_V5),
    "v8": (DetectionModel, "yolov8n.yaml", HYP_V8),
    "v5seg": (SegmentationModel, "yolov5n-seg.yaml", HYP_V5),
    "v8seg": (SegmentationModel, "yolov8n-seg.yaml", HYP_V8),
    "v8pose": (PoseModel, "yolov8n-pose.yaml", {**HYP_V8, "pose": 12.0, "kobj": 1.0}),
}
# four 64 x 64 images: two overlapping objects and a small one (anchors claimed by several boxes), none, five of
# every size up to the borders, one
TARGETS = [
    [0, 0, 0.40, 0.45, 0.50, 0.55], [0, 1, 0.45, 0.50, 0.45, 0.50], [0, 2, 0.80, 0.20, 0.10, 0.12],
    [2, 2, 0.10, 0.12, 0.18, 0.22], [2, 0, 0.50, 0.50, 0.95, 0.90], [2, 1, 0.62, 0.37, 0.30, 0.20],
    [2, 1, 0.93, 0.90, 0.14, 0.18], [2, 0, 0.26, 0.74, 0.05, 0.06],
    [3, 1, 0.55, 0.60, 0.35, 0.40],
]


def batch(name):
    """The batch a criterion reads: targets, and the masks (overlap and per-target) or keypoints it needs."""
    targets = torch.tensor(TARGETS)
    g = torch.Generator().manual_seed(2)
    out = {"targets": targets}
    if "seg" in name:
        ys, xs = torch.meshgrid(torch.arange(16) + 0.5, torch.arange(16) + 0.5, indexing="ij")
        per = torch.stack([((xs / 16 - cx).abs() < w / 2) & ((ys / 16 - cy).abs() < h / 2)
                           for cx, cy, w, h in targets[:, 2:6].tolist()]).float()
        masks = torch.zeros(4, 16, 16)
        for i in range(4):
            rows = (targets[:, 0] == i).nonzero().flatten().tolist()
            for k, r in enumerate(rows):
                masks[i][per[r] > 0] = k + 1
        out.update(masks=masks, overlap=True, per_target_masks=per)
    if "pose" in name:
        kpts = torch.rand(len(targets), 17, 3, generator=g)
        kpts[..., :2] = targets[:, None, 2:4] + (kpts[..., :2] - 0.5) * targets[:, None, 4:6]
        kpts[..., 2] = (kpts[..., 2] * 3).floor()  # visibility 0, 1 or 2
        out["keypoints"] = kpts
    return out


def typed(data):
    """A stored batch (its targets as rows [image, cls, cx, cy, w, h], keypoints beside them: the file holds tensors
    only) as the criteria read it: typed targets (data/targets.py) on the 64 px canvas."""
    data = dict(data)
    data["targets"] = Targets.from_rows(data["targets"], (64, 64), keypoints=data.pop("keypoints", None))
    return data


def load():
    """The stored reference: {case: {preds, batch, loss, items, grads}}, a case per criterion, and `<name>-no-overlap`
    for the segmentation ones with per-target masks."""
    return torch.load(OUT, weights_only=True)


def case_names():
    return [*CASES, *(f"{name}-no-overlap" for name in CASES if "seg" in name)]


def evaluate(criterion, preds, data):
    """(loss, items, gradient of the loss with respect to every output tensor) from fresh leaf copies of `preds`."""
    leaves = tree_map(lambda t: t.detach().clone().requires_grad_(), preds)
    loss, items = criterion(leaves, typed(data))
    grads = torch.autograd.grad(loss, [t for t in torch.utils._pytree.tree_leaves(leaves)], allow_unused=True)
    return loss.detach(), items, [torch.zeros(0) if g is None else g for g in grads]


def main():
    ref = {}
    for name, (cls, cfg, hyp) in CASES.items():
        torch.manual_seed(0)
        model = cls(cfg, nc=3).train()
        img = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            preds = tree_map(lambda t: t.detach(), model(img))
        data = batch(name)
        per_target = data.pop("per_target_masks", None)
        criterion = model.init_criterion(hyp, imgsz=64)
        loss, items, grads = evaluate(criterion, preds, data)
        ref[name] = {"preds": preds, "batch": data, "loss": loss, "items": items, "grads": grads}
        if per_target is not None:  # the per-target mask layout (--no-overlap) too
            per = {**data, "masks": per_target, "overlap": False}
            loss, items, grads = evaluate(criterion, preds, per)
            ref[name + "-no-overlap"] = {"preds": preds, "batch": per, "loss": loss, "items": items, "grads": grads}
        print(name, loss.item(), items.tolist())
    torch.save(ref, OUT)


if __name__ == "__main__":
    main()
