"""Validate a segmentation model: box and mask mAP50 / mAP50-95.

Usage:
    $ python segment/val.py --weights runs/train-seg/exp/weights/best.pt --data data/shapes-seg.yaml
    $ python segment/val.py --weights best.pt --data data/shapes-seg.yaml --save-json   # + pycocotools bbox/segm
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import val as detect_val  # noqa: E402
from utils.tasks.segment import SegmentationValidator  # noqa: E402


def parse_opt(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--data" or a.startswith("--data=") for a in argv):  # val.py would default to detection data
        argv += ["--data", "data/shapes-seg.yaml"]
    opt = detect_val.parse_opt(argv)
    opt.project = "runs/val-seg" if opt.project == "runs/val" else opt.project
    return opt


def main(opt):
    return detect_val.run_val(opt, SegmentationValidator, task="segment")


if __name__ == "__main__":
    main(parse_opt())
