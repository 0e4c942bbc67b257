"""The one loader for every `.pt` file the project reads: nothing a file holds may run code, and nothing it claims
is allocated before it is checked. `load_checkpoint` reads the file's bytes once and, before torch sees them
(models/untrusted.py, which decides on the bytes torch reads):
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
webbrowser. An unpickled official tree is read from its dicts (official.py), never through nn.Module methods that
would call hooks the file stored.
"""

import contextlib
import functools
import io
import pickle
import reprlib
import warnings
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import torch
import torch.nn as nn

from models.registry import check_user_blocks
from models.untrusted import ZIP_MAGIC, Archive, UnsafeCheckpoint, check_checkpoint, shown
from utils.budget import MAX_NESTING
from utils.errors import BadCheckpoint

# GitHub YOLOv5/YOLOv7 (`models.*`, and `utils.*`, which the pip package mirrors as `yolov5.utils.*`), pip yolov5, v8
OFFICIAL_PREFIXES = ("models.", "utils.", "yolov5.models.", "yolov5.utils.", "ultralytics.")

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


class Stub(nn.Module):
    """Stand-in for a class of an official package: it only keeps the state the pickle gives it."""


_STUBS = {}


def _stub_class(path):
    if path not in _STUBS:
        module, _, name = path.rpartition(".")
        _STUBS[path] = type(name, (Stub,), {"official_path": path, "__module__": module, "__qualname__": name})
    return _STUBS[path]


class _Refused(pickle.UnpicklingError):
    """Raised while unpickling for what the static scan cannot see (the arguments of a call)."""


def _stub_getattr(obj, name):
    """`builtins.getattr` as official pickles use it: protocol 2 writes a function kept as a class attribute, such
    as YOLOv5's `Segment.detect = Detect.forward`, as getattr(Detect, 'forward'). Only a stubbed official class is
    accepted and the result is a placeholder string, so getattr cannot reach any real object (the payload route)."""
    if isinstance(obj, type) and issubclass(obj, Stub) and isinstance(name, str):
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
        # an official class called with no arguments is its empty stand-in, as NEWOBJ makes it: Ultralytics'
        # trainer checkpoints pickle the model's `args` (IterableSimpleNamespace, a SimpleNamespace) that way
        official = isinstance(func, str) and func.startswith(OFFICIAL_PREFIXES) and args == ()
        if op == "REDUCE" and not official and not (isinstance(func, str) and func in CALLABLE
                                                    and CALLABLE[func](args)):
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


