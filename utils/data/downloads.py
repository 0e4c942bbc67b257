"""Fetching and unpacking dataset archives (the `download:` entries of dataset YAMLs) and weights files.

Several processes, also on several machines sharing the dataset folder, may run the same download at once: each
fetches into its own temporary file and unpacks into its own temporary folder, and everything becomes visible under
its final name by rename only (utils.files.publish), so nobody reads a half-written file.

A dataset download delivers data, nothing else (`download`): what it fetches must be a zip or tar archive by its
content, and only data files (DATA_SUFFIXES: images, videos, labels, annotations) are unpacked, as plain files
without modes or owners, and only inside the folder the caller names; the archive is deleted after. An archive
holding a link, a device node, a FIFO or a setuid/setgid file is refused whole (no dataset needs one); other files
(code, libraries, `.pth`, licences) are left out with one warning naming them.
"""

import errno
import http.client
import os
import shutil
import stat
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from utils.data.image_files import IMG_FORMATS, VID_FORMATS, suffix
from utils.errors import BadDataset, BadFile
from utils.files import publish, temp_sibling
from utils.loggers import LOGGER

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
DATA_SUFFIXES = IMG_FORMATS | VID_FORMATS | {"txt", "json", "yaml", "yml", "csv", "xml"}


class UnsafeArchive(BadDataset):
    """A downloaded file that is not a data archive, or an archive holding what no dataset needs."""


class DownloadFailed(BadFile):
    """A URL the user named (a --source, an official weights name, a dataset YAML's `download:`) could not be
    fetched: no network, a refused connection, an HTTP error. The user's or the machine's to fix, not a bug."""


def _reason(e):
    """What went wrong, without urllib's wrapping: '[Errno 111] Connection refused', 'HTTP Error 404: Not Found'."""
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        return str(e.reason)
    return str(e)


def _fetch_into(url, path, retries):
    for attempt in range(1, retries + 1):
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(path, "wb") as f:
                shutil.copyfileobj(r, f, length=1 << 20)
                # urllib ends an HTTP body cut short by the server without a word: this file is not whole
                # (a file:// reply has no length to check)
                left = getattr(r, "length", None)
                if left:
                    raise OSError(f"the connection closed with {left} bytes of the file still to come")
            return
        except (OSError, http.client.HTTPException) as e:  # HTTPException: a malformed URL or reply
            if attempt == retries:
                raise DownloadFailed(f"download of {url} failed after {retries} attempts: {_reason(e)}") from e
            LOGGER.warning(f"download of {url} failed ({_reason(e)}), retrying {attempt}/{retries - 1}...")
            time.sleep(2 * attempt)


def fetch(url, dest, retries=3):
    """Download `url` to the file `dest` unless it is already there; True if this call wrote it."""
    return publish(dest, lambda tmp: _fetch_into(url, tmp, retries))


def _within(folder, path):
    """True if `path` (resolved) is `folder` or lies under it."""
    return path == folder or folder in path.parents


def _zip_members(z):
    """[(name, is_file, unix mode)] of a zip (the mode is in the high bits of external_attr where a Unix tool
    wrote it, else 0)."""
    return [(i.filename, not i.is_dir(), i.external_attr >> 16) for i in z.infolist()]


def _tar_members(t):
    return [(m.name, m.isfile(), m.mode | (stat.S_IFREG if m.isfile() else stat.S_IFDIR if m.isdir() else
                                            stat.S_IFLNK)) for m in t.getmembers()]


def _select(archive, members, dest, within):
    """The member names to unpack: regular data files inside `within` (a folder under or equal to `dest`). Refuses
    (UnsafeArchive) links, devices, FIFOs, setuid/setgid files and paths leaving `dest`; leaves out other files and
    files outside `within` with one warning."""
    keep, left_out = [], []
    for name, is_file, mode in members:
        kind = stat.S_IFMT(mode)
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR) or mode & (stat.S_ISUID | stat.S_ISGID):
            raise UnsafeArchive(f"{archive.name}: refusing to unpack {name!r} (a link, device, FIFO or setuid/setgid "
                                "file, which no dataset needs)")
        target = (dest / name).resolve()
        if not _within(dest, target):
            raise UnsafeArchive(f"{archive.name}: refusing to unpack {name!r}, which leads outside {dest}")
        if is_file:
            (keep if suffix(name) in DATA_SUFFIXES and _within(within, target) else left_out).append(name)
    if left_out:
        LOGGER.warning(f"{archive.name}: left out {len(left_out)} files that are not data or lie outside {within.name}:"
                       f" {', '.join(left_out[:5])}{', ...' if len(left_out) > 5 else ''}")
    return keep


def unpack(archive, dest, within=None):
    """Unpack the data files of a zip or tar archive (decided by its content) into `dest`, each of them inside
    `within` (default: `dest`). UnsafeArchive for anything else."""
    archive, dest = Path(archive), Path(dest).resolve()
    within = Path(within).resolve() if within else dest
    with open(archive, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if is_zip:
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest, members=_select(archive, _zip_members(z), dest, within))  # zipfile writes no modes
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as t:
            keep = set(_select(archive, _tar_members(t), dest, within))
            t.extractall(dest, members=[m for m in t.getmembers() if m.name in keep], filter="data")
    else:
        raise UnsafeArchive(f"{archive.name}: not a zip or tar archive; a dataset download must be one")


def is_archive(path):
    return str(path).lower().endswith(ARCHIVE_SUFFIXES)


def _move_into(src, dst):
    """Move the tree `src` into the folder `dst` by renames: a missing folder moves whole, an existing one is merged
    entry by entry, files replace. Another process merging the same archive at once gives the same result."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        target = dst / entry.name
        if entry.is_dir() and not entry.is_symlink():
            try:
                os.rename(entry, target)
                continue
            except OSError as e:  # the folder exists (maybe just published by another process): merge into it
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR) or not target.is_dir():
                    raise
            _move_into(entry, target)
        else:
            os.replace(entry, target)


def _unpack_into(archive, dir, within):
    """Unpack into a temporary folder beside the content, then move the result into `dir` (see _move_into)."""
    tmp = temp_sibling(dir / Path(archive).name)
    try:
        unpack(archive, tmp, tmp / within.relative_to(dir))
        _move_into(tmp, dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download(urls, dir=".", threads=1, within=None):
    """Download each archive URL into `dir` (skipping files already there), unpack its data files into `dir`, each
    inside the folder `within` (default `dir`; the dataset root for archives that hold the dataset folder itself),
    and delete the archive, also when it is refused."""
    dir = Path(dir)
    within = Path(within) if within else dir
    dir.mkdir(parents=True, exist_ok=True)

    def one(url):
        dest = dir / Path(urllib.parse.urlparse(url).path).name
        if not is_archive(dest):
            raise UnsafeArchive(f"{url}: does not name a zip or tar archive; a dataset download must be one")
        if not dest.exists():
            LOGGER.info(f"Downloading {url} to {dest}...")
            fetch(url, dest)
        LOGGER.info(f"Unpacking {dest}...")
        try:
            _unpack_into(dest, dir, within)
        except FileNotFoundError:
            if dest.exists():
                raise  # else another process unpacked this archive and deleted it: its content is in place
        finally:
            dest.unlink(missing_ok=True)

    urls = [urls] if isinstance(urls, (str, Path)) else list(urls)
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, urls))
    else:
        for u in urls:
            one(u)
