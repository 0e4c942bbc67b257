"""Two "nodes" on one machine (two torchrun launchers, --nnodes 2, one process each) sharing one filesystem, started
with no dataset generated, no label cache and no --cache disk files: each node's local rank 0 prepares them at the
same time. The job must train to the end with one run folder and one copy of the dataset."""

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
import yaml

from data.image_files import DISK_CACHE_SUFFIX, disk_cache_path
from data.label_cache import FORMAT
from tests.ddp_utils import free_port
from utils.files import ROOT

pytestmark = pytest.mark.ddp  # every test here starts a process group

SYNTH = {"task": "detect", "n_train": 8, "n_val": 4, "seed": 0, "min_side": 64, "max_side": 96}


def test_two_nodes_prepare_one_shared_dataset(tmp_path):
    datasets, runs = tmp_path / "datasets", tmp_path / "runs"
    data = tmp_path / "shapes.yaml"
    data.write_text(yaml.safe_dump({"path": str(datasets / "shapes"), "train": "images/train", "val": "images/val",
                                    "names": ["circle", "rectangle", "triangle"], "synthetic": SYNTH}))
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = []
    for node in (0, 1):
        cmd = ["timeout", "-k", "10", "400", sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node_rank", str(node), "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port",
               str(port), str(ROOT / "train.py"), "--data", str(data), "--cfg", "yolov5n.yaml", "--imgsz", "64",
               "--batch-size", "2", "--epochs", "1", "--workers", "0", "--device", "cpu", "--cache", "disk",
               "--project", str(runs), "--name", "exp"]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [p.communicate(timeout=420)[0] for p in procs]
    for node, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {node}:\n{out[-4000:]}"

    assert [p.name for p in runs.iterdir()] == ["exp"]
    assert (runs / "exp" / "weights" / "best.pt").is_file()
    root = datasets / "shapes"
    assert [p.name for p in datasets.iterdir()] == ["shapes"]  # one copy, no temporary sibling left
    assert not list(root.rglob(".*")), "temporary files left in the dataset"
    for split, n in (("train", SYNTH["n_train"]), ("val", SYNTH["n_val"])):
        assert len(list((root / "images" / split).glob("*.jpg"))) == n
        assert len(list((root / "labels" / split).glob("*.txt"))) == n
        # sha256, a line of JSON, the arrays' bytes
        digest, header, _ = (root / "labels" / f"{split}.yolo-engine.cache").read_bytes().split(b"\n", 2)
        assert len(digest) == 64 and json.loads(header)["format"] == FORMAT
    npys = list(root.rglob("*.npy"))
    assert npys, "--cache disk wrote nothing"
    for f in npys:
        image = f.with_name(f.name.removesuffix(DISK_CACHE_SUFFIX))
        assert disk_cache_path(image) == f, "every cache file is an image's"
        np.testing.assert_array_equal(np.load(f), cv2.imread(str(image)))
