"""Classify images, folders, globs or videos; prints and draws the top-5 classes.

Usage:
    $ python classify/predict.py --weights runs/train-cls/exp/weights/best.pt --source data/images
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.cli import predict_parser  # noqa: E402
from utils.loggers import set_logging  # noqa: E402
from utils.tasks.classify import ClassificationPredictor  # noqa: E402


def parse_opt(argv=None):
    return predict_parser("Run a YOLO classifier", "runs/train-cls/exp/weights/best.pt", 96,
                          "runs/predict-cls").parse_args(argv)


def main(opt):
    set_logging()
    return ClassificationPredictor(opt)()


if __name__ == "__main__":
    main(parse_opt())
