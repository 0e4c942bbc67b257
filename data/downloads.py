"""Fetching and unpacking dataset archives (the `download:` entries of dataset YAMLs) and weights files.

Several processes, also on several machines sharing the dataset folder, may run the same download at once: each
fetches into its own temporary file and unpacks into its own temporary folder, and everything becomes visible under
its final name by rename only (utils.files.publish), so nobody reads a half-written file.

A dataset download delivers data, nothing else (`download`): what it fetches must be a zip or tar archive by its
content, and only data files (DATA_SUFFIXES: images, videos, labels, annotations) are unpacked, as plain files
without modes or owners, and only inside the folder the caller names; the archive is deleted after. An archive
holding a link, a device node, a FIFO, a setuid/setgid file or a sparse file is refused whole (no dataset needs one);
other files (code, libraries, `.pth`, licences) are left out with one warning naming them.

What a download may cost (utils/budget.py): its kind is decided on its first 512 bytes as they arrive, so a file that
is no archive is refused before the rest is fetched; nothing is written past the disk's free space less DISK_MARGIN;
an archive unpacks to at most ARCHIVE_RATIO times its size (at least ARCHIVE_FLOOR), counted on the sizes its
members declare (and the disk blocks each file takes) before one of them is written, and a compressed tar is
decompressed only that far. A refused download leaves nothing behind.
"""

import bz2
import errno
import gzip
import http.client
import io
import lzma
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

from data.image_files import IMG_FORMATS, VID_FORMATS, suffix
from utils.budget import ARCHIVE_FLOOR, ARCHIVE_RATIO, DISK_MARGIN
from utils.errors import BadDataset, BadFile
from utils.files import publish, temp_sibling
from utils.log import LOGGER

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


def free_bytes(folder):
    """What may still be written in `folder`: its disk's free space less DISK_MARGIN."""
    return shutil.disk_usage(folder).free - DISK_MARGIN


def _copy_body(r, f, url, accept):
    """Write the reply `r` to `f`: `accept(head)` judges its first 512 bytes before the rest comes, and nothing is
    written past the disk's room."""
    room = free_bytes(Path(f.name).parent)
    declared = getattr(r, "length", None)
    if declared and declared > room:
        raise DownloadFailed(f"download of {url}: {declared} bytes, more than the {max(room, 0)} this disk has free "
                             f"(keeping {DISK_MARGIN} free)")
    head = b""
    while accept is not None and len(head) < 512:
        block = r.read(512 - len(head))
        if not block:
            break
        head += block
    if accept is not None:
        accept(head)
    f.write(head)
    written = len(head)
    while block := r.read(1 << 20):
        written += len(block)
        if written > room:
            raise DownloadFailed(f"download of {url}: more than the {room} bytes this disk has free (keeping "
                                 f"{DISK_MARGIN} free)")
        f.write(block)


def _fetch_into(url, path, retries, accept=None):
    for attempt in range(1, retries + 1):
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(path, "wb") as f:
                _copy_body(r, f, url, accept)
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


def fetch(url, dest, retries=3, accept=None):
    """Download `url` to the file `dest` unless it is already there; True if this call wrote it. `accept(head)`, if
    given, judges the file's first 512 bytes (fewer if it is shorter) before the rest is fetched, and raises to
    refuse it; a refused or failed download leaves nothing at `dest`."""
    return publish(dest, lambda tmp: _fetch_into(url, tmp, retries, accept))


def _within(folder, path):
    """True if `path` (resolved) is `folder` or lies under it."""
    return path == folder or folder in path.parents


def archive_kind(head):
    """'zip', 'gz', 'bz2', 'xz' or 'tar' from a file's first 512 bytes (the magic numbers; a tar says `ustar` at
    offset 257), None for anything else."""
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    magics = {b"\x1f\x8b": "gz", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}
    kind = next((k for m, k in magics.items() if head.startswith(m)), None)
    return kind or ("tar" if head[257:262] == b"ustar" else None)


def check_archive_head(head, label):
    """UnsafeArchive unless `head` (a file's first bytes) starts a zip or tar archive."""
    if archive_kind(head) is None:
        raise UnsafeArchive(f"{label}: not a zip or tar archive by its first bytes; a dataset download must be one")


def _zip_members(z):
    """[(name, is_file, unix mode, size)] of a zip (the mode is in the high bits of external_attr where a Unix tool
    wrote it, else 0)."""
    return [(i.filename, not i.is_dir(), i.external_attr >> 16, i.file_size) for i in z.infolist()]


def _tar_members(t):
    return [(m.name, m.isfile(), m.mode | (stat.S_IFREG if m.isfile() else stat.S_IFDIR if m.isdir() else
                                            stat.S_IFLNK), m.size) for m in t.getmembers()]


UNPACK_TRIES = 3  # unpacking an archive that processes racing for it fetched anew and deleted meanwhile
BLOCK = 4096  # a file's disk blocks, and one more for its inode and folder entry
MAX_TAR_READ = 1 << 20  # one read from a tar: a header, a long name (a pax header of gigabytes would be read whole)


def _disk_cost(size):
    return (-(-size // BLOCK) + 1) * BLOCK


def unpack_budget(archive, dest):
    """Bytes an archive may unpack to: ARCHIVE_RATIO times its size (at least ARCHIVE_FLOOR), and what the disk of
    `dest` has free."""
    return min(max(ARCHIVE_FLOOR, ARCHIVE_RATIO * os.path.getsize(archive)), free_bytes(dest))


def _check_cost(archive, sizes, n_members, budget):
    """UnsafeArchive when the files to write (`sizes`, as the archive declares them) and a block for each of its
    `n_members` entries take more than `budget`."""
    need = sum(_disk_cost(n) for n in sizes) + BLOCK * (n_members - len(sizes))
    if need > budget:
        raise UnsafeArchive(f"{archive.name}: refusing to unpack {n_members} members of {need} bytes on disk, more "
                            f"than the {budget} it may take (at most {ARCHIVE_RATIO}x its size, within the disk's free "
                            "space)")


class _Bounded(io.RawIOBase):
    """A seekable (decompressed) stream for tarfile that ends the unpacking (UnsafeArchive) when read or sought past
    `limit` bytes, or asked for more than MAX_TAR_READ at once: decompression stops there."""

    def __init__(self, f, limit, label):
        super().__init__()
        self.f, self.limit, self.label = f, limit, label

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.f.tell()

    def _refuse(self, what):
        raise UnsafeArchive(f"{self.label}: refusing to unpack it: {what}, beyond the {self.limit} bytes it may "
                            f"unpack to (at most {ARCHIVE_RATIO}x its size)")

    def seek(self, pos, whence=0):
        if whence != 0:  # tarfile seeks to absolute offsets; the others are resolved to one first
            pos = self.f.tell() + pos if whence == 1 else self.f.seek(0, 2)
        if pos > self.limit:
            self._refuse(f"it holds more than {pos} bytes")
        return self.f.seek(pos)

    def read(self, n=-1):
        if n is None or n < 0 or n > MAX_TAR_READ:
            self._refuse(f"a header or name of {n} bytes")
        data = self.f.read(n)
        if self.f.tell() > self.limit:
            self._refuse(f"it holds more than {self.f.tell()} bytes")
        return data


_DECOMPRESS = {"gz": lambda f: gzip.GzipFile(fileobj=f), "bz2": bz2.BZ2File, "xz": lzma.LZMAFile}


def _open_tar(archive, kind, budget):
    raw = open(archive, "rb")
    stream = _DECOMPRESS[kind](raw) if kind in _DECOMPRESS else raw
    # the headers count against the budget too: a member costs a 512-byte header and padding besides its bytes
    return tarfile.open(fileobj=_Bounded(stream, budget, archive.name), mode="r:"), (stream, raw)


def _select(archive, members, dest, within):
    """The member names to unpack: regular data files inside `within` (a folder under or equal to `dest`). Refuses
    (UnsafeArchive) links, devices, FIFOs, setuid/setgid files and paths leaving `dest`; leaves out other files and
    files outside `within` with one warning."""
    keep, left_out = [], []
    for name, is_file, mode, _ in members:
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
    """Unpack the data files of a zip or tar archive (decided by its first bytes) into `dest`, each of them inside
    `within` (default: `dest`), within unpack_budget. UnsafeArchive for anything else."""
    archive, dest = Path(archive), Path(dest).resolve()
    within = Path(within).resolve() if within else dest
    with open(archive, "rb") as f:
        head = f.read(512)
    check_archive_head(head, archive.name)
    dest.mkdir(parents=True, exist_ok=True)
    budget = unpack_budget(archive, dest)
    if archive_kind(head) == "zip":
        with zipfile.ZipFile(archive) as z:  # zipfile writes no modes, and no member beyond its declared size
            members = _zip_members(z)
            keep = _select(archive, members, dest, within)
            _check_cost(archive, [m[3] for m in members if m[0] in set(keep)], len(members), budget)
            z.extractall(dest, members=keep)
        return
    t, streams = _open_tar(archive, archive_kind(head), budget)
    try:
        for n, m in enumerate(iter(t.next, None), 1):  # read up to the budget, a member at a time
            if m.issparse():
                raise UnsafeArchive(f"{archive.name}: refusing to unpack {m.name!r}, a sparse file (its holes would "
                                    "be written out in full; no dataset needs one)")
            _check_cost(archive, [], n, budget)
        members = _tar_members(t)
        keep = set(_select(archive, members, dest, within))
        _check_cost(archive, [m[3] for m in members if m[0] in keep], len(members), budget)
        t.extractall(dest, members=[m for m in t.getmembers() if m.name in keep], filter="data")
    finally:
        t.close()
        for s in streams:
            s.close()


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


def _unpack_shared(dest, dir, within):
    """`_unpack_into` of an archive that other processes may be fetching, unpacking and deleting at the same time."""
    for attempt in range(UNPACK_TRIES):
        try:
            return _unpack_into(dest, dir, within)
        except FileNotFoundError:
            if not dest.exists():
                return  # another process unpacked this archive and deleted it: its content is in place
            if attempt == UNPACK_TRIES - 1:
                raise
            # there again: a third process fetched it anew meanwhile (a fetch renames a whole file into place)


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
            fetch(url, dest, accept=lambda head: check_archive_head(head, url))
        LOGGER.info(f"Unpacking {dest}...")
        try:
            _unpack_shared(dest, dir, within)
        finally:
            dest.unlink(missing_ok=True)

    urls = [urls] if isinstance(urls, (str, Path)) else list(urls)
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, urls))
    else:
        for u in urls:
            one(u)
