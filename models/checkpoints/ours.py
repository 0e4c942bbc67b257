"""Our checkpoint format (written by `engine/checkpointer.Checkpointer.checkpoint` through `save_checkpoint`, which
docs/design.md describes): a dict of the loop's position (`LoopState`), `model` and `ema` as `model_to_ckpt` dicts
(class name, YAML dict, state_dict, names; fp32 while the run can resume, the EMA alone in fp16 as `model` once
`strip_optimizer` finished it), the optimizer, scheduler and scaler states, each rank's RNG states (`ranks`), options
and hyp. It holds only tensors, numbers, strings, None and lists/tuples/dicts of them (`to_safe` converts numpy
arrays, Paths and namespaces), which `weights_only` loads as is (models/checkpoints/safe.py reads it).
"""

import reprlib
from pathlib import PurePath
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn

import models.yolo as yolo_module
from models.registry import with_needs
from models.yolo import BaseModel, check_values, parse_model, yaml_model_load
from utils.dist import de_parallel
from utils.errors import BadCheckpoint
from utils.files import atomic_save
from utils.text import escape_controls, has_controls

# the classes a checkpoint's `class` may name: the models models/yolo.py defines (a new task's model class with no line
# here). Only that module's own classes: a subclass made anywhere else (a test's, a --modules file's) is never one, so a
# checkpoint naming a class we do not define is refused as before; BaseModel builds no model from a YAML.
MODEL_CLASSES = {c.__name__: c for c in vars(yolo_module).values() if isinstance(c, type) and issubclass(c, BaseModel)
                 and c.__module__ == yolo_module.__name__ and c is not BaseModel}


def model_to_ckpt(model, half=True):
    """Portable dict of an (unfused) model: class name, YAML dict, CPU state_dict (fp16 unless half=False: a resumable
    checkpoint keeps fp32 so that training continues exactly), names."""
    model = de_parallel(model)
    state = {
        k: (v.detach().half() if half and v.is_floating_point() else v.detach()).cpu()
        for k, v in model.state_dict().items()
    }
    return {"class": type(model).__name__, "yaml": model.yaml, "state_dict": state, "names": dict(model.names)}


def float_state(state):
    """`state` with its floating-point tensors in float32."""
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def check_model_size(cfg, state):
    """Refuse (ValueError) a model YAML that describes more weights than `state` holds, before the model is built:
    a few bytes of YAML (`width_multiple: 100`) can describe gigabytes. Built on the meta device, the layers
    allocate nothing; a model that loads `state` strictly has exactly as many values."""
    if not isinstance(cfg, dict):  # a string would name a YAML file on this machine
        raise ValueError(f"its model YAML is a {type(cfg).__name__}, not a mapping")
    d = yaml_model_load(cfg)
    check_values(d)  # before parse_model makes anything of them
    with torch.device("meta"):
        layers, _ = parse_model(d, d.get("ch", 3))
    need, have = sum(t.numel() for t in layers.state_dict().values()), sum(t.numel() for t in state.values())
    if need > have:
        raise ValueError(f"its model YAML describes {need} weights but the file holds {have}")


def model_from_ckpt(d):
    """Rebuild a float32 model from a `model_to_ckpt` dict."""
    check_model_size(d["yaml"], d["state_dict"])
    model = MODEL_CLASSES[d["class"]](d["yaml"])
    model.load_state_dict(float_state(d["state_dict"]))
    model.names = class_names(d["names"], model.nc)
    return model


_SAFE_LEAVES = (type(None), bool, int, float, str, bytes, torch.Tensor, nn.Parameter, torch.Size,
                torch.dtype, torch.device)


def _check_storable(x, key="checkpoint"):
    """Raise TypeError naming the first value weights_only loading would refuse (a bug: convert it with to_safe)."""
    if isinstance(x, dict):
        for k, v in x.items():
            _check_storable(v, f"{key}[{k!r}]")
    elif type(x) in (list, tuple, set):
        for i, v in enumerate(x):
            _check_storable(v, f"{key}[{i}]")
    elif type(x) not in _SAFE_LEAVES:
        raise TypeError(f"{key} is a {type(x).__module__}.{type(x).__qualname__}, which weights_only loading refuses;"
                        " convert it with models.checkpoints.to_safe")


def save_checkpoint(obj, path):
    """Atomically write a checkpoint that `load_checkpoint` reads with weights_only (temp file + rename), first in it
    the user blocks (--modules) its models need, if any (`models.registry.with_needs`)."""
    obj = with_needs(obj)
    _check_storable(obj)
    atomic_save(obj, path)


def to_safe(x):
    """`x` with what weights_only refuses converted: numpy arrays -> {"__ndarray__": tensor, "dtype": str} (undone by
    `from_safe`), numpy scalars -> Python numbers, Paths -> str, SimpleNamespace -> dict. Generic, so any RNG state
    (numpy legacy or Generator, Python random, torch CPU/CUDA/loader generators, per rank) goes through it."""
    if isinstance(x, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(x)), "dtype": x.dtype.str}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, PurePath):
        return str(x)
    if isinstance(x, SimpleNamespace):
        x = vars(x)
    if isinstance(x, dict):
        return {k: to_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_safe(v) for v in x)
    return x


def from_safe(x):
    """Undo `to_safe` for numpy arrays (everything else it converted stays converted)."""
    if isinstance(x, dict):
        if x.keys() == {"__ndarray__", "dtype"}:
            return x["__ndarray__"].numpy().astype(np.dtype(x["dtype"]))
        return {k: from_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(from_safe(v) for v in x)
    return x


def check_class_ids(predicted, labelled, weights, data, instead):
    """Refuse (BadCheckpoint) weights that predict a class `labelled` ({id: name}, a dataset's) names under another
    id: labels and scores are class ids, so such a class would be trained or scored on another's boxes. `weights`,
    `data`: how the message names them; `instead`: what to do, ending in the data to give. A name `labelled` gives
    several classes (a dataset may) tells no id: it is not judged."""
    given = list(labelled.values())
    ids = {n: k for k, n in labelled.items() if given.count(n) == 1}
    moved = [(k, n) for k, n in dict(predicted).items() if ids.get(n, k) != k]
    if moved:
        k, n = moved[0]
        raise BadCheckpoint(f"{weights} predicts {n!r} as class {k}, {data} labels it {ids[n]} ({len(moved)} classes "
                            f"in another order); {instead} whose names follow the weights': "
                            f"{', '.join(list(dict(predicted).values())[:10])}")


def class_names(names, nc):
    """{class index: name} from a list or dict of names (numbers are names too), or '0', '1', ... when absent."""
    if not names:
        return {i: str(i) for i in range(nc)}
    pairs = enumerate(names) if isinstance(names, (list, tuple)) else dict(names).items()
    out = {int(k): v for k, v in pairs if type(k) is int or (isinstance(k, str) and k.isdecimal())}
    if len(out) != len(names) or not all(isinstance(v, (str, int, float)) and not has_controls(v)
                                         for v in out.values()):
        raise ValueError(f"names must map class indices to names without control characters, got "
                         f"{escape_controls(reprlib.repr(names))}")
    if sorted(out) != list(range(nc)):  # every script looks a predicted class up by its index
        raise ValueError(f"names must name classes 0-{nc - 1} of the model, one each; got {reprlib.repr(names)}")
    return {k: str(v) for k, v in out.items()}


