"""Classify images, folders, globs or videos; prints and draws the top-5 classes.

Usage:
    $ python classify/predict.py --weights runs/train-cls/exp/weights/best.pt --source data/images
"""



from engine.options import PredictOptions
from utils.cli import predict_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return predict_parser(PredictOptions, "Run a YOLO classifier", "runs/train-cls/exp/weights/best.pt",
                          "runs/predict-cls", boxes=False).parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help
    from utils.dist import get_rank
    from utils.log import set_logging

    set_logging(get_rank())
    return TASKS["classify"].predictor(opt)()


if __name__ == "__main__":
    run_cli(main, parse_opt)
