"""Validate a classifier: top-1 / top-5 accuracy, per-class accuracy, confusion matrix.

Usage:
    $ python classify/val.py --weights runs/train-cls/exp/weights/best.pt --data data/shapes-cls
    One machine, several GPUs (each validates a share; --batch-size is per GPU; metrics as one process)
    $ python -m torch.distributed.run --nproc_per_node 4 classify/val.py --weights best.pt --data imagenet
"""

from engine.options import ClassifyValOptions
from utils.cli import val_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return val_parser(ClassifyValOptions, "Validate a YOLO classifier", "runs/val-cls", batch_default=64,
                      boxes=False).parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help

    return TASKS["classify"].validator.run_val(opt)


if __name__ == "__main__":
    run_cli(main, parse_opt)
