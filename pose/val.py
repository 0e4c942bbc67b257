"""Validate a pose model: box and keypoint (OKS) mAP50 / mAP50-95.

Usage:
    $ python pose/val.py --weights runs/train-pose/exp/weights/best.pt --data data/shapes-pose.yaml
    $ python pose/val.py --weights best.pt --data data/shapes-pose.yaml --save-json   # + pycocotools bbox/keypoints
    One machine, several GPUs (each validates a share; --batch-size is per GPU; metrics as one process)
    $ python -m torch.distributed.run --nproc_per_node 4 pose/val.py --weights best.pt --data coco-pose.yaml
"""

from engine.options import PoseValOptions
from utils.cli import val_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return val_parser(PoseValOptions, "Validate a YOLO pose model", "runs/val-pose").parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help

    return TASKS["pose"].validator.run_val(opt)


if __name__ == "__main__":
    run_cli(main, parse_opt)
