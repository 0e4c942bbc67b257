"""The scripts of this clone, found by task and mode: what the `yolo` command and the `YOLO` class run.

The scripts (train.py, segment/val.py, ...) lie in the clone beside the packages, not in a package; they are loaded
from their files under private module names, so a `train.py` of the user's own in the working folder is never
taken for ours.
"""

import importlib.util
import re
import sys
from pathlib import Path

from utils.cli import WEIGHTS_FORMATS
from utils.errors import BadOption
from utils.tasks import SUFFIX_TASKS, TASKS

ROOT = Path(__file__).resolve().parents[1]
MODES = ("train", "val", "predict", "export", "track")  # track: the predict script with --track


def script_path(task, mode):
    """The script of `mode` for `task`, relative to the clone (export.py serves every task)."""
    from engine.messages import SCRIPTS

    return "export.py" if mode == "export" else SCRIPTS[task]["predict" if mode == "track" else mode]


def load_script(task, mode):
    """The script module of `task` and `mode`, loaded once per process."""
    rel = script_path(task, mode)
    name = "yolo._scripts." + rel.removesuffix(".py").replace("/", ".")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / rel)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def model_task(model):
    """The task of a model YAML or weights file: its name's suffix (yolov8n-seg.yaml), else, for a file or OpenVINO
    folder that exists, what its head declares; 'detect' otherwise (the detection scripts then say where another
    model belongs)."""
    found = re.search(rf"-({'|'.join(SUFFIX_TASKS)})\d*(\.\w+)?$", Path(str(model)).name)
    if found:
        return SUFFIX_TASKS[found.group(1)]
    path = Path(str(model))
    if path.suffix.lower() in WEIGHTS_FORMATS and path.is_file() or path.is_dir():
        from models.backend import weights_task  # a folder: an OpenVINO IR's (it says so where it is not)

        return weights_task(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        from models.yolo import head_task, yaml_model_load

        try:
            return head_task(yaml_model_load(str(model)))
        except (OSError, ValueError):  # not a model YAML: the script that reads it says what is wrong
            return "detect"
    return "detect"


def check_model(model):
    """BadModelYaml or BadFile, naming the closest known name, for a model that is neither a model YAML we have
    (`yolov8q.yaml`), nor a file, nor official weights the scripts would download (`yolov8q.pt`): what `YOLO(...)`
    refuses at once, where the scripts would refuse it only when they run."""
    path = Path(str(model))
    if path.is_file() or path.is_dir():  # a folder: an OpenVINO IR's, checked where it is read
        return
    if path.suffix.lower() in (".yaml", ".yml"):
        from models.model_yaml import yaml_model_load

        yaml_model_load(str(model))
        return
    from models.checkpoints.releases import official_url
    from utils.cli import did_you_mean
    from utils.errors import BadFile

    if path.suffix.lower() == ".pt" and path.name == str(model) and official_url(path.name):
        return
    official = [n for n in (f"{f}{s}{t}.pt" for f in ("yolov8", "yolo11", "yolov5") for s in "nslmx"
                            for t in ("", "-seg", "-cls", "-pose", "u")) if official_url(n)]
    official += ["yolov7.pt", "yolov7x.pt", "yolov7-tiny.pt"]
    near = [p.name for p in path.parent.glob("*") if p.suffix in (".pt", ".onnx", ".torchscript", ".yaml")] \
        if path.parent.is_dir() else []
    hint = did_you_mean(path.name, near + official, lambda n: str(path.with_name(n)))
    raise BadFile(f"model {model}: no such file, model YAML or official weights{hint}")


def check_words(task, mode):
    if task not in TASKS:
        raise BadOption(f"{task!r} is not a task: {', '.join(TASKS)}")
    if mode not in MODES:
        raise BadOption(f"{mode!r} is not a mode: {', '.join(MODES)}")
    if mode == "track" and task == "classify":
        raise BadOption("classify track: a tracker follows boxes, which a classifier has none of")


def track_words(mode, args):
    """The predict script's arguments of `yolo track`: --track (bytetrack) unless they name a tracker."""
    named = any(a == "--track" or a.startswith(("--track=", "tracker=", "track=")) for a in args)
    return args if mode != "track" or named else [*args, "--track"]
