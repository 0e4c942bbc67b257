"""Dataset YAMLs: validation, path resolution, and getting a missing dataset (synthetic generation or download).

Detection/segmentation YAML keys (official format): `path` (dataset root; relative paths are tried from the
current directory, then from the repo root), `train`, `val`, optional `test` (folders, list .txt files or globs,
or lists of them, relative to `path`), `names` (list or {id: name}), optional `nc`, and optionally one of
`synthetic: {task, n_train, n_val, seed, ...}` (data.synthetic.generate_dataset arguments) or `download:`.
Pose YAMLs add `kpt_shape`, `flip_idx` and `skeleton` (`check_pose_dataset`). Any other key (Roboflow's `roboflow:`
block, Ultralytics' `channels`) is read by nothing here, and the log says so. A split entry `../x/images` that does
not exist from the root but `x/images` does is read as that: Roboflow's data.yaml sits beside its train/ and valid/
folders and names them so (Ultralytics resolves it the same way). A relative `path` whose splits are found from the
YAML's own folder only is read from there (CVAT's Ultralytics export writes `path: ./` in its data.yaml).

A --data that is a folder is looked into (data/annotations.find_layout): its data.yaml, else a COCO JSON or
Pascal VOC XML layout, read natively (the label rule of data/annotations.py).

`download:` is data, never code: an http(s) archive URL or a list of them (fetched and unpacked beside the dataset
root, i.e. into its parent, each file landing inside the root), and a list may also hold `{urls: <URL or list>,
dir: <folder relative to the root's parent>, threads: <int, optional>}` items for files that go into that folder
(data/coco.yaml). The official repositories also run a `bash ...` command or a Python script found there; a YAML can
come from anywhere, so such an entry is refused (nothing this project reads may run code), as is any other key, URL
scheme, a URL that does not name a zip or tar archive, or a `dir` outside the root's parent, all checked before
anything is fetched. What is fetched is unpacked as data only (data.downloads: data files, no links, devices
or setuid bits) and deleted.
Errors are one line naming the file and the problem; under DDP call these inside torch_distributed_zero_first.
"""

import glob
import os
import time
import urllib.parse
from pathlib import Path

from data.annotations import find_layout
from data.downloads import ARCHIVE_SUFFIXES, DownloadFailed, download, is_archive
from data.image_files import class_folders
from data.synthetic import TASKS, dataset_pixels, generate_dataset, sides
from utils.budget import MAX_SYNTHETIC_OBJECTS, MAX_SYNTHETIC_PIXELS, MAX_SYNTHETIC_SIDE, SYNTHETIC_FILE_PIXELS
from utils.errors import BadDataset
from utils.files import ROOT, ConfigError, yaml_load
from utils.log import LOGGER
from utils.text import escape_controls, has_controls

SYNTHETIC_KEYS = {"task", "n_train", "n_val", "seed", "min_side", "max_side", "max_objects"}
# what a YAML may make this machine generate: each count an integer in these bounds, and all of it within
# MAX_SYNTHETIC_PIXELS (data/synthetic.dataset_pixels)
SYNTHETIC_BOUNDS = {"n_train": (1, MAX_SYNTHETIC_PIXELS), "n_val": (1, MAX_SYNTHETIC_PIXELS), "seed": (0, 2**32 - 1),
                    "min_side": (16, MAX_SYNTHETIC_SIDE), "max_side": (16, MAX_SYNTHETIC_SIDE),
                    "max_objects": (1, MAX_SYNTHETIC_OBJECTS)}
# the keys of a detection, segmentation or pose dataset YAML that something reads
DET_KEYS = {"path", "train", "val", "test", "names", "nc", "download", "synthetic", "kpt_shape", "flip_idx", "skeleton"}
DOWNLOAD_KEYS = {"urls", "dir", "threads"}
DOWNLOAD_FORMS = "an http(s) URL, or a list of URLs and {urls, dir, threads} items"


class DatasetError(ConfigError, BadDataset):
    """A dataset YAML or dataset folder is malformed (a ValueError)."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset YAML or the data it points to is missing and cannot be obtained."""


class NamedByFile(str):
    """A dataset path a file named (a checkpoint's run record, an export's metadata: engine/inherit.py), not this
    command: read as any --data is, but what it lacks is never downloaded (its `download:` may name any URL), and
    the refusal says how to fetch it. `source` says which file named it."""

    def __new__(cls, path, source):
        self = super().__new__(cls, path)
        self.source = source
        return self


def _check_given(data):
    """Refuse an empty --data (`--data $DATA` with DATA unset): Path('') is the current folder, which it does not
    mean."""
    if not isinstance(data, dict) and not str(data):
        raise DatasetError("--data is empty: give a dataset YAML, a dataset name or (to classify) a folder")


def find_dataset_yaml(data):
    """`data` itself, else `<data>.yaml`; a bare name also as the repo's data/<name> or data/<name>.yaml, and a
    relative path also from the repo's root. A path naming folders is never swapped for a file of the same name
    elsewhere: a mistyped /data/coco128.yaml would validate on the repo's own coco128 without a word."""
    _check_given(data)
    p = Path(data)
    candidates = [p]
    if p.name:  # '.', '..' and '/' have no name to look up
        if p.suffix not in (".yaml", ".yml"):
            candidates.append(p.with_name(p.name + ".yaml"))
        if len(p.parts) == 1:
            candidates += [ROOT / "data" / p.name, ROOT / "data" / f"{p.name}.yaml"]
        elif not p.is_absolute():
            candidates += [ROOT / c for c in list(candidates)]
    for c in candidates:
        if c.is_file():
            return c
    tried = ", ".join(str(c) for c in candidates[1:])
    if p.is_dir():
        raise DatasetError(f"{data} is a folder: detection and segmentation read a dataset YAML (path, train, val, "
                           f"names; e.g. {ROOT / 'data' / 'shapes.yaml'}){f', and no {tried} exists' if tried else ''}")
    raise DatasetNotFoundError(f"{data}: dataset YAML not found{f' (also tried {tried})' if tried else ''}")


def _load(yaml_file):
    try:
        return yaml_load(yaml_file)
    except ConfigError as e:
        raise DatasetError(str(e)) from None


def _nc(d, label):
    """`nc` if given: an integer (YAML `'3'` is text and `true` a bool, neither a class count)."""
    nc = d.get("nc")
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int) or nc < 1):
        raise DatasetError(f"{label}: 'nc' must be a positive integer, got {type(nc).__name__} {nc!r:.40}")
    return nc


def _name(v, k, label):
    """One class name as text; None (YAML `null` or `~`), an empty name or a list/mapping is refused, not turned into
    'None' or '[...]'."""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or not str(v).strip():
        raise DatasetError(f"{label}: the name of class {k} must be text, got {type(v).__name__} {v!r:.40}")
    if has_controls(v):  # printed, drawn and saved, it would drive the terminal or forge a line
        raise DatasetError(f"{label}: the name of class {k} holds control characters ({escape_controls(v)[:60]})")
    return str(v)


def _names(d, label):
    names, nc = d.get("names"), _nc(d, label)
    if names is None:
        if nc is None:
            raise DatasetError(f"{label}: needs 'names' (a list or {{id: name}}) or a positive integer 'nc'")
        return {i: f"class{i}" for i in range(nc)}
    if isinstance(names, (list, tuple)):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise DatasetError(f"{label}: 'names' must be a non-empty list or {{id: name}} mapping")
    try:
        ids = {k: int(k) for k in names if not isinstance(k, (bool, float))}
    except (TypeError, ValueError):
        ids = {}
    if len(ids) != len(names) or len(set(ids.values())) != len(names):  # 1.5, true, 'a', or both 1 and '1'
        raise DatasetError(f"{label}: 'names' keys must be distinct integer class ids, got {list(names)}")
    names = {ids[k]: _name(v, k, label) for k, v in names.items()}
    if sorted(names) != list(range(len(names))):
        raise DatasetError(f"{label}: 'names' ids must be 0..{len(names) - 1}, got {sorted(names)}")
    if nc is not None and nc != len(names):
        raise DatasetError(f"{label}: nc={nc} but {len(names)} names are given")
    return dict(sorted(names.items()))


def _check_paths(v, label, key, lists=True):
    """Refuse a `key` that is not a path (text) nor, where `lists`, a list of paths: a mapping names no folder, and a
    number is not the text it was written as (YAML reads `010` as 8 and `1e3` as 1000.0)."""
    items = v if lists and isinstance(v, (list, tuple)) else [v]
    if all(isinstance(x, (str, os.PathLike)) for x in items):
        return
    number = any(isinstance(x, (int, float)) and not isinstance(x, bool) for x in items)
    hint = f"; quote a folder name that YAML reads as a number ({key}: '2017')" if number else ""
    what = "a path or a list of paths" if lists else "a path"
    raise DatasetError(f"{label}: '{key}' must be {what}, got {type(v).__name__} {v!r:.60}{hint}")


def dataset_root(d, yaml_file=None):
    """The absolute dataset root: `path` as given if absolute, else from the cwd if it exists there, else from the
    repo root (the official convention: `../datasets/x` is beside the repo); without `path`, the YAML's folder."""
    p = d.get("path")
    if p is not None:
        _check_paths(p, yaml_file or "dataset dict", "path", lists=False)
    if not p:
        return (yaml_file.parent if yaml_file else Path.cwd()).resolve()
    p = Path(p).expanduser()
    if p.is_absolute():
        return p
    for base in (Path.cwd(), ROOT):
        if (base / p).exists():
            return (base / p).resolve()
    return (ROOT / p).resolve()


def _resolve(entry, root):
    if isinstance(entry, (list, tuple)):
        return [_resolve(e, root) for e in entry]
    p = Path(str(entry)).expanduser()
    return str(p if p.is_absolute() else root / p)


def _exists(entry):
    return bool(glob.glob(entry)) if any(c in entry for c in "*?[") else Path(entry).exists()


def _missing(d, keys):
    """The entries of the splits `keys` that do not exist: of a list, only those missing."""
    return [e for k in keys if d.get(k) for e in (d[k] if isinstance(d[k], list) else [d[k]]) if not _exists(e)]


def _is_script(text):
    """A `download:` string that is a command or a program (the official `bash ...` and Python forms), not URLs."""
    words = text.split()
    return "\n" in text.strip() or (len(words) > 1 and "://" not in words[0])


def _url(u, label, where):
    """`u` if it is one http(s) URL, else DatasetError (a script gets the message saying why scripts are refused)."""
    if not isinstance(u, str):
        raise DatasetError(f"{label}: {where} must be an http(s) URL, got {type(u).__name__} {u!r:.60}")
    u = u.strip()
    if _is_script(u):
        raise DatasetError(f"{label}: {where} is a script; scripts in dataset YAMLs are not run (nothing this project "
                           "reads may run code): download the data yourself, or give archive URLs")
    parsed = urllib.parse.urlparse(u)
    if parsed.scheme not in ("http", "https") or not parsed.netloc or any(c.isspace() for c in u):
        raise DatasetError(f"{label}: {where} {u!r:.80} is not an http(s) URL")
    if not is_archive(parsed.path):
        raise DatasetError(f"{label}: {where} {u!r:.80} does not name a zip or tar archive "
                           f"({', '.join(ARCHIVE_SUFFIXES)}); a dataset download delivers data archives only")
    return u


def _urls(v, label, where):
    items = v if isinstance(v, list) else [v]
    if not items:
        raise DatasetError(f"{label}: {where} is an empty list; expected {DOWNLOAD_FORMS}")
    return [_url(u, label, f"{where}[{i}]" if isinstance(v, list) else where) for i, u in enumerate(items)]


def _subdir(v, label, where, parent):
    """parent / v for a relative `v` that stays inside `parent` (checked on the text: nothing exists yet)."""
    if not isinstance(v, str) or not v.strip():
        raise DatasetError(f"{label}: {where} must be a folder name relative to {parent}, got {v!r:.60}")
    if Path(v).is_absolute() or v.startswith("~"):
        raise DatasetError(f"{label}: {where} {v!r} must be relative to the dataset root's parent {parent}")
    norm = os.path.normpath(v)
    if norm == ".." or norm.startswith(".." + os.sep):
        raise DatasetError(f"{label}: {where} {v!r} leads outside the dataset root's parent {parent}")
    return parent / norm


def download_plan(spec, label, root):
    """The `download:` entry `spec` as [(urls, folder, threads)], or DatasetError naming `label` and the problem.

    Bare URLs go into root.parent (the official archives hold the dataset folder itself); a mapping item
    `{urls, dir, threads}` into root.parent / dir. What lands in root.parent itself may only fill the root
    (run_download). Nothing is fetched or created here."""
    parent, where = root.parent, "'download'"
    if isinstance(spec, str) and spec.split():
        if _is_script(spec):
            _url(spec, label, where)  # raises the message for scripts
        return [([_url(u, label, where) for u in spec.split()], parent, 1)]  # "URL URL ..." as the official form
    if not isinstance(spec, list) or not spec:
        raise DatasetError(f"{label}: {where} must be {DOWNLOAD_FORMS}, got {type(spec).__name__} {spec!r:.60}")
    plan, bare = [], None  # consecutive bare URLs make one call, as a plain list always did
    for i, item in enumerate(spec):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            if bare is None:
                bare = []
                plan.append((bare, parent, 1))
            bare.append(_url(item, label, at))
            continue
        bare = None
        unknown = set(item) - DOWNLOAD_KEYS
        if unknown:
            raise DatasetError(f"{label}: {at} has unknown key(s) {sorted(map(str, unknown))}, "
                               f"expected {sorted(DOWNLOAD_KEYS)}")
        if "urls" not in item:
            raise DatasetError(f"{label}: {at} needs 'urls' (a URL or a list of URLs)")
        threads = item.get("threads", 1)
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 32:
            raise DatasetError(f"{label}: {at}.threads must be an integer 1..32, got {threads!r:.40}")
        urls = _urls(item["urls"], label, f"{at}.urls")
        folder = _subdir(item["dir"], label, f"{at}.dir", parent) if "dir" in item else parent
        plan.append((urls, folder, threads))
    return plan


def run_download(spec, label, root):
    """Fetch and unpack what the `download:` entry `spec` names; the whole entry is validated first."""
    plan = download_plan(spec, label, root)
    t = time.time()
    for urls, folder, threads in plan:
        try:  # into the root's parent only the root itself, not the user's other files there
            download(urls, dir=folder, threads=threads, within=root if folder == root.parent else folder)
        except (BadDataset, DownloadFailed) as e:
            raise DatasetError(f"{label}: {e}") from None
    LOGGER.info(f"Dataset download finished in {time.time() - t:.1f}s: {root}")


def _synthetic_spec(spec, label):
    """The `synthetic:` mapping `spec` as generate_dataset's arguments, checked before anything is written: known
    keys, integers in SYNTHETIC_BOUNDS, min_side <= max_side, and the whole within MAX_SYNTHETIC_PIXELS (seconds of
    a CPU: docs/safety.md); DatasetError naming `label` otherwise."""
    if not isinstance(spec, dict):
        raise DatasetError(f"{label}: 'synthetic' must be a mapping of {sorted(SYNTHETIC_KEYS)}, got "
                           f"{type(spec).__name__} {spec!r:.40}")
    unknown = set(spec) - SYNTHETIC_KEYS
    if unknown:
        raise DatasetError(f"{label}: unknown 'synthetic' keys {sorted(map(str, unknown))}, expected "
                           f"{sorted(SYNTHETIC_KEYS)}")
    if spec.get("task", "detect") not in TASKS:
        raise DatasetError(f"{label}: synthetic.task must be one of {', '.join(TASKS)}, got {spec['task']!r:.40}")
    for k, (lo, hi) in SYNTHETIC_BOUNDS.items():
        v = spec.get(k, lo)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise DatasetError(f"{label}: synthetic.{k} must be an integer {lo}..{hi}, got {v!r:.40}")
    low, high = sides(spec.get("task", "detect"), spec.get("min_side"), spec.get("max_side"))
    if low > high:
        raise DatasetError(f"{label}: synthetic.min_side {low} is larger than max_side {high}")
    cost = dataset_pixels(**spec)
    if cost > MAX_SYNTHETIC_PIXELS:
        raise DatasetError(f"{label}: its synthetic images would take {cost} pixels' worth to draw, more than the "
                           f"{MAX_SYNTHETIC_PIXELS} a dataset YAML may ask for (each image counts its largest side "
                           f"squared plus {SYNTHETIC_FILE_PIXELS}: docs/safety.md); ask for fewer or smaller images")
    return dict(spec)


def _obtain(d, label, root, missing, autodownload, named_by=None):
    """Make a missing dataset exist: generate it (synthetic) or download it, else raise. `named_by`: the file that
    named this dataset (NamedByFile), whose download is refused."""
    if d.get("synthetic"):
        spec = _synthetic_spec(d["synthetic"], label)
        LOGGER.info(f"{label}: dataset not found, generating synthetic {spec.get('task', 'detect')} data in {root}...")
        try:
            generate_dataset(root, **spec)
        except FileExistsError:
            if not _missing(d, ["train", "val"]):
                return  # another node published it between our check and the generation: use that copy
            lacks = ", ".join(missing)
            raise DatasetError(f"{label}: {root} exists but lacks {lacks}; remove it to regenerate") from None
    elif d.get("download") and named_by:
        raise DatasetNotFoundError(f"{label}: dataset not found, missing {', '.join(missing)}; {named_by} names it, "
                                   f"and what a file names is not downloaded: give --data {label} to download it")
    elif d.get("download") and autodownload:
        LOGGER.info(f"{label}: dataset not found (missing {', '.join(missing)}), downloading...")
        run_download(d["download"], label, root)
    else:
        why = "autodownload is off" if d.get("download") else "the YAML has no 'download' or 'synthetic' entry"
        raise DatasetNotFoundError(f"{label}: dataset not found, missing {', '.join(missing)} ({why})")


def _load_source(data, keypoints=False):
    """(dict copy, yaml Path or None, label for messages) from a YAML path, a dict, or a folder holding a dataset
    (its data.yaml, or the dict of its COCO or VOC layout; keypoints: a pose run's COCO files)."""
    if isinstance(data, dict):
        return dict(data), None, "dataset dict"
    _check_given(data)
    if Path(data).is_dir():
        d, yaml_file = find_layout(data, keypoints)
        if d is not None:
            return d, None, str(data)
    else:
        yaml_file = find_dataset_yaml(data)
        if is_archive(yaml_file) or yaml_file.suffix.lower() == ".json":  # what annotation tools hand out
            what = "an archive" if is_archive(yaml_file) else "an annotation file"
            raise DatasetError(f"{data} is {what}, not a dataset YAML: give the folder of the dataset (unpacked), or "
                               "its data.yaml, as --data")
    return _load(yaml_file), yaml_file, str(yaml_file)


def _note_unread_keys(d, label):
    unread = sorted(str(k) for k in d if k not in DET_KEYS)
    if unread:
        LOGGER.info(f"{label}: {', '.join(map(repr, unread))} not read by this project (ignored)")


def _up_one(d, root, label):
    """Roboflow's `train: ../train/images` from a data.yaml at the root: read as `train/images` where only that
    exists (module docstring), saying so."""
    for k in ("train", "val", "test"):
        v = d.get(k)
        if isinstance(v, str) and v.replace("\\", "/").startswith("../") and not _exists(_resolve(v, root)) \
                and _exists(_resolve(v[3:], root)):
            LOGGER.info(f"{label}: {k} {v} is not found from {root}; reading {v[3:]} (as Roboflow's data.yaml means)")
            d[k] = v[3:]


def _beside_yaml(d, root, yaml_file, label):
    """The root a relative `path` names from the YAML's own folder where the splits are found only there: CVAT's
    Ultralytics export writes `path: ./` in its data.yaml, meaning that folder, which from the current directory
    would be another one (module docstring)."""
    p = d.get("path")
    if yaml_file is None or not p or Path(p).expanduser().is_absolute():
        return root
    there = (Path(yaml_file).parent / Path(p).expanduser()).resolve()
    splits = [k for k in ("train", "val") if d.get(k)]
    if there == root or not _missing({k: _resolve(d[k], root) for k in splits}, splits) or \
            _missing({k: _resolve(d[k], there) for k in splits}, splits):
        return root
    LOGGER.info(f"{label}: path {p} is read from the YAML's folder, {there}: its splits are not found from {root}")
    return there


def check_det_dataset(data, autodownload=True, keypoints=False):
    """Validate a detection/segmentation dataset YAML (path, dict, or a folder holding a dataset), get the data if
    missing, return a new dict with absolute `path`, `train`, `val`, `test` (str or list of str), `names` {int: str},
    `nc` and `yaml_file`. keypoints: a folder's COCO layout is sought in its keypoint files (pose)."""
    d, yaml_file, label = _load_source(data, keypoints)
    _note_unread_keys(d, label)
    absent = [k for k in ("train", "val") if not d.get(k)]
    if absent:
        raise DatasetError(f"{label}: missing required key(s) {', '.join(repr(k) for k in absent)}")
    for k in ("train", "val", "test"):
        if d.get(k):
            _check_paths(d[k], label, k)
    names = _names(d, label)
    root = _beside_yaml(d, dataset_root(d, yaml_file), yaml_file, label)
    _up_one(d, root, label)
    d.update(path=str(root), names=names, nc=len(names), yaml_file=str(yaml_file) if yaml_file else None)
    for k in ("train", "val", "test"):
        if d.get(k):
            d[k] = _resolve(d[k], root)
    missing = _missing(d, ["val"])
    if missing:
        _obtain(d, label, root, missing, autodownload, getattr(data, "source", None))
    missing = _missing(d, ["train", "val"])
    if missing:
        raise DatasetNotFoundError(f"{label}: dataset not found, missing {', '.join(missing)}")
    return d


def _class_map(d, label, train):
    """The one class map of every split: the YAML's `names`, else the training split's sorted class folders."""
    folders = class_folders(train)
    if d.get("names") is None:
        if not folders:
            raise DatasetError(f"{label}: {train} has no class folders")
        nc = _nc(d, label)
        if nc is not None and nc != len(folders):
            raise DatasetError(f"{label}: nc={nc} but {train} has {len(folders)} class folders")
        return dict(enumerate(folders))
    names = _names(d, label)
    unknown = [f for f in folders if f not in names.values()]
    if unknown:
        raise DatasetError(f"{label}: class folder(s) {', '.join(map(repr, unknown))} of {train} are not in "
                           f"'names' ({', '.join(names.values())})")
    absent = [n for n in names.values() if n not in folders]
    if absent:
        LOGGER.warning(f"WARNING: {label}: {train} has no folder for class(es) {', '.join(absent)}: the model "
                       "cannot learn them")
    return names


def _check_split_classes(names, split, train):
    """A class folder in val/test that training lacks cannot be scored: refuse it, naming it."""
    unknown = [f for f in class_folders(split) if f not in names.values()]
    if unknown:
        raise DatasetError(f"{split}: class folder(s) {', '.join(map(repr, unknown))} are not classes of the training "
                           f"split {train} ({', '.join(names.values())}); a classifier cannot predict a class it never "
                           "trained on: add its images to train/ or remove the folder")


def check_cls_dataset(data, autodownload=True):
    """A classification dataset: a folder with train/ and val/ (or test/) of class folders, a YAML, or a name.

    When `data` is not an existing folder or file, `<data>.yaml` and the repo's data/<name>.yaml are tried, so
    `--data data/shapes-cls` or `--data shapes-cls` builds the synthetic set on a fresh clone. Returns a dict with
    absolute `path`, `train`, `val`, `test` (or None), `names` {int: str} and `nc`. The names are the one class map
    of every split (see `_class_map`); val/test may lack a class, but hold none that training lacks.
    """
    _check_given(data)
    if not isinstance(data, dict) and Path(data).is_dir():
        d, yaml_file, label = {"path": str(Path(data).resolve())}, None, str(data)
    else:
        d, yaml_file, label = _load_source(data)
    for k in ("train", "val", "test"):
        if d.get(k):
            _check_paths(d[k], label, k, lists=False)  # one folder of class folders each
    root = dataset_root(d, yaml_file)
    train = root / (d.get("train") or "train")
    val = root / d["val"] if d.get("val") else (root / "val" if (root / "val").is_dir() else root / "test")
    missing = [str(p) for p in (train, val) if not p.is_dir()]
    if missing and (yaml_file is not None or isinstance(data, dict)):  # a bare folder has no recipe to build it
        _obtain(d, label, root, missing, autodownload, getattr(data, "source", None))
        missing = [str(p) for p in (train, val) if not p.is_dir()]
    if missing:
        wanted = f" (the validation split is {root / 'val'}, else {root / 'test'})" if str(val) in missing and \
            not d.get("val") else ""
        raise DatasetNotFoundError(f"{label}: classification dataset not found, missing {', '.join(missing)}{wanted}")
    names = _class_map(d, label, train)
    test = root / d["test"] if d.get("test") else root / "test"
    for split in (val, test) if test.is_dir() else (val,):
        _check_split_classes(names, split, train)
    return {"path": str(root), "train": str(train), "val": str(val), "test": str(test) if test.is_dir() else None,
            "names": names, "nc": len(names), "yaml_file": str(yaml_file) if yaml_file else None}


def _int_list(v):
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _kpt_shape(d, label):
    shape = d.get("kpt_shape")
    if not _int_list(shape) or len(shape) != 2 or shape[0] < 1 or shape[1] not in (2, 3):
        raise DatasetError(f"{label}: 'kpt_shape' must be [K, 2] or [K, 3] (K >= 1 keypoints of x y, or x y "
                           f"visibility), got {shape!r:.60}")
    return shape


def _flip_idx(d, label, k):
    flip = d.get("flip_idx")
    if flip is None:
        LOGGER.warning(f"WARNING: {label}: no 'flip_idx': left-right flips keep each keypoint's index, which is wrong "
                       "for left/right pairs (give flip_idx, or set fliplr: 0 in the hyp file)")
        return None
    if not _int_list(flip) or sorted(flip) != list(range(k)):
        raise DatasetError(f"{label}: 'flip_idx' must list each keypoint index 0..{k - 1} once (the index each "
                           f"keypoint takes after a left-right flip), got {flip!r:.80}")
    return flip


def _skeleton(d, label, k):
    skeleton = d.get("skeleton")
    if skeleton is None:
        return None
    ok = isinstance(skeleton, list) and all(_int_list(e) and len(e) == 2 and all(0 <= i < k for i in e)
                                            for e in skeleton)
    if not ok:
        raise DatasetError(f"{label}: 'skeleton' must be a list of [i, j] keypoint index pairs in 0..{k - 1}, got "
                           f"{skeleton!r:.80}")
    return skeleton


def check_pose_dataset(data, autodownload=True):
    """A detection dataset dict (`check_det_dataset`) whose YAML also gives `kpt_shape: [K, 2 or 3]` and optionally
    `flip_idx` (a permutation of 0..K-1) and `skeleton` ([i, j] pairs, 0-based, drawn by predict); every mistake is
    one DatasetError naming the file and the key, found before the data is looked at, generated or downloaded."""
    raw, _, label = _load_source(data, keypoints=True)
    shape = _kpt_shape(raw, label)
    k = shape[0]
    keypoints = {"kpt_shape": shape, "flip_idx": _flip_idx(raw, label, k), "skeleton": _skeleton(raw, label, k)}
    return {**check_det_dataset(data, autodownload, keypoints=True), **keypoints}


def has_keypoints(data):
    """Whether the dataset YAML (or dict) `data` declares keypoints (`kpt_shape`), read without getting its data."""
    return _load_source(data)[0].get("kpt_shape") is not None


def pose_skeleton(data, k):
    """The `skeleton` of the pose dataset YAML `data` (None where it has none), checked against k keypoints; the data
    itself is neither looked at nor fetched."""
    d, yaml_file, label = _load_source(data)
    return _skeleton(d, label, k)
