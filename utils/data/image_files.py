"""Finding image/video files (folders, globs, list files) and the official image -> label path rule."""

import glob
import hashlib
import os
from pathlib import Path

IMG_FORMATS = frozenset({"bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm"})
VID_FORMATS = frozenset({"asf", "avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "ts", "wmv", "webm"})


def suffix(path):
    return Path(path).suffix[1:].lower()


def _read_list_file(path):
    """Lines of a list file, relative entries taken relative to the list file's folder (official './x.jpg')."""
    parent = path.parent
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            p = Path(line)
            out.append(str(p if p.is_absolute() else (parent / p).resolve()))
    return out


def _expand(entry):
    """One source entry -> candidate file paths (not yet filtered by format)."""
    s = str(entry)
    if any(c in s for c in "*?["):
        return sorted(glob.glob(s, recursive=True))
    p = Path(s)
    if p.is_dir():
        return sorted(str(f) for f in p.rglob("*") if f.is_file())
    if p.is_file():
        if suffix(p) == "txt":
            files = []
            for line in _read_list_file(p):
                files += _expand(line) if Path(line).is_dir() or any(c in line for c in "*?[") else [line]
            return files
        return [str(p)]
    raise FileNotFoundError(f"{s} does not exist")


def list_files(source, formats=IMG_FORMATS):
    """Files with a suffix in `formats` from a path, folder (recursive), glob, list .txt, or a list of those;
    folders and globs expand in sorted order, lists keep theirs.

    Raises FileNotFoundError naming the source when an entry is missing or nothing usable is found.
    """
    entries = source if isinstance(source, (list, tuple)) else [source]
    files = []
    for entry in entries:
        files += _expand(entry)
    files = list(dict.fromkeys(os.path.normpath(f) for f in files if suffix(f) in formats))  # given order, no repeats
    if not files:
        raise FileNotFoundError(f"no supported files found in {source} (formats: {', '.join(sorted(formats))})")
    return files


def img2label_paths(img_paths):
    """The official rule: the last /images/ in the path becomes /labels/ and the suffix becomes .txt."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return [sb.join(p.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt" for p in img_paths]


def files_hash(paths, extra=""):
    """A hash of the paths plus each existing file's size and modification time: changes when any file does."""
    h = hashlib.sha256(str(extra).encode())
    for p in paths:
        h.update(p.encode())
        try:
            st = os.stat(p)
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(b"missing")
    return h.hexdigest()
