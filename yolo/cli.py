"""The `yolo` command (pip install -e .): `yolo [TASK] MODE ARGS`, as Ultralytics' users type it, runs this clone's
script for that task and mode with ARGS, given as `key=value` words, as the script's own flags, or both:

    yolo detect train data=data/shapes.yaml model=yolov8n.yaml epochs=10 imgsz=320 --name v8n
    yolo val model=runs/train/v8n/weights/best.pt          # TASK from the model (its name, else its head)
    yolo segment predict model=best.pt source=data/images
    yolo export model=best.pt format=onnx

TASK: detect (the default when the model does not say), segment, classify, pose. MODE: train, val, predict,
export. `yolo TASK MODE --help` lists the script's options; each `key=value` is the flag of that name (utils/cli.py
`Parser.expand_assignments`: batch, conf, iou, format and model stand for --batch-size, --conf-thres, --iou-thres,
--include, and --cfg / --weights; save=False, show and line_width for --nosave, --view-img, --line-thickness; an
on/off key alone turns it on: `format=onnx dynamic`). Also
Ultralytics' `yolo train resume model=last.pt` and `yolo train model=last.pt resume=True` (--resume last.pt),
`verbose=False` and `stream=True` (`habit_words`); a misspelt key, flag or model name is refused with the closest one.
A model YAML given to val, predict, track or export runs its model untrained, as Ultralytics does (yolo/untrained.py).
After a run, what to run next is said as `yolo` lines. torchrun launches the scripts themselves (README.md).
"""

import logging
import sys

from utils.errors import BadOption
from utils.run import run_cli
from yolo.scripts import MODES, TASKS, check_model, check_words, load_script, model_task, track_words
from yolo.untrained import Untrained, is_yaml

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


def with_model(args, model):
    """`args` with the model they name (as `model_argument` finds it) replaced by `model`."""
    out = list(args)
    for i, tok in enumerate(out):
        flag, eq, _ = tok.partition("=")
        if eq and flag in ("model", "--weights", "--cfg", "--model"):
            out[i] = f"{flag}={model}"
            return out
        if tok in ("--weights", "--cfg", "--model") and i + 1 < len(out):
            out[i + 1] = model
            return out
    return out


def _on(word):
    """True / False / None (not an on-off word) of `key=value`'s value, or True for the bare key."""
    value = word.partition("=")[2] if "=" in word else "true"
    return {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(value.lower())


def habit_words(mode, words):
    """(the script's words, verbose) of Ultralytics' words that are not the scripts' options: its two resume forms
    (`resume model=last.pt` and `model=last.pt resume=True`: --resume last.pt; `resume` alone: the newest run),
    `verbose=False` (the log at warnings) and `stream=True` (the predict scripts read every source a frame at a
    time already)."""
    out, verbose, resume = [], True, None
    for w in words:
        key = w.partition("=")[0]
        if key == "verbose" and _on(w) is not None:
            verbose = _on(w)
        elif key == "stream" and mode == "predict" and _on(w) is not None:
            continue
        elif key == "resume" and mode == "train" and _on(w) is not None:
            resume = _on(w)
        else:
            out.append(w)
    if resume:
        model = next((w for w in out if w.startswith("model=")), None)
        out = [w for w in out if w != model] + ["--resume", *([model.partition("=")[2]] if model else [])]
    return out, verbose


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
    return task, mode, track_words(mode, habit_words(mode, words)[0])


def verbose(argv):
    """False where the command line says verbose=False."""
    return habit_words(None, argv)[1]


class _Warnings(logging.Filter):
    """verbose=False: the `yolo` logger's warnings and errors only (the scripts set its level themselves)."""

    def filter(self, record):
        return record.levelno >= logging.WARNING


def run(argv):
    """What the script of `argv`'s task and mode returns (metrics, results or files), or None for the help."""
    if not argv or argv[0] in ("help", "-h", "--help"):
        print("usage: " + USAGE.strip())
        return None

    def parse():
        task, mode, args = split_words(argv)
        model = model_argument(args)
        if model:  # a misspelt name is refused now, with the closest, not once the run has set up
            check_model(model)
        untrained = Untrained(model, task) if model and mode != "train" and is_yaml(model) else None
        if untrained:  # predict, val and export run a YAML's model with its random weights, as Ultralytics does
            args = with_model(args, untrained.checkpoint())
        module = load_script(task, mode)
        # `untrained` goes on with the options: its folder, the weights they name, lives as long as it
        return task, module, module.parse_opt(args), verbose(argv), untrained, mode

    def main(parsed):
        task, module, opt, loud, untrained, mode = parsed
        from engine import messages

        messages.YOLO_TASK = task  # what the run says to run next (and to resume it) are `yolo` lines
        quiet = None if loud else _Warnings()
        if quiet:
            logging.getLogger("yolo").addFilter(quiet)
        try:
            if untrained is None:
                return module.main(opt)
            with untrained.named():
                out = module.main(opt)
            return untrained.publish(out) if mode == "export" else out
        finally:
            messages.YOLO_TASK = None
            if quiet:
                logging.getLogger("yolo").removeFilter(quiet)

    return run_cli(main, parse)


def main(argv=None):
    """The command's exit status: 0 once the script has run (its errors exit 2 inside run_cli). Returning the
    script's result would hand it to sys.exit, which prints it and exits with status 1."""
    run(sys.argv[1:] if argv is None else list(argv))
    return 0
