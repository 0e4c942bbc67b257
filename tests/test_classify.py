"""Classification end to end on CPU: classify/train.py -> val.py -> predict.py, seeding from detectors, DDP
gradient equivalence and a 2-rank torchrun run, and a short run that must learn the synthetic shapes."""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
import torch
import yaml

from classify import predict as cls_predict
from classify import train as cls_train
from classify import val as cls_val
from engine.tasks import TASKS
from engine.tasks.classify import build_classifier
from engine.trainer import run
from tests.ddp_utils import free_port, spawn, train_mode
from tests.probes import probing
from utils import dist as du
from utils.files import ROOT, yaml_load

ClassificationTrainer = TASKS["classify"].trainer

DRIVER = Path(__file__).with_name("ddp_driver.py")
NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}


@pytest.fixture(autouse=True)
def one_thread():
    """On 2 shared cores a second intra-op thread spins against the other processes: one thread was ~80x faster
    for these tiny models whenever the machine was busy."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _train_args(data, project, *extra):
    return ["--data", str(data), "--imgsz", "64", "--batch-size", "16", "--epochs", "2", "--workers", "0",
            "--device", "cpu", "--project", str(project), "--name", "exp", *extra]


@pytest.fixture(scope="module")
def trained(shapes_classify, tmp_path_factory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # module fixtures start before the autouse one
    project = tmp_path_factory.mktemp("cls_runs")
    out = cls_train.main(cls_train.parse_opt(_train_args(shapes_classify, project, "--model", "yolov8n-cls.yaml")))
    torch.set_num_threads(n)
    return out


def _independent_top1(weights, folder, imgsz):
    """Per-image predicted class for every image of folder/<class>/*.jpg, with a plain loop and our own resize."""
    from models.checkpoints import attempt_load

    model = attempt_load(weights, device="cpu", fuse=True)
    truth, pred = [], []
    for c, name in NAMES.items():
        for f in sorted((Path(folder) / name).glob("*.jpg")):
            im = cv2.imread(str(f))  # square images: the val transform is a plain resize
            shrink = im.shape[0] > imgsz
            im = cv2.resize(im, (imgsz, imgsz), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
            x = torch.from_numpy(im[..., ::-1].copy()).permute(2, 0, 1).float()[None] / 255
            with torch.no_grad():
                probs = model(x)[0]
            assert torch.isclose(probs.sum(), torch.tensor(1.0), atol=1e-5)  # eval output is softmax
            truth.append(c)
            pred.append(int(probs.argmax()))
    return torch.tensor(truth), torch.tensor(pred)


def test_train_writes_run_folder(trained):
    trainer, metrics = trained
    d = trainer.save_dir
    for f in ("weights/last.pt", "weights/best.pt", "results.csv", "opt.yaml", "hyp.yaml", "train_batch0.jpg",
              "confusion_matrix_normalized.png"):
        assert (d / f).is_file(), f
    rows = list(csv.DictReader(open(d / "results.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert {"metrics/accuracy_top1", "metrics/accuracy_top5", "fitness"} <= set(rows[0])
    ckpt = torch.load(d / "weights/best.pt", weights_only=True)
    assert ckpt["optimizer"] is None and ckpt["model"]["class"] == "ClassificationModel"
    assert ckpt["model"]["names"] == NAMES
    assert ckpt["hyp"]["label_smoothing"] == yaml_load(ROOT / "data/hyps/hyp.cls.yaml")["label_smoothing"]
    assert metrics["metrics/accuracy_top5"] == 1.0  # 3 classes: the top 5 always holds the truth


def test_val_matches_independent_accuracy(trained, shapes_classify, tmp_path):
    trainer, _ = trained
    best = trainer.save_dir / "weights/best.pt"
    stats = cls_val.main(cls_val.parse_opt(["--weights", str(best), "--data", str(shapes_classify), "--imgsz", "64",
                                            "--device", "cpu", "--workers", "0", "--project", str(tmp_path)]))
    truth, pred = _independent_top1(best, shapes_classify / "val", 64)
    assert stats["metrics/accuracy_top1"] == pytest.approx(float((truth == pred).float().mean()))
    assert stats["metrics/accuracy_top5"] == 1.0
    assert (tmp_path / "exp" / "confusion_matrix_normalized.png").is_file()


def test_val_scores_a_subset_of_the_classes_and_rejects_unknown_ones(trained, tmp_path):
    """classify/val.py reports under the checkpoint's class map: a dataset with only some of its classes is scored
    by name (its own folders would number rectangle 0), exactly as a plain loop does; a class the model does not
    know is an error naming it."""
    from data.synthetic import generate_dataset

    trainer, _ = trained
    best = trainer.save_dir / "weights/best.pt"
    two = generate_dataset(tmp_path / "two", task="classify", n_train=1, n_val=3, seed=5, min_side=64, max_side=64)
    for split in ("train", "val"):  # keep only 2 of the 3 class folders
        shutil.rmtree(two / split / "circle")
    args = ["--weights", str(best), "--data", str(two), "--device", "cpu", "--workers", "0", "--imgsz", "64",
            "--project", str(tmp_path / "v")]
    stats = cls_val.main(cls_val.parse_opt(args))
    truth, pred = _independent_top1(best, two / "val", 64)
    assert truth.tolist() == [1, 1, 1, 2, 2, 2]
    assert stats["metrics/accuracy_top1"] == pytest.approx(float((truth == pred).float().mean()))
    for split in ("train", "val"):
        (two / split / "rectangle").rename(two / split / "square")
    with pytest.raises(ValueError, match=f"--weights {best} knows no class 'square' of --data {two}"):
        cls_val.main(cls_val.parse_opt(args))


def test_predict_prints_and_draws_top5(trained, shapes_classify, tmp_path):
    trainer, _ = trained
    best = trainer.save_dir / "weights/best.pt"
    source = shapes_classify / "val" / "circle"
    results = cls_predict.main(cls_predict.parse_opt(["--weights", str(best), "--source", str(source), "--imgsz",
                                                      "64", "--device", "cpu", "--project", str(tmp_path),
                                                      "--save-txt"]))
    files = sorted(source.glob("*.jpg"))
    assert len(results) == len(files)
    _, pred = _independent_top1(best, shapes_classify / "val", 64)
    out = tmp_path / "exp"
    for f, probs, p in zip(files, (r.probs for r in results), pred[: len(files)]):
        assert probs.shape == (3,) and torch.isclose(probs.sum(), torch.tensor(1.0), atol=1e-5)
        assert int(probs.argmax()) == int(p)  # predict and val see the same centre-crop transform
        lines = (out / "labels" / f"{f.stem}.txt").read_text().splitlines()
        order = probs.argsort(descending=True).tolist()
        assert [ln.split()[1] for ln in lines] == [NAMES[j] for j in order]
        assert [float(ln.split()[0]) for ln in lines] == pytest.approx(probs[order].tolist(), abs=0.006)
        drawn = cv2.imread(str(out / f.name))
        assert drawn is not None and (drawn != cv2.imread(str(f))).any()  # text was drawn on it


def _detector_ckpt(cfg, path):
    from models.checkpoints import model_to_ckpt
    from models.yolo import DetectionModel

    torch.manual_seed(0)
    torch.save({"model": model_to_ckpt(DetectionModel(cfg, nc=3))}, path)
    return path


class _Stop(BaseException):  # a callback's Exception is a warning (engine/callbacks.py); this stops
    pass


@pytest.mark.parametrize("cfg", ["yolov5n.yaml", "yolov8n.yaml"])
def test_classifier_seeded_from_detector_backbone(cfg, shapes_classify, tmp_path):
    from models.checkpoints import attempt_load

    det = attempt_load(_detector_ckpt(cfg, tmp_path / "det.pt"), fuse=False).state_dict()
    seen = {}

    def capture(trainer):
        seen["state"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        seen["hyp"], seen["nc"] = trainer.hyp, trainer.model.nc
        raise _Stop  # the seeding is what we check, not training

    opt = cls_train.parse_opt(_train_args(shapes_classify, tmp_path / "runs", "--model", str(tmp_path / "det.pt")))
    with pytest.raises(_Stop):
        run(probing(ClassificationTrainer, {"on_train_start": [capture]}), opt)
    state = seen["state"]
    backbone = [k for k in det if int(k.split(".")[1]) <= 8]
    assert backbone and all(torch.equal(state[k], det[k]) for k in backbone)
    assert {k for k in state if int(k.split(".")[1]) <= 8} == set(backbone)
    assert {k.split(".")[2] for k in state if k.startswith("model.9.")} == {"conv", "linear"}  # Classify at 9
    assert seen["nc"] == 3 and seen["hyp"]["label_smoothing"] == 0.1  # hyp.cls, not the detector's hyp


def test_finetune_from_classifier_with_other_class_count(trained):
    trainer, _ = trained
    best = trainer.save_dir / "weights/best.pt"
    from models.checkpoints import attempt_load

    src = attempt_load(best, fuse=False).state_dict()
    model, given = build_classifier(best, 5, {i: str(i) for i in range(5)})
    dst = model.state_dict()
    assert set(dst) - given == {"model.9.linear.weight", "model.9.linear.bias"}
    assert model.nc == 5 and dst["model.9.linear.weight"].shape == (5, 1280)
    same = [k for k in src if src[k].shape == dst[k].shape]
    assert set(src) - set(same) == {"model.9.linear.weight", "model.9.linear.bias"}
    assert all(torch.equal(src[k], dst[k]) for k in same)


# ---------------------------------------------------------------- DDP
def _cls_model(sync_bn):
    from models.yolo import ClassificationModel

    torch.manual_seed(1)
    return train_mode(ClassificationModel("yolov8n-cls.yaml", nc=3), freeze_bn=not sync_bn)


def _cls_batch():
    g = torch.Generator().manual_seed(0)
    return torch.rand(4, 3, 64, 64, generator=g), torch.tensor([0, 2, 1, 2])


def _grad_worker(rank, world_size, out):
    for sync_bn in (False, True):  # one spawn for both: starting the processes costs more than the work
        model = _cls_model(sync_bn)
        criterion = model.init_criterion(yaml_load(ROOT / "data/hyps/hyp.cls.yaml"))
        train_model, plain = du.prepare_model(model, torch.device("cpu"), sync_bn=sync_bn)
        img, cls = _cls_batch()
        per = len(img) // world_size
        x, y = img[rank * per : (rank + 1) * per], cls[rank * per : (rank + 1) * per]
        loss, _ = criterion(train_model(x), {"img": x, "cls": y})
        (loss * world_size).backward()  # the engine's rule (BaseTrainer.forward_backward)
        torch.save({k: p.grad.clone() for k, p in plain.named_parameters()}, f"{out}/g{rank}_{int(sync_bn)}.pt")


@pytest.mark.ddp
def test_ddp_gradient_equals_single_process(tmp_path):
    """yolov8n-cls, loss x WORLD_SIZE under DDP == the single-process gradient of the whole batch, with BN frozen
    and with CPUSyncBatchNorm (whose reference is plain BN in train mode over the whole batch)."""
    spawn(_grad_worker, 2, str(tmp_path))
    img, cls = _cls_batch()
    for sync_bn in (False, True):
        model = _cls_model(sync_bn)
        criterion = model.init_criterion(yaml_load(ROOT / "data/hyps/hyp.cls.yaml"))
        loss, _ = criterion(model(img), {"img": img, "cls": cls})
        loss.backward()
        single = {k: p.grad for k, p in model.named_parameters()}
        for rank in range(2):
            ddp = torch.load(tmp_path / f"g{rank}_{int(sync_bn)}.pt")
            assert ddp.keys() == single.keys()
            num = sum(((ddp[k] - single[k]) ** 2).sum() for k in single)
            den = sum((single[k] ** 2).sum() for k in single)
            assert den > 0
            err = float((num / den).sqrt())
            assert err < 1e-4, f"sync_bn={sync_bn} rank {rank}: relative gradient difference {err:.2e}"


@pytest.mark.ddp
def test_torchrun_two_ranks_identical_weights(shapes_classify, tmp_path):
    project = tmp_path / "runs"
    args = ["--data", str(shapes_classify), "--imgsz", "32", "--batch-size", "4", "--epochs", "1", "--workers", "0",
            "--device", "cpu", "--project", str(project), "--name", "exp", "--model", "yolov8n-cls.yaml",
            "--sync-bn"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(DRIVER), "classify", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in project.iterdir()) == ["exp"]  # both ranks agreed on one run folder
    exp = project / "exp"
    assert sorted(p.name for p in (exp / "weights").iterdir()) == ["best.pt", "last.pt"]
    hashes = [(exp / f"weights_rank{i}.sha").read_text() for i in range(2)]
    assert hashes[0] == hashes[1], "ranks ended with different weights"
    assert [(exp / f"saved_rank{i}.txt").read_text() for i in range(2)] == ["1", "0"]


# ---------------------------------------------------------------- learning
@pytest.mark.slow
def test_short_run_learns_shapes(tmp_path):
    """1800 32-px images, 8 epochs, AdamW at 1e-3 with flips only: ~0.77 top-1 (chance 0.33) in ~40 s."""
    from data.synthetic import generate_dataset

    data = generate_dataset(tmp_path / "data", task="classify", n_train=600, n_val=40, seed=0, min_side=32,
                            max_side=32)
    hyp = yaml_load(ROOT / "data/hyps/hyp.cls.yaml")
    # one optimizer step per batch of 16 (nbs) so that 8 epochs make ~900 steps; no crop or colour jitter: at
    # 32 px they slow learning more than they help in so short a run
    hyp.update(nbs=16, warmup_epochs=0.0, lr0=0.001, label_smoothing=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    (tmp_path / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    opt = cls_train.parse_opt(["--data", str(data), "--imgsz", "32", "--batch-size", "16", "--epochs", "8",
                               "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs"),
                               "--hyp", str(tmp_path / "hyp.yaml"), "--optimizer", "AdamW"])
    trainer, metrics = cls_train.main(opt)
    rows = list(csv.DictReader(open(trainer.save_dir / "results.csv")))
    loss = next(k for k in rows[0] if k.startswith("train/"))
    assert float(rows[-1][loss]) < 0.8 * float(rows[0][loss])
    assert metrics["metrics/accuracy_top1"] >= 0.6, metrics
