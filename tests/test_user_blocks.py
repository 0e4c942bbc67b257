"""Blocks from the user's own file end to end: `train.run(modules=[...])`, then the scripts as a user runs them:
without `--modules` a checkpoint that needs the blocks is one `error:` line naming them and the option (exit 2),
with it val, detect, export and --resume work, and an export runs without it; torchrun carries the option."""

import importlib
import os
import subprocess
import sys

import pytest
import torch
import yaml

import models.registry as registry
import train
from tests.ddp_utils import free_port
from tests.user_blocks_util import BLOCKS, with_rows
from utils.cli import Parsed
from utils.files import ROOT

SCRIPTS = ["train.py", "val.py", "detect.py", "export.py",
           *(f"{task}/{s}.py" for task in ("segment", "classify", "pose") for s in ("train", "val", "predict"))]


def options_of(parsed):
    """The options a script's parse_opt read (a train script's: utils/cli.Parsed, with the names given)."""
    return parsed.opt if isinstance(parsed, Parsed) else parsed


def test_every_script_takes_modules():
    for script in SCRIPTS:
        module = importlib.import_module(script.removesuffix(".py").replace("/", "."))
        extra = ["--weights", "w.pt"] if script in ("val.py", "export.py") or script.endswith("/val.py") else []
        opt, empty = (options_of(module.parse_opt(argv)) for argv in ([*extra, "--modules", "a.py", "--modules",
                                                                       "b.py", "c.py"], extra))
        assert opt.modules == ["a.py", "b.py", "c.py"], script
        assert empty.modules == [], script


def _run(args, cwd, timeout=300):
    """A script of this checkout (`args[0]` relative to it) or `python -m` module, run from `cwd`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    args = [str(ROOT / args[0]) if args[0].endswith(".py") else args[0], *args[1:]]
    return subprocess.run(["timeout", str(timeout), sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True)


class _Stop(BaseException):  # a callback's Exception is only a warning (engine/callbacks.py)
    pass


def _stop_after_first_epoch(event):
    if event.epoch == 1:
        raise _Stop


@pytest.fixture(scope="module")
def world(tmp_path_factory, shapes_detect):
    """A user's file of blocks, a model YAML naming one, and a run of it trained by `train.run(modules=[...])`
    stopped after its first of two epochs (last.pt unfinished)."""
    t = tmp_path_factory.mktemp("user_blocks")
    (t / "my_blocks.py").write_text(BLOCKS)
    (t / "scaled.yaml").write_text(yaml.safe_dump(with_rows([-1, 1, "Scale", [1024]], [-1, 1, "Blur", []])))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "USER_BLOCKS", {})
        with pytest.raises(_Stop):
            train.run(callbacks={"on_fit_epoch_end": [_stop_after_first_epoch]}, modules=[str(t / "my_blocks.py")],
                      cfg=str(t / "scaled.yaml"), data=str(shapes_detect), imgsz=64, batch_size=8, epochs=2,
                      workers=0, device="cpu", project=str(t / "runs"), name="exp", noplots=True)
    return t


@pytest.mark.slow
def test_the_scripts_with_and_without_the_users_file(world, shapes_detect):
    t, weights = world, world / "runs" / "exp" / "weights"
    mods = ["--modules", str(t / "my_blocks.py")]
    common = ["--device", "cpu", "--img", "64"]
    resume = ["train.py", "--resume", str(weights / "last.pt"), "--device", "cpu", "--workers", "0"]

    refused = _run(resume, t)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert len(errors) == 1 and "Blur, Scale" in errors[0] and "my_blocks.py" in errors[0] and "--modules" in errors[0]

    resumed = _run([*resume, *mods], t)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    best = weights / "best.pt"
    assert torch.load(weights / "last.pt", weights_only=True)["epoch"] == 1  # the resumed run trained epoch 2
    val = ["val.py", "--weights", str(best), "--data", str(shapes_detect), "--project", str(t / "val"), *common]
    for argv, rc in ((val, 2), ([*val, *mods], 0),
                     (["detect.py", "--weights", str(best), "--source", str(ROOT / "data" / "images"), "--project",
                       str(t / "det"), *common, *mods], 0),
                     (["export.py", "--weights", str(best), "--include", "onnx", "--img", "64", *mods], 0),
                     (["detect.py", "--weights", str(weights / "best.onnx"), "--source", str(ROOT / "data" / "images"),
                       "--project", str(t / "det"), *common], 0)):
        r = _run(argv, t)
        assert r.returncode == rc, (argv, r.stderr[-3000:])
        assert "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.ddp
def test_torchrun_carries_modules(world, shapes_detect, tmp_path):
    """Two ranks each import the file the command line names; rank 0's checkpoint records the blocks."""
    args = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
            str(ROOT / "train.py"), "--cfg", str(world / "scaled.yaml"), "--modules", str(world / "my_blocks.py"),
            "--data", str(shapes_detect), "--img", "64", "--batch-size", "8", "--epochs", "1", "--workers", "0",
            "--device", "cpu", "--project", str(tmp_path / "runs"), "--name", "exp", "--noplots"]
    r = _run(args, tmp_path, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ckpt = torch.load(tmp_path / "runs" / "exp" / "weights" / "best.pt", weights_only=True)
    assert sorted(yaml.safe_load(ckpt[registry.NEEDS_KEY])) == ["Blur", "Scale"]
