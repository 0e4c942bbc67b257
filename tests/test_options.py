"""The YOLOv5-style training options: AutoAnchor, --freeze, --single-cls, --label-smoothing, --multi-scale,
single process and under a 2-rank torchrun (gloo, CPU)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml

import train
import val
from engine.evolve import META
from models.checkpoints import attempt_load
from models.yolo import DetectionModel, yaml_model_load
from tests.ddp_utils import free_port
from utils.errors import BadOption
from utils.files import ROOT

IMGSZ = 64
DRIVER = Path(__file__).with_name("options_driver.py")


def bars_dataset(root, n_train=8, n_val=4):
    """Square 64 px images of thin bars (about 51 x 3 px, lying or standing): no default YOLOv5 anchor is within
    a factor 4 of such a box in both sides, so the YAML anchors recall almost none of them."""
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            img = rng.integers(0, 60, (IMGSZ, IMGSZ, 3), dtype=np.uint8)
            lines = []
            for c in (0, 1):
                long, thin = rng.uniform(0.7, 0.9), rng.uniform(0.04, 0.07)
                w, h = (long, thin) if c == 0 else (thin, long)
                cx, cy = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
                p1 = (int((cx - w / 2) * IMGSZ), int((cy - h / 2) * IMGSZ))
                p2 = (int((cx + w / 2) * IMGSZ), int((cy + h / 2) * IMGSZ))
                cv2.rectangle(img, p1, p2, (255, 255, 255) if c == 0 else (0, 200, 255), -1)
                lines.append(f"{c} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
            cv2.imwrite(str(root / "images" / split / f"{i}.png"), img)
            (root / "labels" / split / f"{i}.txt").write_text("\n".join(lines) + "\n")
    f = root / "bars.yaml"
    f.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                 "names": {0: "lying", 1: "standing"}}))
    return f


def label_wh_px(data_yaml, split="train", imgsz=IMGSZ):
    root = Path(yaml.safe_load(Path(data_yaml).read_text())["path"])
    rows = [np.loadtxt(f, ndmin=2) for f in sorted((root / "labels" / split).glob("*.txt"))]
    return np.concatenate(rows)[:, 3:5] * imgsz  # square images: the long side is imgsz at training size


def best_possible_recall(wh, anchors_px, thr=4.0):
    """Share of labels with an anchor within a factor thr in both width and height."""
    fits = [(np.maximum(wh / a, a / wh) < thr).all(1) for a in np.asarray(anchors_px).reshape(-1, 2)]
    return float(np.any(fits, axis=0).mean())


def head_anchors_px(model):
    head = model.model[-1]
    return (head.anchors * head.stride.view(-1, 1, 1)).view(-1, 2).double().numpy()


def _args(data, project, *extra, imgsz=IMGSZ):
    return ["--data", str(data), "--imgsz", str(imgsz), "--epochs", "1", "--workers", "0", "--device", "cpu",
            "--project", str(project), "--name", "exp", "--cfg", "yolov5n.yaml", "--noplots", *extra]


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    return bars_dataset(tmp_path_factory.mktemp("bars"))


def test_autoanchor_single_cls_label_smoothing(bars, tmp_path):
    wh = label_wh_px(bars)
    default = head_anchors_px(DetectionModel("yolov5n.yaml", nc=1))
    assert best_possible_recall(wh, default) < 0.98
    trainer, _ = train.main(train.parse_opt(_args(bars, tmp_path / "runs", "--batch-size", "4", "--single-cls",
                                                  "--label-smoothing", "0.1")))
    best = trainer.save_dir / "weights" / "best.pt"
    model = attempt_load(best, device=torch.device("cpu"), fuse=False)  # the loader val.py and detect.py use
    fitted = head_anchors_px(model)
    assert best_possible_recall(wh, fitted) >= 0.98
    np.testing.assert_allclose(fitted, head_anchors_px(trainer.model), rtol=1e-3)  # fp16 in the checkpoint
    assert model.yaml["anchors"] != DetectionModel("yolov5n.yaml").yaml["anchors"]
    # --single-cls: one class in the model, the metrics and the loss; --label-smoothing reached the criterion
    assert model.nc == 1 and model.names == {0: "item"}
    assert len(trainer.validator.nt_per_class) == 1
    assert trainer.validator.nt_per_class[0] == len(label_wh_px(bars, "val"))
    assert trainer.hyp["label_smoothing"] == 0.1 and (trainer.criterion.cp, trainer.criterion.cn) == (0.95, 0.05)
    stats = val.main(val.parse_opt(["--weights", str(best), "--data", str(bars), "--imgsz", str(IMGSZ),
                                    "--device", "cpu", "--workers", "0", "--project", str(tmp_path / "val"),
                                    "--single-cls"]))
    assert 0.0 <= stats["metrics/mAP50(B)"] <= 1.0


def test_noautoanchor_keeps_yaml_anchors_and_image_weights(bars, tmp_path):
    from data.image_weights import ImageWeightSampler

    trainer, _ = train.main(train.parse_opt(_args(bars, tmp_path / "runs", "--batch-size", "8", "--noautoanchor",
                                                  "--noval", "--image-weights")))
    np.testing.assert_array_equal(head_anchors_px(trainer.model),
                                  head_anchors_px(DetectionModel("yolov5n.yaml", nc=2)))
    sampler = trainer.data_plan.train_loader.sampler
    assert isinstance(sampler, ImageWeightSampler) and sampler.weights.all()


@pytest.mark.ddp
def test_torchrun_autoanchor_freeze_multiscale(bars, tmp_path):
    """2 ranks: identical refitted anchors right after set-up; --freeze 10 trains (no DDP unused-parameter error)
    with the frozen weights bitwise unchanged and the others changed; --multi-scale gives both ranks the same size
    at every step. At 96 px, as 1 image per rank at 64 * 0.5 px would leave BatchNorm a single value at P5."""
    project = tmp_path / "runs"
    args = _args(bars, project, "--batch-size", "2", "--freeze", "10", "--multi-scale", "--noval", imgsz=96)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(DRIVER), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rec = [json.loads((project / "exp" / f"record_rank{i}.json").read_text()) for i in range(2)]
    assert rec[0]["anchors"] == rec[1]["anchors"]
    anchors_px = np.array(rec[0]["anchors"]) * np.array([8, 16, 32])[:, None, None]
    assert best_possible_recall(label_wh_px(bars, imgsz=96), anchors_px) >= 0.98
    n_frozen_expected = sum(n.startswith(tuple(f"model.{i}." for i in range(10)))
                            for n, _ in DetectionModel("yolov5n.yaml", nc=2).named_parameters())
    for r_ in rec:
        assert r_["n_frozen"] == n_frozen_expected
        assert r_["frozen_start"] == r_["frozen_end"]
        assert r_["trainable_start"] != r_["trainable_end"]
    assert rec[0]["sizes"] == rec[1]["sizes"] and len(rec[0]["sizes"]) == 4
    sizes = {s for hw in rec[0]["sizes"] for s in hw}
    assert len(sizes) > 1 and all(s % 32 == 0 and 48 <= s <= 144 for s in sizes), rec[0]["sizes"]


def test_evolve_two_generations(bars, tmp_path):
    base = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    out = train.main(train.parse_opt(_args(bars, tmp_path / "evo", "--batch-size", "8", "--evolve", "2")))
    rows = list(csv.DictReader(open(out.parent / "evolve.csv")))
    assert len(rows) == 2
    hyp = yaml.safe_load(out.read_text())
    assert set(hyp) == set(base)
    best = max(rows, key=lambda r: float(r["fitness"]))
    for k in META.keys() & base.keys():
        assert META[k][1] <= hyp[k] <= META[k][2] and hyp[k] == pytest.approx(float(best[k]))
    assert any(float(rows[0][k]) != base[k] for k in META.keys() & base.keys())  # generation 0 was mutated
    assert sorted(p.name for p in out.parent.glob("gen*") if p.is_dir()) == ["gen0", "gen1"]


def test_evolve_refuses_ddp(bars, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(BadOption, match="single process"):
        train.main(train.parse_opt(_args(bars, tmp_path / "evo", "--evolve", "2")))


@pytest.mark.ddp
def test_image_weights_rank0_weights_and_shares(tmp_path):
    from data.image_weights import ImageWeightSampler
    from tests.ddp_utils import spawn
    from tests.image_weights_worker import weighted_shares

    spawn(weighted_shares, 2, str(tmp_path))
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # independent arithmetic: label counts per class 0: 16, 1: 4, 2: 4 -> 1/count normalised, times (1 - mAP)^2 / nc
    inv = np.array([1 / 16, 1 / 4, 1 / 4])
    cw = inv / inv.sum() * (1 - np.array([0.5, 0.0, 0.2])) ** 2 / 3
    expected = [cw[0], 2 * cw[0], cw[1], cw[2] + cw[0], 0.0] * 4
    for g in got:
        np.testing.assert_allclose(g["weights"], expected, rtol=1e-12)
    assert len(got[0]["idx"]) == len(got[1]["idx"]) == 10
    labels = [np.array([0.0]), np.array([0.0, 0.0]), np.array([1.0]), np.array([2.0, 0.0]), np.zeros(0)] * 4
    single = ImageWeightSampler(labels, 3, 1, -1, seed=3, maps_fn=lambda: np.array([0.5, 0.0, 0.2]))
    single.set_epoch(1)
    merged = [None] * 20
    merged[0::2], merged[1::2] = got[0]["idx"], got[1]["idx"]
    assert merged == list(single)  # the two shares are one weighted draw split between the ranks
    assert all(i % 5 != 4 for i in merged)  # images without labels have weight 0


def test_set_anchors_keeps_v7_anchor_grid_and_yaml_in_step():
    from copy import deepcopy

    from models.autoanchor import set_anchors

    model = DetectionModel("yolov7-tiny.yaml", nc=2)
    new = np.array([[4 + 3 * i, 50 - 4 * i] for i in range(9)], dtype=float)
    new = new[np.argsort(new.prod(1))]
    set_anchors(model, new)
    head = model.model[-1]
    np.testing.assert_allclose(head.anchor_grid.view(-1, 2).numpy(), new, rtol=1e-6)  # finest stride first
    np.testing.assert_allclose(head_anchors_px(model), new, rtol=1e-6)
    np.testing.assert_allclose(head_anchors_px(DetectionModel(deepcopy(model.yaml))), new, atol=0.01)


def test_classifier_freeze_label_smoothing_multiscale(shapes_classify, tmp_path):
    from classify import train as cls_train

    trainer, _ = cls_train.main(cls_train.parse_opt([
        "--data", str(shapes_classify), "--imgsz", "64", "--epochs", "1", "--batch-size", "4", "--workers", "0",
        "--device", "cpu", "--project", str(tmp_path), "--noplots", "--noval", "--freeze", "3",
        "--label-smoothing", "0.2", "--multi-scale"]))
    assert trainer.criterion.label_smoothing == 0.2  # the flag wins over hyp.cls.yaml's 0.1
    frozen = {n for n, p in trainer.model.named_parameters() if not p.requires_grad}
    first3 = {n for n, _ in trainer.model.named_parameters() if n.startswith(("model.0.", "model.1.", "model.2."))}
    assert frozen == first3 and first3


def test_noautoanchor_refuses_anchors_left_to_autoanchor(bars, tmp_path):
    """yolov5-p2 says `anchors: 3`: its placeholders (0..5 px) are no anchors to train with."""
    d = {k: v for k, v in yaml_model_load("yolov5-p2.yaml").items() if k != "yaml_file"}
    (tmp_path / "p2.yaml").write_text(yaml.safe_dump({**d, "depth_multiple": 0.33, "width_multiple": 0.25}))
    with pytest.raises(BadOption, match=r"--noautoanchor: .*p2\.yaml says `anchors: 3`"):
        train.main(train.parse_opt(_args(bars, tmp_path / "runs", "--cfg", str(tmp_path / "p2.yaml"),
                                         "--noautoanchor", "--noval")))
