"""train.py under `torch.distributed.run` with 2 gloo processes on CPU: identical weights on both ranks, rank 0
alone writes, a rank with an empty batch does not hang DDP, and a killed run resumes."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.ddp_utils import free_port
from utils.files import ROOT

pytestmark = pytest.mark.ddp  # every test here starts a process group

DRIVER = Path(__file__).with_name("ddp_driver.py")


def torchrun(script_args, cwd, timeout=420, path=()):
    """`path`: folders put before the project on the workers' PYTHONPATH."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), *script_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(map(str, [*path, ROOT]))}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def sharded_val(tmp_path, task, val_module, val_args):
    """A val script over 2 ranks (tests/val_driver.py: each rank writes the stats `main` returned) and in one process
    with one thread, as each rank runs: (each rank's stats, the single process's stats through JSON)."""
    # as a module: run as a file, tests/ would come first on sys.path and its engine/ would shadow the package
    r = torchrun(["-m", "tests.val_driver", str(tmp_path), task, *val_args, "--project", str(tmp_path / "ddp")], ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: kernels then sum in the same order
    try:
        single = val_module.main(val_module.parse_opt([*val_args, "--project", str(tmp_path / "one")]))
    finally:
        torch.set_num_threads(threads)
    ranks = [json.loads((tmp_path / f"stats_rank{r}.json").read_text()) for r in range(2)]
    return ranks, json.loads(json.dumps(single))


def sparse_dataset(root, seed=0):
    """8 train images of which 4 have no labels; with 1 image per rank per step, some step gives a rank an
    empty batch (mosaic is off in the hyp below, so labels are not borrowed from other images)."""
    from data.synthetic import generate_dataset

    generate_dataset(root, task="detect", n_train=8, n_val=4, seed=seed, min_side=96, max_side=128)
    labels = sorted((root / "labels" / "train").glob("*.txt"))
    for f in labels[::2]:
        f.write_text("")
    data = root / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                    "names": {0: "circle", 1: "rectangle", 2: "triangle"}}))
    return data


def plain_hyp(tmp_path, base):
    hyp = yaml.safe_load((ROOT / "data" / "hyps" / base).read_text())
    hyp.update(mosaic=0.0, mixup=0.0, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    f = tmp_path / "hyp.yaml"
    f.write_text(yaml.safe_dump(hyp))
    return f


def _common(data, project, hyp, epochs):
    return ["--data", str(data), "--imgsz", "64", "--batch-size", "2", "--epochs", str(epochs), "--workers", "0",
            "--device", "cpu", "--project", str(project), "--name", "exp", "--hyp", str(hyp)]


SECOND_RANK_CANNOT_READ_LAST = """import os
import pathlib

if os.environ.get("RANK", "0") != "0":  # a machine that does not mount the run folder
    _read_bytes = pathlib.Path.read_bytes

    def _refuse_last(self):
        if self.name == "last.pt":
            raise PermissionError(f"rank {os.environ['RANK']} reads {self}")
        return _read_bytes(self)

    pathlib.Path.read_bytes = _refuse_last
"""


@pytest.mark.parametrize("cfg,base_hyp", [("yolov5n.yaml", "hyp.scratch-low.yaml"), ("yolov8n.yaml", "hyp.v8.yaml"),
                                          ("yolov7-tiny.yaml", "hyp.v7-tiny.yaml")])
def test_torchrun_two_ranks_identical_weights(tmp_path, cfg, base_hyp):
    data = sparse_dataset(tmp_path / "data")
    hyp = plain_hyp(tmp_path, base_hyp)
    project = tmp_path / "runs"
    r = torchrun([str(DRIVER), "train", *_common(data, project, hyp, 1), "--cfg", cfg, "--sync-bn"], ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = sorted(p.name for p in project.iterdir())
    assert runs == ["exp"], runs  # both ranks agreed on one run folder
    assert sorted(p.name for p in (project / "exp" / "weights").iterdir()) == ["best.pt", "last.pt"]
    hashes = [(project / "exp" / f"weights_rank{i}.sha").read_text() for i in range(2)]
    assert hashes[0] == hashes[1], "ranks ended with different weights"
    saves = [(project / "exp" / f"saved_rank{i}.txt").read_text() for i in range(2)]
    assert saves == ["1", "0"], f"checkpoint saves per rank: {saves}"
    empty = [(project / "exp" / f"empty_batches_rank{i}.txt").read_text() for i in range(2)]
    assert sum(int(e) for e in empty) > 0, "no rank saw an empty batch: the test lost its point"


def test_torchrun_killed_run_resumes(tmp_path):
    data = sparse_dataset(tmp_path / "data", seed=1)
    hyp = plain_hyp(tmp_path, "hyp.scratch-low.yaml")
    project = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(ROOT / "train.py"), *_common(data, project, hyp, 6), "--cfg", "yolov5n.yaml"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    results = project / "exp" / "results.csv"
    deadline = time.time() + 300
    while time.time() < deadline and not (results.exists() and len(results.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    # torchrun starts its workers in their own sessions and forwards SIGTERM to them; Python dies on it at once,
    # with no cleanup: for training this is a crash, not a clean stop
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    assert results.exists(), "the first run never finished an epoch"
    last = project / "exp" / "weights" / "last.pt"
    done = torch.load(last, weights_only=True)["epoch"]
    assert done < 5
    # global rank 0 alone reads the run folder's last.pt (docs/distributed.md): the other rank's reads of it fail
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SECOND_RANK_CANNOT_READ_LAST)
    r = torchrun([str(ROOT / "train.py"), "--resume", str(last), "--device", "cpu", "--workers", "0"], ROOT,
                 path=[site])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader(open(results)))
    epochs = [int(row["epoch"]) for row in rows]
    assert epochs[-1] == 6 and epochs[-(5 - done):] == list(range(done + 2, 7))  # numbered from 1
    assert torch.load(last, weights_only=True)["optimizer"] is None  # finished and stripped
