"""Train a YOLO oriented-box (OBB) model: DOTA-style labels, `cls x1 y1 x2 y2 x3 y3 x4 y4` normalised (docs/obb.md).

Usage:
    $ python obb/train.py                                    # the synthetic shapes-obb set, generated offline
    $ python obb/train.py --data data/shapes-obb.yaml --cfg yolov8n-obb.yaml --img 320 --epochs 10
    $ python -m torch.distributed.run --nproc_per_node 2 obb/train.py --data data/shapes-obb.yaml --device cpu
    $ python -m torch.distributed.run --nnodes 2 --node_rank 0 --nproc_per_node 8 --master_addr 10.0.0.1 \
          --master_port 29500 obb/train.py --data DOTAv1.yaml --cfg yolo11s-obb.yaml
    $ python obb/train.py --resume runs/train-obb/exp/weights/last.pt
"""

from engine.options import DetectTrainOptions
from utils.cli import options_from_kwargs, train_parser
from utils.run import run_cli


def parse_opt(argv=None):
    """utils/cli.Parsed: the options of `argv` (default: the command line) and the names it gave."""
    return train_parser(DetectTrainOptions, "Train a YOLO oriented-box (OBB) model", "yolov8n-obb.yaml",
                        "data/shapes-obb.yaml", 320, "runs/train-obb").parse(argv)


def main(parsed, callbacks=None):
    """(trainer, metrics) of the run `parsed` (parse_opt's: the options and the names given) asks for; `callbacks` as
    engine.trainer.run takes them (listener objects, or {event: [functions]})."""
    from engine.evolve import train_or_evolve  # imports torch: after parsing, for a quick --help
    from engine.tasks import TASKS

    return train_or_evolve(TASKS["obb"].trainer, parsed, callbacks)


def run(callbacks=None, **options):
    """For Python: `run(data="data/shapes-obb.yaml", epochs=3, callbacks=[MyLogger()])`, options named as the flags."""
    return main(options_from_kwargs(parse_opt, options), callbacks)


if __name__ == "__main__":
    run_cli(main, parse_opt)
