import pytest
import torch
from make_loss_reference import CASES, load


@pytest.fixture(scope="session")
def reference():
    return load()


@pytest.fixture(scope="session")
def criteria():
    """One criterion per reference case, on the model it trains (the head's strides, anchors and shapes)."""
    built = {}
    for name, (cls, cfg, hyp) in CASES.items():
        torch.manual_seed(0)
        built[name] = cls(cfg, nc=3).init_criterion(hyp, imgsz=64)
    return built
