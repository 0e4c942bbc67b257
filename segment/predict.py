"""Run a segmentation model on images, folders, globs or videos; masks drawn, polygons with --save-txt.

Usage:
    $ python segment/predict.py --weights runs/train-seg/exp/weights/best.pt --source data/images
    $ python segment/predict.py --weights best.pt --source video.mp4 --save-txt
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.cli import add_nms_args, predict_parser  # noqa: E402
from utils.loggers import set_logging  # noqa: E402
from utils.tasks.segment import SegmentationPredictor  # noqa: E402


def parse_opt(argv=None):
    p = predict_parser("Run a YOLO segmentation model", "runs/train-seg/exp/weights/best.pt", 320,
                       "runs/predict-seg")
    add_nms_args(p)
    return p.parse_args(argv)


def main(opt):
    set_logging()
    return SegmentationPredictor(opt)()


if __name__ == "__main__":
    main(parse_opt())
