import math

import pytest
import torch
from loss_fakes import HYP_V5, HYP_V8, alone, box_masks, det_batch, fake_model

from losses import V5SegmentationLoss, V8SegmentationLoss
from losses.seg import mask_loss, prepare_masks


def square_case():
    """16x16 masks, one object filling the box x 4..12, y 2..10 (box area 64 px = 0.25 of the image)."""
    gt = torch.zeros(1, 16, 16)
    gt[0, 2:10, 4:12] = 1
    proto = torch.stack((gt[0] * 2 - 1, torch.ones(16, 16)))  # channel 0 is +1 on the object, -1 elsewhere
    xyxy = torch.tensor([[4.0, 2.0, 12.0, 10.0]])
    return gt, proto, xyxy, torch.tensor([0.25])


def test_mask_loss_perfect_coefficients_beat_random():
    gt, proto, xyxy, area = square_case()
    perfect = mask_loss(gt, torch.tensor([[8.0, 0.0]]), proto, xyxy, area)
    torch.manual_seed(0)
    random = torch.stack([mask_loss(gt, torch.randn(1, 2), proto, xyxy, area) for _ in range(20)])
    assert perfect < 1e-3 and (random > perfect).all()


def test_mask_loss_area_normalisation():
    """Constant logit 0 gives per-pixel BCE log 2; cropped, averaged and divided by the area it is log 2 again,
    whatever the size of the box."""
    proto = torch.zeros(2, 16, 16)
    coeffs = torch.zeros(2, 2)
    gt = torch.zeros(2, 16, 16)
    xyxy = torch.tensor([[0.0, 0.0, 4.0, 4.0], [2.0, 2.0, 14.0, 10.0]])
    area = torch.tensor([16 / 256, 96 / 256])
    assert math.isclose(mask_loss(gt, coeffs, proto, xyxy, area).item(), math.log(2), rel_tol=1e-5)
    # pixels outside the box do not count
    gt[:, 12:, 12:] = 1
    assert math.isclose(mask_loss(gt[:1], coeffs[:1], proto, xyxy[:1], area[:1]).item(), math.log(2), rel_tol=1e-5)


def test_prepare_masks_brings_masks_to_the_proto_size():
    m = prepare_masks(torch.ones(2, 32, 32, dtype=torch.uint8), (16, 16))
    assert m.shape == (2, 16, 16) and m.dtype == torch.float32 and bool((m == 1).all())


def seg_batch(overlap=True):
    batch = det_batch()
    batch["masks"] = box_masks(batch["targets"], 2, (16, 16), overlap=overlap)
    batch["overlap"] = overlap  # how the masks read travels with them, as the collate step puts it
    return batch


def split_image(batch, i, overlap=True):
    t = alone(batch["targets"].of_image(i))
    masks = batch["masks"][i : i + 1] if overlap else batch["masks"][batch["targets"].image == i]
    return {"img": batch["img"][i : i + 1], "targets": t, "masks": masks, "overlap": overlap}


@pytest.mark.parametrize("kind,cls,hyp", [("anchor", V5SegmentationLoss, HYP_V5), ("free", V8SegmentationLoss, HYP_V8)])
def test_mask_term_is_additive_over_images(kind, cls, hyp):
    model = fake_model(kind, nm=4)
    crit = cls(model, hyp, imgsz=64)
    batch = seg_batch()
    loss, items = crit(model(batch["img"]), batch)
    assert torch.allclose(loss, items.sum() * 2)
    assert cls.loss_names[1] == "seg" and items[1] > 0
    single = [crit(model(b["img"]), b)[1][1] for b in (split_image(batch, 0), split_image(batch, 1))]
    assert torch.allclose(items[1] * 2, single[0] + single[1], rtol=1e-5)


@pytest.mark.parametrize("kind,cls,hyp", [("anchor", V5SegmentationLoss, HYP_V5), ("free", V8SegmentationLoss, HYP_V8)])
def test_overlap_and_separate_masks_agree(kind, cls, hyp):
    model = fake_model(kind, nm=4)
    crit = cls(model, hyp, imgsz=64)
    batch = seg_batch(overlap=True)
    preds = model(batch["img"])
    _, a = crit(preds, batch)
    _, b = crit(preds, dict(batch, masks=box_masks(batch["targets"], 2, (16, 16), overlap=False), overlap=False))
    assert torch.allclose(a, b)
    # masks at input resolution are brought to the proto size
    _, c = crit(preds, dict(batch, masks=box_masks(batch["targets"], 2, (64, 64), overlap=True)))
    assert torch.allclose(a[1], c[1], rtol=0.2)
