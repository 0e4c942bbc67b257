"""Hyperparameter files: who reads which key, what values it takes, which file a model defaults to, and how a partial
file is completed.

Each reader declares the keys it reads next to its code: a dict {key: the values it takes} (`HYP_KEYS` of a module,
`hyp_keys` of a class) and the defaults of the keys it can do without (`HYP_DEFAULTS` / `hyp_defaults`). `READERS`
lists them. A hyp file is checked in both directions: a key that no reader reads is refused (a value the user sets
is never silently ignored), and so is a key a reader of this run needs that neither the file nor its default file
gives; each is one `error:` line naming the key and its reader. A value of the wrong type or outside its range is
refused naming the key.

A file that sets only some keys (`--hyp my.yaml` with `lr0: 0.001`) is completed from the model's default hyp file
(`default_hyp_file`: the one its YAML names, else the task's), and the run says which keys it took from there; the
completed dict is what hyp.yaml in the run folder holds.
"""

import functools
import math
import sys
from pathlib import Path
from typing import NamedTuple

import losses as criteria
from data import augment
from data.classify_dataset import ClassifyTrainTransforms
from models import autoanchor
from models.yolo import head_class, yaml_model_load
from utils import schedule
from utils.cli import in_interval
from utils.errors import BadModelYaml, BadOption
from utils.files import ROOT, find_file, yaml_load
from utils.log import LOGGER


class Reader(NamedTuple):
    """Code that reads hyperparameters: its name, its file, {key: values it takes}, {key: default}."""

    name: str
    module: str
    keys: dict
    defaults: dict

    @classmethod
    def of(cls, owner, name=None):
        """The declaration of a module (HYP_KEYS, HYP_DEFAULTS) or a class (hyp_keys, hyp_defaults)."""
        if isinstance(owner, type):
            return cls(name or owner.__name__, _source(sys.modules[owner.__module__]), owner.hyp_keys,
                       owner.hyp_defaults)
        return cls(name or owner.__name__, _source(owner), owner.HYP_KEYS, owner.HYP_DEFAULTS)

    def __str__(self):
        return f"{self.name} ({self.module})"


def _source(module):
    return Path(module.__file__).resolve().relative_to(ROOT).as_posix()


SCHEDULE = Reader.of(schedule, "the optimizer and its schedule")
# every reader in the project; official files carry `iou_t`, which no YOLO code reads, so it is refused
READERS = (
    SCHEDULE,
    Reader.of(criteria, "the criterion choice"),
    *(Reader.of(c) for c in dict.fromkeys(criteria.REGISTRY.values())),
    Reader.of(augment, "detection augmentation"),
    Reader.of(ClassifyTrainTransforms, "classification augmentation"),
    Reader.of(autoanchor, "AutoAnchor"),
)


def known_keys():
    """{key: the values it takes}, over every reader (readers of one key agree on them: a test checks it)."""
    return {k: v for r in READERS for k, v in r.keys.items()}


def check_value(key, value, where):
    """Raise BadOption naming `where` and `key` unless `value` is what the key's readers take."""
    values = known_keys()[key]
    if values == "criterion":
        if value not in criteria.REGISTRY:
            raise BadOption(f"{where}: loss {value!r:.40} is not a criterion; known: {', '.join(criteria.REGISTRY)}")
        return
    whole = values.endswith(" whole")
    interval = values.removesuffix(" whole")
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (number and in_interval(value, interval) and (not whole or value == int(value))):
        kind = "a whole number" if whole else "a number"
        hint = " (YAML reads 1e-3 as text: write 1.0e-3)" if isinstance(value, str) and _numeric(value) else ""
        raise BadOption(f"{where}: {key} must be {kind} in {interval}, got {type(value).__name__} "
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
    known = known_keys()
    unknown = sorted(set(hyp) - set(known), key=str)
    if unknown:
        raise BadOption(f"--hyp {path}: {', '.join(map(repr, unknown))} is read by nothing in this project "
                        f"(remove it); known keys: {', '.join(sorted(known))}")
    for k, v in hyp.items():
        check_value(k, v, f"--hyp {path}")
    return hyp


def default_hyp_file(model_yaml):
    """(file, why): the hyp file a model (its YAML dict) trains with unless --hyp says otherwise. The one rule:
    1. the file its YAML names (`hyp:`): our model YAMLs, so every checkpoint this project wrote;
    2. else the file named by the model YAML of this project that lists the same layers (backbone and head, the same
       head class): a checkpoint Ultralytics, the yolov5 package or YOLOv7 trained holds the YAML it was built from,
       which names no hyp file (yolov7-tiny is told from yolov7 this way, both ending in IDetect);
    3. else the file of the criterion its head trains with (`hyp_file` of the head's `default_loss`: anchor-based
       v5, v7 OTA, anchor-free v8 for YOLOv8/v5u/YOLO11, their -seg and -pose, cls), for layers no YAML here lists.
    """
    if model_yaml.get("hyp"):
        return model_yaml["hyp"], f"named by its model YAML {Path(model_yaml.get('yaml_file', '')).name}".rstrip()
    head = head_class(model_yaml)
    layers = (model_yaml.get("backbone"), model_yaml.get("head"))
    alike = [(name, hyp) for name, their_layers, cls, hyp in _project_yamls()
             if hyp and cls is head and their_layers == layers]
    if alike and len({hyp for _, hyp in alike}) == 1:
        more = f" (and {len(alike) - 1} more)" if len(alike) > 1 else ""
        return alike[0][1], f"its YAML names none; its layers are those of models/{alike[0][0]}{more}, which names it"
    loss = criteria.REGISTRY.get(getattr(head, "default_loss", None))
    if loss is None:  # the model classes refuse such a YAML too, saying more
        raise BadModelYaml(f"{model_yaml.get('yaml_file', 'the model YAML')}: ends in no head, so no hyp file fits")
    return loss.hyp_file, (f"its YAML names none and no model YAML here has its layers; the file of the criterion "
                           f"of its {head.__name__} head, {loss.__name__}")


@functools.cache
def _project_yamls():
    """(file name, (backbone, head), head class, hyp file) of every model YAML under models/."""
    out = []
    for path in sorted((ROOT / "models").glob("*.yaml")):
        d = yaml_model_load(path)
        out.append((path.name, (d["backbone"], d["head"]), head_class(d), d.get("hyp")))
    return tuple(out)


def load_hyp(given, default, saved=None):
    """The run's hyp dict: the file `given` (--hyp), completed from the model's `default` file for the keys it does
    not set (listed in one line), or the default file itself; a resumed run's the dict its checkpoint records
    (`saved`, checked as a file is; the files may have changed since), keys added to the project since from
    `default`."""
    base = read_hyp(default)
    if saved is not None:
        known = known_keys()
        for k, v in saved.items():
            if k in known:  # a key the project no longer reads is left out
                check_value(k, v, "the hyperparameters the run's checkpoint records")
        return {**base, **{k: v for k, v in saved.items() if k in known}}
    if not given:
        return base
    hyp = read_hyp(given)
    taken = [k for k in base if k not in hyp]
    if taken:
        LOGGER.info(f"--hyp {given} sets {len(hyp)} keys; taken from {default}: "
                    + ", ".join(f"{k}={base[k]}" for k in taken))
    return {**base, **hyp}


def run_hyp(model, given, label_smoothing=None, saved=None, saved_from=None):
    """A run's hyperparameters: --hyp `given`, completed from the model's default hyp file, or that file itself; a
    resumed run's own (`saved`, as the checkpoint `saved_from` records them). Every key this run's readers need (the
    schedule's, the criterion's) must be there; --label-smoothing wins over the files (a new dict: they stay as
    read)."""
    default, why = default_hyp_file(model.yaml)
    named = f"--hyp {given}; the model's default is " if given else ""
    LOGGER.info(f"hyperparameters: as {saved_from} records them" if saved else
                f"hyperparameters: {named}{default} ({why})")
    hyp = load_hyp(given, default, saved)
    require_keys(hyp, (SCHEDULE, Reader.of(criteria.criterion_class(model, hyp))), given, default)
    return hyp if label_smoothing is None else {**hyp, "label_smoothing": label_smoothing}


def require_keys(hyp, readers, given, default):
    """BadOption naming the first key that one of `readers` (this run's) reads without a default and `hyp` (loaded
    from --hyp `given` and the `default` file) lacks."""
    for reader in readers:
        missing = [k for k in reader.keys if k not in hyp and k not in reader.defaults]
        if missing:
            where = f"--hyp {given} (completed from {default})" if given else f"hyp {default}"
            raise BadOption(f"{where}: {missing[0]!r} is missing; {reader} reads it")
