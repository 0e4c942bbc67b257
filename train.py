"""Train a YOLOv5 / YOLOv7 / YOLOv8 detector.

Usage:
    Single process (CPU or one GPU), no arguments: yolov5n on the built-in synthetic shapes dataset
        $ python train.py
        $ python train.py --data data/shapes.yaml --cfg yolov8n.yaml --img 320 --epochs 10 --batch-size 16
    One machine, several GPUs (one process per GPU; --batch-size is the total over all of them)
        $ python -m torch.distributed.run --nproc_per_node 4 train.py --data coco.yaml --cfg yolov5s.yaml \
              --weights yolov5s.pt --batch-size 64 --device 0,1,2,3 --sync-bn
    Several machines (run on each, with its --node_rank)
        $ python -m torch.distributed.run --nnodes 2 --node_rank 0 --nproc_per_node 8 \
              --master_addr 10.0.0.1 --master_port 29500 train.py --data coco.yaml --cfg yolov8s.yaml
    Evolve hyperparameters (single process; evolve.csv and hyp_evolve.yaml in runs/evolve/expN)
        $ python train.py --data data/shapes.yaml --epochs 10 --evolve 100
    Resume an interrupted run (same launch command as before, single process or torchrun)
        $ python train.py --resume                # the newest unfinished last.pt under runs/train
        $ python train.py --resume runs/train/exp/weights/last.pt
"""

from engine.options import DetectTrainOptions
from utils.cli import options_from_kwargs, train_parser
from utils.run import run_cli


def parse_opt(argv=None):
    """utils/cli.Parsed: the options of `argv` (default: the command line) and the names it gave."""
    return train_parser(DetectTrainOptions, "Train a YOLO detector", "yolov5n.yaml", "data/shapes.yaml", 320,
                        "runs/train").parse(argv)


def main(parsed, callbacks=None):
    """(trainer, metrics) of the run `parsed` (parse_opt's: the options and the names given) asks for; `callbacks` as
    engine.trainer.run takes them (listener objects, or {event: [functions]})."""
    from engine.evolve import train_or_evolve  # imports torch: after parsing, for a quick --help
    from engine.tasks import TASKS

    return train_or_evolve(TASKS["detect"].trainer, parsed, callbacks)


def run(callbacks=None, **options):
    """For Python: `run(data="data/shapes.yaml", epochs=3, callbacks=[MyLogger()])`, options named as the flags."""
    return main(options_from_kwargs(parse_opt, options), callbacks)


if __name__ == "__main__":
    run_cli(main, parse_opt)
