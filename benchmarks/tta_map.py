"""mAP with and without test-time augmentation (--augment) on a short from-scratch run, at the training size and
at 4/3 of it. An accuracy figure, not a test: a model that learns enough to compare takes minutes on a CPU.

    python -m benchmarks.tta_map                       # yolov8n, 256 synthetic images at 96 px, 8 epochs
    python -m benchmarks.tta_map --cfg yolov5n.yaml --epochs 12
"""

import argparse
import tempfile
from pathlib import Path

import yaml

import train
import val
from data.synthetic import generate_dataset
from utils.files import ROOT


def dataset(root):
    generate_dataset(root, task="detect", n_train=256, n_val=24, seed=3, min_side=96, max_side=128, max_objects=4)
    hyp = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.v8.yaml").read_text())
    hyp.update(nbs=16, warmup_epochs=0.0, close_mosaic=0, lr0=0.003)  # a short run that visibly learns
    (root / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    data = root / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                    "names": {0: "circle", 1: "rectangle", 2: "triangle"}}))
    return data, root / "hyp.yaml"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov8n.yaml")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--imgsz", type=int, default=96)
    opt = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    data, hyp = dataset(tmp / "data")
    trainer, _ = train.main(train.parse_opt([
        "--data", str(data), "--hyp", str(hyp), "--cfg", opt.cfg, "--imgsz", str(opt.imgsz), "--batch-size", "16",
        "--epochs", str(opt.epochs), "--workers", "0", "--device", "cpu", "--optimizer", "AdamW", "--noval",
        "--noplots", "--project", str(tmp / "runs")]))
    best = str(trainer.save_dir / "weights" / "best.pt")
    rows = []
    for size in (opt.imgsz, round(opt.imgsz * 4 / 3 / 32) * 32):
        for aug in ([], ["--augment"]):
            s = val.main(val.parse_opt(["--weights", best, "--data", str(data), "--imgsz", str(size), "--device",
                                        "cpu", "--workers", "0", "--project", str(tmp / "val"), *aug]))
            rows.append((size, "TTA" if aug else "plain", s["metrics/mAP50(B)"], s["metrics/mAP50-95(B)"]))
    print(f"\n{opt.cfg}, {opt.epochs} epochs at {opt.imgsz} px\n{'val size':>9}{'':>7}{'mAP50':>8}{'mAP50-95':>10}")
    for size, kind, m50, m in rows:
        print(f"{size:>9}{kind:>7}{m50:>8.3f}{m:>10.3f}")


if __name__ == "__main__":
    main()
