import shutil

import pytest
import torch

from data.synthetic import generate_dataset


@pytest.fixture(autouse=True)
def _torch_seed():
    """Datasets seed their augmentation from torch's process seed: fix it so every test run draws the same."""
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def shapes_det(tmp_path_factory):
    """A tiny generated detection dataset shared by read-only tests (copy it before changing files)."""
    return generate_dataset(tmp_path_factory.mktemp("data") / "det", "detect", 16, 4, seed=1, min_side=96, max_side=128)


@pytest.fixture(scope="session")
def shapes_seg(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "seg"
    return generate_dataset(root, "segment", 16, 4, seed=2, min_side=96, max_side=128)


@pytest.fixture(scope="session")
def shapes_cls(tmp_path_factory):
    return generate_dataset(tmp_path_factory.mktemp("data") / "cls", "classify", 4, 2, seed=3, min_side=48, max_side=64)


@pytest.fixture
def det_copy(shapes_det, tmp_path):
    """A private copy of the detection dataset that a test may modify."""
    dst = tmp_path / "det"
    shutil.copytree(shapes_det, dst, ignore=shutil.ignore_patterns("*.cache"))
    return dst
