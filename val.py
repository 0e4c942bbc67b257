"""Validate a trained detector: mAP50, mAP50-95, precision, recall, per-class table and speed.

Usage:
    $ python val.py --weights runs/train/exp/weights/best.pt --data data/shapes.yaml --img 320
    $ python val.py --weights best.pt --data data/shapes.yaml --save-json   # also pycocotools mAP
    $ python val.py --weights best.pt --data data/shapes.yaml --task speed   # timing only
"""

from engine.tasks.detect import DetectionValidator, run_val
from utils.cli import val_parser
from utils.errors import run_cli


def parse_opt(argv=None):
    return val_parser("Validate a YOLO detector", "data/shapes.yaml", 320, "runs/val").parse_args(argv)


def main(opt):
    return run_val(opt, DetectionValidator)


if __name__ == "__main__":
    run_cli(main, parse_opt)
