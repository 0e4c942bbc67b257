"""Pose on CPU: pose/train.py -> val.py (OKS mAP beside box mAP, COCO keypoint JSON against pycocotools) ->
predict.py (keypoints drawn and written) -> export.py (ONNX / TorchScript parity), a short run that must learn
keypoints, a bad keypoint line in data_problems.txt, and a 2-rank torchrun train + val."""

import csv
import json

import numpy as np
import pytest
import torch
import yaml

from data.synthetic import POSE_FLIP_IDX, generate_dataset
from utils.files import ROOT

NAMES = {0: "rectangle"}


def _pose_yaml(root, train="images/train", val="images/val"):
    data = root / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(root / "data"), "train": train, "val": val, "names": NAMES,
                                    "kpt_shape": [4, 3], "flip_idx": list(POSE_FLIP_IDX),
                                    "skeleton": [[0, 1], [1, 2], [2, 3], [3, 0]]}))
    return data


def _train(project, data, cfg, *extra):
    from pose import train as pose_train

    args = ["--data", str(data), "--cfg", str(cfg), "--workers", "0", "--device", "cpu", "--project", str(project),
            "--name", "exp", *extra]
    trainer, _ = pose_train.main(pose_train.parse_opt(args))
    return trainer


@pytest.fixture(scope="module")
def pose_run(tmp_path_factory):
    """YOLOv8n-pose overfitting 8 rectangles images (validated on themselves) for 30 epochs of 4 optimizer steps,
    as the segmentation learning test: nbs 2, no warmup, no augmentation, AdamW at 0.002, BatchNorm momentum 0.3 (the
    EMA model validates on running statistics). A ninth image has a bad keypoint line: skipped, and listed in
    data_problems.txt."""
    root = tmp_path_factory.mktemp("pose")
    generate_dataset(root / "data", task="pose", n_train=9, n_val=1, seed=0, min_side=96, max_side=120,
                     max_objects=3)
    bad = root / "data" / "labels" / "train" / "00008.txt"
    bad.write_text(bad.read_text() + "0 0.5 0.5 0.2 0.2 0.5 0.5 2\n")
    data = _pose_yaml(root, val="images/train")
    hyp = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.v8.yaml").read_text())
    hyp.update(lr0=0.002, nbs=2, warmup_epochs=0.0, mosaic=0.0, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0,
               hsv_s=0.0, hsv_v=0.0, close_mosaic=0)
    (root / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    cfg = yaml.safe_load((ROOT / "models" / "yolov8-pose.yaml").read_text())
    cfg.update(scale="n", bn_momentum=0.3)
    (root / "yolov8n-pose.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    args = ("--imgsz", "96", "--batch-size", "2", "--epochs", "30", "--hyp", str(root / "hyp.yaml"),
            "--optimizer", "AdamW")
    return _train(root / "runs", data, root / "yolov8n-pose.yaml", *args), data


def _results(trainer):
    return list(csv.DictReader(open(trainer.save_dir / "results.csv")))


def test_run_folder_columns_and_data_problems(pose_run):
    trainer, _ = pose_run
    d = trainer.save_dir
    for f in ("weights/last.pt", "weights/best.pt", "results.csv", "train_batch0.jpg", "val_batch0_pred.jpg",
              "PosePR_curve.png", "data_problems.txt"):
        assert (d / f).is_file(), f
    rows = _results(trainer)
    assert {"train/pose_loss", "train/kobj_loss", "val/pose_loss", "metrics/mAP50(B)", "metrics/mAP50(P)",
            "metrics/mAP50-95(P)", "fitness"} <= set(rows[0])
    assert trainer.model.kpt_shape == (4, 3)  # from the dataset YAML, not the model YAML's [17, 3]
    problems = (d / "data_problems.txt").read_text()
    assert "00008.txt" in problems and "expected 17" in problems


@pytest.mark.slow
def test_short_run_learns_keypoints(pose_run):
    m = [float(r["metrics/mAP50-95(P)"]) for r in _results(pose_run[0])]
    assert max(m) > m[0] + 0.2, f"pose mAP50-95 per epoch: {m}"
    assert m[-1] > m[0] + 0.1, f"pose mAP50-95 per epoch: {m}"


def test_val_json_agrees_with_pycocotools_and_predict_writes_keypoints(pose_run, tmp_path):
    from pose import predict as pose_predict
    from pose import val as pose_val

    trainer, data = pose_run
    best = trainer.save_dir / "weights" / "best.pt"
    stats = pose_val.main(pose_val.parse_opt(["--weights", str(best), "--data", str(data), "--imgsz", "96",
                                              "--project", str(tmp_path / "val"), "--device", "cpu", "--workers",
                                              "0", "--save-json", "--save-txt"]))
    assert stats["metrics/mAP50-95(P)"] > 0.2
    # pycocotools' keypoint evaluation of the same predictions (same sigmas, label areas box x 0.53). Measured: mAP50
    # 0.832 ours, 0.827 COCO; mAP50-95 0.697 and 0.690: the official integration reads about 0.008 above COCO's (as
    # for boxes, evaluation/metrics.py). With one gain for both axes of the letterbox (the official validators' way) the
    # predictions came back up to 0.9 px off in x at 96 px and COCO read 0.680; utils/ops maps each axis by its own.
    assert abs(stats["coco/mAP50(P)"] - stats["metrics/mAP50(P)"]) < 0.01, stats
    assert abs(stats["coco/mAP50-95(P)"] - stats["metrics/mAP50-95(P)"]) < 0.01, stats
    rows = json.loads((tmp_path / "val" / "exp" / "predictions.json").read_text())
    assert len(rows[0]["keypoints"]) == 4 * 3
    saved = [line.split() for f in (tmp_path / "val" / "exp" / "labels").glob("*.txt") for line in
             f.read_text().splitlines()]
    assert saved and all(len(v) == 5 + 4 * 3 + 1 for v in saved)  # + conf
    source = data.parent / "data" / "images" / "train"
    results = pose_predict.main(pose_predict.parse_opt([
        "--weights", str(best), "--source", str(source), "--imgsz", "96", "--project", str(tmp_path / "pred"),
        "--device", "cpu", "--save-txt", "--conf-thres", "0.25", "--data", str(data)]))
    assert all(r.boxes.shape[1] == 6 + 4 * 3 for r in results)
    lines = [line.split() for f in sorted((tmp_path / "pred" / "exp" / "labels").glob("*.txt"))
             for line in f.read_text().splitlines()]
    assert lines and all(len(v) == 5 + 4 * 3 for v in lines)
    values = np.array([v[1:] for v in lines], float)
    assert ((values >= 0) & (values <= 1)).all()  # normalised to the original image


def test_export_parity(pose_run, tmp_path):
    """ONNX and TorchScript exports give the .pt's eval outputs within 1e-4 of each channel's largest value."""
    pytest.importorskip("onnxruntime")
    from export import main as export_main
    from export import parse_opt as export_opt
    from models.backend import InferenceBackend

    trainer, _ = pose_run
    weights = tmp_path / "best.pt"
    weights.write_bytes((trainer.save_dir / "weights" / "best.pt").read_bytes())
    export_main(export_opt(["--weights", str(weights), "--include", "onnx", "torchscript", "--img", "96",
                            "--dynamic", "--device", "cpu"]))
    x = torch.rand(2, 3, 96, 128)
    ref = InferenceBackend(weights)(x)[0]
    for suffix in (".onnx", ".torchscript"):
        backend = InferenceBackend(weights.with_suffix(suffix))
        assert backend.task == "pose" and backend.output_layout.kpt_shape == (4, 3)
        got = backend(x)[0]
        err, scale = (got - ref).abs().amax(dim=(0, 2)), ref.abs().amax(dim=(0, 2))  # per output channel
        assert (err <= 1e-4 * scale + 1e-7).all(), f"{suffix}: worst {(err / scale).max():.3g}"


def test_a_static_export_is_validated_square_as_the_pt_is_there(pose_run, tmp_path):
    """pose/val.py takes a --no-dynamic export: every image letterboxed square to its size, in batches of its batch
    (the last padded); its box and keypoint metrics are the .pt's validated the same way."""
    pytest.importorskip("onnxruntime")
    import subprocess
    import sys

    from engine.tasks import TASKS
    from export import main as export_main
    from export import parse_opt as export_opt
    from models.backend import InferenceBackend
    from models.checkpoints import attempt_load

    trainer, data = pose_run
    weights = tmp_path / "best.pt"
    weights.write_bytes((trainer.save_dir / "weights" / "best.pt").read_bytes())
    export_main(export_opt(["--weights", str(weights), "--include", "onnx", "--img", "96", "--batch", "3",
                            "--no-dynamic", "--device", "cpu"]))
    validator_cls = TASKS["pose"].validator

    def validate(model, name):
        options = validator_cls.options(imgsz=96, batch=3, workers=0, plots=False)
        d = validator_cls.get_data(str(data), options)
        validator = validator_cls(options.for_dataset(d), tmp_path / name, d["names"])
        validator.build_dataloader(d["val"], 32, rect=False)
        return validator(model)

    pt, onnx = validate(attempt_load(weights), "pt"), validate(InferenceBackend(weights.with_suffix(".onnx")), "onnx")
    assert pt.keys() == onnx.keys() and all(abs(pt[k] - onnx[k]) < 1e-4 for k in pt)
    assert min(v for k, v in pt.items() if k.startswith("metrics/mAP50(")) > 0.5  # a model that finds them
    run = subprocess.run([sys.executable, str(ROOT / "pose" / "val.py"), "--weights", str(weights.with_suffix(".onnx")),
                          "--data", str(data), "--project", str(tmp_path / "runs")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and "--batch-size 32 -> 3" in run.stdout + run.stderr, run.stderr[-2000:]


def test_hub_results_carry_keypoints(pose_run):
    import hubconf

    model = hubconf.custom(str(pose_run[0].save_dir / "weights" / "best.pt"), device="cpu")
    model.conf = 0.25
    source = pose_run[1].parent / "data" / "images" / "train" / "00000.jpg"
    r = model(str(source), size=96)
    assert r.keypoints[0].shape == (len(r.xyxy[0]), 4, 3)
    assert all(row["keypoints"].shape == (4, 3) for row in r.tolist()[0])


@pytest.mark.ddp
def test_torchrun_two_ranks_pose(tmp_path):
    """2 ranks with gloo: one run folder, identical weights on both ranks, only rank 0 saves, pose metrics logged;
    then pose/val.py sharded over 2 ranks gives the single-process metrics."""
    from tests.test_ddp import DRIVER, plain_hyp, sharded_val, torchrun

    generate_dataset(tmp_path / "data", task="pose", n_train=8, n_val=4, seed=0, min_side=96, max_side=128)
    data = _pose_yaml(tmp_path)
    project = tmp_path / "runs"
    args = ["--data", str(data), "--cfg", "yolov8n-pose.yaml", "--imgsz", "64", "--batch-size", "4", "--epochs",
            "1", "--workers", "0", "--device", "cpu", "--project", str(project), "--name", "exp",
            "--hyp", str(plain_hyp(tmp_path, "hyp.v8.yaml")), "--sync-bn"]
    r = torchrun([str(DRIVER), "pose", *args], ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    exp = project / "exp"
    assert sorted(p.name for p in project.iterdir()) == ["exp"]
    hashes = [(exp / f"weights_rank{i}.sha").read_text() for i in range(2)]
    assert hashes[0] == hashes[1], "ranks ended with different weights"
    assert [(exp / f"saved_rank{i}.txt").read_text() for i in range(2)] == ["1", "0"]
    assert "metrics/mAP50-95(P)" in (exp / "results.csv").read_text()
    # pose/val.py sharded over the 2 ranks returns what one process computes (as a module: see test_val_sharding)
    val_args = ["--weights", str(exp / "weights" / "last.pt"), "--data", str(data), "--imgsz", "64", "--batch-size",
                "1", "--device", "cpu", "--workers", "0", "--conf", "0.0001", "--name", "exp"]
    from pose import val as pose_val

    ranks, single = sharded_val(tmp_path, "pose", pose_val, val_args)
    assert ranks == [single, single]


def test_scripts_default_to_the_synthetic_pose_set():
    """`python pose/train.py` with no arguments trains yolov8n-pose on data/shapes-pose.yaml, generated offline."""
    from data.dataset_yaml import check_pose_dataset, find_dataset_yaml
    from engine.inherit import run_values
    from engine.options import PoseValOptions
    from pose import predict as pose_predict
    from pose import train as pose_train
    from pose import val as pose_val
    from utils.files import yaml_load

    opt = pose_train.parse_opt([]).opt
    assert (opt.data, opt.cfg) == ("data/shapes-pose.yaml", "yolov8n-pose.yaml")
    val_opt = PoseValOptions.from_cli(pose_val.parse_opt(["--weights", "w.pt"]))  # the run's data, else this default
    assert val_opt.data is None and run_values(val_opt, {})["data"] == "data/shapes-pose.yaml"
    assert pose_predict.parse_opt([]).weights == "runs/train-pose/exp/weights/best.pt"
    d = yaml_load(find_dataset_yaml(opt.data))
    assert d["synthetic"]["task"] == "pose" and d["kpt_shape"] == [4, 3] and d["flip_idx"] == list(POSE_FLIP_IDX)
    assert check_pose_dataset({**d, "synthetic": None, "train": ".", "val": ".", "path": str(ROOT)})["skeleton"]


def test_interrupted_pose_run_resumes(tmp_path):
    """A pose run stopped after its first epoch continues from last.pt with --resume: the model is rebuilt from the
    checkpoint with the dataset's kpt_shape, and results.csv ends with both epochs."""
    from pose import train as pose_train
    from utils.errors import Interrupted

    generate_dataset(tmp_path / "data", task="pose", n_train=4, n_val=2, seed=1, min_side=64, max_side=96)
    data = _pose_yaml(tmp_path)

    def stop(event):
        raise Interrupted(2)

    parsed = pose_train.parse_opt(["--data", str(data), "--imgsz", "64", "--batch-size", "2", "--epochs", "2",
                                   "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs"),
                                   "--name", "exp", "--noplots"])
    with pytest.raises(Interrupted):
        pose_train.main(parsed, {"on_fit_epoch_end": [stop]})
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    trainer, _ = pose_train.main(pose_train.parse_opt(["--resume", str(last)]))
    assert trainer.model.kpt_shape == (4, 3)
    assert [r["epoch"] for r in _results(trainer)] == ["1", "2"]
