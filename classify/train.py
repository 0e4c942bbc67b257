"""Train a YOLOv5-cls / YOLOv8-cls image classifier on an ImageFolder dataset.

Usage:
    $ python classify/train.py --data data/shapes-cls --model yolov8n-cls.yaml --img 96 --epochs 10
    $ python classify/train.py --data path/to/imagenet --model yolov5s.pt       # seeded from detection weights
    $ python -m torch.distributed.run --nproc_per_node 2 classify/train.py --data data/shapes-cls \
          --model yolov5n-cls.yaml --device cpu
    $ python classify/train.py --resume runs/train-cls/exp/weights/last.pt
"""

from engine.options import TrainOptions
from utils.cli import DATA_HELP, options_from_kwargs, train_parser
from utils.run import run_cli


def parse_opt(argv=None):
    """utils/cli.Parsed: the options of `argv` (default: the command line) and the names it gave."""
    p = train_parser(TrainOptions, "Train a YOLO classifier", "yolov8n-cls.yaml", "data/shapes-cls", 96,
                     "runs/train-cls", cfg_flags=("--model", "--cfg"), data_help=DATA_HELP["classify"])
    return p.parse(argv)


def main(parsed, callbacks=None):
    """(trainer, metrics) of the run `parsed` (parse_opt's: the options and the names given) asks for; `callbacks` as
    engine.trainer.run takes them (listener objects, or {event: [functions]})."""
    from engine.tasks import TASKS  # imports torch: after parsing, for a quick --help
    from engine.trainer import run as run_training

    return run_training(TASKS["classify"].trainer, parsed, callbacks)


def run(callbacks=None, **options):
    """For Python: `run(data="data/shapes-cls", epochs=3, callbacks=[MyLogger()])`, options named as the flags."""
    return main(options_from_kwargs(parse_opt, options), callbacks)


if __name__ == "__main__":
    run_cli(main, parse_opt)
