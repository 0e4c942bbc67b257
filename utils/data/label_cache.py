"""The `.yolo-engine.cache` file beside a dataset's labels: the result of a label scan, saved so the next run
skips the scan.

Format: one JSON document, `{"format": FORMAT, "version": VERSION, "hash": ..., "data": ...}`. `data` is the
caller's dict, with numpy arrays written as `{"__ndarray__": [dtype, shape, base64 bytes]}` (numeric dtypes only)
and tuples as `{"__tuple__": [...]}`, so reading it back can never run code, unlike the pickled caches of the
official repos. `hash` is the caller's key: a hash of the image/label file list with sizes and mtimes
(utils.data.image_files.files_hash). A cache in another format (an official pickled cache), of another version,
corrupt or unreadable is ignored with one warning and rebuilt; one whose hash differs (the files changed) is rebuilt
silently. Only local rank 0 writes it (the others read what it wrote), atomically (utils.files.publish); a folder
that cannot be written costs one warning and a rescan next time, never a crash.
"""

import base64
import json
from pathlib import Path

import numpy as np

from utils import dist as du
from utils.files import publish
from utils.loggers import LOGGER

FORMAT = "yolo-engine label cache"
# not `train.cache`, the official repos' name for their pickled cache: on a shared name each tool would rescan after
# the other had run
SUFFIX = ".yolo-engine.cache"
VERSION = 2  # 1 was the pickled .npy cache
_warned_dirs = set()  # one "not writeable" warning per folder and process


def _encode(x):
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biuf":
            raise TypeError(f"label cache: arrays of dtype {x.dtype} are not stored")
        data = base64.b64encode(np.ascontiguousarray(x).tobytes()).decode("ascii")
        return {"__ndarray__": [x.dtype.str, list(x.shape), data]}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(v) for v in x]}
    if isinstance(x, list):
        return [_encode(v) for v in x]
    if isinstance(x, dict):
        if not all(isinstance(k, str) and not k.startswith("__") for k in x):
            raise TypeError(f"label cache: dict keys must be plain strings, got {list(x)[:5]}")
        return {k: _encode(v) for k, v in x.items()}
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    raise TypeError(f"label cache: cannot store {type(x).__name__}")


def _decode_object(d):
    """json object_hook: undo the two encodings above; a malformed one raises ValueError (a corrupt cache)."""
    if "__ndarray__" in d:
        dtype, shape, data = d["__ndarray__"]
        dtype = np.dtype(dtype)
        if dtype.kind not in "biuf":
            raise ValueError(f"array dtype {dtype} not allowed")
        return np.frombuffer(base64.b64decode(data), dtype=dtype).reshape(shape).copy()
    if "__tuple__" in d:
        return tuple(d["__tuple__"])
    return d


def _warn(prefix, msg):
    LOGGER.warning(f"{prefix}WARNING: {msg}")


def load_cache(path, hash_, prefix=""):
    """The `data` dict saved at `path` under key `hash_`, or None (missing, stale, or unusable: then warn)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(1)
            f.seek(0)
            if head != b"{":  # an official cache (a pickle in .npy) or anything else: never parsed
                raise ValueError("not a JSON label cache (another program's format?)")
            cache = json.loads(f.read().decode("utf-8"), object_hook=_decode_object)
        if not isinstance(cache, dict) or cache.get("format") != FORMAT:
            raise ValueError("not a label cache of this project")
        if cache.get("version") != VERSION:
            raise ValueError(f"cache version {cache.get('version')}, this program reads {VERSION}")
        if not isinstance(cache.get("data"), dict):
            raise ValueError("no data")
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:  # json and base64 errors are ValueErrors
        _warn(prefix, f"ignoring label cache {path} ({e}); rescanning")
        return None
    return cache["data"] if cache.get("hash") == hash_ else None


def save_cache(path, data, hash_, prefix=""):
    """Write `data` under key `hash_` to `path` (local rank 0 only). Returns True if written."""
    if du.get_local_rank() not in (-1, 0):
        return False  # the other ranks of this machine read what local rank 0 wrote
    path = Path(path)
    text = json.dumps({"format": FORMAT, "version": VERSION, "hash": hash_, "data": _encode(data)})
    try:
        publish(path, lambda tmp: Path(tmp).write_text(text), replace=True)
        return True
    except OSError as e:
        if path.parent not in _warned_dirs:
            _warned_dirs.add(path.parent)
            _warn(prefix, f"cache dir {path.parent} is not writeable, labels not cached ({e})")
        return False


def cache_path(split_path):
    """The cache of a split: labels/train -> labels/train.yolo-engine.cache, train.txt -> train.yolo-engine.cache."""
    split_path = Path(split_path)
    stem = split_path.stem if split_path.suffix == ".txt" else split_path.name
    return split_path.with_name(stem + SUFFIX)
