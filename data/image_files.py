"""Finding image/video files (folders, globs, list files), the official image -> label path rule, and the
`--cache disk` copy of an image."""

import errno
import fnmatch
import glob
import hashlib
import os
import re
import stat
import time
from pathlib import Path

import numpy as np

from utils.budget import MAX_IMAGE_PIXELS, MAX_LIST_BYTES, MAX_SCAN_ENTRIES, SCAN_NOTE_SECONDS
from utils.errors import BadDataset, BadFile
from utils.files import publish
from utils.imageio import printable
from utils.log import LOGGER

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


class ListingTooLarge(BadFile):
    """A listing beyond the budget (docs/safety.md): a list file over MAX_LIST_BYTES, or a scan meeting more than
    MAX_SCAN_ENTRIES entries. No OSError: a folder that cannot be read is noted and passed, this ends the scan."""


class _Scan:
    """One scan_files call's count of the entries it meets (list lines, folder entries, glob matches; a folder or
    glob met again is counted again): past MAX_SCAN_ENTRIES it is refused, and one running longer than
    SCAN_NOTE_SECONDS says how far it has got, every SCAN_NOTE_SECONDS."""

    def __init__(self, source):
        self.source, self.entries = source, 0
        self.start = self.noted = time.monotonic()

    def met(self, n):
        self.entries += n
        if self.entries > MAX_SCAN_ENTRIES:
            raise ListingTooLarge(f"{printable(self.source)}: listing it meets more than {MAX_SCAN_ENTRIES} entries "
                                  "(list lines, folder entries and glob matches, repeats counted; docs/safety.md): "
                                  "name fewer or smaller folders, each once")
        now = time.monotonic()
        if now - self.noted > SCAN_NOTE_SECONDS:
            self.noted = now
            LOGGER.info(f"listing {printable(self.source)}: {self.entries} entries so far ({now - self.start:.0f} s)")

    def listdir(self, d):
        """[(path, is_dir)] of folder `d`'s entries, counted (is_dir False for a symlink loop, which the scan then
        names); OSError where it cannot be listed."""
        with os.scandir(d) as it:
            entries = list(it)
        self.met(len(entries))
        out = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            out.append((entry.path, is_dir))
        return out


def _read_list_file(path, others, scan):
    """Lines of a list file, relative entries taken relative to the list file's folder (official './x.jpg'), each
    once (a line repeated goes to `others`): one folder named 60 times is listed once. The lines are file names, so
    bytes that are not UTF-8 are kept as the names they are (surrogate escapes). A darknet
    list names its files from darknet's folder, in whose data/ the dataset lies (CVAT's YOLO 1.1 export:
    `data/obj_train_data/x.jpg` in train.txt beside obj_train_data/): an entry `data/...` that is not found from the
    list's folder but is without that prefix is read so. An entry found from neither but from the working folder is
    read from there: a list written for `--source` names files as the command line does (Ultralytics reads both).
    A list over MAX_LIST_BYTES is refused unread; its lines count against the scan's entries as they are read."""
    size = os.stat(path).st_size
    if size > MAX_LIST_BYTES:
        raise ListingTooLarge(f"{printable(path)}: a list file of {size} bytes, more than the {MAX_LIST_BYTES} a list "
                              "may hold (docs/safety.md)")
    parent = path.parent
    out = {}
    with open(path, "rb") as f:
        for raw in f:
            scan.met(1)
            line = os.fsdecode(raw).strip()
            if "\0" in line:
                others.append((line, NUL_BYTE))
            elif line:  # os.path's tests: a name too long for the system is no error here (the scan names it)
                p = Path(line)
                if not p.is_absolute() and not os.path.exists(parent / p):
                    if line.startswith("data/") and os.path.exists(parent / line[5:]):
                        p = Path(line[5:])
                    elif os.path.exists(p):
                        p = p.resolve()
                entry = str(p if p.is_absolute() else (parent / p).resolve())
                if entry in out:
                    others.append((entry, "a repeated entry (used once)"))
                out[entry] = None
    return list(out)


SUBFOLDER = "a sub-folder, not read"  # the reason a non-recursive scan gives for the folders it meets
NUL_BYTE = "holds a NUL byte, which no file name can"  # what is wrong with such a list line or entry


def _walk(folder, others, scan, recursive=True):
    """Every entry under `folder` that is not itself a folder, plus folders named like an image file (which the
    scan then names as such). Symlinked folders are followed, each real folder entered once (a link back up is not
    a loop); a folder that cannot be listed goes to `others` with the reason. Not `recursive`: the folder's own
    entries, its sub-folders going to `others` as SUBFOLDER. Entries are counted by `scan`; folders are entered
    from a list, not by recursion, so any depth is walked."""
    found, seen, todo = [], set(), [str(folder)]
    while todo:
        d = todo.pop()
        try:
            st = os.stat(d)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = scan.listdir(d)
        except OSError as e:
            others.append((d, f"folder cannot be read ({e.strerror})"))
            continue
        for path, is_dir in entries:
            if is_dir and not recursive:
                others.append((path, SUBFOLDER))
            elif is_dir:
                if suffix(path) in MEDIA_FORMATS:
                    found.append(path)
                todo.append(path)
            else:
                found.append(path)
    return sorted(found)


def _glob(pattern, others, scan):
    """The paths `pattern` matches, as glob.glob(recursive=True) finds them (`**`: any number of folders; wildcards
    skip hidden names), except that each real folder under a `**` is entered once, symlinked ones included:
    glob.glob follows links without end (two links to '.' make 2^depth paths, until names reach PATH_MAX). Every
    folder a wildcard looks into is counted by `scan`, matched or not."""
    parts = pattern.split("/")
    if "**" not in parts:
        return _match(parts, scan)
    i = parts.index("**")
    rest = [None if p == "**" else _name_rx(p) for p in parts[i:]]
    found = []
    for base in _match(parts[:i], scan, folders=True) if i else [""]:
        if os.path.isdir(base or "."):
            found += [f for f in _walk(base or ".", others, scan)
                      if _names_match(os.path.relpath(f, base or ".").split(os.sep), rest)]
    return [f.removeprefix("./") if not i else f for f in found]


def _name_rx(part):
    """The regular expression of one glob part (a name, no '/'): fnmatch's, whose wildcards cannot backtrack without
    end (a part of 60 stars), matching no hidden name unless the part starts with '.', as glob does."""
    return re.compile(("" if part.startswith(".") else r"(?!\.)") + fnmatch.translate(part))


def _names_match(names, parts):
    """Whether the path components `names` match the glob `parts` (compiled names; None for `**`: any number of
    names that are not hidden), in time of len(names) x len(parts)."""
    memo = {}

    def match(i, j):
        if (i, j) not in memo:
            if j == len(parts):
                memo[i, j] = i == len(names)
            elif parts[j] is None:
                memo[i, j] = match(i, j + 1) or (i < len(names) and not names[i].startswith(".") and match(i + 1, j))
            else:
                memo[i, j] = i < len(names) and bool(parts[j].match(names[i])) and match(i + 1, j + 1)
        return memo[i, j]

    return match(0, 0)


def _match(parts, scan, folders=False):
    """The paths the `/`-separated glob `parts` (no `**`) match, each wildcard part matched against the listing of
    the folders before it, as glob.glob does; with `folders`, the folders they match, each ending in '/'."""
    paths = [""]
    for j, part in enumerate(parts):
        last = j == len(parts) - 1 and not folders
        if not glob.has_magic(part):
            paths = [f"{p}{part}{'' if last else '/'}" for p in paths]
            continue
        rx, matched = _name_rx(part), []
        for p in paths:
            if not os.path.isdir(p or "."):
                continue
            try:
                entries = scan.listdir(p or ".")
            except OSError:  # what glob.glob skips too
                continue
            for path, is_dir in entries:
                name = os.path.basename(path)
                if rx.match(name) and (last or is_dir):
                    matched.append(f"{p}{name}{'' if last else '/'}")
        paths = matched
    return [p for p in paths if os.path.lexists(p or ".")] if paths != [""] else []


def _expand(entry, others, scan, recursive=True):
    """One source entry -> candidate file paths (not yet filtered by format); problems met go to `others`. A folder
    is walked into its sub-folders when `recursive`; a glob goes where it says (`**` for any depth). FileNotFoundError
    for an entry that does not exist, or is no file nor folder (a FIFO named as --source would block its reader)."""
    s = str(entry)
    if "\0" in s:
        raise FileNotFoundError(f"{printable(s)} {NUL_BYTE}")
    if any(c in s for c in "*?["):
        return [f for f in sorted(_glob(s, others, scan)) if not os.path.isdir(f) or suffix(f) in MEDIA_FORMATS]
    p = Path(s)
    if os.path.isdir(s):
        return _walk(p, others, scan, recursive)
    if os.path.isfile(s):
        if suffix(s) == "txt":
            files = []
            for line in _read_list_file(p, others, scan):
                is_many = os.path.isdir(line) or any(c in line for c in "*?[")
                files += _expand(line, others, scan, recursive) if is_many else [line]
            return files
        return [s]
    why = entry_problem(s)
    raise FileNotFoundError(f"{printable(s)} {'does not exist' if why in ('', MISSING) else why}")


def _is_own_cache(f, files):
    """An image's `--cache disk` copy (x.jpg.yolo-engine.npy beside x.jpg): written by this project, not a stray
    file."""
    return f.endswith(DISK_CACHE_SUFFIX) and f.removesuffix(DISK_CACHE_SUFFIX) in files


def scan_files(source, formats=IMG_FORMATS, recursive=True):
    """(files, others) from a path, folder (with its sub-folders when `recursive`, symlinked folders followed), glob,
    list .txt, or a list of those: `files` has a suffix in `formats` (whatever it turns out to be: the scan says
    what is wrong with a folder or dangling link named x.jpg), in sorted order for folders and globs, as listed for
    lists; `others` is (path, reason) for every other entry met, so that nothing is left out without a word.

    Raises FileNotFoundError naming an entry that does not exist (or is no file nor folder), ListingTooLarge (one)
    for a listing beyond the budget (docs/safety.md)."""
    entries = source if isinstance(source, (list, tuple)) else [source]
    found, others, scan = [], [], _Scan(source if len(entries) != 1 else entries[0])
    for entry in entries:
        found += _expand(entry, others, scan, recursive)
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
    """The official rule: the last /images/ in the path becomes /labels/ and the suffix becomes .txt. Two images that
    it gives one label file (x.jpg and x.png in one folder) are a BadDataset naming both: each would be trained on
    the other's objects, and one of them is usually a stray copy (a blank picture)."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    labels = [sb.join(p.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt" for p in img_paths]
    if len(set(labels)) < len(labels):
        first = {}
        shared = [(first[lb], im, lb) for im, lb in zip(img_paths, labels) if first.setdefault(lb, im) != im]
        a, b, lb = shared[0]
        more = f" ({len(shared)} such pairs)" if len(shared) > 1 else ""
        raise BadDataset(f"{printable(a)} and {printable(b)} would both take the label file {printable(lb)}{more}: "
                         "one label file cannot be both images'; rename or remove one of them")
    return labels


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
