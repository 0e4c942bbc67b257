"""Train a YOLOv5-cls / YOLOv8-cls image classifier on an ImageFolder dataset.

Usage:
    $ python classify/train.py --data data/shapes-cls --model yolov8n-cls.yaml --img 96 --epochs 10
    $ python classify/train.py --data path/to/imagenet --model yolov5s.pt       # seeded from detection weights
    $ python -m torch.distributed.run --nproc_per_node 2 classify/train.py --data data/shapes-cls \
          --model yolov5n-cls.yaml --device cpu
    $ python classify/train.py --resume runs/train-cls/exp/weights/last.pt
"""



from engine.tasks.classify import ClassificationTrainer
from engine.trainer import run
from utils.cli import DATA_HELP, train_parser
from utils.errors import run_cli


def parse_opt(argv=None):
    p = train_parser("Train a YOLO classifier", "yolov8n-cls.yaml", "data/shapes-cls", 96, "runs/train-cls",
                     cfg_flags=("--model", "--cfg"), data_help=DATA_HELP["classify"])
    return p.parse_args(argv)


def main(opt):
    return run(ClassificationTrainer, opt)


if __name__ == "__main__":
    run_cli(main, parse_opt)
