"""The `yolo` command (pip install -e .): `yolo [TASK] MODE ARGS`, as Ultralytics' users type it, runs this clone's
script for that task and mode with ARGS, given as `key=value` words, as the script's own flags, or both:

    yolo detect train data=data/shapes.yaml model=yolov8n.yaml epochs=10 imgsz=320 --name v8n
    yolo val model=runs/train/v8n/weights/best.pt          # TASK from the model (its name, else its head)
    yolo segment predict model=best.pt source=data/images
    yolo export model=best.pt format=onnx

TASK: detect (the default when the model does not say), segment, classify, pose. MODE: train, val, predict,
export. `yolo TASK MODE --help` lists the script's options; each `key=value` is the flag of that name (utils/cli.py
`Parser.expand_assignments`: batch, conf, iou, format and model stand for --batch-size, --conf-thres, --iou-thres,
--include, and --cfg / --weights). torchrun launches the scripts themselves (README.md).
"""

import sys

from utils.errors import BadOption, run_cli
from yolo.scripts import MODES, TASKS, check_words, load_script, model_task

USAGE = "yolo [TASK] MODE [key=value ...] [--flag value ...]\n\n" + __doc__.split("\n\n", 1)[1]


def model_argument(args):
    """The model named in `args` (model=, --weights, --cfg or --model), or None."""
    for i, tok in enumerate(args):
        if tok.startswith("model="):
            return tok.partition("=")[2]
        flag, eq, value = tok.partition("=")
        if flag in ("--weights", "--cfg", "--model"):
            return value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return None


def split_words(argv):
    """(task, mode, the script's arguments) of a `yolo` command line; BadOption for words that are neither."""
    words = list(argv)
    task = words.pop(0) if words and words[0] in TASKS else None
    if not words or words[0] not in MODES:
        said = f"{words[0]!r}" if words else "nothing"
        raise BadOption(f"yolo: expected a mode ({', '.join(MODES)}) after the task, got {said}; yolo help")
    mode = words.pop(0)
    if task is None:
        model = model_argument(words)
        task = model_task(model) if model else "detect"
    check_words(task, mode)
    return task, mode, words


def run(argv):
    """What the script of `argv`'s task and mode returns (metrics, results or files), or None for the help."""
    if not argv or argv[0] in ("help", "-h", "--help"):
        print("usage: " + USAGE.strip())
        return None

    def parse():
        task, mode, args = split_words(argv)
        module = load_script(task, mode)
        return module, module.parse_opt(args)

    return run_cli(lambda parsed: parsed[0].main(parsed[1]), parse)


def main(argv=None):
    """The command's exit status: 0 once the script has run (its errors exit 2 inside run_cli). Returning the
    script's result would hand it to sys.exit, which prints it and exits with status 1."""
    run(sys.argv[1:] if argv is None else list(argv))
    return 0
