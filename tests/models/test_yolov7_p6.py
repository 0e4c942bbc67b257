"""YOLOv7 P6 (yolov7-w6, -e6, -d6, -e6e) against the official YOLOv7 repository's own code (fixtures/v7p6_parity.pt;
fixtures/make_v7p6_parity.py says how it was made): state-dict keys and shapes, eval outputs of the lead head and the
maps of the auxiliary one, the lead-guided auxiliary loss (ComputeLossAuxOTA) on a fixed batch; and what the
auxiliary head is for: trained, never in an eval output or an export."""

import math

import pytest
import torch
import torch.nn as nn
from fixtures.make_v7p6_parity import CLASSES, CROP, NAMES, NARROW, seeded_keep_anchors
from fixtures.make_zoo_parity import FIXTURES, combined_fingerprint, key_lines, keys_digest
from models_testutil import PARITY, assert_close_per_channel

from data.targets import Targets
from engine.hyp import read_hyp
from losses import build_criterion
from losses.v5 import match_anchors
from losses.v7_ota import AuxOTADetectionLoss, OTADetectionLoss
from models.checkpoints import transfer_weights
from models.heads import IAuxDetect
from models.yolo import DetectionModel, parse_model, yaml_model_load
from utils.errors import BadModelYaml, BadOption


@pytest.fixture(scope="module")
def fixtures():
    return torch.load(FIXTURES / "v7p6_parity.pt", weights_only=True)


def typed(ref):
    """The fixture's targets (rows [image, cls, cx, cy, w, h] normalised: the file holds tensors only), typed."""
    return Targets.from_rows(ref["targets"], (ref["imgsz"], ref["imgsz"]))


def narrow(name, nc=80):
    return DetectionModel({**yaml_model_load(f"{name}.yaml"), **NARROW}, nc=nc)


@pytest.mark.parametrize("name", NAMES)
def test_full_size_keys_and_parameters_equal_official(name, fixtures):
    """The full-size model's key list in the official order, shapes included (built on the meta device: 166 M
    parameters cost nothing there), and its parameter count."""
    ref = fixtures["keys"][name]
    with torch.device("meta"):
        layers, _ = parse_model(yaml_model_load(f"{name}.yaml"), 3)
    lines = [f"model.{line}" for line in key_lines(layers.state_dict())]
    keys_file = FIXTURES / "zoo_keys" / f"{name}.txt"
    if keys_file.is_file():
        assert lines == keys_file.read_text().splitlines()
    assert (keys_digest(lines), len(lines)) == (ref["keys"], ref["n_keys"])
    assert sum(p.numel() for p in layers.parameters()) == ref["params"]


@pytest.mark.skipif(not (PARITY / "inputs.pt").is_file(), reason=f"parity inputs not found at {PARITY}")
@pytest.mark.parametrize("name", NAMES)
def test_eval_outputs_equal_official(name, fixtures):
    """With the official model's seeded weights: the decoded rows (box, objectness, first classes) within 1e-4 of
    each channel's largest value, and the auxiliary head's maps (which the official head computes in eval mode and
    drops) too."""
    ref = fixtures["outputs"][name]
    model = narrow(name).eval()
    state = seeded_keep_anchors(model.state_dict())
    assert combined_fingerprint(state) == ref["fingerprint"]  # the weights (and anchors) the official model ran with
    model.load_state_dict(state, strict=True)
    x = torch.load(PARITY / "inputs.pt", weights_only=True)["x256x320"][:1, :, :CROP, :CROP]
    keep = 5 + CLASSES
    with torch.no_grad():
        y, lead = model(x)
        assert_close_per_channel(y[..., :keep], ref["y"])
        nl = model.model[-1].nl
        assert len(lead) == nl  # the auxiliary head is no part of the eval output
    maps = train_maps(model, x)
    for got, expected in zip(maps[nl:], ref["aux"], strict=True):
        assert_close_per_channel(got[..., :keep], expected)


@pytest.mark.skipif(not (PARITY / "inputs.pt").is_file(), reason=f"parity inputs not found at {PARITY}")
def test_the_released_deploy_model_gives_the_official_outputs(fixtures):
    """The released yolov7-w6.pt holds cfg/deploy/yolov7-w6.yaml: the training file without rows 118-121 and the
    auxiliary head, ending in a plain Detect; our models/yolov7-w6.yaml so cut gives its outputs. Its Detect keeps
    an `anchor_grid` that ours derives (models/checkpoints/official.py drops it): put back for the seeded draws,
    which follow the key order, then dropped as the loader drops it."""
    ref = fixtures["deploy"]
    d = {**yaml_model_load("yolov7-w6.yaml"), **NARROW}
    d["head"] = [*d["head"][:-5], [[114, 115, 116, 117], 1, "Detect", ["nc", "anchors"]]]
    model = DetectionModel(d, nc=80).eval()
    head, prefix = model.model[-1], f"model.{len(model.model) - 1}."
    grid = (head.anchors * head.stride.view(-1, 1, 1)).view(head.nl, 1, head.na, 1, 1, 2)
    official = {}
    for k, v in model.state_dict().items():
        official[k] = v
        if k == prefix + "anchors":
            official[prefix + "anchor_grid"] = grid
    state = seeded_keep_anchors(official)
    assert (keys_digest(key_lines(state)), combined_fingerprint(state)) == (ref["keys"], ref["fingerprint"])
    model.load_state_dict({k: v for k, v in state.items() if not k.endswith("anchor_grid")}, strict=True)
    x = torch.load(PARITY / "inputs.pt", weights_only=True)["x256x320"][:1, :, :CROP, :CROP]
    with torch.no_grad():
        assert_close_per_channel(model(x)[0][..., : 5 + CLASSES], ref["y"])


def train_maps(model, x):
    """The train output (lead, then auxiliary maps) with BatchNorm as in eval mode."""
    model.train()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    with torch.no_grad():
        return model(x)


def test_aux_loss_equals_official(fixtures):
    """ComputeLossAuxOTA's value and its box, objectness and class terms on fixed maps and targets: the lead-guided
    assignment (bias 1 neighbours for the auxiliary head, 20 IoUs for dynamic k), the 0.25 weights, the P6 level
    balance and the hyp scaling of train_aux.py."""
    ref = fixtures["loss"]
    model = narrow("yolov7-w6", nc=ref["nc"])
    head = model.model[-1]
    assert torch.equal(head.anchors, ref["anchors"]) and torch.equal(head.stride, ref["stride"])
    hyp = read_hyp("hyp.v7-p6.yaml")
    assert {k: hyp[k] for k in ref["hyp"]} == ref["hyp"]
    criterion = model.init_criterion(hyp, imgsz=ref["imgsz"])
    assert type(criterion) is AuxOTADetectionLoss
    loss, items = criterion([p.float() for p in ref["preds"]], {"targets": typed(ref)})
    torch.testing.assert_close(items, ref["items"][:3], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(loss.view(1), ref["loss"], rtol=1e-5, atol=1e-7)


def test_aux_head_changes_the_loss_and_lead_alone_is_the_lead_loss(fixtures):
    """The auxiliary maps count (0.25 of their own terms); given the lead maps alone (validation reads the eval
    output), the criterion is the OTA loss of the lead head with its 20-IoU dynamic k."""
    ref = fixtures["loss"]
    model = narrow("yolov7-w6", nc=ref["nc"])
    criterion = model.init_criterion(read_hyp("hyp.v7-p6.yaml"), imgsz=ref["imgsz"])
    preds, batch = [p.float() for p in ref["preds"]], {"targets": typed(ref)}
    nl = criterion.nl
    both, lead = criterion(preds, batch)[1], criterion(preds[:nl], batch)[1]
    aux_only = criterion.detection_terms(preds[nl:], criterion.assign(preds[:nl], typed(ref), 1.0))
    torch.testing.assert_close(both, lead + 0.25 * torch.stack(aux_only))
    assert (both - lead).abs().min() > 1e-4
    plain = OTADetectionLoss(model, read_hyp("hyp.v7-p6.yaml"), ref["imgsz"])
    plain.n_top = 20
    torch.testing.assert_close(lead, plain(preds[:nl], batch)[1])


def test_wider_neighbours_of_the_aux_assignment():
    """Bias 0.5 takes a centre's two nearest neighbour cells, bias 1 all four (away from the border): a target
    centred at (2.3, 5.6) cells of an 8 x 8 map, one anchor of its size."""
    targets = Targets.from_rows(torch.tensor([[0, 0, 2.3 / 8, 5.6 / 8, 1 / 8, 1 / 8]]), (64, 64))
    anchors = torch.ones(1, 1, 2)
    cells = {g: {(int(i), int(j)) for i, j in zip(t.gi, t.gj)}
             for g in (0.5, 1.0) for t in match_anchors([(8, 8)], anchors, targets, 4.0, g)}
    assert cells[0.5] == {(2, 5), (1, 5), (2, 6)}
    assert cells[1.0] == {(2, 5), (1, 5), (2, 4), (3, 5), (2, 6)}


def test_aux_head_is_trained():
    """One backward pass reaches the auxiliary convs, and no other criterion is allowed to read its maps."""
    torch.manual_seed(0)
    model = DetectionModel({**yaml_model_load("yolov7-w6.yaml"), "width_multiple": 0.125}, nc=2).train()
    hyp = read_hyp("hyp.v7-p6.yaml")
    criterion = model.init_criterion(hyp, imgsz=128)
    targets = Targets.from_rows(torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 0, 0.3, 0.6, 0.6, 0.5]]), (128, 128))
    loss, _ = criterion(model(torch.rand(2, 3, 128, 128)), {"targets": targets})
    loss.backward()
    head = model.model[-1]
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in head.m2)
    # a batch without targets: objectness alone, of both heads
    _, items = criterion(model(torch.rand(2, 3, 128, 128)), {"targets": targets[:0]})
    assert items[1] > 0 and items[0] == items[2] == 0
    for name in ("ota", "v5"):
        with pytest.raises(BadOption, match="cannot train the model's IAuxDetect head"):
            build_criterion(model, {**hyp, "loss": name})


def test_aux_convs_start_from_the_lead_priors():
    """Official: the auxiliary convs get the lead's prior biases, objectness log(8 / (640 / stride)^2) and classes
    log(0.6 / (nc - 0.99)), on top of torch's uniform initialisation within 1 / sqrt(fan_in)."""
    torch.manual_seed(0)
    head = narrow("yolov7-w6", nc=3).model[-1]
    for m, s in zip(head.m2, head.stride.tolist(), strict=True):
        b = m.bias.detach().view(head.na, -1)
        bound = m.in_channels**-0.5
        assert (b[:, 4] - math.log(8 / (640 / s) ** 2)).abs().max() <= bound
        assert (b[:, 5:] - math.log(0.6 / (3 - 0.99))).abs().max() <= bound


def test_eval_mode_is_the_deploy_model():
    """Eval mode runs neither the auxiliary convs nor the four layers that feed only them (118-121 of yolov7-w6):
    the counted cost drops by exactly those four 3x3 convolutions, and fuse() folds the lead head's implicit layers
    and keeps the eval output."""
    torch.manual_seed(0)
    model = narrow("yolov7-w6", nc=3).eval()
    assert model.eval_idle == (118, 119, 120, 121)
    x = torch.rand(1, 3, 128, 192)
    with torch.no_grad():
        deploy = model._gflops(640)
        idle, model.eval_idle = model.eval_idle, ()
        every_layer = model._gflops(640)
        model.eval_idle = idle
    calls = []
    for i in (*model.eval_idle, len(model.model) - 1):
        convs = model.model[i].m2 if i == len(model.model) - 1 else [model.model[i]]
        for m in convs:
            m.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        ref = model(x)[0]
        fused = model.fuse()(x)[0]
    assert_close_per_channel(fused, ref)
    assert not calls
    # rows 118-121 at width 0.25: c_in -> c_out 3x3 at strides 8-64, 2 FLOPs per multiply-add
    skipped = sum(2 * c1 * c2 * 9 * (640 / s) ** 2 for c1, c2, s in ((32, 80, 8), (64, 160, 16), (96, 240, 32),
                                                                   (128, 320, 64)))
    assert every_layer - deploy == pytest.approx(skipped / 1e9)


def test_fine_tuning_carries_both_heads_classes_named_alike():
    """`--weights` with other classes: the classes named alike keep their weights in the auxiliary head too."""
    torch.manual_seed(0)
    d = {**yaml_model_load("yolov7-w6.yaml"), "width_multiple": 0.125}
    src, dst = DetectionModel(d, nc=4), DetectionModel(d, nc=2)
    src.names, dst.names = dict(enumerate("abcd")), {0: "c", 1: "a"}
    transfer_weights(dst, src, "src.pt")
    x = torch.rand(1, 3, 128, 128)
    nl = src.model[-1].nl
    for got, ref in zip(train_maps(dst, x)[nl:], train_maps(src, x)[nl:], strict=True):
        torch.testing.assert_close(got[..., :5], ref[..., :5])
        torch.testing.assert_close(got[..., 5:], ref[..., [7, 5]])


def test_an_anchor_count_gives_one_level_per_two_inputs():
    """`anchors: 3` (refitted by autoanchor when training starts) makes 4 levels of placeholders from 8 inputs."""
    d = {**yaml_model_load("yolov7-w6.yaml"), "anchors": 3, "width_multiple": 0.125}
    head = DetectionModel(d, nc=2).model[-1]
    assert head.nl == 4 and head.stride.tolist() == [8, 16, 32, 64] and len(head.m2) == 4


def test_iauxdetect_needs_twice_its_levels_of_inputs():
    d = yaml_model_load("yolov7-w6.yaml")
    d["head"][-1] = [[114, 115, 116, 117, 118, 119, 120], 1, "IAuxDetect", ["nc", "anchors"]]
    with pytest.raises(BadModelYaml, match="IAuxDetect takes 2 x 4 inputs"):
        DetectionModel(d)
    assert IAuxDetect.default_loss == "aux_ota"
