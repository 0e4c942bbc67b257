"""Train a YOLOv5-seg / YOLOv8-seg instance segmentation model.

Usage:
    $ python segment/train.py --data data/shapes-seg.yaml --cfg yolov5n-seg.yaml --img 320 --epochs 10
    $ python -m torch.distributed.run --nproc_per_node 2 segment/train.py --data data/shapes-seg.yaml \
          --cfg yolov8n-seg.yaml --device cpu
    $ python -m torch.distributed.run --nnodes 2 --node_rank 0 --nproc_per_node 8 --master_addr 10.0.0.1 \
          --master_port 29500 segment/train.py --data coco128-seg.yaml --cfg yolov8s-seg.yaml
    $ python segment/train.py --resume runs/train-seg/exp/weights/last.pt
"""

from engine.options import SegmentTrainOptions
from utils.cli import options_from_kwargs, train_parser
from utils.run import run_cli


def parse_opt(argv=None):
    """utils/cli.Parsed: the options of `argv` (default: the command line) and the names it gave."""
    return train_parser(SegmentTrainOptions, "Train a YOLO segmentation model", "yolov5n-seg.yaml",
                        "data/shapes-seg.yaml", 320, "runs/train-seg").parse(argv)


def main(parsed, callbacks=None):
    """(trainer, metrics) of the run `parsed` (parse_opt's: the options and the names given) asks for; `callbacks` as
    engine.trainer.run takes them (listener objects, or {event: [functions]})."""
    from engine.evolve import train_or_evolve  # imports torch: after parsing, for a quick --help
    from engine.tasks import TASKS

    return train_or_evolve(TASKS["segment"].trainer, parsed, callbacks)


def run(callbacks=None, **options):
    """For Python: `run(data="data/shapes.yaml", epochs=3, callbacks=[MyLogger()])`, options named as the flags."""
    return main(options_from_kwargs(parse_opt, options), callbacks)


if __name__ == "__main__":
    run_cli(main, parse_opt)
