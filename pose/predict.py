"""Run a pose model on images, folders, globs or videos; keypoints and the skeleton drawn, keypoints with --save-txt.

Usage:
    $ python pose/predict.py --weights runs/train-pose/exp/weights/best.pt --source data/images
    $ python pose/predict.py --weights best.pt --source video.mp4 --save-txt --data data/shapes-pose.yaml
"""

from engine.options import PosePredictOptions
from utils.cli import predict_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return predict_parser(PosePredictOptions, "Run a YOLO pose model", "runs/train-pose/exp/weights/best.pt",
                          "runs/predict-pose").parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help
    from utils.dist import get_rank
    from utils.log import set_logging

    set_logging(get_rank())
    return TASKS["pose"].predictor(opt)()


if __name__ == "__main__":
    run_cli(main, parse_opt)
