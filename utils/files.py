"""Run folders, atomic saves and YAML I/O with errors that name the file."""

import os
import tempfile
from pathlib import Path

import torch
import yaml

from utils.errors import BadFile

ROOT = Path(__file__).resolve().parents[1]  # repository root


class ConfigError(BadFile):
    """A configuration file (dataset, model or hyperparameter YAML) is missing or malformed."""


def yaml_load(path):
    """Read a YAML mapping; a missing file or broken YAML raises ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        data = yaml.safe_load(path.read_text(errors="replace"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def yaml_save(path, data):
    with open(path, "w") as f:
        yaml.safe_dump({k: str(v) if isinstance(v, Path) else v for k, v in data.items()}, f, sort_keys=False)


def find_file(name, *folders):
    """Return `name` if it exists, else the first `folder/name` that does; otherwise raise ConfigError."""
    p = Path(name)
    if p.is_file():
        return p
    for folder in folders:
        q = ROOT / folder / p.name
        if q.is_file():
            return q
    raise ConfigError(f"{name}: file not found (also looked in {', '.join(str(ROOT / f) for f in folders)})")


def increment_path(path, exist_ok=False, mkdir=False):
    """runs/train/exp -> runs/train/exp2, exp3, ... (the first free name) unless exist_ok."""
    path = Path(path)
    if path.exists() and not exist_ok:
        n = 2
        while Path(f"{path}{n}").exists():
            n += 1
        path = Path(f"{path}{n}")
    if mkdir:
        path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_save(obj, path):
    """torch.save to a temp file in the same folder, then rename over `path`.

    A crash mid-save leaves the previous file intact: rename is atomic on POSIX when source and target share a
    file system, which is why the temp file sits beside the target.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
