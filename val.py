"""Validate a trained detector: mAP50, mAP50-95, precision, recall, per-class table and speed.

Usage:
    $ python val.py --weights runs/train/exp/weights/best.pt --data data/shapes.yaml --img 320
    $ python val.py --weights best.pt --data data/shapes.yaml --save-json   # also pycocotools mAP
    $ python val.py --weights best.pt --data data/shapes.yaml --task speed   # timing only
"""

import argparse
from pathlib import Path

from utils.cli import add_nms_args
from utils.dist import select_device
from utils.files import increment_path
from utils.loggers import set_logging
from utils.tasks.detect import DetectionValidator


def parse_opt(argv=None):
    p = argparse.ArgumentParser(description="Validate a YOLO detector")
    p.add_argument("--data", type=str, default="data/shapes.yaml", help="dataset YAML")
    p.add_argument("--weights", type=str, required=True, help="model weights")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--imgsz", "--img", "--img-size", type=int, default=320)
    p.add_argument("--task", default="val", choices=["val", "test", "speed"], help="split to evaluate, or speed")
    p.add_argument("--device", default="", help="cuda device, i.e. 0 or cpu")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--save-txt", action="store_true", help="save predictions to labels/*.txt")
    p.add_argument("--save-json", action="store_true", help="save COCO-format predictions and run pycocotools")
    p.add_argument("--half", action="store_true", help="FP16 inference (CUDA only)")
    p.add_argument("--project", default="runs/val")
    p.add_argument("--name", default="exp")
    p.add_argument("--exist-ok", action="store_true")
    add_nms_args(p, conf=0.001, iou=0.6, max_det=300)
    return p.parse_args(argv)


def build_loader(opt, data, split, stride, task="detect"):
    from utils.data.detect_dataset import YOLODataset
    from utils.data.loader import build_dataloader

    ds = YOLODataset(data[split], imgsz=opt.imgsz, batch_size=opt.batch_size, augment=False, rect=True,
                     stride=stride, pad=0.5, prefix=f"{split}: ", nc=data["nc"], task=task)
    return build_dataloader(ds, opt.batch_size, opt.workers, shuffle=False)


def run_val(opt, validator_cls, task="detect"):
    """Shared by detection and segmentation val scripts."""
    from models.experimental import attempt_load
    from utils.data.dataset_yaml import check_det_dataset

    set_logging()
    device = select_device(opt.device)
    model = attempt_load(opt.weights, device=device, fuse=True)
    data = check_det_dataset(opt.data)
    if data["nc"] != model.nc:
        raise ValueError(f"{opt.weights} has {model.nc} classes but {opt.data} has {data['nc']}")
    if opt.task == "speed":
        opt.conf_thres, opt.iou_thres, opt.save_json = 0.25, 0.45, False
    split = "test" if opt.task == "test" and data.get("test") else "val"
    save_dir = increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok, mkdir=True)
    loader = build_loader(opt, data, split, int(max(model.stride)), task)
    validator = validator_cls(loader, save_dir, opt, data["names"])
    return validator(model=model)


def main(opt):
    return run_val(opt, DetectionValidator)


if __name__ == "__main__":
    main(parse_opt())
