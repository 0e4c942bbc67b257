"""Command-line options shared by the task scripts (train, val, predict), so the tasks' scripts cannot drift apart."""

import argparse
import dataclasses
import difflib
import math
import re
import sys
import typing
from pathlib import Path

from utils.budget import MAX_IMGSZ
from utils.errors import BadOption
from utils.log import LOGGER


def _edits(a, b):
    """Levenshtein distance: the insertions, deletions and substitutions that turn a into b."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def close_match(word, choices):
    """The choice closest to `word` (difflib's candidates, the fewest edits first, then the same length: a typo of
    one letter names the word of that letter, `yolov8q.yaml` -> `yolov8n.yaml`, not `yolov8.yaml`; then the first in
    `choices`), or None."""
    word, choices = str(word), [str(c) for c in choices]
    # a suggestion is a typo's fix: at most one edit per three letters (flags' dashes not counted), or '--rect'
    # would name '--project', which difflib finds close
    most = max(1, len(word.lstrip("-")) // 3)
    found = [c for c in difflib.get_close_matches(word, choices, n=8, cutoff=0.6)
             if _edits(word.lstrip("-"), c.lstrip("-")) <= most]
    return min(found, key=lambda c: (_edits(word, c), abs(len(c) - len(word)), choices.index(c))) if found else None


def did_you_mean(word, choices, show=str):
    """'; did you mean X?' for the choice closest to `word` (`show` writes it as the user would type it), else ''."""
    found = close_match(word, choices)
    return f"; did you mean {show(found)}?" if found is not None else ""


def str2bool_or_path(v):
    """--resume alone means 'the latest run'; --resume PATH names a last.pt; --resume auto, the run --name names."""
    return True if v in (None, "", "True", "true") else v


# The values each numeric option can take (whichever of them a script has), brackets as in mathematics; and a train
# script's --batch-size -1, AutoBatch (utils/autobatch.py).
OPTION_RANGES = {
    "epochs": "[1, inf)", "batch_size": "[1, inf)", "imgsz": f"[1, {MAX_IMGSZ}]", "workers": "[0, inf)",
    "patience": "[0, inf)", "save_period": "[-1, inf)", "seed": "[0, 2147483647]", "freeze": "[0, inf)",
    "label_smoothing": "[0, 1)", "evolve": "[1, inf)", "vid_stride": "[1, inf)", "line_thickness": "[1, inf)",
    "conf_thres": "[0, 1]", "iou_thres": "[0, 1]", "max_det": "[1, inf)", "classes": "[0, inf)",
    "batch": "[1, inf)", "conf": "[0, 1]", "iou": "[0, 1]",  # the val scripts' --batch-size, --conf/--iou-thres
}


# the options that take one of a few words (None: not given); the parsers and the check of saved options read these
OPTION_CHOICES = {"cache": (None, "ram", "disk"), "optimizer": ("SGD", "Adam", "AdamW", "auto"),
                  "amp": ("auto", "off", "fp16", "bf16")}


def in_interval(value, interval):
    """Whether `value` lies in an interval written as in mathematics: '[0, 1)', '(0, inf)'."""
    lo, hi = (float(x) for x in interval[1:-1].split(","))
    above = value > lo if interval[0] == "(" else value >= lo
    return above and (value < hi if interval[-1] == ")" else value <= hi)


# the loggers --loggers may name (engine/loggers/ builds them)
LOGGERS = {
    "csv": "results.csv in the run folder, one row per epoch",
    "tensorboard": "TensorBoard scalars and pictures in the run folder",
    "tensorboard-graph": "the same with the model's graph, traced at set-up (seconds of a run)",
    "wandb": "Weights & Biases (engine/loggers/wandb.py; pip install wandb)",
    "mlflow": "MLflow (engine/loggers/mlflow.py; pip install mlflow)",
    "clearml": "ClearML (engine/loggers/clearml.py; pip install clearml)",
    "comet": "Comet (engine/loggers/comet.py; pip install comet_ml)",
}
DEFAULT_LOGGERS = ["csv", "tensorboard"]
ALWAYS = "csv"

def check_loggers(value):
    """The loggers a run has, in order, each once, from the words --loggers was given: a name adds a logger to the
    default (csv tensorboard), `no-name` drops one, `none` drops all but results.csv; words may be comma lists
    ('wandb,mlflow'), or one such string. BadOption naming the first unknown name, or an attempt to drop results.csv.
    Read the words once: the list that results, read again, has the default's loggers added back."""
    items = [value] if isinstance(value, str) else list(value or [])
    names = list(DEFAULT_LOGGERS)
    for word in (n.strip().lower() for item in items for n in str(item).split(",") if n.strip()):
        drop = word.startswith("no-")
        name = word.removeprefix("no-")
        if word == "none":
            names = [ALWAYS]
            continue
        if name not in LOGGERS:
            raise BadOption(f"--loggers {word}: unknown logger; choose from {', '.join(LOGGERS)} (no-NAME drops one, "
                            "none keeps results.csv alone)")
        if drop and name == ALWAYS:
            raise BadOption("--loggers no-csv: results.csv is the run's record and is always written")
        names = [n for n in names if n != name] if drop else [*names, name]
    return list(dict.fromkeys([ALWAYS, *names]))


def check_options(opt, flags=None):
    """BadOption naming the first option whose value is outside OPTION_RANGES (by its flag: `flags` {dest: flag},
    else the dest's own), or a --loggers name that is not a logger (before the script does any work). --loggers'
    words (the command line's, or a Python caller's `loggers="wandb,mlflow"`) become the run's list of loggers here,
    once."""
    if isinstance(getattr(opt, "loggers", None), LoggerWords):
        opt.loggers = check_loggers(opt.loggers)
    for dest, interval in OPTION_RANGES.items():
        values = getattr(opt, dest, None)
        for v in values if isinstance(values, list) else [values]:
            if dest == "batch_size" and v == -1 and hasattr(opt, "epochs"):  # training's AutoBatch (utils/autobatch)
                continue
            if v is not None and not (math.isfinite(v) and in_interval(v, interval)):
                flag = (flags or {}).get(dest) or "--" + dest.replace("_", "-")
                hint = " (there is no automatic batch size here: -1 is training's AutoBatch; give the images per " \
                       "step)" if flag == "--batch-size" and v == -1 else ""
                raise BadOption(f"{flag} {v}: must be in {interval}{hint}")
    _check_run_folder(opt)


def _check_run_folder(opt):
    """--project must be a folder (or not exist yet) and --name a folder inside it: PROJECT/NAME is created, or
    written into, later, once the work has begun."""
    name = getattr(opt, "name", None)
    if isinstance(name, str) and (not name or Path(name).is_absolute() or ".." in Path(name).parts):
        raise BadOption(f"--name {name!r}: must name a folder inside --project (no '..', not absolute)")
    project = getattr(opt, "project", None)
    if isinstance(project, (str, Path)):
        blocker = next((a for a in [Path(project), *Path(project).parents] if a.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise BadOption(f"--project {project}: {blocker} is a file, not a folder")


class Parsed(typing.NamedTuple):
    """A train script's command line, read: `opt`, its options (a namespace holding nothing else), and `given`, the
    names of those it named (--resume refuses those that would change the run; --weights without --cfg trains the
    weights' own model)."""

    opt: argparse.Namespace
    given: list


def options_from_kwargs(parse_opt, options):
    """Parsed: what the train script's `parse_opt` makes of an empty command line, with `options` (named as the
    flags, dashes as underscores: `batch_size=8`) in place of the defaults, checked as a command line is, and given;
    for the train scripts' `run(**options)`."""
    opt = parse_opt([]).opt
    unknown = sorted(set(options) - set(vars(opt)))
    if unknown:
        raise BadOption(f"unknown option {', '.join(unknown)}; known: {', '.join(sorted(vars(opt)))}")
    vars(opt).update(options)
    if "loggers" in options:
        opt.loggers = LoggerWords([options["loggers"]] if isinstance(options["loggers"], str) else options["loggers"])
    check_options(opt)
    return Parsed(opt, sorted(options))


class LoggerWords(list):
    """--loggers' words as given, not yet read (check_loggers reads them once, in check_options)."""


class LoggersAction(argparse.Action):
    """--loggers wandb mlflow, --loggers wandb,mlflow, --loggers no-tensorboard, or the option repeated: the words
    are kept in order (checked at once, so a mistake names the option) and read by check_options."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest)
        words = LoggerWords([*(given if isinstance(given, LoggerWords) else []), *values])
        try:
            check_loggers(words)
        except BadOption as e:
            raise argparse.ArgumentError(None, str(e)) from None  # the message names the option
        setattr(namespace, self.dest, words)


class ValTaskAction(argparse.Action):
    """The val scripts' --task (the official scripts' name), read once into two options: `split` (val or test) and
    `speed` (--task speed: the val split at deployment thresholds, for timing)."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.split, namespace.speed = ("val", True) if value == "speed" else (value, False)


class HelpFormatter(argparse.HelpFormatter):
    """--help with each option's default said once: appended where the help text does not already say it, left out
    where there is nothing to say (a flag that is off, an option whose help explains its empty default)."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        nothing = default is None or default is False or default == "" or default is argparse.SUPPRESS
        if "default" in text or nothing or not action.option_strings:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """The scripts' parser. With `launcher`, it accepts the `--local-rank=N` / `--local_rank N` that the older
    launcher `python -m torch.distributed.launch` passes, used only where LOCAL_RANK is not set, listed last in
    --help. `parse_args` gives the options alone; `parse` gives them with the names of those the command line
    named (Parsed), which training needs."""

    def __init__(self, description, launcher=True):
        super().__init__(description=description, formatter_class=HelpFormatter)
        if launcher:
            self.add_argument_group("set by a launcher").add_argument(
                "--local-rank", "--local_rank", dest="local_rank", type=int, default=-1,
                help="the process's local rank, from torch.distributed.launch (torchrun sets LOCAL_RANK instead)")

    def error(self, message):
        """argparse's own complaints (an unknown option, `--epochs ten`) end as every user error does: one
        `error:` line and exit status 2 (utils/run.run_cli), not a usage dump."""
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        hint = ""
        if unknown and unknown.group(1).startswith("--"):
            flag = unknown.group(1).split("=", 1)[0]
            hint = did_you_mean(flag, [s for s in self._option_string_actions if s.startswith("--")])
        raise BadOption(f"{message}{hint} (see --help)")

    def parse_args(self, args=None, namespace=None):
        return self.parse(args, namespace).opt

    def parse(self, args=None, namespace=None):
        """Parsed: the options of `args` (default: this process's command line), checked, and the names it gave."""
        args = self.expand_assignments(sys.argv[1:] if args is None else list(args))
        opt = super().parse_args(args, namespace)
        check_options(opt, {a.dest: a.option_strings[0] for a in self._actions if a.option_strings})
        if getattr(opt, "local_rank", -1) >= 0:
            from utils import dist as du  # here: it imports torch, which --help does without

            du.use_launcher_local_rank(opt.local_rank)
        return Parsed(opt, self.named_options(args))

    def expand_assignments(self, args):
        """`key=value` words, as Ultralytics' users type them (`epochs=3 batch=8 model=yolov8n.yaml`), as the flags
        they stand for, beside flags given as flags; `assignment_flags` says how each becomes flags."""
        out = []
        for i, tok in enumerate(args):
            key, eq, value = tok.partition("=")
            if not eq and self._bare_switch(tok, args[i - 1] if i else None):
                out += self.assignment_flags(tok, "true")
            elif tok.startswith("-") or not eq or not re.fullmatch(r"[A-Za-z_][\w-]*", key):
                out.append(tok)
            else:
                out += self.assignment_flags(key, value)
        return out

    def _switch(self, key):
        """The on/off action `key` (a name or Ultralytics' alias) names, or None."""
        name = KEY_ALIASES.get(key, key).replace("_", "-")
        action = self._option_string_actions.get(f"--{name}")
        return action if action is not None and action.nargs in (0, "?") else None

    def _bare_switch(self, word, previous):
        """True for an on/off option named alone (`format=onnx dynamic`: Ultralytics turns a bare boolean key on),
        unless it is the value of the flag before it (`--name half`)."""
        if not re.fullmatch(r"[A-Za-z_][\w-]*", word) or self._switch(word) is None:
            return False
        if previous is None or not previous.startswith("-") or "=" in previous:
            return True
        before = self._option_string_actions.get(previous)
        return before is not None and before.nargs == 0

    def assignment_flags(self, key, value):
        """The flags `key=value` stands for; `value` text (the command line's) or a Python value (yolo.YOLO's
        keyword arguments). A true/false value turns a flag on or off; a list (or a comma list) gives several values;
        `model` is --model, --cfg for a YAML to train, else --weights."""
        acts = self._option_string_actions
        name = KEY_ALIASES.get(key, key).replace("_", "-")
        if key == "model":
            name = "model" if "--model" in acts else "cfg" if str(value).endswith((".yaml", ".yml")) and \
                "--cfg" in acts else "weights"
        action = acts.get(f"--{name}") or next((a for a in acts.values() if a.dest == name.replace("-", "_")), None)
        if action is None and key == "save" and "--nosave" in acts:  # Ultralytics' save=False is our --nosave
            on = _truth(value)
            if on is None:
                raise BadOption(f"{key}={value}: save is on or off (true or false)")
            return [] if on else ["--nosave"]
        if action is None:
            keys = {a.dest for a in acts.values()} | {k for k, v in KEY_ALIASES.items() if v in
                                                      {a.dest for a in acts.values()}}
            raise BadOption(f"{key}={value}: no option --{name}{did_you_mean(key, keys, lambda k: k + '=')} "
                            "(see --help)")
        flag = action.option_strings[0]
        if action.nargs == 0 or (action.nargs == "?" and _truth(value) is not None):  # on/off (--resume alone)
            on = _truth(value)
            if on is None:
                raise BadOption(f"{key}={value}: {flag} is on or off (true or false)")
            negative = [s for s in action.option_strings if s.startswith("--no-")]
            if isinstance(action, argparse.BooleanOptionalAction):
                return [flag if on else negative[0]]
            return [flag] if on == bool(action.const) else []  # store_false: --no-log-model means log_model=false
        if action.nargs in ("+", "*"):
            items = value if isinstance(value, (list, tuple)) else re.split(r"[,\s]+", str(value).strip("[]()"))
            return [flag, *(str(v) for v in items if str(v) != "")]
        return [flag, str(value)]

    def named_options(self, args):
        """dest of every option in `args`, abbreviations included (argparse accepts unique prefixes)."""
        names = set()
        for tok in args:
            flag = tok.split("=", 1)[0]
            if not flag.startswith("--"):
                continue
            acts = self._option_string_actions
            found = {acts[flag].dest} if flag in acts else {a.dest for s, a in acts.items() if s.startswith(flag)}
            if len(found) == 1:
                names |= found
        return sorted(names)


# Ultralytics' names of the scripts' options (save=False is --nosave: Parser.assignment_flags)
KEY_ALIASES = {"batch": "batch_size", "conf": "conf_thres", "iou": "iou_thres", "format": "include", "img": "imgsz",
               "show": "view_img", "line_width": "line_thickness", "tracker": "track"}


def _truth(value):
    """True / False for the ways a command line or a caller says on and off, None for anything else."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return True if text in ("true", "yes", "on", "1") else False if text in ("false", "no", "off", "0") else None


# what --data takes, per kind of task: the box tasks read a dataset YAML or a folder holding a dataset, classification
# a folder of class folders
DATA_HELP = {
    "boxes": "dataset YAML (path, train, val, names; see data/shapes.yaml), or a folder holding a dataset: its "
             "data.yaml (a Roboflow export), COCO JSON (annotations/instances_<split>.json), Pascal VOC XML "
             "(Annotations/, ImageSets/Main/, JPEGImages/) or Label Studio JSON exports (train.json, val.json)",
    "classify": "dataset folder with train/ and val/ (or test/) holding one folder per class, or a YAML naming it",
}


# --modules, on every script that builds or loads a model: the user's own blocks
MODULES_ARG = {"nargs": "+", "action": "extend", "default": [], "metavar": "FILE.py"}
MODULES_HELP = ("Python files of your own blocks: each torch.nn.Module subclass a file defines becomes a name model "
                "YAML rows may use (docs/blocks.md); needed again to load what they trained")


LOGGERS_HELP = (f"what records the run besides results.csv (always written): names of "
                f"{', '.join(n for n in LOGGERS if n != 'csv')} are added to the default, no-NAME drops one "
                f"(no-tensorboard), none drops all; a comma list or the option repeated also work; trackers: "
                f"README.md, Experiment tracking")


def add_modules_arg(p):
    p.add_argument("--modules", help=MODULES_HELP, **MODULES_ARG)
    return p


def train_parser(options, description, cfg_default, data_default, imgsz_default, project, cfg_flags=("--cfg",),
                 data_help=DATA_HELP["boxes"]):
    """The train scripts' options, made from the fields of `options` (their task's engine.options.TrainOptions)."""
    return add_option_fields(Parser(description), options,
                             {"cfg": cfg_default, "data": data_default, "imgsz": imgsz_default}, {"cfg": cfg_flags},
                             project=project, data_help=data_help)


def _value_type(hint):
    """int or float for a field of that type (Optional or not), else None (argparse keeps the text)."""
    types = [t for t in typing.get_args(hint) if t is not type(None)] if typing.get_origin(hint) is typing.Union \
        else [hint]
    return types[0] if len(types) == 1 and types[0] in (int, float) else None


def add_option_fields(p, options, defaults, flags=None, boxes=True, overrides=None, **words):
    """One argument per field of the dataclass `options` whose metadata names its flags (engine/options._cli), in
    field order: a bool field is an on-flag, an int or float one takes that type, unless its settings say otherwise;
    the help text is formatted with `words` and, as `{field}`, the fallback of each field the weights' run fills
    (its `run_default`, engine/inherit.py); `defaults` {field: value}, `flags` {field: flags} and `overrides`
    {field: argparse settings} are the script's own. Without `boxes` the box tasks' flags are left out, their
    fields at their defaults."""
    hints = typing.get_type_hints(options)
    fields = dataclasses.fields(options)
    words = {**{f.name: f.metadata["run_default"] for f in fields if "run_default" in f.metadata}, **words}
    for f in fields:
        if "flags" not in f.metadata:
            continue
        settings = {**f.metadata["argparse"], **(overrides or {}).get(f.name, {}),
                    **({"default": defaults[f.name]} if f.name in defaults else {})}
        if f.metadata.get("boxes") and not boxes:
            p.set_defaults(**{f.name: settings.get("default", False)})
            continue
        if isinstance(settings.get("default"), list):  # each parser its own list
            settings["default"] = list(settings["default"])
        if hints[f.name] is bool:
            settings.setdefault("action", "store_true")
        elif _value_type(hints[f.name]):
            settings.setdefault("type", _value_type(hints[f.name]))
        p.add_argument(*(flags or {}).get(f.name, f.metadata["flags"]), dest=f.name,
                       help=f.metadata["help"].format(**words), **settings)
    return p


def predict_parser(options, description, weights_default, project, boxes=True):
    """The predict scripts' options, made from the fields of `options` (their task's engine.options.PredictOptions);
    a classifier's (`boxes` False) has no box flags."""
    return add_option_fields(Parser(description), options, {"weights": weights_default}, boxes=boxes,
                             project=project)


def val_parser(options, description, project, batch_default=None, boxes=True):
    """The val scripts' options, made from the fields of `options` (their task's engine.options.ValOptions): `boxes`
    keeps the box tasks' options (NMS, saved predictions, --task speed), which a classifier has no use for."""
    p = Parser(description)
    p.set_defaults(speed=False)  # ValTaskAction sets it with --task
    defaults = {"project": project, **({"batch": batch_default} if batch_default else {})}
    speed = ", or speed: val at conf 0.25, IoU 0.45, no JSON" if boxes else ""
    return add_option_fields(p, options, defaults, boxes=boxes,
                             overrides={} if boxes else {"split": {"choices": ["val", "test"]}},
                             data_help=DATA_HELP["boxes" if boxes else "classify"], speed_help=speed)


EXPORT_FORMATS = ("onnx", "torchscript", "openvino", "engine")
# what --weights runs, by its suffix (an OpenVINO folder is read as its .xml): models/backend chooses the runtime by it,
# and the `yolo` command reads a file's task by it without importing torch first
WEIGHTS_FORMATS = {".pt": "pytorch", ".onnx": "onnx", ".torchscript": "torchscript", ".xml": "openvino",
                   ".engine": "engine"}
# Whether a format takes any batch and image size where --dynamic/--no-dynamic does not say. OpenVINO's CPU plugin
# pays about 55 ms the first time a dynamic IR meets an input shape and then runs a 640x480 input no faster than a
# static IR runs 640x640 (docs/deploy.md), so its IR is fixed at --img, as Ultralytics' is; a TensorRT engine always
# takes a range of batches.
EXPORT_DYNAMIC = {"onnx": True, "torchscript": True, "openvino": False, "engine": True}
DEFAULT_OPSET = 17  # every model of this project exports at it (tests/models/test_export.py)


def export_parser(options, description):
    """export.py's options, made from the fields of `options` (engine.options.ExportOptions); --img defaults to the
    size the weights trained at (engine/inherit.py)."""
    return add_option_fields(Parser(description, launcher=False), options, {})


def check_imgsz(imgsz, stride):
    """--img rounded up to a multiple of the model's largest stride (every level's feature map must tile the image,
    or the head's concatenations fail), with one warning when it changes."""
    if imgsz <= 0:
        raise BadOption(f"--img {imgsz}: must be a positive number of pixels")
    new = max(math.ceil(imgsz / stride), 1) * stride
    if new != imgsz:
        LOGGER.warning(f"WARNING: --img {imgsz} is not a multiple of the model's largest stride {stride}: using {new}")
    return new
