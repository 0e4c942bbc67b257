"""Run a segmentation model on images, folders, globs or videos; masks drawn, polygons with --save-txt.

Usage:
    $ python segment/predict.py --weights runs/train-seg/exp/weights/best.pt --source data/images
    $ python segment/predict.py --weights best.pt --source video.mp4 --save-txt
"""



from engine.options import DetectPredictOptions
from utils.cli import predict_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return predict_parser(DetectPredictOptions, "Run a YOLO segmentation model", "runs/train-seg/exp/weights/best.pt",
                          "runs/predict-seg").parse_args(argv)


def main(opt):
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help
    from utils.dist import get_rank
    from utils.log import set_logging

    set_logging(get_rank())
    return TASKS["segment"].predictor(opt)()


if __name__ == "__main__":
    run_cli(main, parse_opt)
