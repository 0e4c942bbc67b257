"""Validate a classifier: top-1 / top-5 accuracy, per-class accuracy, confusion matrix.

Usage:
    $ python classify/val.py --weights runs/train-cls/exp/weights/best.pt --data data/shapes-cls
"""

from pathlib import Path

from engine.tasks.classify import ClassificationValidator
from models.backend import validation_model
from utils.cli import Parser
from utils.data.classify_dataset import ClassificationDataset
from utils.data.dataset_yaml import check_cls_dataset
from utils.data.loader import build_dataloader
from utils.dist import get_rank, select_device
from utils.errors import BadCheckpoint, run_cli
from utils.files import increment_path
from utils.loggers import set_logging


def parse_opt(argv=None):
    p = Parser("Validate a YOLO classifier")
    p.add_argument("--data", type=str, default="data/shapes-cls", help="dataset folder or YAML")
    p.add_argument("--weights", type=str, required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--imgsz", "--img", "--img-size", type=int, default=96)
    p.add_argument("--device", default="")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--half", action="store_true", help="FP16 inference (CUDA only)")
    p.add_argument("--project", default="runs/val-cls")
    p.add_argument("--name", default="exp")
    p.add_argument("--exist-ok", action="store_true")
    return p.parse_args(argv)


def main(opt):
    set_logging(get_rank())
    device = select_device(opt.device)
    model, _ = validation_model(opt.weights, device, opt.imgsz)
    data = check_cls_dataset(opt.data)
    if model.nc != data["nc"]:
        raise BadCheckpoint(f"{opt.weights} predicts {model.nc} classes but {opt.data} has {data['nc']}")
    split = data.get("test") or data["val"]
    ds = ClassificationDataset(split, imgsz=opt.imgsz, augment=False, prefix="val: ")
    loader = build_dataloader(ds, opt.batch_size, opt.workers, shuffle=False)
    save_dir = increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok, mkdir=True)
    return ClassificationValidator(loader, save_dir, opt, data["names"])(model=model)


if __name__ == "__main__":
    run_cli(main, parse_opt)
