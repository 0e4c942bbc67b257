"""Validate a trained detector: mAP50, mAP50-95, precision, recall, per-class table and speed.

Usage:
    $ python val.py --weights runs/train/exp/weights/best.pt --data data/shapes.yaml --img 320
    $ python val.py --weights best.pt --data data/shapes.yaml --save-json   # also pycocotools mAP
    $ python val.py --weights best.pt --data data/shapes.yaml --task speed   # timing only
    One machine, several GPUs (each validates a share; --batch-size is per GPU; metrics as one process)
    $ python -m torch.distributed.run --nproc_per_node 4 val.py --weights best.pt --data coco.yaml --img 640
"""

from engine.options import ValOptions
from utils.cli import val_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return val_parser(ValOptions, "Validate a YOLO detector", "runs/val").parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help

    return TASKS["detect"].validator.run_val(opt)


if __name__ == "__main__":
    run_cli(main, parse_opt)
