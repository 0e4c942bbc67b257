import copy
import importlib
import pkgutil

import pytest
import torch
from loss_fakes import HYP_V5, HYP_V8, box_masks, fake_model, make_targets, missing_grads

import losses
from losses import FITS, REGISTRY, build_criterion

CASES = [  # (fake kind, nm, default_loss, hyp)
    ("anchor", 0, "v5", HYP_V5),
    ("anchor", 0, "ota", HYP_V5),
    ("free", 0, "v8", HYP_V8),
    ("anchor", 4, "v5seg", HYP_V5),
    ("free", 4, "v8seg", HYP_V8),
]


def test_registry_names():
    assert set(REGISTRY) == {"v5", "ota", "aux_ota", "v8", "v5seg", "v8seg", "v8pose", "v8obb", "cls"}


def test_every_criterion_class_is_registered_under_its_name():
    """The registry is found, not kept: every class with `loss_names` any module of losses/ defines declares a `name`
    of its own and is REGISTRY[name], so a criterion left out of a list cannot happen."""
    criteria = [c for info in pkgutil.iter_modules(losses.__path__)
                for c in vars(importlib.import_module(f"losses.{info.name}")).values()
                if isinstance(c, type) and c.__module__ == f"losses.{info.name}" and hasattr(c, "loss_names")]
    assert len(criteria) == len(REGISTRY) == 9
    for c in criteria:
        assert "name" in vars(c) and REGISTRY[c.name] is c, c.__qualname__


def test_fits_from_the_classes_is_the_table_it_replaced():
    assert FITS == {"v5": {"v5", "ota"}, "ota": {"v5", "ota"}, "aux_ota": {"aux_ota"}, "v8": {"v8"},
                    "v5seg": {"v5seg"}, "v8seg": {"v8seg"}, "v8pose": {"v8pose"}, "v8obb": {"v8obb"}, "cls": {"cls"}}


@pytest.mark.parametrize("kind,nm,name,hyp", CASES)
def test_default_loss_picks_class_and_hyp_is_untouched(kind, nm, name, hyp):
    model = fake_model(kind, nm=nm, default_loss=name)
    frozen = copy.deepcopy(hyp)
    crit = build_criterion(model, hyp, imgsz=64)
    assert isinstance(crit, REGISTRY[name]) and hyp == frozen


def test_hyp_loss_overrides_head_default():
    model = fake_model("anchor", default_loss="ota")
    assert type(build_criterion(model, dict(HYP_V5, loss="v5"))) is REGISTRY["v5"]


def test_unknown_loss_lists_known_names():
    with pytest.raises(ValueError, match="aux_ota, cls, ota, v5, v5seg, v8, v8obb, v8pose, v8seg"):
        build_criterion(fake_model("anchor"), dict(HYP_V5, loss="yolo9000"))


@pytest.mark.parametrize("kind,nm,name,hyp", CASES)
def test_every_head_parameter_gets_grad_without_targets(kind, nm, name, hyp):
    model = fake_model(kind, nm=nm, default_loss=name)
    crit = build_criterion(model, hyp, imgsz=64)
    batch = {"img": torch.rand(2, 3, 64, 64), "targets": make_targets([])}
    if nm:
        batch["masks"], batch["overlap"] = torch.zeros(2, 16, 16), True
    loss, items = crit(model(batch["img"]), batch)
    loss.backward()
    assert torch.isfinite(loss) and items.shape == (len(crit.loss_names),)
    assert missing_grads(model.model[1]) == []


@pytest.mark.parametrize("kind,nm,name,hyp", CASES)
def test_every_head_parameter_gets_grad_when_one_image_is_empty(kind, nm, name, hyp):
    model = fake_model(kind, nm=nm, default_loss=name)
    crit = build_criterion(model, hyp, imgsz=64)
    targets = make_targets([[1, 0, 0.5, 0.5, 0.4, 0.4]])
    batch = {"img": torch.rand(2, 3, 64, 64), "targets": targets}
    if nm:
        batch["masks"], batch["overlap"] = box_masks(targets, 2, (16, 16)), True
    loss, _ = crit(model(batch["img"]), batch)
    loss.backward()
    assert missing_grads(model.model[1]) == []
