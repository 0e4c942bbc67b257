"""Checkpoints: the one loader for every `.pt` file the project reads, and our own checkpoint format.

Nothing a file holds may run code, and nothing it claims is allocated before it is checked. `load_checkpoint` reads
the file's bytes once and, before torch sees them (models/untrusted.py, which decides on the bytes torch reads):
1. Decides what the file is as torch does (a zip archive exactly when it starts with the zip magic, read with
   torch's own archive reader; else a pre-1.6 torch file) and refuses TorchScript archives, duplicate, overlapping
   or compressed records, and pre-1.6 files that pickle whole modules (torch's restricted loader cannot read those;
   the message says how to re-save them).
2. Reads the exact pickle torch will unpickle statically (nothing built): every global it names must be on the
   allow-list below, and every storage it declares must fit in the bytes the file holds for it.
3. Hands the same bytes to torch.load(weights_only=True), torch's restricted unpickler, with the stand-ins below
   admitted through torch.serialization.safe_globals. There is no other unpickler, and torch.load is
   never asked to unpickle without its restrictions.
4. Refuses a result whose tensors describe far more memory than the file (views of one small storage, which a
   conversion would materialise) or that nests deeper than any checkpoint.

The allow-list (`allowed_global`): torch's own tensor/storage rebuilders and value types (`TORCH_GLOBALS`), the
`torch.nn` layer classes of official YOLO trees (`NN_LAYERS`), numpy's array/scalar reconstructors with numeric dtypes
(`NUMPY_GLOBALS`: official YOLOv7 and old YOLOv5 files store `best_fitness` as numpy, and checkpoints of earlier
versions of this project the numpy RNG state), the torchvision transforms Ultralytics classifiers keep
(`TORCHVISION_NAMES`), pathlib paths by exact name (`PATH_TYPES`, rebuilt as pure paths: official `opt` dicts hold
them), and any class of the official packages (`OFFICIAL_PREFIXES`), which is replaced by an empty nn.Module stub
that only keeps the state the pickle gives it, so none of their code is needed or run.
`builtins.getattr` is admitted only as a stand-in that accepts a stubbed class and returns a placeholder (YOLOv5 and
early YOLOv8 segmentation files pickle `Detect.forward` that way). Refused: everything else, in particular builtins
(eval, exec, __import__, open), functools, os/posix/nt, sys, subprocess, runpy, importlib, pickle, shutil and
webbrowser. An unpickled official tree is read from its dicts (`_module_state`), never through nn.Module methods that
would call hooks the file stored.

Our format (written by `engine/checkpointer.Checkpointer.checkpoint` through `save_checkpoint`, which docs/design.md
describes): a dict of the loop's position (`LoopState`), `model` and `ema` as `model_to_ckpt` dicts (class name, YAML
dict, state_dict, names; fp32 while the run can resume, the EMA alone in fp16 as `model` once `strip_optimizer`
finished it), the optimizer, scheduler and scaler states, each rank's RNG states (`ranks`), options and hyp. It holds
only tensors, numbers, strings, None and lists/tuples/dicts of them (`to_safe` converts numpy arrays, Paths and
namespaces), which `weights_only` loads as is.

Official files pickle whole module trees under `models.*` (YOLOv5 and YOLOv7 GitHub: the same paths with different
class bodies), `yolov5.models.*` / `yolov5.utils.*` (the pip yolov5 package) and `ultralytics.*`; our model is built
from the stub tree's `yaml` and loaded with its state. Anything malformed in a file's model is a BadCheckpoint.
"""

import contextlib
import functools
import io
import pickle
import re
import reprlib
import warnings
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn

from models.registry import check_user_blocks, with_needs
from models.untrusted import ZIP_MAGIC, Archive, UnsafeCheckpoint, check_checkpoint, shown
from models.yolo import (
    ClassificationModel,
    DetectionModel,
    PoseModel,
    SegmentationModel,
    check_values,
    parse_model,
    yaml_model_load,
)
from utils.budget import MAX_NESTING
from utils.data.downloads import fetch
from utils.dist import de_parallel
from utils.errors import BadCheckpoint, BadFile, UserError
from utils.files import atomic_save
from utils.loggers import LOGGER
from utils.text import escape_controls, has_controls

MODEL_CLASSES = {c.__name__: c for c in (DetectionModel, SegmentationModel, PoseModel, ClassificationModel)}
OFFICIAL_CLASSES = {**MODEL_CLASSES, "Model": DetectionModel}  # 'Model': YOLOv7 and old YOLOv5 detectors
# GitHub YOLOv5/YOLOv7 (`models.*`, and `utils.*`, which the pip package mirrors as `yolov5.utils.*`), pip yolov5, v8
OFFICIAL_PREFIXES = ("models.", "utils.", "yolov5.models.", "yolov5.utils.", "ultralytics.")
RELEASES = (
    (r"yolov5[nsmlx]6?(-seg|-cls)?\.pt", "https://github.com/ultralytics/yolov5/releases/download/v7.0/"),
    (r"yolov7(x|-tiny|-w6|-e6|-d6|-e6e)?(_training)?\.pt", "https://github.com/WongKinYiu/yolov7/releases/download/v0.1/"),
    (r"yolov8[nsmlx](-seg|-cls|-pose)?\.pt", "https://github.com/ultralytics/assets/releases/download/v0.0.0/"),
    (r"yolov5[nsmlx]6?u\.pt", "https://github.com/ultralytics/assets/releases/download/v8.2.0/"),  # YOLOv5u
    (r"yolo11[nsmlx](-seg|-cls|-pose)?\.pt", "https://github.com/ultralytics/assets/releases/download/v8.3.0/"),
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
NN_LAYERS = {  # every torch.nn class in official YOLOv5/v7/v8/11 detect/segment/classify trees
    f"torch.nn.modules.{path}": cls for path, cls in {
        "conv.Conv2d": nn.Conv2d, "conv.ConvTranspose2d": nn.ConvTranspose2d, "batchnorm.BatchNorm2d": nn.BatchNorm2d,
        "activation.SiLU": nn.SiLU, "activation.LeakyReLU": nn.LeakyReLU, "activation.ReLU": nn.ReLU,
        "activation.Hardswish": nn.Hardswish, "activation.Sigmoid": nn.Sigmoid, "linear.Identity": nn.Identity,
        "linear.Linear": nn.Linear, "dropout.Dropout": nn.Dropout, "pooling.MaxPool2d": nn.MaxPool2d,
        "pooling.AdaptiveAvgPool2d": nn.AdaptiveAvgPool2d, "upsampling.Upsample": nn.Upsample,
        "container.Sequential": nn.Sequential, "container.ModuleList": nn.ModuleList,
        # later Ultralytics versions keep the criterion on the model (the stubbed v8DetectionLoss holds this)
        "loss.BCEWithLogitsLoss": nn.BCEWithLogitsLoss,
        # yolov3-tiny's pad; the transformer of yolov5s-transformer (C3TR)
        "padding.ZeroPad2d": nn.ZeroPad2d, "activation.MultiheadAttention": nn.MultiheadAttention,
        "linear.NonDynamicallyQuantizableLinear": nn.modules.linear.NonDynamicallyQuantizableLinear,
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


# torch >= 2.6 admits named stand-ins in its weights_only unpickler (safe_globals with (object, name) pairs); older
# versions load our checkpoints, which need none, and refuse official module trees with a line saying why
TORCH_SAFE_GLOBALS = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 6)
_np_core = (np._core if hasattr(np, "_core") else np.core).multiarray
NUMPY_GLOBALS = {  # numpy 1.x pickles name numpy.core, numpy 2.x numpy._core: the same functions
    **{f"numpy.{core}.multiarray.{f}": getattr(_np_core, f) for core in ("core", "_core") for f in ("_reconstruct",
                                                                                                    "scalar")},
    "numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype,
}
# the classes of numeric dtype objects: torch's unpickler checks the type of what it builds (never object dtype)
_NUMPY_DTYPE_TYPES = [type(np.dtype(c)) for c in "?bBhHiIlLqQefd"]


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


def _check_model_size(cfg, state):
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
    _check_model_size(d["yaml"], d["state_dict"])
    model = MODEL_CLASSES[d["class"]](d["yaml"])
    model.load_state_dict(_float_state(d["state_dict"]))
    model.names = _names(d["names"], model.nc)
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
# paths are plain values (official `opt` dicts hold them), rebuilt as pure paths: a WindowsPath cannot be built on
# Linux nor a PosixPath on Windows, and neither touches the file system; Python >= 3.13 names them pathlib._local.*
PATH_TYPES = {f"pathlib{mod}.{name}": cls for mod in ("", "._local")
              for name, cls in (("PosixPath", PurePosixPath), ("WindowsPath", PureWindowsPath),
                                ("PurePosixPath", PurePosixPath), ("PureWindowsPath", PureWindowsPath))}


def allowed_global(path):
    """True if a checkpoint may reference the global `module.name`."""
    return (path in TORCH_GLOBALS or path in NN_LAYERS or path in NUMPY_GLOBALS or path in TORCHVISION_NAMES
            or path in _RESTRICTED or path in PATH_TYPES or path.startswith(OFFICIAL_PREFIXES))


def _refuse_unsafe(path, names):
    bad = next((g for g in names if not allowed_global(g)), None)
    if bad is not None:
        raise UnsafeCheckpoint(f"refusing {path}: it references {bad}, which no model checkpoint needs")


_REBUILDERS = {f"torch._utils._rebuild_{f}" for f in ("tensor", "tensor_v2", "tensor_v3", "parameter",
                                                       "parameter_with_state")}
_NUMPY_RECONSTRUCT = {f"numpy.{core}.multiarray._reconstruct" for core in ("core", "_core")}
# what a checkpoint's pickle may call (REDUCE), each with the arguments it may take: a rebuilder makes a view of a
# storage the file holds, the others plain values. Classes (torch.nn layers, official stand-ins, transforms) are made
# without calling them (NEWOBJ with no arguments, then BUILD): `Conv2d(512, 1024, 32)` called would allocate 2 GiB
# of weights, `torch.Tensor(10**9)` 4 GiB, numpy's _reconstruct any shape
CALLABLE = {
    **dict.fromkeys(_REBUILDERS, lambda args: True),
    "torch._tensor._rebuild_from_type_v2": lambda args: isinstance(args, tuple) and bool(args)
    and args[0] in _REBUILDERS,
    **dict.fromkeys(_NUMPY_RECONSTRUCT, lambda args: isinstance(args, tuple) and len(args) > 1 and args[1] == (0,)),
    **dict.fromkeys(("collections.OrderedDict", "builtins.set", "_codecs.encode", "torch.Size", "torch.device",
                     "numpy.dtype", "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
                     "torchvision.transforms.functional.InterpolationMode", *PATH_TYPES), lambda args: True),
    # what _stub_getattr admits: an attribute of an official class (a stand-in)
    "builtins.getattr": lambda args: isinstance(args, tuple) and len(args) == 2 and isinstance(args[0], str)
    and args[0].startswith(OFFICIAL_PREFIXES) and isinstance(args[1], str),
}


def _refuse_calls(path, calls):
    """Refuse what a pickle would call beyond CALLABLE and its arguments, or a class made with arguments."""
    for op, func, args in calls:
        if op == "NEWOBJ" and args != ():
            raise UnsafeCheckpoint(f"refusing {path}: it makes {func if isinstance(func, str) else 'an object'} with "
                                   f"arguments {reprlib.repr(shown(args))}, which no checkpoint does")
        if op == "REDUCE" and not (isinstance(func, str) and func in CALLABLE and CALLABLE[func](args)):
            if func == "builtins.getattr" and isinstance(args, tuple) and args:
                raise UnsafeCheckpoint(f"refusing {path}: it calls getattr on {args[0]}, which no model checkpoint "
                                       "needs")
            what, args = func if isinstance(func, str) else "a value it built", reprlib.repr(shown(args))
            raise UnsafeCheckpoint(f"refusing {path}: it calls {what} with arguments {args}, which no checkpoint does "
                                   "(modules are rebuilt without calling them)")


def _safe_globals(names):
    """The (object, name) pairs torch's weights_only unpickler needs beyond its defaults for these globals."""
    pairs = [(_stub_class(g), g) for g in names if g.startswith(OFFICIAL_PREFIXES)]
    pairs += [(obj, g) for g, obj in {**NN_LAYERS, **NUMPY_GLOBALS, **_RESTRICTED, **PATH_TYPES}.items()]
    pairs += [(_torchvision_global(g), g) for g in names if g in TORCHVISION_NAMES]
    return pairs + [(t, f"numpy.dtypes.{t.__name__}") for t in _NUMPY_DTYPE_TYPES]


def load_checkpoint(path):
    """Read any checkpoint file (ours or official) without running code from it. Returns what it holds.

    Raises UnsafeCheckpoint for a file that names a global outside the allow-list or claims what it does not hold,
    BadCheckpoint for one that is not a readable checkpoint (truncated, empty, another format).
    """
    path = Path(path)
    try:
        data = path.read_bytes()  # once: the checks and torch read the same bytes
    except OSError as e:
        raise BadCheckpoint(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    names = list(dict.fromkeys(check_checkpoint(data, path, functools.partial(_refuse_unsafe, path),
                                                functools.partial(_refuse_calls, path))))
    if data[:4] == ZIP_MAGIC:  # blocks of the user's own that the model needs: refused before anything is built
        check_user_blocks(Archive(data, path).read("data.pkl"), path)
    if not TORCH_SAFE_GLOBALS and any(g not in TORCH_GLOBALS for g in names):
        raise BadCheckpoint(f"{path}: official module trees load safely only with torch >= 2.6 (this is "
                            f"{torch.__version__}): upgrade torch")
    admitted = contextlib.nullcontext()
    if TORCH_SAFE_GLOBALS:
        admitted = torch.serialization.safe_globals(_safe_globals(names))
    try:
        with admitted, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # protocol notes of torch's unpickler; the file is refused or loaded
            ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for damaged files; none of them is our bug
        refused = next((c for c in _exception_chain(e) if isinstance(c, _Refused)), None)
        if refused is not None:
            raise UnsafeCheckpoint(f"refusing {path}: {refused}") from None
        raise BadCheckpoint(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    _check_contents(ckpt, len(data), path)
    return ckpt


def _exception_chain(e):
    """`e` and the exceptions it was raised from or during (torch re-raises unpickling errors with a new type)."""
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__




def _children(x):
    if isinstance(x, dict):
        return [*x.keys(), *x.values()]
    if isinstance(x, (list, tuple, set, frozenset)):
        return list(x)
    if isinstance(x, (str, bytes, int, float, type, torch.Tensor, np.ndarray)) or not hasattr(x, "__dict__"):
        return []
    return list(vars(x).values())


def _check_contents(ckpt, size, path):
    """Refuse a loaded file that would cost far more than its bytes to use: tensors describing more than 4x its size
    + 64 MiB (a stride-0 view of a few bytes can describe gigabytes, which any conversion allocates; official YOLOv5
    files keep a few expanded anchor grids), nesting deeper than MAX_NESTING, a structure that contains itself, or
    shared references that unfold to far more than the file holds (every walk of it, a repr, to_safe, would)."""
    limit, tensor_bytes, unfolded = 4 * size + (64 << 20), 0, {}
    max_values = size + 1_000_000  # each value the pickle builds costs it at least a byte, unless shared
    todo, on_path = [(ckpt, 0, False)], set()
    while todo:  # depth first; a node's unfolded size (1 + its children's) is known when it is left
        x, depth, leaving = todo.pop()
        if leaving:
            on_path.discard(id(x))
            unfolded[id(x)] = 1 + sum(unfolded[id(c)] for c in _children(x))
            if unfolded[id(x)] > max_values:
                raise UnsafeCheckpoint(f"refusing {path}: its shared references unfold to more than {max_values} "
                                       "values")
            continue
        if id(x) in on_path:
            raise UnsafeCheckpoint(f"refusing {path}: it contains itself, which no checkpoint does")
        if id(x) in unfolded:
            continue
        if depth > MAX_NESTING:
            raise UnsafeCheckpoint(f"refusing {path}: it nests deeper than {MAX_NESTING} levels, which no checkpoint "
                                   "does")
        if isinstance(x, (torch.Tensor, np.ndarray)):
            tensor_bytes += x.numel() * x.element_size() if isinstance(x, torch.Tensor) else x.nbytes
            if tensor_bytes > limit:
                raise UnsafeCheckpoint(f"refusing {path}: its tensors describe more than {limit} bytes, far more "
                                       f"than its {size} bytes hold")
        on_path.add(id(x))
        todo.append((x, depth, True))
        todo.extend((c, depth + 1, False) for c in _children(x))


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
    return _float_state(state)


def _copy_batchnorm_settings(src, dst):
    """eps/momentum as the official tree had them (its YAML cannot say that YOLOv8-cls keeps the torch defaults)."""
    src_bn = {n: vars(m) for n, m in _module_tree(src) if isinstance(m, nn.BatchNorm2d)}
    for n, m in dst.named_modules():
        if n in src_bn:
            eps, momentum = src_bn[n].get("eps"), src_bn[n].get("momentum")
            if type(eps) is not float or not (momentum is None or type(momentum) is float):
                raise ValueError(f"BatchNorm '{n}' has eps {eps!r:.40} and momentum {momentum!r:.40}")
            m.eps, m.momentum = eps, momentum


def _names(names, nc):
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


def _from_official(tree, path):
    """Our model equal to an unpickled official module tree (stubbed classes)."""
    kind = type(tree).__name__
    if not isinstance(tree, _Stub) or kind not in OFFICIAL_CLASSES:
        raise BadCheckpoint(f"{path}: unsupported official model class '{getattr(tree, 'official_path', kind)}'")
    state = _module_state(tree)
    cfg = vars(tree).get("yaml")
    if cfg:
        _check_model_size(cfg, state)
    model = OFFICIAL_CLASSES[kind](cfg) if cfg else _match_classifier(state)
    own = model.state_dict()
    # YOLOv5 <= v6.0 and YOLOv7's deploy Detect also stored `anchor_grid`; ours derives it from anchors * stride
    state = {k: v for k, v in state.items() if k in own or not k.endswith(".anchor_grid")}
    model.load_state_dict(state)
    _copy_batchnorm_settings(tree, model)
    model.names = _names(vars(tree).get("names"), model.nc)
    return model


def _model_entry(ckpt, path):
    """The model a checkpoint holds: its `ema` if present, else `model`. Whatever in it does not build a model (a
    missing key, a wrong type, a YAML the parser refuses, weights of other shapes) is a BadCheckpoint."""
    entry = None
    if isinstance(ckpt, dict):
        entry = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt.get("model")
    if entry is None:
        raise BadCheckpoint(f"{path}: not a model checkpoint (expected a dict with a 'model' or 'ema' entry)")
    if isinstance(entry, dict) and (entry.get("class") not in MODEL_CLASSES
                                    or not isinstance(entry.get("state_dict"), dict)):
        raise BadCheckpoint(f"{path}: its model entry is not one this project wrote")
    try:
        return model_from_ckpt(entry) if isinstance(entry, dict) else _from_official(entry, path)
    except BadCheckpoint:
        raise
    except (UserError, KeyError, AttributeError, TypeError, ValueError, IndexError, RuntimeError) as e:
        raise BadCheckpoint(f"{path}: its model is malformed ({type(e).__name__}: {_one_line(e)})") from e


def _one_line(e):
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."


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

    Anchors are left to the model YAML. Where the classes differ (another count or order), the head's class slices
    (its `class_rows`) are carried over for the classes both models name alike (`_shared_classes`), and the other
    classes start new.
    """
    dst, src_sd = model.state_dict(), src.float().state_dict()
    keep = {
        k: v for k, v in src_sd.items() if k in dst and v.shape == dst[k].shape and not any(e in k for e in exclude)
    }
    whole = len(keep)
    shared = _shared_classes(model, src, dst, src_sd, keep)
    model.load_state_dict(keep, strict=False)
    said = f"; in the head, the classes named alike: {', '.join(shared)}" if shared else ""
    LOGGER.info(f"Transferred {whole}/{len(dst)} items from {name}{said}")
    return len(keep)


def _shared_classes(model, src, dst, src_sd, keep):
    """Put in `keep` the head tensors of `model` with src's slices copied in for the classes both name alike (and
    the slices that mean the same for any class count, e.g. anchor boxes), the other classes left new, where the
    classes differ (another count, or another order) but every other dimension fits; returns those names. Nothing
    changes when no name is shared. dst, src_sd: the two models' state dicts."""
    head, src_head = model.model[-1], src.model[-1]
    if type(head) is not type(src_head) or not hasattr(head, "class_rows"):
        return []
    names, src_names = _names(model.names, model.nc), _names(src.names, src.nc)
    if names == src_names:
        return []  # the same classes in the same order: the head transferred whole, or has another shape
    by_name = {n: c for c, n in src_names.items()}
    pairs = [(c, by_name[n]) for c, n in sorted(names.items()) if n in by_name]
    if not pairs:
        return []
    prefix = f"model.{len(model.model) - 1}."
    ours, theirs = head.class_rows(), src_head.class_rows()
    tensors = {}
    for key, (dim, rows, fixed) in ours.items():
        k = prefix + key
        if k not in src_sd or key not in theirs:
            continue
        a, b = dst[k], src_sd[k]
        if a.dim() != b.dim() or any(x != y for d, (x, y) in enumerate(zip(a.shape, b.shape)) if d != dim):
            return []  # the rest of the head differs too: nothing of it carries over
        src_rows, src_fixed = theirs[key][1:]
        if len(fixed) != len(src_fixed):  # another number of anchors or mask coefficients
            return []
        copies = [(rows(c), src_rows(c_src)) for c, c_src in pairs] + ([(fixed, src_fixed)] if fixed else [])
        a = a.clone()
        for to, frm in copies:
            a.index_copy_(dim, torch.tensor(to), b.index_select(dim, torch.tensor(frm)))
        tensors[k] = a
    if not tensors:
        return []
    keep.update(tensors)
    return [names[c] for c, _ in pairs]


def model_yaml(cfg):
    """The model dict `cfg` names: a model YAML (name under models/, path or dict), or a checkpoint (.pt, ours or
    official, by name or path) whose own model it is."""
    if isinstance(cfg, (str, Path)) and str(cfg).endswith(".pt"):
        return attempt_load(cfg, device="cpu", fuse=False).yaml
    return yaml_model_load(cfg)


def load_pretrained(model, weights, exclude=("anchors", "anchor_grid")):
    """Seed `model` from a checkpoint file (ours or official) by `transfer_weights`."""
    return transfer_weights(model, attempt_load(weights, device="cpu", fuse=False), weights, exclude)
