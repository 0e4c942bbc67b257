"""Checkpoints: our own format, and official YOLOv5 / YOLOv7 / YOLOv8 `.pt` files loaded without their code.

Our format (saved by the trainer with torch.save): a dict with `epoch, best_fitness, model, ema, updates, optimizer,
scaler, opt, hyp, date, version`, where `model` and `ema` are `model_to_ckpt` dicts (class name, YAML dict, fp16
state_dict, names), so loading never depends on pickled classes.

Official files pickle whole module trees under `models.*` (v5 and v7 share those paths with different class bodies)
and `ultralytics.*`. They are unpickled with every class from those packages replaced by an empty nn.Module stub,
which is enough to read the tree's `yaml`, `names` and `state_dict()`; our model is then built from that YAML.
"""

import pickle
import re
import types
from pathlib import Path

import torch
import torch.nn as nn

from models.yolo import ClassificationModel, DetectionModel, SegmentationModel
from utils.dist import de_parallel
from utils.loggers import LOGGER

MODEL_CLASSES = {c.__name__: c for c in (DetectionModel, SegmentationModel, ClassificationModel)}
OFFICIAL_CLASSES = {**MODEL_CLASSES, "Model": DetectionModel}  # 'Model': YOLOv7 and old YOLOv5 detectors
OFFICIAL_PACKAGES = ("models", "utils", "ultralytics")
RELEASES = (
    (r"yolov5[nsmlx]6?(-seg|-cls)?\.pt", "https://github.com/ultralytics/yolov5/releases/download/v7.0/"),
    (r"yolov7(x|-tiny|-w6|-e6|-d6|-e6e)?(_training)?\.pt", "https://github.com/WongKinYiu/yolov7/releases/download/v0.1/"),
    (r"yolov8[nsmlx](-seg|-cls)?\.pt", "https://github.com/ultralytics/assets/releases/download/v0.0.0/"),
)


def model_to_ckpt(model):
    """Portable dict of an (unfused) model: class name, YAML dict, fp16 CPU state_dict, names."""
    model = de_parallel(model)
    state = {
        k: (v.detach().half() if v.is_floating_point() else v.detach()).cpu() for k, v in model.state_dict().items()
    }
    return {"class": type(model).__name__, "yaml": model.yaml, "state_dict": state, "names": dict(model.names)}


def _float_state(state):
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def model_from_ckpt(d):
    """Rebuild a float32 model from a `model_to_ckpt` dict."""
    model = MODEL_CLASSES[d["class"]](d["yaml"])
    model.load_state_dict(_float_state(d["state_dict"]))
    model.names = dict(d["names"])
    return model


class _Stub(nn.Module):
    """Stand-in for a class of an official package: it only keeps the state the pickle gives it."""


_STUBS = {}


def _stub_class(module, name):
    key = f"{module}.{name}"
    if key not in _STUBS:
        _STUBS[key] = type(name, (_Stub,), {"official_path": key})
    return _STUBS[key]


class _OfficialUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.split(".")[0] in OFFICIAL_PACKAGES:
            return _stub_class(module, name)
        return super().find_class(module, name)


def _official_pickle_module():
    """A pickle-module look-alike for torch.load(pickle_module=...) that stubs the official packages."""
    mod = types.ModuleType("official_pickle")
    mod.Unpickler = _OfficialUnpickler
    mod.load = lambda f, **kwargs: _OfficialUnpickler(f, **kwargs).load()
    return mod


def official_url(name):
    """Release asset URL of an official weights file name, or None if the name is not an official one."""
    for pattern, base in RELEASES:
        if re.fullmatch(pattern, name):
            return base + name
    return None


def attempt_download(name, dest_dir="."):
    """Download official weights `name` (e.g. 'yolov5s.pt') from its GitHub release into dest_dir; return the path.

    Under DDP call it on one rank first (torch_distributed_zero_first) so ranks do not download concurrently.
    """
    url = official_url(name)
    if url is None:
        raise FileNotFoundError(f"weights '{name}' not found and not an official release name")
    dst = Path(dest_dir) / name
    LOGGER.info(f"downloading {url} to {dst}")
    torch.hub.download_url_to_file(url, str(dst), progress=False)
    return dst


def _resolve_weights(weights):
    path = Path(weights)
    if path.is_file():
        return path
    if path.name == str(weights) and official_url(path.name):
        return attempt_download(path.name)
    raise FileNotFoundError(f"weights file not found: {weights}")


def _match_classifier(state):
    """YAML-less official YOLOv5 classifiers: the yolov5?-cls.yaml whose keys and shapes equal the state_dict's."""
    nc = state["model.9.linear.weight"].shape[0]
    shapes = {k: v.shape for k, v in state.items()}
    for size in "nsmlx":
        model = ClassificationModel(f"yolov5{size}-cls.yaml", nc=nc)
        if {k: v.shape for k, v in model.state_dict().items()} == shapes:
            return model
    raise ValueError("official classifier without a YAML matches none of models/yolov5[nsmlx]-cls.yaml")


def _copy_batchnorm_settings(src, dst):
    """eps/momentum as the official tree had them (its YAML cannot say that YOLOv8-cls keeps the torch defaults)."""
    src_bn = {n: m for n, m in src.named_modules() if isinstance(m, nn.BatchNorm2d)}
    for n, m in dst.named_modules():
        if n in src_bn:
            m.eps, m.momentum = src_bn[n].eps, src_bn[n].momentum


def _names(names, nc):
    if isinstance(names, (list, tuple)):
        return dict(enumerate(names))
    return dict(names) if names else {i: str(i) for i in range(nc)}


def _from_official(tree):
    """Our model equal to an unpickled official module tree (stubbed classes)."""
    kind = type(tree).__name__
    if kind not in OFFICIAL_CLASSES:
        raise ValueError(f"unsupported official model class '{getattr(tree, 'official_path', kind)}'")
    state = _float_state(tree.state_dict())
    cfg = tree.__dict__.get("yaml")
    model = OFFICIAL_CLASSES[kind](cfg) if cfg else _match_classifier(state)
    own = model.state_dict()
    # YOLOv5 <= v6.0 and YOLOv7's deploy Detect also stored `anchor_grid`; ours derives it from anchors * stride
    state = {k: v for k, v in state.items() if k in own or not k.endswith(".anchor_grid")}
    model.load_state_dict(state)
    _copy_batchnorm_settings(tree, model)
    model.names = _names(tree.__dict__.get("names"), model.nc)
    return model


def attempt_load(weights, device="cpu", fuse=True):
    """Load our checkpoint (its `ema` if present, else `model`) or an official YOLOv5/v7/v8 `.pt` file.

    Returns the model in eval mode, float32, on `device`, fused if asked. A missing bare official name (e.g.
    'yolov8n.pt') is downloaded first; any other missing path raises FileNotFoundError.
    """
    path = _resolve_weights(weights)
    ckpt = torch.load(path, map_location="cpu", pickle_module=_official_pickle_module(), weights_only=False)
    entry = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt["model"]
    model = model_from_ckpt(entry) if isinstance(entry, dict) else _from_official(entry)
    model = model.float()
    if fuse:
        model.fuse()
    return model.eval().to(device)


def transfer_weights(model, src, name, exclude=("anchors", "anchor_grid")):
    """Copy every tensor of model `src` whose key and shape match `model` (the v5 fine-tuning rule); return the count.

    Anchors are left to the model YAML, and heads with another class count simply do not match.
    """
    dst = model.state_dict()
    keep = {
        k: v for k, v in src.float().state_dict().items()
        if k in dst and v.shape == dst[k].shape and not any(e in k for e in exclude)
    }
    model.load_state_dict(keep, strict=False)
    LOGGER.info(f"Transferred {len(keep)}/{len(dst)} items from {name}")
    return len(keep)


def load_pretrained(model, weights, exclude=("anchors", "anchor_grid")):
    """Seed `model` from a checkpoint file (ours or official) by `transfer_weights`."""
    return transfer_weights(model, attempt_load(weights, device="cpu", fuse=False), weights, exclude)
