"""Classification criterion."""

import torch.nn.functional as F


class ClassificationLoss:
    """Cross-entropy with label smoothing over `Classify` train logits (B, nc) and `batch['cls']` (B,).

    Reduction: the engine multiplies every loss by WORLD_SIZE and DDP averages gradients over ranks, so the
    optimizer sees sum_r grad(L_r). That equals the single-process gradient on the concatenated batch exactly when
    L is a sum over images times a constant; so L = sum of CE / nbs with a fixed nominal batch nbs = 64 (as the
    v8-era official classifier). A per-rank mean would make DDP W times too large (or need a different rule).
    """

    name = "cls"  # what `hyp loss:` and a head's `default_loss` call it
    loss_names = ("cls",)
    nbs = 64
    hyp_keys = {"label_smoothing": "[0, 1)"}  # what engine/hyp.py checks files against
    hyp_defaults = {"label_smoothing": 0.0}
    hyp_file = "hyp.cls.yaml"  # every classifier's: the detection files would bring mosaic and box gains

    def __init__(self, model, hyp, imgsz=640):
        self.label_smoothing = {**self.hyp_defaults, **hyp}["label_smoothing"]

    def __call__(self, preds, batch):
        ce = F.cross_entropy(preds, batch["cls"], label_smoothing=self.label_smoothing, reduction="sum")
        return ce / self.nbs, (ce.detach() / max(preds.shape[0], 1)).view(1)
