"""Validate a segmentation model: box and mask mAP50 / mAP50-95.

Usage:
    $ python segment/val.py --weights runs/train-seg/exp/weights/best.pt --data data/shapes-seg.yaml
    $ python segment/val.py --weights best.pt --data data/shapes-seg.yaml --save-json   # + pycocotools bbox/segm
"""

from engine.tasks.detect import run_val
from engine.tasks.segment import SegmentationValidator
from utils.cli import val_parser
from utils.errors import run_cli


def parse_opt(argv=None):
    p = val_parser("Validate a YOLO segmentation model", "data/shapes-seg.yaml", 320, "runs/val-seg")
    return p.parse_args(argv)


def main(opt):
    return run_val(opt, SegmentationValidator, task="segment")


if __name__ == "__main__":
    run_cli(main, parse_opt)
