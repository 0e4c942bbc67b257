"""The `.yolo-engine.cache` file beside a dataset's labels: the result of a label scan, saved so the next run
skips the scan.

Format: a line holding the cache's MAC, then one line of JSON, `{"format": FORMAT, "version": VERSION, "hash": ...,
"data": ...}`, then the bytes of its arrays. `data` is the caller's dict, with numpy arrays written as
`{"__ndarray__": [dtype, shape, offset]}` (numeric dtypes only; the array's bytes at `offset` after the JSON line,
read straight into the array) and tuples as `{"__tuple__": [...]}`, so reading it back can never run code, unlike
the pickled caches of the official repos. `hash` is the caller's key: a hash of the image/label file list with sizes
and mtimes (data.image_files.files_hash).

A cache is bound to the dataset it describes and to this user: the MAC is an HMAC-SHA256 of the rest under a
secret key kept in the user's configuration folder (`cache_key`), so a cache planted beside a dataset (shipped with
it, or written by anyone else) does not verify, whatever hash it claims, and the caller also checks that every entry
names a file of the dataset (`valid`). A cache that does not verify, in another format (an official pickled cache),
of another version, corrupt or unreadable is ignored with one warning and rebuilt; one whose hash differs (the files
changed) is rebuilt silently. Machines that share a dataset folder but not a home folder each rebuild the other's
caches: point YOLO_ENGINE_CONFIG_DIR at one shared folder to share the key. Under DDP every rank signs and checks
with global rank 0's key (`cache_key`), handed on through the process group's store, so the machines of one job
accept each other's caches whatever their folders (the key then travels over the job's store connection, as
everything else the ranks exchange). Only local rank 0 writes it (the others
read what it wrote), atomically (utils.files.publish); a folder that cannot be written costs one warning and a rescan
next time, never a crash.
"""

import datetime
import errno
import hmac
import json
import math
import os
import secrets
from pathlib import Path

import numpy as np
import torch.distributed as dist

from utils import dist as du
from utils.files import publish
from utils.log import LOGGER

FORMAT = "yolo-engine label cache"
# not `train.cache`, the official repos' name for their pickled cache: on a shared name each tool would rescan after
# the other had run
SUFFIX = ".yolo-engine.cache"
VERSION = 4  # 1 was the pickled .npy cache, 2 had no MAC, 3 held its arrays in base64 inside the JSON
KEY_ENV = "YOLO_ENGINE_CONFIG_DIR"
JOB_KEY = "yolo-engine/label-cache-key"  # where global rank 0 leaves its key in the process group's store
JOB_KEY_WAIT = 600  # seconds a rank waits for it (rank 0 asks for it before it scans, after listing the split)
_job = {}  # the job's key, once read
_warned_dirs = set()  # one "not writeable" warning per folder and process


def _encode(x):
    """`x` in JSON's types, its arrays left as they are (checked): the writer places them after the document."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biuf":
            raise TypeError(f"label cache: arrays of dtype {x.dtype} are not stored")
        return x
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


def _decode(x, f, base, size):
    """Undo the encodings of `_encode` and the writer in a document read back: arrays are read from the file `f`
    (their bytes start at `base`, `size` of them) straight into their own memory. A malformed entry raises
    ValueError (a corrupt cache)."""
    if isinstance(x, list):
        return [_decode(v, f, base, size) for v in x]
    if not isinstance(x, dict):
        return x
    if "__ndarray__" in x:
        dtype, shape, offset = x["__ndarray__"]
        dtype = np.dtype(dtype)
        if dtype.kind not in "biuf":
            raise ValueError(f"array dtype {dtype} not allowed")
        if not all(type(n) is int and n >= 0 for n in [*shape, offset]):
            raise ValueError("an array's shape or place is not made of whole numbers")
        nbytes = math.prod(shape) * dtype.itemsize
        if offset + nbytes > size:
            raise ValueError("an array runs past the end of the file")
        out = np.empty(shape, dtype)
        f.seek(base + offset)
        if nbytes and f.readinto(out.reshape(-1).view(np.uint8)) != nbytes:
            raise ValueError("the file ended inside an array")
        return out
    if "__tuple__" in x:
        return tuple(_decode(x["__tuple__"], f, base, size))
    return {k: _decode(v, f, base, size) for k, v in x.items()}


def _warn(prefix, msg):
    LOGGER.warning(f"{prefix}WARNING: {msg}")


def key_path():
    """Where the label caches' key lives: $YOLO_ENGINE_CONFIG_DIR, else $XDG_CONFIG_HOME/yolo-engine, else
    ~/.config/yolo-engine."""
    folder = os.environ.get(KEY_ENV) or Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / \
        "yolo-engine"
    return Path(folder) / "label-cache.key"


def cache_key():
    """The key label caches are signed and checked with: this user's (`own_key`); under DDP, global rank 0's for
    every rank of the job (`_job_key`), so that machines whose configuration folders differ accept each other's
    caches on a shared dataset folder instead of each rescanning and overwriting the other's every run."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return _job_key()
    return own_key()


def _job_key():
    """Global rank 0's key, handed to the others through the process group's store (no collective: the ranks ask
    for it at different times, some while others scan). A rank that waits for it longer than JOB_KEY_WAIT (rank 0
    stuck before its own scan) uses its own, as before, with one warning. Read once per process."""
    if "key" not in _job:
        store = dist.distributed_c10d._get_default_store()
        if dist.get_rank() == 0:
            key = own_key()
            store.set(JOB_KEY, key.hex() if key else "")
        try:
            store.wait([JOB_KEY], datetime.timedelta(seconds=JOB_KEY_WAIT))
            value = store.get(JOB_KEY).decode()
            _job["key"] = bytes.fromhex(value) if value else None
        except (RuntimeError, ValueError) as e:  # DistStoreError is a RuntimeError
            _warn("", f"label caches signed with this machine's key, not the job's ({e})")
            _job["key"] = own_key()
    return _job["key"]


def own_key():
    """This user's secret key for label caches (32 random bytes, hex), made on first use, readable by the user only;
    None where the folder cannot be written (caches are then neither trusted nor written). Processes making it at
    once agree: each links its own draft to the name, and the first link wins."""
    path = key_path()
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(draft, path)
        except OSError as e:
            if e.errno != errno.EEXIST:
                raise
        finally:
            draft.unlink(missing_ok=True)
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _mac(key, data):
    return hmac.new(key, data, "sha256").hexdigest()


def _read_verified(path):
    """The cache document at `path`, its arrays read from the file, once its MAC (streamed through in blocks)
    verifies: a planted file of any size costs a read, never its size in memory. ValueError saying why not."""
    key = cache_key()
    with open(path, "rb") as f:
        mac = f.read(65)
        if len(mac) != 65 or mac[64:] != b"\n" or f.read(1) != b"{":  # an official cache (a pickle), an older one
            raise ValueError("not a label cache of this version of this project (another program's format?)")
        if key is None:
            raise ValueError(f"its key {key_path()} cannot be read or made here")
        f.seek(65)
        digest = hmac.new(key, digestmod="sha256")
        while block := f.read(1 << 20):
            digest.update(block)
        if not hmac.compare_digest(mac[:64], digest.hexdigest().encode()):
            raise ValueError("it was not written with this user's key (copied from elsewhere, or edited)")
        f.seek(65)
        cache = json.loads(f.readline().decode("utf-8"))
        if not isinstance(cache, dict) or cache.get("format") != FORMAT or not isinstance(cache.get("data"), dict):
            raise ValueError("not a label cache of this project")
        if cache.get("version") != VERSION:
            raise ValueError(f"cache version {cache.get('version')}, this program reads {VERSION}")
        base = f.tell()
        return _decode(cache, f, base, os.fstat(f.fileno()).st_size - base)


def load_cache(path, hash_, prefix="", valid=lambda data: True):
    """The `data` dict saved at `path` under key `hash_`, or None (missing, stale, or unusable: then warn).
    `valid(data)` says whether every entry names a file of the dataset."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        cache = _read_verified(path)
        if cache.get("hash") == hash_ and not valid(cache["data"]):
            raise ValueError("its entries name files outside the dataset")
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:  # json's errors are ValueErrors
        _warn(prefix, f"ignoring label cache {path} ({e}); rescanning")
        return None
    return cache["data"] if cache.get("hash") == hash_ else None


BLOCK = 1 << 20  # bytes of an array written at a time


def write_signed(path, doc, key):
    """`doc` (what `_encode` gives) as the cache file: a line for the MAC, the document as one line of JSON with
    each array as `{"__ndarray__": [dtype, shape, offset]}`, then the arrays' bytes, streamed; the MAC, computed
    along, is written over a placeholder at the end. The whole text with base64 arrays held about four copies of
    every array's bytes at once, writing and reading (139 MB of Python memory over 33 MB of outline points at
    12,800 segmentation images), which a process keeping its freed memory (utils/heap.py) then kept."""
    arrays, ends = [], [0]

    def place(a):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"label cache: cannot store {type(a).__name__}")
        arrays.append(a)
        ends.append(ends[-1] + a.nbytes)
        return {"__ndarray__": [a.dtype.str, list(a.shape), ends[-2]]}

    header = json.dumps(doc, default=place).encode("utf-8") + b"\n"
    digest = hmac.new(key, digestmod="sha256")
    with open(path, "wb") as f:
        f.write(b"0" * 64 + b"\n")
        for part in [header, *arrays]:
            raw = np.ascontiguousarray(part).reshape(-1).view(np.uint8) if isinstance(part, np.ndarray) else part
            for start in range(0, len(raw), BLOCK):
                digest.update(raw[start:start + BLOCK])
                f.write(raw[start:start + BLOCK])
        f.seek(0)
        f.write(digest.hexdigest().encode("ascii"))


def save_cache(path, data, hash_, prefix=""):
    """Write `data` under key `hash_` to `path` (local rank 0 only). Returns True if written."""
    if du.get_local_rank() not in (-1, 0):
        return False  # the other ranks of this machine read what local rank 0 wrote
    path = Path(path)
    doc = {"format": FORMAT, "version": VERSION, "hash": hash_, "data": _encode(data)}
    key = cache_key()
    try:
        if key is None:
            raise OSError(f"its key {key_path()} cannot be made")
        publish(path, lambda tmp: write_signed(tmp, doc, key), replace=True)
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
