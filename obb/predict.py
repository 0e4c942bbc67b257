"""Run an oriented-box (OBB) model on images, folders, globs or videos; rotated boxes drawn as polygons, and with
--save-txt DOTA-style lines (cls, the four corners normalised, conf).

Usage:
    $ python obb/predict.py --weights runs/train-obb/exp/weights/best.pt --source data/images
    $ python obb/predict.py --weights best.pt --source video.mp4 --save-txt
"""

from engine.options import DetectPredictOptions
from utils.cli import predict_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return predict_parser(DetectPredictOptions, "Run a YOLO oriented-box (OBB) model",
                          "runs/train-obb/exp/weights/best.pt", "runs/predict-obb").parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help
    from utils.dist import get_rank
    from utils.log import set_logging

    set_logging(get_rank())
    return TASKS["obb"].predictor(opt)()


if __name__ == "__main__":
    run_cli(main, parse_opt)
