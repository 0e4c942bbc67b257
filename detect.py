"""Run a detector on images, folders, globs or videos; save annotated results (and labels) to runs/detect/expN.

Usage:
    $ python detect.py --weights runs/train/exp/weights/best.pt --source data/images
    $ python detect.py --weights best.pt --source 'path/*.jpg' --save-txt --conf-thres 0.4
    $ python detect.py --weights best.pt --source video.mp4
    $ python detect.py --weights best.onnx --source data/images   # or best.torchscript (export.py)
"""

from engine.options import DetectPredictOptions
from utils.cli import predict_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return predict_parser(DetectPredictOptions, "Run a YOLO detector", "runs/train/exp/weights/best.pt",
                          "runs/detect").parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help
    from utils.dist import get_rank
    from utils.log import set_logging

    set_logging(get_rank())
    return TASKS["detect"].predictor(opt)()


if __name__ == "__main__":
    run_cli(main, parse_opt)
