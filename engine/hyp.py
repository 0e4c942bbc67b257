"""Hyperparameter files: which keys exist (each has a reader), what values they take, and how a partial file is
completed.

A hyp file is data: it is checked in both directions before any work. A key that nothing reads is refused (so a
value the user sets is never silently ignored); a value of the wrong type or outside its range is refused naming
the key. A file that sets only some keys (`--hyp my.yaml` with `lr0: 0.001`) is completed from the model's default
hyp file (the one its YAML names, else the task's), and the run says which keys it took from there; the completed
dict is what hyp.yaml in the run folder holds.
"""

import math

from utils.cli import in_interval
from utils.errors import BadOption
from utils.files import find_file, yaml_load
from utils.loggers import LOGGER
from utils.loss import REGISTRY as LOSSES

# Every hyperparameter something reads, by reader; a hyp file with any other key is refused, so that a value the
# user sets is never silently ignored (official files carry `iou_t`, which no YOLO code reads).
HYP_KEYS = {
    "optimizer and schedule (engine/trainer.py, utils/torch_utils.py)": (
        "lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr", "nbs",
        "close_mosaic"),
    "criteria (utils/loss/)": (
        "loss", "box", "cls", "obj", "dfl", "cls_pw", "obj_pw", "anchor_t", "fl_gamma", "label_smoothing"),
    "augmentation (utils/data/)": (
        "hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud", "fliplr",
        "mosaic", "mixup", "copy_paste"),
}
# The values each key's reader can work with (not what is sensible): a learning rate of 0 trains nothing, a
# probability is in [0, 1], a momentum of 1 never forgets, a crop or zoom scale of 1 leaves nothing of the image, a
# shear of 90 degrees is infinite, no label fits an anchor_t of 1 or less. Brackets as in mathematics.
RANGES = {
    "lr0": "(0, inf)", "lrf": "[0, inf)", "momentum": "[0, 1)", "weight_decay": "[0, inf)",
    "warmup_epochs": "[0, inf)", "warmup_momentum": "[0, 1)", "warmup_bias_lr": "[0, inf)", "nbs": "[1, inf)",
    "close_mosaic": "[0, inf)", "box": "[0, inf)", "cls": "[0, inf)", "obj": "[0, inf)", "dfl": "[0, inf)",
    "cls_pw": "(0, inf)", "obj_pw": "(0, inf)", "anchor_t": "(1, inf)", "fl_gamma": "[0, inf)",
    "label_smoothing": "[0, 1)", "hsv_h": "[0, 1]", "hsv_s": "[0, 1]", "hsv_v": "[0, 1]", "degrees": "[0, 180]",
    "translate": "[0, 1]", "scale": "[0, 1)", "shear": "[0, 90)", "perspective": "[0, inf)", "flipud": "[0, 1]",
    "fliplr": "[0, 1]", "mosaic": "[0, 1]", "mixup": "[0, 1]", "copy_paste": "[0, 1]",
}
WHOLE = {"nbs", "close_mosaic"}  # counts (images, epochs)


def check_value(key, value, where):
    """Raise BadOption naming `where` and `key` unless `value` is what the key's reader takes."""
    if key == "loss":
        if value not in LOSSES:
            raise BadOption(f"{where}: loss {value!r:.40} is not a criterion; known: {', '.join(LOSSES)}")
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    whole = key in WHOLE
    if not (number and in_interval(value, RANGES[key]) and (not whole or value == int(value))):
        kind = "a whole number" if whole else "a number"
        hint = " (YAML reads 1e-3 as text: write 1.0e-3)" if isinstance(value, str) and _numeric(value) else ""
        raise BadOption(f"{where}: {key} must be {kind} in {RANGES[key]}, got {type(value).__name__} "
                        f"{value!r:.40}{hint}")


def _numeric(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def read_hyp(name):
    """The hyp YAML `name` (a path or a file in data/hyps), every key and value checked; BadOption names the file
    and the key."""
    path = find_file(name, "data/hyps")
    hyp = yaml_load(path)
    known = {k for keys in HYP_KEYS.values() for k in keys}
    unknown = sorted(set(hyp) - known, key=str)
    if unknown:
        raise BadOption(f"--hyp {path}: {', '.join(map(repr, unknown))} is read by nothing in this project "
                        f"(remove it); known keys: {', '.join(sorted(known))}")
    for k, v in hyp.items():
        check_value(k, v, f"--hyp {path}")
    return hyp


def load_hyp(given, default):
    """The run's hyp dict: the file `given` (--hyp), completed from the model's `default` file for the keys it does
    not set (listed in one line), or the default file itself."""
    base = read_hyp(default)
    if not given:
        return base
    hyp = read_hyp(given)
    taken = [k for k in base if k not in hyp]
    if taken:
        LOGGER.info(f"--hyp {given} sets {len(hyp)} keys; taken from {default}: "
                    + ", ".join(f"{k}={base[k]}" for k in taken))
    return {**base, **hyp}
