"""Run folders, atomic saves and YAML I/O with errors that name the file."""

import errno
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import torch
import yaml

from utils.budget import MAX_YAML_BYTES, MAX_YAML_NODES
from utils.errors import BadFile

ROOT = Path(__file__).resolve().parents[1]  # repository root


class ConfigError(BadFile):
    """A configuration file (dataset, model or hyperparameter YAML) is missing or malformed."""


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a mapping holding one key twice: PyYAML keeps the last value without a word, so a
    second `train:` or `lr0:` further down a file would silently override the first. A document whose aliases
    unfold to more than MAX_YAML_NODES values (a few lines of `&a [*b, *b]` describe billions: any walk of the
    result, a copy, a save, takes them all) or that contains itself is refused before anything is built from it."""

    def construct_document(self, node):
        _check_unfolded(node)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        first = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                line = first.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class names it
                continue
            if line != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} (first on line {line + 1})",
                                                        key_node.start_mark)
        return super().construct_mapping(node, deep)


def _check_unfolded(root):
    """yaml.YAMLError unless the node graph `root` unfolds (every alias copied out) to at most MAX_YAML_NODES."""
    size, on_path, todo = {}, set(), [(root, False)]
    while todo:
        node, leaving = todo.pop()
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
        if leaving:
            on_path.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            if size[id(node)] > MAX_YAML_NODES:
                raise yaml.YAMLError(f"its aliases unfold to more than {MAX_YAML_NODES} values")
        elif id(node) in on_path:
            raise yaml.YAMLError("an alias refers to a value that contains it")
        elif id(node) not in size:
            on_path.add(id(node))
            todo.append((node, True))
            todo.extend((c, False) for c in children)


def parse_yaml(text, label):
    """The YAML document `text` read strictly (UniqueKeyLoader); broken YAML, a duplicate key, aliases that unfold
    beyond the budget and nesting deeper than Python's parser goes raise ConfigError naming `label` and the line."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{label}:{where} invalid YAML ({getattr(e, 'problem', None) or e})") from None
    except RecursionError:
        raise ConfigError(f"{label}: invalid YAML (it nests deeper than any configuration does)") from None


def yaml_text(path):
    """The text of a YAML file; bytes that are not UTF-8 raise ConfigError naming the offset (replacing them would
    change a class name or a path without a word). A UTF-8 byte order mark is accepted. A file larger than
    MAX_YAML_BYTES is refused unread."""
    size = os.stat(path).st_size
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: {size} bytes, more than the {MAX_YAML_BYTES} of any configuration file")
    with open(path, "rb") as f:
        data = f.read(MAX_YAML_BYTES + 1)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def yaml_load(path):
    """Read a YAML mapping; a missing file, broken YAML or a duplicate key raises ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    data = parse_yaml(yaml_text(path), path)
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


def atomic_copy(src, dst):
    """`dst` becomes a copy of the file `src`, published by `publish`'s rename. A hard link where the file system has
    them (no bytes written again), else a copied and fsynced file. A link is a true copy here because nothing here
    rewrites a file in place: every writer replaces it by rename, which leaves the other name on the old content."""

    def build(tmp):
        try:
            os.link(src, tmp)
        except OSError:  # no hard links (some FUSE and SMB mounts) or another file system
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())

    publish(dst, build, replace=True)


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
    # temp files of saves and copies (`atomic_copy`) killed before their rename (a SIGKILL runs no except clause);
    # one writer per file
    for stale in path.parent.glob(f".{path.name}.*.tmp*"):
        stale.unlink(missing_ok=True)


def _remove(path):
    """Best-effort removal of a temporary file or folder: a read-only or vanished one is not an error."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def is_published(path):
    """A file, or a folder with something in it (an empty folder is a placeholder a folder may be renamed over)."""
    path = Path(path)
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def temp_sibling(target):
    """A temporary name beside `target`, unique across processes and machines (pids repeat across nodes); it keeps
    the target's suffix for writers that add their own (np.save)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp{target.suffix}")


def publish(target, build, replace=False):
    """Make `target` (a file or a folder) exist: `build(tmp)` writes it under a temporary name beside the target,
    then one rename publishes it. Returns True if this call published it, False if it was already there.

    Safe when several processes, on one machine or on several sharing the filesystem (NFS, Lustre), do it at once:
    each builds its own uniquely named copy, and rename within one folder is atomic there, so the target name only
    ever points at a finished build and no reader sees a half-written one. A folder is renamed only onto a missing or
    empty target: the process whose rename finds a published folder drops its copy and uses the one there. A file
    rename replaces, which is harmless because concurrent builds of one target write the same content; with
    `replace=True` a file is rebuilt even if it exists (a stale label cache).

    No file lock on purpose: fcntl/flock locks are unreliable on some network filesystems (NFSv3 without lockd,
    FUSE mounts) and a crashed holder leaves them stale. The cost is that processes racing for the same target may
    each do the work once. A lock would be needed only for work that must happen exactly once or whose results
    differ between processes, which nothing here does.
    """
    target = Path(target)
    if not replace and is_published(target):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(target)
    try:
        build(tmp)
        if tmp.is_dir():
            try:
                os.rename(tmp, target)
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not is_published(target):
                    raise
                return False  # another process published it first
        else:
            os.replace(tmp, target)
        return True
    finally:
        _remove(tmp)  # a no-op after a successful rename
