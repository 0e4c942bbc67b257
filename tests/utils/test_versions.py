"""torch and torchvision checked at every script's start (utils/versions.py): a torchvision of another release, or of
this release built for another torch build (its operators do not load, the 'operator torchvision::nms does not exist'
of a CPU torch beside a CUDA torchvision), is one `error:` line with the pip command that fixes it, before any work.
The broken torchvision is a package placed ahead of the real one on the path, with its own dist-info version."""

import subprocess
import sys

import pytest
import torch
import torchvision

from utils.files import ROOT
from utils.versions import check_torch_pair, fix_command, paired_torchvision


def test_the_pairs_follow_the_release_rule():
    assert paired_torchvision("2.0.1") == "0.15.1"
    assert paired_torchvision("2.13.0+cpu") == "0.28.0"
    assert paired_torchvision("2.14.1+cu130") == "0.29.1"
    assert paired_torchvision(torch.__version__).split(".")[:2] == torchvision.__version__.split(".")[:2]


def test_the_fix_installs_from_the_index_of_torchs_own_build():
    assert fix_command("2.13.0+cpu") == ('pip install --force-reinstall --no-deps "torchvision==0.28.0" '
                                         '--index-url https://download.pytorch.org/whl/cpu')
    assert fix_command("2.14.1+cu130").endswith("--index-url https://download.pytorch.org/whl/cu130")
    assert "--index-url" not in fix_command("2.14.1")  # PyPI's own build


def test_this_installation_passes():
    check_torch_pair()


def _fake_torchvision(root, version, init):
    """A torchvision package `version` (as pip records it) whose import runs `init`, found before the real one."""
    (root / "torchvision").mkdir(parents=True)
    (root / "torchvision" / "__init__.py").write_text(init)
    info = root / f"torchvision-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchvision\nVersion: {version}\n")
    return root


def _train(tmp_path, path):
    env_path = f"{path}:{ROOT}"
    return subprocess.run(["timeout", "300", sys.executable, str(ROOT / "train.py"), "--epochs", "1"], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path}, capture_output=True, text=True)


@pytest.mark.parametrize("case", ["other build", "other release"])
def test_a_mismatched_pair_is_one_line_naming_the_fix_before_any_work(tmp_path, case):
    wanted = paired_torchvision(torch.__version__)
    if case == "other build":  # the release torch wants, whose compiled operators cannot load in this torch
        fake = _fake_torchvision(tmp_path / "site", wanted, "raise RuntimeError('operator torchvision::nms does not "
                                                            "exist')\n")
    else:  # imports, but another release's
        fake = _fake_torchvision(tmp_path / "site", "0.16.0", "")
    r = _train(tmp_path, fake)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
    assert f'pip install --force-reinstall --no-deps "torchvision=={wanted}"' in lines[0]
    assert ("torchvision::nms does not exist" if case == "other build" else "0.16.0 is installed") in lines[0]
    assert not (tmp_path / "runs").exists() and "Training on" not in r.stdout  # nothing began


def test_the_check_loads_the_operators_without_importing_torchvision():
    """Every command runs the check at its start; importing the torchvision package there (torch._dynamo and the
    model zoo come with it) doubled a training run's start-up on a 2-core CPU (issue 57)."""
    code = ("import sys; from utils.versions import check_torch_pair; check_torch_pair(); "
            "import torch; print('torchvision' in sys.modules, torch.ops.torchvision.nms is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=ROOT)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]
