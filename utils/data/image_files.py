"""Finding image/video files (folders, globs, list files), the official image -> label path rule, and the
`--cache disk` copy of an image."""

import errno
import glob
import hashlib
import os
import re
import stat
from pathlib import Path

import numpy as np

from utils.budget import MAX_IMAGE_PIXELS
from utils.files import publish

IMG_FORMATS = frozenset({"bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm"})
VID_FORMATS = frozenset({"asf", "avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "ts", "wmv", "webm"})
MEDIA_FORMATS = IMG_FORMATS | VID_FORMATS
# x.jpg -> x.jpg.yolo-engine.npy, not the official repos' x.npy: that name is shared by x.jpg and x.png, and may be a
# user's own array (a depth map) that the cache would read as the image or overwrite
DISK_CACHE_SUFFIX = ".yolo-engine.npy"


MISSING = "missing"  # entry_problem's answer for a path that does not exist (and is no symlink)


def suffix(path):
    """Path(path).suffix without its dot, lower case; as pathlib finds it (a last '.' neither first nor last in the
    name), without building a Path: a split's listing asks it twice per file."""
    name = os.path.basename(os.fspath(path).rstrip("/"))
    i = name.rfind(".")
    return name[i + 1:].lower() if 0 < i < len(name) - 1 else ""


def entry_problem(path):
    """'' when `path` is a readable regular file (directly or through symlinks), MISSING when nothing is there, else
    what it is instead: a folder, a dangling symlink, a symlink loop, a device/pipe/socket, or unreadable."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "is a dangling symlink (its target is missing)" if os.path.islink(path) else MISSING
    except OSError as e:
        return "is a symlink loop" if e.errno == errno.ELOOP else f"cannot be read ({e.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a device, pipe or socket)"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return ""


def _read_list_file(path):
    """Lines of a list file, relative entries taken relative to the list file's folder (official './x.jpg'). The
    lines are file names, so bytes that are not UTF-8 are kept as the names they are (surrogate escapes). A darknet
    list names its files from darknet's folder, in whose data/ the dataset lies (CVAT's YOLO 1.1 export:
    `data/obj_train_data/x.jpg` in train.txt beside obj_train_data/): an entry `data/...` that is not found from the
    list's folder but is without that prefix is read so. An entry found from neither but from the working folder is
    read from there: a list written for `--source` names files as the command line does (Ultralytics reads both)."""
    parent = path.parent
    out = []
    for line in os.fsdecode(path.read_bytes()).splitlines():
        line = line.strip()
        if line:
            p = Path(line)
            if not p.is_absolute() and not (parent / p).exists():
                if line.startswith("data/") and (parent / line[5:]).exists():
                    p = Path(line[5:])
                elif p.exists():
                    p = p.resolve()
            out.append(str(p if p.is_absolute() else (parent / p).resolve()))
    return out


SUBFOLDER = "a sub-folder, not read"  # the reason a non-recursive scan gives for the folders it meets


def _walk(folder, others, recursive=True):
    """Every entry under `folder` that is not itself a folder, plus folders named like an image file (which the
    scan then names as such). Symlinked folders are followed, each real folder entered once (a link back up is not
    a loop); a folder that cannot be listed goes to `others` with the reason. Not `recursive`: the folder's own
    entries, its sub-folders going to `others` as SUBFOLDER."""
    found, seen = [], set()

    def visit(d):
        try:
            st = os.stat(d)
            if (st.st_dev, st.st_ino) in seen:
                return
            seen.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(d))
        except OSError as e:
            others.append((d, f"folder cannot be read ({e.strerror})"))
            return
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:  # a symlink loop: a candidate, which the scan then names
                is_dir = False
            if is_dir and not recursive:
                others.append((entry.path, SUBFOLDER))
            elif is_dir:
                if suffix(entry.name) in MEDIA_FORMATS:
                    found.append(entry.path)
                visit(entry.path)
            else:
                found.append(entry.path)

    visit(str(folder))
    return sorted(found)


def _glob(pattern, others):
    """The paths `pattern` matches, as glob.glob(recursive=True) finds them (`**`: any number of folders; wildcards
    skip hidden names), except that each real folder under a `**` is entered once, symlinked ones included:
    glob.glob follows links without end (two links to '.' make 2^depth paths, until names reach PATH_MAX)."""
    parts = pattern.split("/")
    if "**" not in parts:
        return glob.glob(pattern)
    i = parts.index("**")
    head, rest = "/".join(parts[:i]) + "/" if i else "", parts[i:]
    rx = re.compile("".join(_glob_part(p, last=j == len(rest) - 1) for j, p in enumerate(rest)))
    found = []
    for base in glob.glob(head) if glob.has_magic(head) else [head]:
        if os.path.isdir(base or "."):
            found += [f for f in _walk(base or ".", others) if rx.fullmatch(os.path.relpath(f, base or "."))]
    return [f.removeprefix("./") if not head else f for f in found]


def _glob_part(part, last):
    """A regular expression for one `/`-separated part of a glob pattern, with its `/` unless it is the last."""
    if part == "**":
        return r"(?:[^/.][^/]*(?:/[^/.][^/]*)*)?" if last else r"(?:[^/.][^/]*/)*"
    rx, i = "" if part.startswith(".") else r"(?!\.)", 0
    while i < len(part):
        c, i = part[i], i + 1
        end = part.find("]", i + 1) if c == "[" else -1
        if c == "*":
            rx += "[^/]*"
        elif c == "?":
            rx += "[^/]"
        elif end > 0:
            inside = part[i:end].replace("\\", "\\\\").replace("[", "\\[")
            if inside[0] in "!^":  # glob's negation is '!'; a '^' there is the character itself
                inside = "^" + inside[1:] if inside[0] == "!" else "\\" + inside
            rx += f"[{inside}]"
            i = end + 1
        else:
            rx += re.escape(c)
    return rx if last else rx + "/"


def _expand(entry, others, recursive=True):
    """One source entry -> candidate file paths (not yet filtered by format); problems met go to `others`. A folder
    is walked into its sub-folders when `recursive`; a glob goes where it says (`**` for any depth)."""
    s = str(entry)
    if any(c in s for c in "*?["):
        return [f for f in sorted(_glob(s, others)) if not os.path.isdir(f) or suffix(f) in MEDIA_FORMATS]
    p = Path(s)
    if p.is_dir():
        return _walk(p, others, recursive)
    if p.is_file():
        if suffix(p) == "txt":
            files = []
            for line in _read_list_file(p):
                is_many = Path(line).is_dir() or any(c in line for c in "*?[")
                files += _expand(line, others, recursive) if is_many else [line]
            return files
        return [str(p)]
    raise FileNotFoundError(f"{s} does not exist")


def _is_own_cache(f, files):
    """An image's `--cache disk` copy (x.jpg.yolo-engine.npy beside x.jpg): written by this project, not a stray
    file."""
    return f.endswith(DISK_CACHE_SUFFIX) and f.removesuffix(DISK_CACHE_SUFFIX) in files


def scan_files(source, formats=IMG_FORMATS, recursive=True):
    """(files, others) from a path, folder (with its sub-folders when `recursive`, symlinked folders followed), glob,
    list .txt, or a list of those: `files` has a suffix in `formats` (whatever it turns out to be: the scan says
    what is wrong with a folder or dangling link named x.jpg), in sorted order for folders and globs, as listed for
    lists; `others` is (path, reason) for every other entry met, so that nothing is left out without a word.

    Raises FileNotFoundError naming an entry that does not exist."""
    entries = source if isinstance(source, (list, tuple)) else [source]
    found, others = [], []
    for entry in entries:
        found += _expand(entry, others, recursive)
    found, seen = [os.path.normpath(f) for f in found], set()
    others += [(f, "a repeated entry (used once)") for f in found if f in seen or seen.add(f)]
    found = list(dict.fromkeys(found))  # given order, no repeats
    files = [f for f in found if suffix(f) in formats]
    file_set = set(files)
    for f in found:
        if suffix(f) not in formats and not _is_own_cache(f, file_set):
            why = f"suffix '.{suffix(f)}' is not an image format" if suffix(f) else "no image suffix"
            others.append((f, why))
    return files, others


def class_folders(split_dir, hidden=None):
    """The sorted class folder names of a classification split (symlinked folders included). Hidden folders
    (`.ipynb_checkpoints`, `.git`) are no classes: their paths go to the list `hidden` when given."""
    names = []
    for e in os.scandir(split_dir):
        try:
            is_dir = e.is_dir()
        except OSError:  # a symlink loop
            is_dir = False
        if is_dir and e.name.startswith("."):
            if hidden is not None:
                hidden.append(e.path)
        elif is_dir:
            names.append(e.name)
    return sorted(names)


def disk_cache_path(im_file):
    """Where `--cache disk` keeps the decoded pixels of `im_file`: beside it, named DISK_CACHE_SUFFIX."""
    return Path(f"{im_file}{DISK_CACHE_SUFFIX}")


def read_disk_cache(npy_file, im_file, mmap_mode=None):
    """The pixels `--cache disk` saved for `im_file`, or None where they cannot be trusted: no file, one older than
    the image (edited since), or one that is not an (h, w, 3) uint8 array (cut short, garbage, another program's).
    mmap_mode='r' checks the file without reading its pixels. The file is mapped before it is read: a header
    declaring more than the file holds, or more pixels than an image may have, allocates nothing."""
    try:
        if os.stat(npy_file).st_mtime_ns < os.stat(im_file).st_mtime_ns:
            return None
        im = np.load(npy_file, mmap_mode="r", allow_pickle=False)  # a pickle could run code: never loaded
    except (OSError, ValueError, EOFError):  # what np.load raises on a truncated, garbage or pickled file
        return None
    ok = im.dtype == np.uint8 and im.ndim == 3 and im.shape[2] == 3 and im.shape[0] * im.shape[1] <= MAX_IMAGE_PIXELS
    return None if not ok else im if mmap_mode else np.array(im)


def write_disk_cache(npy_file, im):
    """Save `im` where read_disk_cache finds it, replacing a stale or broken copy. Published by rename: a worker
    killed mid-write leaves the old file or none, never half an array."""
    publish(npy_file, lambda tmp: np.save(tmp, im, allow_pickle=False), replace=True)


def img2label_paths(img_paths):
    """The official rule: the last /images/ in the path becomes /labels/ and the suffix becomes .txt."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return [sb.join(p.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt" for p in img_paths]


def files_hash(paths, extra=""):
    """A hash of the paths plus each existing file's size and modification time: changes when any file does."""
    h = hashlib.sha256(str(extra).encode())
    for p in paths:
        h.update(os.fsencode(p))  # the name's bytes as on disk, whatever their encoding (surrogate-escaped in str)
        try:
            st = os.stat(p)
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(b"missing")
    return h.hexdigest()
