"""Validation sharded over 2 gloo ranks gives exactly the metrics, confusion matrix, COCO JSON and losses of one
process (detect v5/v8, segment, classify; an odd number of images, so the ranks hold different counts); val.py under
torchrun equals val.py alone; a 2-rank training run writes validation losses equal to one process validating its
EMA weights."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from engine.tasks import TASKS
from engine.validator import ShardedBatchSampler, ValOptions
from models.checkpoints import from_safe, to_safe
from models.yolo import ClassificationModel, DetectionModel, SegmentationModel
from tests.ddp_utils import free_port, spawn
from utils.files import ROOT

ClassificationValidator = TASKS["classify"].validator
DetectionValidator = TASKS["detect"].validator
SegmentationValidator = TASKS["segment"].validator

NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}
N_VAL = 7  # odd: with batches of 2, rank 0 validates 4 images and rank 1 three (classify: 21, 12 and 9)
CASES = {
    "v5": ("yolov5n.yaml", DetectionModel, DetectionValidator, "detect", "hyp.scratch-low.yaml"),
    "v8": ("yolov8n.yaml", DetectionModel, DetectionValidator, "detect", "hyp.v8.yaml"),
    "v8seg": ("yolov8n-seg.yaml", SegmentationModel, SegmentationValidator, "segment", "hyp.v8.yaml"),
    "cls": ("yolov8n-cls.yaml", ClassificationModel, ClassificationValidator, "classify", "hyp.cls.yaml"),
}


@pytest.mark.parametrize("n,batch,world", [(7, 2, 2), (9, 4, 2), (3, 4, 2), (10, 3, 4), (1, 1, 1)])
def test_sharded_batches_cover_every_image_once(n, batch, world):
    shards = [list(ShardedBatchSampler(n, batch, rank, world)) for rank in range(world)]
    images = sorted(i for s in shards for b in s for i in b)
    assert images == list(range(n))
    # the batches are exactly those of one process, dealt out whole
    single = list(ShardedBatchSampler(n, batch))
    assert sorted(b for s in shards for b in s) == single
    assert all(len(b) == batch for b in single[:-1])


def _dataset(root, task):
    from data.synthetic import generate_dataset

    generate_dataset(root, task=task, n_train=1, n_val=N_VAL, seed=3, min_side=64, max_side=112)
    if task == "classify":
        return root
    f = root / "data.yaml"
    f.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": NAMES}))
    return f


def _model(case, state=None):
    """A fresh model; a few head biases raised so that the untrained detector finds boxes above conf 0.001."""
    cfg, model_cls, *_ = CASES[case]
    torch.manual_seed(0)
    model = model_cls(cfg, nc=len(NAMES))
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def _validate(case, data_path, save_dir):
    """Validate with the case's criterion; returns (stats, confusion matrix, JSON rows)."""
    from utils.files import find_file, yaml_load

    _, _, validator_cls, task, hyp = CASES[case]
    model = _model(case, torch.load(save_dir.parent / "state.pt", weights_only=True))
    criterion = model.init_criterion(yaml_load(find_file(hyp, "data/hyps")), imgsz=64)
    options = validator_cls.options(imgsz=64, batch=2, workers=0, save_json=task != "classify", plots=False)
    data = validator_cls.get_data(str(data_path), options)
    save_dir.mkdir(parents=True, exist_ok=True)
    validator = validator_cls(options, save_dir, data["names"], criterion=criterion)
    validator.build_dataloader(data["val"], int(max(model.stride)))
    stats = validator(model, final=True)
    return stats, validator.confusion.matrix, getattr(validator, "jdict", None), validator.seen


def _worker(rank, world_size, cases, out):
    torch.set_num_threads(1)
    for case, data_path in cases:
        stats, matrix, jdict, seen = _validate(case, Path(data_path), Path(out) / case / f"rank{rank}")
        results = to_safe({"stats": stats, "matrix": matrix, "jdict": jdict, "seen": seen})  # weights_only-loadable
        torch.save(results, Path(out) / case / f"{rank}.pt")


def _perturb(model, task):
    """Make the untrained detector find boxes (some right) at conf 0.001: higher scores; for the anchor-free
    head DFL bins peaked at 1 stride per side instead of the 7.5 of uniform bins (boxes far too large), and masks
    that fill their boxes."""
    head = model.model[-1]
    with torch.no_grad():
        if task == "classify":
            return model
        if hasattr(head, "reg_max"):
            for level, (a, b) in enumerate(zip(head.cv2, head.cv3)):
                a[-1].weight.mul_(0.2)
                a[-1].bias.copy_(-3 * (torch.arange(head.reg_max) - 1.0).abs().repeat(4))
                b[-1].bias.add_(4.0 if level == 0 else -4.0)  # the finest level's 16-pixel boxes fit the shapes
            if hasattr(head, "proto"):  # positive prototypes and coefficients: each mask fills its box
                head.proto.cv3.conv.weight.mul_(0.01)
                head.proto.cv3.bn.bias.fill_(5.0)
                for c in head.cv4:
                    c[-1].weight.mul_(0.01)
                    c[-1].bias.fill_(1.0)
            return model
        for name, p in head.named_parameters():
            if name.endswith("bias"):
                p.add_(torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Every case validated by 2 gloo ranks, in one launch (starting the processes costs more than validating)."""
    root = tmp_path_factory.mktemp("sharded")
    cases = []
    for case, (*_, task, _) in CASES.items():
        data = _dataset(root / case / "data", task)
        torch.save(_perturb(_model(case), task).state_dict(), root / case / "state.pt")
        cases.append((case, str(data)))
    spawn(_worker, 2, cases, str(root))
    return root, dict(cases)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.ddp
def test_two_ranks_equal_one_process(sharded, case):
    root, data = sharded
    task = CASES[case][3]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: kernels then sum in the same order
    try:
        single, matrix, jdict, seen = _validate(case, Path(data[case]), root / case / "single")
    finally:
        torch.set_num_threads(threads)
    ranks = [from_safe(torch.load(root / case / f"{r}.pt", weights_only=True)) for r in range(2)]
    for r in ranks:  # every rank returns rank 0's results
        assert r["stats"] == single, (r["stats"], single)
    sharded = ranks[0]
    assert sharded["seen"] == seen == N_VAL * (len(NAMES) if task == "classify" else 1)  # classify: N_VAL per class
    np.testing.assert_array_equal(sharded["matrix"], matrix)
    assert matrix.sum() > 0
    loss_keys = [k for k in single if k.startswith("val/")]
    assert loss_keys and all(np.isfinite(single[k]) for k in loss_keys)
    if task == "classify":
        assert 0 < single["metrics/accuracy_top1"] <= 1
        return
    assert single[f"metrics/mAP50({'M' if task == 'segment' else 'B'})"] > 0  # some boxes match: the test has a point
    assert sharded["jdict"] == jdict and len(jdict) > 0
    written = json.loads((root / case / "rank0" / "predictions.json").read_text())
    assert written == json.loads(json.dumps(jdict))
    ids = [r["image_id"] for r in written]
    # each image's rows come together, once: the id changes exactly at the boundaries between images
    runs = [i for k, i in enumerate(ids) if k == 0 or ids[k - 1] != i]
    assert len(runs) == len(set(runs)) == len(set(ids))
    assert not (root / case / "rank1" / "predictions.json").exists()  # rank 0 alone writes


# ------------------------------------------------------------------------------------------ the scripts
def _torchrun(args, timeout=300):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.ddp
def test_torchrun_val_py_equals_single_process(sharded, tmp_path):
    import val
    from models.checkpoints import model_to_ckpt
    from tests.test_ddp import sharded_val

    root, data = sharded
    weights = tmp_path / "w.pt"
    state = torch.load(root / "v5" / "state.pt", weights_only=True)
    torch.save({"model": model_to_ckpt(_model("v5", state))}, weights)
    args = ["--weights", str(weights), "--data", data["v5"], "--imgsz", "64", "--batch-size", "2", "--device", "cpu",
            "--workers", "0", "--save-json", "--name", "exp"]
    ranks, single = sharded_val(tmp_path, "val", val, args)
    assert single["metrics/mAP50(B)"] > 0
    assert ranks == [single, single]
    assert [p.name for p in (tmp_path / "ddp").iterdir()] == ["exp"]  # the ranks agreed on one folder
    pred = [json.loads((tmp_path / d / "exp" / "predictions.json").read_text()) for d in ("ddp", "one")]
    assert pred[0] == pred[1]


@pytest.mark.ddp
def test_two_rank_training_writes_val_losses_of_one_process(tmp_path):
    """results.csv of a 2-rank run holds the validation losses and metrics that one process computes for the same
    EMA weights (to the 6 digits the file keeps)."""
    from data.synthetic import generate_dataset
    from utils.files import yaml_load
    from utils.torch_utils import amp_settings, memory_format

    root = tmp_path / "data"
    generate_dataset(root, task="detect", n_train=4, n_val=N_VAL, seed=1, min_side=64, max_side=112)
    data = root / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": NAMES}))
    project = tmp_path / "runs"
    _torchrun([str(Path(__file__).with_name("ddp_driver.py")), "train", "--data", str(data), "--cfg", "yolov5n.yaml",
               "--imgsz", "64", "--batch-size", "4", "--epochs", "1", "--workers", "0", "--device", "cpu",
               "--project", str(project), "--name", "exp"], timeout=420)
    exp = project / "exp"
    ema = [torch.load(exp / f"ema_rank{r}.pt", weights_only=True) for r in range(2)]
    assert all(torch.equal(ema[0][k], ema[1][k]) for k in ema[0])  # rank 0's EMA reached rank 1, buffers too
    model = DetectionModel("yolov5n.yaml", nc=len(NAMES))
    model.load_state_dict(ema[0])
    criterion = model.init_criterion(yaml_load(exp / "hyp.yaml"), imgsz=64)
    options = ValOptions(imgsz=64, batch=4, workers=0, plots=False)  # the trainer's: 2 images per rank, times 2
    validator = DetectionValidator(options, tmp_path / "one", NAMES, criterion=criterion)
    validator.build_dataloader(str(root / "images" / "val"), int(max(model.stride)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # as the trainer validates: its layout, under its autocast (--amp auto: bf16 on CPUs that compute it natively)
    amp, amp_dtype = amp_settings(torch.device("cpu"), "auto")
    model = model.to(memory_format=memory_format(torch.device("cpu")))
    try:
        single = validator(model.eval(), amp_dtype=amp_dtype if amp else None)
    finally:
        torch.set_num_threads(threads)
    row = list(csv.DictReader(open(exp / "results.csv")))[-1]
    names = [f"val/{n}_loss" for n in ("box", "obj", "cls")]
    assert set(names) <= set(row) and set(names) <= set(single)
    for k, v in single.items():
        assert row[k].strip() == f"{float(v):.6g}", (k, row[k], v)
