"""Validate an oriented-box (OBB) model: rotated-box mAP50 / mAP50-95 by exact polygon IoU.

Usage:
    $ python obb/val.py --weights runs/train-obb/exp/weights/best.pt --data data/shapes-obb.yaml
    $ python obb/val.py --weights best.pt --data data/shapes-obb.yaml --save-json   # DOTA-style rows, no pycocotools
    One machine, several GPUs (each validates a share; --batch-size is per GPU; metrics as one process)
    $ python -m torch.distributed.run --nproc_per_node 4 obb/val.py --weights best.pt --data DOTAv1.yaml
"""

from engine.options import OBBValOptions
from utils.cli import val_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return val_parser(OBBValOptions, "Validate a YOLO oriented-box (OBB) model", "runs/val-obb").parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help

    return TASKS["obb"].validator.run_val(opt)


if __name__ == "__main__":
    run_cli(main, parse_opt)
