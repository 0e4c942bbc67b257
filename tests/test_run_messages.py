"""What the scripts tell a new user, from the command line: the line a run starts with names the device and the
precision, the progress bar's memory is the process's on a CPU, a finished run prints commands that work as
printed, and every script that writes files says where."""

import re
import shlex
import subprocess
import sys

import pytest

from engine.messages import RunETA
from utils.files import ROOT
from utils.torch_utils import cpu_bf16_native


def _run(argv, cwd, timeout=300):
    r = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    return r


@pytest.fixture(scope="module")
def trained(shapes_detect, tmp_path_factory):
    """One epoch of yolov5n at 64 px, run from a folder outside the repository, as `python /path/to/train.py`."""
    cwd = tmp_path_factory.mktemp("user")
    r = _run([str(ROOT / "train.py"), "--data", str(shapes_detect), "--img", "64", "--epochs", "1", "--batch-size",
              "4", "--device", "cpu", "--workers", "0", "--noplots"], cwd)
    return cwd, r


def test_the_first_line_says_what_runs(trained):
    _, r = trained
    first = r.stdout.splitlines()[0]
    precision = "bf16 autocast (--amp auto: the CPU has" if cpu_bf16_native() else "fp32 (--amp auto: the CPU has no"
    assert first.startswith("Training on CPU ") and precision in first, first
    assert "torch " in first and "1 process with" in first and "0 dataloader workers" in first
    assert first.endswith("run folder runs/train/exp"), first  # under the working directory


def test_noplots_saves_no_picture(trained):
    """--noplots once skipped every chart but the training batches."""
    cwd, _ = trained
    assert not [p.name for p in (cwd / "runs" / "train" / "exp").glob("*") if p.suffix in (".jpg", ".png")]


def test_the_progress_bar_shows_the_process_memory_on_cpu(trained):
    _, r = trained
    assert re.search(r"^\s+Epoch\s+mem\s", r.stdout, re.M)
    mem = [float(m) for m in re.findall(r"1/1\s+([\d.]+)G", r.stderr)]
    assert mem and min(mem) > 0.05, "resident memory of a process that imported torch is well above 50 MB"


def test_the_progress_bar_shows_the_whole_runs_eta(trained):
    _, r = trained
    assert re.search(r"1/1 .*run ETA \d+:\d\d:\d\d", r.stderr), r.stderr[-2000:]


def test_the_run_eta_is_the_rate_so_far_times_the_batches_left():
    clock = iter([100.0, 130.0, 160.0])  # start, then two reads
    eta = RunETA(epochs=10, batches_per_epoch=20, done=40, clock=lambda: next(clock))  # resumed after 2 epochs
    assert eta.seconds_left(40) is None and eta.text(40) == "run ETA ?"  # nothing measured yet
    assert eta.seconds_left(50) == pytest.approx(30 / 10 * 150)  # 3 s a batch, 150 batches left
    assert eta.text(200) == "run ETA 0:00:00"
    long = RunETA(epochs=300, batches_per_epoch=1000, done=0, clock=iter([0.0, 36.0]).__next__)
    assert long.text(100) == f"run ETA {int(36 / 100 * 299900) // 3600}:59:24"


def test_a_finished_run_prints_commands_that_work(trained):
    cwd, r = trained
    assert "Results saved to runs/train/exp\n" in r.stdout
    block = r.stdout[r.stdout.index("Next: "):].splitlines()[:3]
    commands = [shlex.split(line.removeprefix("Next: ").strip()) for line in block]
    assert [c[1] for c in commands] == [str(ROOT / s) for s in ("val.py", "detect.py", "export.py")]
    assert all(c[c.index("--weights") + 1] == "runs/train/exp/weights/best.pt" for c in commands)  # from cwd
    for c in commands:
        out = _run([*c[1:], "--device", "cpu"], cwd).stdout
        assert re.search(r"^Results saved to \S+", out, re.M), out[-2000:]
    assert (cwd / "runs" / "val" / "exp").is_dir() and (cwd / "runs" / "detect" / "exp").is_dir()
    assert (cwd / "runs" / "train" / "exp" / "weights" / "best.onnx").is_file()


def test_an_inference_summary_says_fused_and_counts_as_training_did(trained):
    cwd, r = trained
    trained_line = re.search(r"^DetectionModel: 25 layers, (\d+) parameters \((\d+) trainable\)", r.stdout, re.M)
    val = _run([str(ROOT / "val.py"), "--weights", "runs/train/exp/weights/best.pt", "--data", _data(cwd), "--img",
                "64", "--device", "cpu", "--name", "summary"], cwd).stdout
    fused = re.search(r"^DetectionModel \(fused\): 25 layers, (\d+) parameters \((\d+) after fusing\)", val, re.M)
    assert trained_line and fused, val[-2000:]
    assert fused.group(1) == trained_line.group(1) and int(fused.group(2)) < int(fused.group(1))
    assert "trainable" not in fused.group(0) and "gradients" not in val


def _data(cwd):
    import yaml

    return yaml.safe_load((cwd / "runs" / "train" / "exp" / "opt.yaml").read_text())["data"]
