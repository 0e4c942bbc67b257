import torch
import torch.nn.functional as F
from loss_fakes import HYP_V5, det_batch, fake_model
from make_loss_reference import evaluate

from losses import OTADetectionLoss, V5DetectionLoss
from losses.v7_ota import _class_cost, dynamic_k_match, image_blocks


def test_dynamic_k_hand_case():
    iou = torch.tensor([[0.9, 0.8, 0.6, 0.1, 0.0],   # top sum 2.4 -> k = 2
                        [0.0, 0.3, 0.2, 0.1, 0.0]])  # top sum 0.6 -> k = 1 (at least one)
    cost = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0],
                         [9.0, 0.5, 8.0, 7.0, 6.0]])
    # target 0 claims candidates 0 and 1, target 1 claims 1; candidate 1 stays with the cheaper target 1
    assert dynamic_k_match(iou, cost).tolist() == [0, 1, -1, -1, -1]


def test_contested_candidate_goes_to_cheapest_target_overall():
    iou = torch.tensor([[0.9, 0.2], [0.9, 0.2], [0.1, 0.9]])  # k = 1 each
    cost = torch.tensor([[1.0, 9.0], [2.0, 9.0], [0.5, 0.1]])
    # targets 0 and 1 both claim candidate 0; target 2 claims candidate 1 but is the cheapest for candidate 0 too
    assert dynamic_k_match(iou, cost).tolist() == [2, 2]


def test_dynamic_k_counts_only_top_ten():
    iou = torch.full((1, 30), 0.25)  # all 30 sum to 7.5, the top 10 to 2.5 -> k = 2
    cost = torch.arange(30.0)[None]
    assert dynamic_k_match(iou, cost).tolist() == [0, 0] + [-1] * 28


def test_dynamic_k_empty():
    assert dynamic_k_match(torch.zeros(2, 0), torch.zeros(2, 0)).shape == (0,)


def test_class_cost_is_summed_bce():
    torch.manual_seed(0)
    prob = torch.rand(6, 4) * 0.98 + 0.01
    labels = torch.tensor([2, 0, 3])
    onehot = F.one_hot(labels, 4).float()
    want = F.binary_cross_entropy(prob[None].expand(3, -1, -1), onehot[:, None].expand(-1, 6, -1),
                                  reduction="none").sum(-1)
    assert torch.allclose(_class_cost(prob, labels), want, atol=1e-5)


def test_ota_positives_are_v5_candidates_and_cover_every_target():
    model = fake_model("anchor", default_loss="ota")
    batch = det_batch()
    preds = model(batch["img"])
    ota = OTADetectionLoss(model, HYP_V5, imgsz=64)
    v5 = V5DetectionLoss(model, HYP_V5, imgsz=64)
    chosen, candidates = ota.assign(preds, batch["targets"]), v5.assign(preds, batch["targets"])
    cand_cells = {(i, *c) for i, lv in enumerate(candidates)
                  for c in zip(lv.b.tolist(), lv.a.tolist(), lv.gj.tolist(), lv.gi.tolist())}
    rows = set()
    n_chosen = 0
    for i, lv in enumerate(chosen):
        n_chosen += len(lv.b)
        for b, a, gj, gi, r in zip(lv.b.tolist(), lv.a.tolist(), lv.gj.tolist(), lv.gi.tolist(), lv.row.tolist()):
            assert (i, b, a, gj, gi) in cand_cells
            assert batch["targets"].image[r] == b  # matched within its own image
            rows.add(r)
        # box targets follow the matched target, relative to the chosen cell
        ny, nx = preds[i].shape[2:4]
        size = torch.tensor([nx, ny], dtype=torch.float32)
        want_xy = batch["targets"].boxes.data[lv.row, :2] * size - torch.stack((lv.gi, lv.gj), 1)
        assert torch.allclose(lv.tbox[:, :2], want_xy)
    assert rows == {0, 1, 2}
    assert n_chosen < sum(len(lv.b) for lv in candidates)


def test_ota_loss_layout():
    model = fake_model("anchor", default_loss="ota")
    batch = det_batch()
    loss, items = OTADetectionLoss(model, HYP_V5, imgsz=64)(model(batch["img"]), batch)
    assert OTADetectionLoss.loss_names == ("box", "obj", "cls")
    assert torch.allclose(loss, items.sum() * 2) and (items > 0).all()


def test_one_matrix_for_a_batch_matches_image_by_image():
    """OTA matches a whole batch in one (targets x candidates) matrix whose pairs across images cost infinity; that
    gives each image the matching of its own matrix, also for an image whose targets have no candidate (k is then
    at least 1, but no candidate of another image may be taken) and one with candidates but no target."""
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        targets_per_image = torch.randint(0, 4, (3,), generator=g).tolist()
        candidates_per_image = [torch.randint(0, 14, (), generator=g).item() if n else 3 for n in targets_per_image]
        candidates_per_image[torch.randint(0, 3, (), generator=g).item()] = 0
        tb = torch.repeat_interleave(torch.arange(3), torch.tensor(targets_per_image))
        cb = torch.repeat_interleave(torch.arange(3), torch.tensor(candidates_per_image))
        iou = torch.rand(len(tb), len(cb), generator=g)
        cost = torch.rand(len(tb), len(cb), generator=g) * 10
        apart = tb[:, None] != cb[None]
        got = dynamic_k_match(iou.masked_fill(apart, 0.0), cost.masked_fill(apart, float("inf")))
        want = torch.full((len(cb),), -1)
        for i in range(3):
            ti, ci = (tb == i).nonzero().flatten(), (cb == i).nonzero().flatten()
            m = dynamic_k_match(iou[ti][:, ci], cost[ti][:, ci])
            want[ci[m >= 0]] = ti[m[m >= 0]]
        assert got.tolist() == want.tolist()


def test_image_blocks_hold_whole_images_within_the_pair_limit():
    """Blocks of whole images, each within max_pairs unless one image alone is over it, every candidate in exactly
    one block with every target of its image; a batch within the limit is one block."""
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        bs = int(torch.randint(1, 7, (), generator=g))
        target_b = torch.randint(0, bs, (int(torch.randint(1, 15, (), generator=g)),), generator=g)
        per_target = torch.randint(0, 5, (len(target_b),), generator=g)  # candidates come from targets
        cand_b = torch.repeat_interleave(target_b, per_target)[torch.randperm(int(per_target.sum()), generator=g)]
        limit = int(torch.randint(1, 60, (), generator=g))
        blocks = image_blocks(target_b, cand_b, bs, limit)
        seen = torch.cat([ci for _, ci in blocks]) if blocks else torch.zeros(0, dtype=torch.long)
        assert sorted(seen.tolist()) == list(range(len(cand_b)))
        for ti, ci in blocks:
            images = set(target_b[ti].tolist())
            assert set(cand_b[ci].tolist()) <= images
            assert sorted(ti.tolist()) == [i for i, b in enumerate(target_b.tolist()) if b in images]
            assert len(ti) * len(ci) <= limit or len(images) == 1
        if len(target_b) * len(cand_b) <= limit:
            assert len(blocks) == 1


def test_blocks_of_images_match_as_one_matrix(criteria, reference, monkeypatch):
    """The reference batch's OTA loss and gradients with the batch matched one image per block equal those of one
    matrix (and so the per-image matching of the criteria before it, test_loss_reference.py)."""
    import losses.v7_ota as ota

    ref = reference["ota"]
    seen = []
    blocks = ota.image_blocks
    monkeypatch.setattr(ota, "image_blocks", lambda *a: seen.append(len(blocks(*a, 1))) or blocks(*a, 1))
    loss, items, grads = evaluate(criteria["ota"], ref["preds"], ref["batch"])
    assert seen == [3]  # the reference batch's three images with targets, one block each
    torch.testing.assert_close(loss, ref["loss"], rtol=1e-6, atol=0)
    torch.testing.assert_close(items, ref["items"], rtol=1e-6, atol=0)
    for got, want in zip(grads, ref["grads"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())
