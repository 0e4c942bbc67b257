"""Checkpoints: the one loader for every `.pt` file the project reads, and our own checkpoint format.

Nothing a file holds may run code. Every file goes through `load_checkpoint`, in two steps:
1. Its pickle is read statically (pickletools, nothing built) and every global it names is checked against an
   allow-list; any other global is refused with one line naming the file and the global before anything runs.
2. It is then unpickled by torch's `weights_only` unpickler, which builds only what the allow-list admits.

The allow-list (`allowed_global`): torch's own tensor/storage rebuilders and value types (`TORCH_GLOBALS`), the
`torch.nn` layer classes of official YOLO trees (`NN_LAYERS`), numpy's array/scalar reconstructors with numeric dtypes
(`NUMPY_GLOBALS`: official YOLOv7 and old YOLOv5 files store `best_fitness` as numpy, and checkpoints of earlier
versions of this project the numpy RNG state), the torchvision transforms Ultralytics classifiers keep
(`TORCHVISION_NAMES`), and any class of the official packages (`OFFICIAL_PREFIXES`), which is replaced by an empty
nn.Module stub that only keeps the state the pickle gives it, so none of their code is needed or run.
`builtins.getattr` is admitted only as a stand-in that accepts a stubbed class and returns a placeholder (YOLOv5 and
early YOLOv8 segmentation files pickle `Detect.forward` that way). Refused: everything else, in particular builtins
(eval, exec, __import__, open), functools, os/posix/nt, sys, subprocess, runpy, importlib, pickle, shutil and
webbrowser.

Our format (saved by the trainer through `save_checkpoint`): a dict with `epoch, best_fitness, model, ema, updates,
optimizer, scheduler, scaler, rng, opt, hyp, metrics, date, version`, where `model` and `ema` are `model_to_ckpt`
dicts (class name, YAML dict, fp16 state_dict, names). It holds only tensors, numbers, strings, None and
lists/tuples/dicts of them (`to_safe` converts numpy arrays, Paths and namespaces), which `weights_only` loads as is.

Official files pickle whole module trees under `models.*` (YOLOv5 and YOLOv7 GitHub: the same paths with different
class bodies), `yolov5.models.*` / `yolov5.utils.*` (the pip yolov5 package) and `ultralytics.*`; our model is built
from the stub tree's `yaml` and loaded with its `state_dict()`.
"""

import functools
import pickle
import pickletools
import re
import types
import warnings
import zipfile
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from pathlib import Path, PurePath
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn

from models.yolo import ClassificationModel, DetectionModel, SegmentationModel
from utils.data.downloads import fetch
from utils.dist import de_parallel
from utils.errors import BadCheckpoint, BadFile
from utils.files import atomic_save
from utils.loggers import LOGGER

MODEL_CLASSES = {c.__name__: c for c in (DetectionModel, SegmentationModel, ClassificationModel)}
OFFICIAL_CLASSES = {**MODEL_CLASSES, "Model": DetectionModel}  # 'Model': YOLOv7 and old YOLOv5 detectors
# GitHub YOLOv5/YOLOv7 (`models.*`, and `utils.*`, which the pip package mirrors as `yolov5.utils.*`), pip yolov5, v8
OFFICIAL_PREFIXES = ("models.", "utils.", "yolov5.models.", "yolov5.utils.", "ultralytics.")
RELEASES = (
    (r"yolov5[nsmlx]6?(-seg|-cls)?\.pt", "https://github.com/ultralytics/yolov5/releases/download/v7.0/"),
    (r"yolov7(x|-tiny|-w6|-e6|-d6|-e6e)?(_training)?\.pt", "https://github.com/WongKinYiu/yolov7/releases/download/v0.1/"),
    (r"yolov8[nsmlx](-seg|-cls)?\.pt", "https://github.com/ultralytics/assets/releases/download/v0.0.0/"),
)

_STORAGE_TYPES = ("Half", "Float", "Double", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")
_DTYPES = ("float16", "float32", "float64", "bfloat16", "bool", "uint8", "int8", "int16", "int32", "int64", "uint16",
           "uint32", "uint64")
TORCH_GLOBALS = frozenset({
    # how torch.save writes tensors and parameters (old and new rebuild paths)
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch._tensor._rebuild_from_type_v2", "torch.Tensor",
    # storage types: in the persistent ids of zip files, and the storages of pre-1.6 files saved on CPU or GPU
    *(f"torch.{t}Storage" for t in _STORAGE_TYPES), *(f"torch.cuda.{t}Storage" for t in _STORAGE_TYPES),
    "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
    # plain values: shapes, devices, dtypes (in module trees, and in v3 rebuilds: the dtypes without a typed storage)
    "torch.Size", "torch.device", *(f"torch.{t}" for t in _DTYPES),
    # nn.Module internals: _parameters/_buffers/_modules/hooks are OrderedDicts, _non_persistent_buffers_set a set;
    # protocol-2 pickles write bytes as _codecs.encode(str, 'latin1')
    "collections.OrderedDict", "builtins.set", "_codecs.encode",
})
NN_LAYERS = {  # every torch.nn class in official YOLOv5/v7/v8 detect/segment/classify trees
    f"torch.nn.modules.{path}": cls for path, cls in {
        "conv.Conv2d": nn.Conv2d, "conv.ConvTranspose2d": nn.ConvTranspose2d, "batchnorm.BatchNorm2d": nn.BatchNorm2d,
        "activation.SiLU": nn.SiLU, "activation.LeakyReLU": nn.LeakyReLU, "activation.ReLU": nn.ReLU,
        "activation.Hardswish": nn.Hardswish, "activation.Sigmoid": nn.Sigmoid, "linear.Identity": nn.Identity,
        "linear.Linear": nn.Linear, "dropout.Dropout": nn.Dropout, "pooling.MaxPool2d": nn.MaxPool2d,
        "pooling.AdaptiveAvgPool2d": nn.AdaptiveAvgPool2d, "upsampling.Upsample": nn.Upsample,
        "container.Sequential": nn.Sequential, "container.ModuleList": nn.ModuleList,
        # later Ultralytics versions keep the criterion on the model (the stubbed v8DetectionLoss holds this)
        "loss.BCEWithLogitsLoss": nn.BCEWithLogitsLoss,
    }.items()
}
# the preprocessing Ultralytics classifiers keep on the model (`model.transforms`): plain torchvision objects,
# resolved only when a file names them (importing torchvision costs about 2 s of every script's start-up)
TORCHVISION_NAMES = {
    **{f"torchvision.transforms.transforms.{n}": n for n in ("Compose", "Resize", "CenterCrop", "ToTensor",
                                                             "Normalize")},
    "torchvision.transforms.functional.InterpolationMode": "InterpolationMode",
}


@functools.cache
def _torchvision_global(path):
    import torchvision.transforms as T  # deferred: see TORCHVISION_NAMES

    return getattr(T, TORCHVISION_NAMES[path])


# torch >= 2.6 can allow named extra globals in its weights_only unpickler; older ones use ours for every file
TORCH_SAFE_GLOBALS = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 6)
_np_core = (np._core if hasattr(np, "_core") else np.core).multiarray
NUMPY_GLOBALS = {  # numpy 1.x pickles name numpy.core, numpy 2.x numpy._core: the same functions
    **{f"numpy.{core}.multiarray.{f}": getattr(_np_core, f) for core in ("core", "_core") for f in ("_reconstruct",
                                                                                                    "scalar")},
    "numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype,
}
# the classes of numeric dtype objects: torch's unpickler checks the type of what it builds (never object dtype)
_NUMPY_DTYPE_TYPES = [type(np.dtype(c)) for c in "?bBhHiIlLqQefd"]


class UnsafeCheckpoint(BadCheckpoint):
    """A file that references a global no model checkpoint needs: refused before anything in it runs."""


def model_to_ckpt(model, half=True):
    """Portable dict of an (unfused) model: class name, YAML dict, CPU state_dict (fp16 unless half=False: a resumable
    checkpoint keeps fp32 so that training continues exactly), names."""
    model = de_parallel(model)
    state = {
        k: (v.detach().half() if half and v.is_floating_point() else v.detach()).cpu()
        for k, v in model.state_dict().items()
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


def _stub_class(path):
    if path not in _STUBS:
        module, _, name = path.rpartition(".")
        _STUBS[path] = type(name, (_Stub,), {"official_path": path, "__module__": module, "__qualname__": name})
    return _STUBS[path]


class _Refused(pickle.UnpicklingError):
    """Raised while unpickling for what the static scan cannot see (the arguments of a call)."""


def _stub_getattr(obj, name):
    """`builtins.getattr` as official pickles use it: protocol 2 writes a function kept as a class attribute, such
    as YOLOv5's `Segment.detect = Detect.forward`, as getattr(Detect, 'forward'). Only a stubbed official class is
    accepted and the result is a placeholder string, so getattr cannot reach any real object (the payload route)."""
    if isinstance(obj, type) and issubclass(obj, _Stub) and isinstance(name, str):
        return f"{obj.official_path}.{name}"
    what = obj if isinstance(obj, type) else type(obj)
    raise _Refused(f"it calls getattr on {what.__module__}.{what.__qualname__}, which no model checkpoint needs")


# globals resolved to something else than what they name: restricted stand-ins
_RESTRICTED = {"builtins.getattr": _stub_getattr}


def allowed_global(path):
    """True if a checkpoint may reference the global `module.name`."""
    return (path in TORCH_GLOBALS or path in NN_LAYERS or path in NUMPY_GLOBALS or path in TORCHVISION_NAMES
            or path in _RESTRICTED or path.startswith(OFFICIAL_PREFIXES))


_STRING_OPS = {"UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"}


def _pickle_globals(f):
    """The globals one pickle in `f` names, read statically (nothing is built). STACK_GLOBAL takes its names from
    the two values pushed last, which is how picklers write them; an unnamed one is reported as such."""
    found, memo, pushed = [], {}, []
    for op, arg, _ in pickletools.genops(f):
        if op.name in ("GLOBAL", "INST"):
            module, name = arg.split(" ", 1)
            # Python 2 names (protocol 2, torch.save's default), mapped as torch's unpickler maps them
            module, name = NAME_MAPPING.get((module, name), (IMPORT_MAPPING.get(module, module), name))
            found.append(f"{module}.{name}")
        elif op.name == "STACK_GLOBAL":
            names = pushed[-2:]
            ok = len(names) == 2 and all(isinstance(n, str) for n in names)
            found.append(".".join(names) if ok else "an unnamed global (STACK_GLOBAL)")
        elif op.name.startswith("EXT"):
            found.append(f"copyreg extension {arg}")
        if op.name in _STRING_OPS:
            pushed.append(arg)
        elif op.name in ("GET", "BINGET", "LONG_BINGET"):
            pushed.append(memo.get(arg))
        elif op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[len(memo) if op.name == "MEMOIZE" else arg] = pushed[-1] if pushed else None
        elif op.stack_after:
            pushed.append(None)
    return found


def checkpoint_globals(path):
    """Every global named by the pickles of a checkpoint: data.pkl of a torch.save zip, else the pickles at the
    start of the file (a pre-1.6 torch file has five, then raw storage bytes; a plain pickle has one)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return [g for n in z.namelist() if n.endswith("data.pkl") for g in _pickle_globals(z.read(n))]
    found = []
    with open(path, "rb") as f:
        for i in range(5):
            try:
                found += _pickle_globals(f)
            except ValueError:  # not (or no longer) pickle data
                if i == 0:
                    raise
                break
            if not f.peek(1):
                break
    return found


def _refuse_unsafe(path, names):
    bad = next((g for g in names if not allowed_global(g)), None)
    if bad is not None:
        raise UnsafeCheckpoint(f"refusing {path}: it references {bad}, which no model checkpoint needs")


def _safe_globals(names):
    """The (object, name) pairs torch's weights_only unpickler needs beyond its defaults for these globals."""
    pairs = [(_stub_class(g), g) for g in names if g.startswith(OFFICIAL_PREFIXES)]
    pairs += [(obj, g) for g, obj in {**NN_LAYERS, **NUMPY_GLOBALS, **_RESTRICTED}.items()]
    pairs += [(_torchvision_global(g), g) for g in names if g in TORCHVISION_NAMES]
    return pairs + [(t, f"numpy.dtypes.{t.__name__}") for t in _NUMPY_DTYPE_TYPES]


class _AllowListUnpickler(pickle.Unpickler):
    """For pre-1.6 (non-zip) torch files, which torch's weights_only unpickler cannot read (they record the classes of
    nn.Modules as persistent ids), and for every file under torch < 2.6: the same allow-list, enforced on every
    global the unpickler resolves."""

    def find_class(self, module, name):
        module, name = NAME_MAPPING.get((module, name), (IMPORT_MAPPING.get(module, module), name))
        path = f"{module}.{name}"
        if not allowed_global(path):
            raise _Refused(f"it references {path}, which no model checkpoint needs")
        if path.startswith(OFFICIAL_PREFIXES):
            return _stub_class(path)
        if path in TORCHVISION_NAMES:
            return _torchvision_global(path)
        extra = {**NN_LAYERS, **NUMPY_GLOBALS, **_RESTRICTED}
        return extra[path] if path in extra else super().find_class(module, name)  # torch's own


def _allow_list_pickle_module():
    """A pickle-module look-alike for torch.load(pickle_module=...)."""
    mod = types.ModuleType("allow_list_pickle")
    mod.Unpickler = _AllowListUnpickler
    mod.load = lambda f, **kwargs: _AllowListUnpickler(f, **kwargs).load()
    return mod


def load_checkpoint(path):
    """Read any checkpoint file (ours or official) without running code from it. Returns what it holds.

    Raises UnsafeCheckpoint for a file naming a global outside the allow-list, BadCheckpoint for one that is not a
    readable checkpoint (truncated, empty, another format).
    """
    path = Path(path)
    try:
        names = list(dict.fromkeys(checkpoint_globals(path)))
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise BadCheckpoint(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    _refuse_unsafe(path, names)
    try:
        if TORCH_SAFE_GLOBALS and zipfile.is_zipfile(path):
            with torch.serialization.safe_globals(_safe_globals(names)):
                return torch.load(path, map_location="cpu", weights_only=True)
        with warnings.catch_warnings():  # stub classes have no source for torch to compare with the saved one
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", pickle_module=_allow_list_pickle_module(), weights_only=False)
    except Exception as e:  # torch raises many types for damaged files; none of them is our bug
        refused = next((c for c in _exception_chain(e) if isinstance(c, _Refused)), None)
        if refused is not None:
            raise UnsafeCheckpoint(f"refusing {path}: {refused}") from None
        raise BadCheckpoint(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None


def _exception_chain(e):
    """`e` and the exceptions it was raised from or during (torch re-raises unpickling errors with a new type)."""
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


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
    """Atomically write a checkpoint that `load_checkpoint` reads with weights_only (temp file + rename)."""
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


def official_url(name):
    """Release asset URL of an official weights file name, or None if the name is not an official one."""
    for pattern, base in RELEASES:
        if re.fullmatch(pattern, name):
            return base + name
    return None


def attempt_download(name, dest_dir="."):
    """Download official weights `name` (e.g. 'yolov5s.pt') from its GitHub release into dest_dir; return the path.

    Published by rename (utils.files.publish): ranks or nodes downloading it at once each fetch a private copy and
    the file appears whole. Call it on one rank per machine first (torch_distributed_zero_first) to fetch it once.
    """
    url = official_url(name)
    if url is None:
        raise BadFile(f"weights '{name}' not found and not an official release name")
    dst = Path(dest_dir) / name
    LOGGER.info(f"downloading {url} to {dst}")
    fetch(url, dst)
    return dst


def _resolve_weights(weights):
    path = Path(weights)
    if path.is_file():
        return path
    if path.name == str(weights) and official_url(path.name):
        return attempt_download(path.name)
    raise BadFile(f"weights file not found: {weights}")


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


def _from_official(tree, path):
    """Our model equal to an unpickled official module tree (stubbed classes)."""
    kind = type(tree).__name__
    if not isinstance(tree, _Stub) or kind not in OFFICIAL_CLASSES:
        raise BadCheckpoint(f"{path}: unsupported official model class '{getattr(tree, 'official_path', kind)}'")
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


def _model_entry(ckpt, path):
    """The model a checkpoint holds: its `ema` if present, else `model`."""
    entry = None
    if isinstance(ckpt, dict):
        entry = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt.get("model")
    if entry is None:
        raise BadCheckpoint(f"{path}: not a model checkpoint (expected a dict with a 'model' or 'ema' entry)")
    if isinstance(entry, dict):
        if entry.get("class") not in MODEL_CLASSES or not isinstance(entry.get("state_dict"), dict):
            raise BadCheckpoint(f"{path}: its model entry is not one this project wrote")
        return model_from_ckpt(entry)
    return _from_official(entry, path)


def attempt_load(weights, device="cpu", fuse=True):
    """Load our checkpoint (its `ema` if present, else `model`) or an official YOLOv5/v7/v8 `.pt` file.

    Returns the model in eval mode, float32, on `device`, fused if asked. A missing bare official name (e.g.
    'yolov8n.pt') is downloaded first; any other missing path raises FileNotFoundError.
    """
    path = _resolve_weights(weights)
    model = _model_entry(load_checkpoint(path), path).float()
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
