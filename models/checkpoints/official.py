"""Official checkpoints as our models. Official files pickle whole module trees under `models.*` (YOLOv5 and YOLOv7
GitHub: the same paths with different class bodies), `yolov5.models.*` / `yolov5.utils.*` (the pip yolov5 package)
and `ultralytics.*`; the safe loader (models/checkpoints/safe.py) unpickles them as stand-ins (`Stub`) that only keep
their state. Our model is built from the stand-in tree's `yaml` and loaded with its state, read from the tree's dicts,
never through nn.Module methods that would call hooks the file stored. Anything malformed in a file's model is a
BadCheckpoint.
"""

import torch
import torch.nn as nn

from models.checkpoints.ours import MODEL_CLASSES, check_model_size, class_names, float_state
from models.checkpoints.safe import Stub
from models.yolo import ClassificationModel, DetectionModel
from utils.errors import BadCheckpoint

OFFICIAL_CLASSES = {**MODEL_CLASSES, "Model": DetectionModel}  # 'Model': YOLOv7 and old YOLOv5 detectors


def _match_classifier(state):
    """YAML-less official YOLOv5 classifiers: the yolov5?-cls.yaml whose keys and shapes equal the state_dict's."""
    nc = state["model.9.linear.weight"].shape[0]
    shapes = {k: v.shape for k, v in state.items()}
    for size in "nsmlx":
        model = ClassificationModel(f"yolov5{size}-cls.yaml", nc=nc)
        if {k: v.shape for k, v in model.state_dict().items()} == shapes:
            return model
    raise ValueError("official classifier without a YAML matches none of models/yolov5[nsmlx]-cls.yaml")


def _module_tree(tree):
    """(name, module) of an unpickled tree and its submodules, read from the `_modules` dicts (nn.Module's own
    walkers would run the hooks a file can store)."""
    todo, found = [("", tree)], []
    while todo:
        name, m = todo.pop()
        if not isinstance(m, nn.Module) or not isinstance(vars(m).get("_modules", {}), dict):
            raise ValueError(f"'{name}' is a {type(m).__name__}, not a module")
        found.append((name, m))
        subs = vars(m).get("_modules", {}).items()
        todo += [(f"{name}.{k}" if name else str(k), v) for k, v in subs if v is not None]
    return found


def _module_state(tree):
    """What `tree.state_dict()` gives, float32, taken from each module's `_parameters` and `_buffers` dicts."""
    state = {}
    for name, m in _module_tree(tree):
        d = vars(m)
        transient = d.get("_non_persistent_buffers_set", set())
        tensors = [*d.get("_parameters", {}).items(), *((k, v) for k, v in d.get("_buffers", {}).items()
                                                        if k not in transient)]
        for k, v in tensors:
            if v is not None:
                if not isinstance(v, torch.Tensor):
                    raise ValueError(f"'{name}.{k}' is a {type(v).__name__}, not a tensor")
                state[f"{name}.{k}" if name else k] = v
    return float_state(state)


def _copy_batchnorm_settings(src, dst):
    """eps/momentum as the official tree had them (its YAML cannot say that YOLOv8-cls keeps the torch defaults)."""
    src_bn = {n: vars(m) for n, m in _module_tree(src) if isinstance(m, nn.BatchNorm2d)}
    for n, m in dst.named_modules():
        if n in src_bn:
            eps, momentum = src_bn[n].get("eps"), src_bn[n].get("momentum")
            if type(eps) is not float or not (momentum is None or type(momentum) is float):
                raise ValueError(f"BatchNorm '{n}' has eps {eps!r:.40} and momentum {momentum!r:.40}")
            m.eps, m.momentum = eps, momentum


def from_official(tree, path):
    """Our model equal to an unpickled official module tree (stubbed classes)."""
    kind = type(tree).__name__
    if not isinstance(tree, Stub) or kind not in OFFICIAL_CLASSES:
        raise BadCheckpoint(f"{path}: unsupported official model class '{getattr(tree, 'official_path', kind)}'")
    state = _module_state(tree)
    cfg = vars(tree).get("yaml")
    if cfg:
        check_model_size(cfg, state)
    model = OFFICIAL_CLASSES[kind](cfg) if cfg else _match_classifier(state)
    own = model.state_dict()
    # YOLOv5 <= v6.0 and YOLOv7's deploy Detect also stored `anchor_grid`; ours derives it from anchors * stride
    state = {k: v for k, v in state.items() if k in own or not k.endswith(".anchor_grid")}
    model.load_state_dict(state)
    _copy_batchnorm_settings(tree, model)
    model.names = class_names(vars(tree).get("names"), model.nc)
    return model


