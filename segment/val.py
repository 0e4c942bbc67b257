"""Validate a segmentation model: box and mask mAP50 / mAP50-95.

Usage:
    $ python segment/val.py --weights runs/train-seg/exp/weights/best.pt --data data/shapes-seg.yaml
    $ python segment/val.py --weights best.pt --data data/shapes-seg.yaml --save-json   # + pycocotools bbox/segm
    One machine, several GPUs (each validates a share; --batch-size is per GPU; metrics as one process)
    $ python -m torch.distributed.run --nproc_per_node 4 segment/val.py --weights best.pt --data coco-seg.yaml
"""

from engine.options import SegmentValOptions
from utils.cli import val_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return val_parser(SegmentValOptions, "Validate a YOLO segmentation model", "runs/val-seg").parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help

    return TASKS["segment"].validator.run_val(opt)


if __name__ == "__main__":
    run_cli(main, parse_opt)
