"""Dataset YAMLs: validation, path resolution, and getting a missing dataset (synthetic generation or download).

Detection/segmentation YAML keys (official format): `path` (dataset root; relative paths are tried from the
current directory, then from the repo root), `train`, `val`, optional `test` (folders, list .txt files or globs,
or lists of them, relative to `path`), `names` (list or {id: name}), optional `nc`, and optionally one of
`synthetic: {task, n_train, n_val, seed, ...}` (utils.data.synthetic.generate_dataset arguments) or `download:`
(archive URL(s), a `bash ...` command, or a Python script run with `yaml` = the resolved dict).
Errors are one line naming the file and the problem; under DDP call these inside torch_distributed_zero_first.
"""

import glob
import subprocess
import time
from pathlib import Path

from utils.data.downloads import download
from utils.data.synthetic import generate_dataset
from utils.errors import BadDataset
from utils.files import ROOT, ConfigError, yaml_load
from utils.loggers import LOGGER

SYNTHETIC_KEYS = {"task", "n_train", "n_val", "seed", "min_side", "max_side", "max_objects"}


class DatasetError(ConfigError, BadDataset):
    """A dataset YAML or dataset folder is malformed (a ValueError)."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset YAML or the data it points to is missing and cannot be obtained."""


def find_dataset_yaml(data):
    """`data` itself, else `<data>.yaml`, else the repo's data/<name> or data/<name>.yaml."""
    p = Path(data)
    candidates = [p]
    if p.suffix not in (".yaml", ".yml"):
        candidates.append(p.with_name(p.name + ".yaml"))
    candidates += [ROOT / "data" / p.name, ROOT / "data" / f"{p.name}.yaml"]
    for c in candidates:
        if c.is_file():
            return c
    tried = ", ".join(str(c) for c in candidates[1:])
    raise DatasetNotFoundError(f"{data}: dataset YAML not found (also tried {tried})")


def _load(yaml_file):
    try:
        return yaml_load(yaml_file)
    except ConfigError as e:
        raise DatasetError(str(e)) from None


def _names(d, label):
    names, nc = d.get("names"), d.get("nc")
    if names is None:
        if not isinstance(nc, int) or nc < 1:
            raise DatasetError(f"{label}: needs 'names' (a list or {{id: name}}) or a positive integer 'nc'")
        return {i: f"class{i}" for i in range(nc)}
    if isinstance(names, (list, tuple)):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise DatasetError(f"{label}: 'names' must be a non-empty list or {{id: name}} mapping")
    try:
        names = {int(k): str(v) for k, v in names.items()}
    except (TypeError, ValueError):
        raise DatasetError(f"{label}: 'names' keys must be integer class ids") from None
    if sorted(names) != list(range(len(names))):
        raise DatasetError(f"{label}: 'names' ids must be 0..{len(names) - 1}, got {sorted(names)}")
    if nc is not None and nc != len(names):
        raise DatasetError(f"{label}: nc={nc} but {len(names)} names are given")
    return dict(sorted(names.items()))


def dataset_root(d, yaml_file=None):
    """The absolute dataset root: `path` as given if absolute, else from the cwd if it exists there, else from the
    repo root (the official convention: `../datasets/x` is beside the repo); without `path`, the YAML's folder."""
    p = d.get("path")
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
    if isinstance(entry, list):
        return all(_exists(e) for e in entry)
    return bool(glob.glob(entry)) if any(c in entry for c in "*?[") else Path(entry).exists()


def _missing(d, keys):
    return [str(d[k]) for k in keys if d.get(k) and not _exists(d[k])]


def run_download(spec, d, root):
    """Official `download:` forms: archive URL(s) (unpacked beside the dataset root), 'bash ...', or Python."""
    t = time.time()
    if isinstance(spec, (list, tuple)) or str(spec).startswith(("http://", "https://")):
        download(spec if isinstance(spec, (list, tuple)) else str(spec).split(), dir=root.parent)
    elif str(spec).startswith("bash "):
        subprocess.run(spec, shell=True, check=True, cwd=ROOT)
    else:
        exec(spec, {"yaml": d, "Path": Path, "download": download})  # the dataset YAML's own script, as official
    LOGGER.info(f"Dataset download finished in {time.time() - t:.1f}s: {root}")


def _obtain(d, label, root, missing, autodownload):
    """Make a missing dataset exist: generate it (synthetic) or download it, else raise."""
    if d.get("synthetic"):
        spec = dict(d["synthetic"])
        unknown = set(spec) - SYNTHETIC_KEYS
        if unknown:
            raise DatasetError(
                f"{label}: unknown 'synthetic' keys {sorted(unknown)}, expected {sorted(SYNTHETIC_KEYS)}")
        LOGGER.info(f"{label}: dataset not found, generating synthetic {spec.get('task', 'detect')} data in {root}...")
        try:
            generate_dataset(root, **spec)
        except FileExistsError:
            if not _missing(d, ["train", "val"]):
                return  # another node published it between our check and the generation: use that copy
            lacks = ", ".join(missing)
            raise DatasetError(f"{label}: {root} exists but lacks {lacks}; remove it to regenerate") from None
    elif d.get("download") and autodownload:
        LOGGER.info(f"{label}: dataset not found (missing {', '.join(missing)}), downloading...")
        run_download(d["download"], d, root)
    else:
        why = "autodownload is off" if d.get("download") else "the YAML has no 'download' or 'synthetic' entry"
        raise DatasetNotFoundError(f"{label}: dataset not found, missing {', '.join(missing)} ({why})")


def _load_source(data):
    """(dict copy, yaml Path or None, label for messages) from a YAML path or a dict."""
    if isinstance(data, dict):
        return dict(data), None, "dataset dict"
    yaml_file = find_dataset_yaml(data)
    return _load(yaml_file), yaml_file, str(yaml_file)


def check_det_dataset(data, autodownload=True):
    """Validate a detection/segmentation dataset YAML (path or dict), get the data if missing, return a new dict
    with absolute `path`, `train`, `val`, `test` (str or list of str), `names` {int: str}, `nc` and `yaml_file`."""
    d, yaml_file, label = _load_source(data)
    absent = [k for k in ("train", "val") if not d.get(k)]
    if absent:
        raise DatasetError(f"{label}: missing required key(s) {', '.join(repr(k) for k in absent)}")
    names = _names(d, label)
    root = dataset_root(d, yaml_file)
    d.update(path=str(root), names=names, nc=len(names), yaml_file=str(yaml_file) if yaml_file else None)
    for k in ("train", "val", "test"):
        if d.get(k):
            d[k] = _resolve(d[k], root)
    missing = _missing(d, ["val"])
    if missing:
        _obtain(d, label, root, missing, autodownload)
    missing = _missing(d, ["train", "val"])
    if missing:
        raise DatasetNotFoundError(f"{label}: dataset not found, missing {', '.join(missing)}")
    return d


def _class_folders(split_dir):
    return sorted(p.name for p in Path(split_dir).iterdir() if p.is_dir())


def check_cls_dataset(data, autodownload=True):
    """A classification dataset: a folder with train/ and val/ (or test/) of class folders, a YAML, or a name.

    When `data` is not an existing folder or file, `<data>.yaml` and the repo's data/<name>.yaml are tried, so
    `--data data/shapes-cls` or `--data shapes-cls` builds the synthetic set on a fresh clone. Returns a dict with
    absolute `path`, `train`, `val`, `test` (or None), `names` {int: str} (sorted class folders) and `nc`.
    """
    if not isinstance(data, dict) and Path(data).is_dir():
        d, yaml_file, label = {"path": str(Path(data).resolve())}, None, str(data)
    else:
        d, yaml_file, label = _load_source(data)
    root = dataset_root(d, yaml_file)
    train = root / d.get("train", "train")
    val = root / d["val"] if d.get("val") else (root / "val" if (root / "val").is_dir() else root / "test")
    missing = [str(p) for p in (train, val) if not p.is_dir()]
    if missing and (yaml_file is not None or isinstance(data, dict)):  # a bare folder has no recipe to build it
        _obtain(d, label, root, missing, autodownload)
        missing = [str(p) for p in (train, val) if not p.is_dir()]
    if missing:
        raise DatasetNotFoundError(f"{label}: classification dataset not found, missing {', '.join(missing)}")
    classes = _class_folders(train)
    if not classes:
        raise DatasetError(f"{label}: {train} has no class folders")
    if d.get("names") is not None:
        given = list(_names(d, label).values())
        if given != classes:
            raise DatasetError(f"{label}: names {given} differ from the class folders {classes} of {train}")
    test = root / d["test"] if d.get("test") else root / "test"
    names = dict(enumerate(classes))
    return {"path": str(root), "train": str(train), "val": str(val), "test": str(test) if test.is_dir() else None,
            "names": names, "nc": len(names), "yaml_file": str(yaml_file) if yaml_file else None}
