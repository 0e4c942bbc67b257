"""Fetching and unpacking dataset archives (the `download:` entries of dataset YAMLs) and weights files.

Several processes, also on several machines sharing the dataset folder, may run the same download at once: each
fetches into its own temporary file and unpacks into its own temporary folder, and everything becomes visible under
its final name by rename only (utils.files.publish), so nobody reads a half-written file.
"""

import errno
import os
import shutil
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from utils.files import publish, temp_sibling
from utils.loggers import LOGGER


def _fetch_into(url, path, retries):
    for attempt in range(1, retries + 1):
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(path, "wb") as f:
                shutil.copyfileobj(r, f, length=1 << 20)
            return
        except OSError as e:
            if attempt == retries:
                raise OSError(f"download of {url} failed after {retries} attempts: {e}") from e
            LOGGER.warning(f"download of {url} failed ({e}), retrying {attempt}/{retries - 1}...")
            time.sleep(2 * attempt)


def fetch(url, dest, retries=3):
    """Download `url` to the file `dest` unless it is already there; True if this call wrote it."""
    return publish(dest, lambda tmp: _fetch_into(url, tmp, retries))


def _inside(root, member):
    """Archive member paths must stay under the extraction folder (no '../' escapes)."""
    target = (root / member).resolve()
    return target == root or root in target.parents


def unpack(archive, dest):
    """Extract a .zip / .tar / .tar.gz / .tgz into `dest`."""
    archive, dest = Path(archive), Path(dest).resolve()
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            bad = [m for m in z.namelist() if not _inside(dest, m)]
            if bad:
                raise ValueError(f"{archive}: refusing to extract paths outside {dest}: {bad[:3]}")
            z.extractall(dest)
    else:
        with tarfile.open(archive) as t:
            bad = [m.name for m in t.getmembers() if not _inside(dest, m.name) or m.issym() or m.islnk()]
            if bad:
                raise ValueError(f"{archive}: refusing to extract links or paths outside {dest}: {bad[:3]}")
            t.extractall(dest)


def is_archive(path):
    name = str(path).lower()
    return name.endswith((".zip", ".tar", ".tar.gz", ".tgz"))


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


def _unpack_into(archive, dir):
    """Unpack into a temporary folder beside the content, then move the result into `dir` (see _move_into)."""
    tmp = temp_sibling(dir / Path(archive).name)
    try:
        unpack(archive, tmp)
        _move_into(tmp, dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download(urls, dir=".", unzip=True, delete=True, threads=1):
    """Download each URL into `dir` (skipping files already there), then unpack archives into `dir`."""
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)

    def one(url):
        dest = dir / Path(urllib.parse.urlparse(url).path).name
        if not dest.exists():
            LOGGER.info(f"Downloading {url} to {dest}...")
            fetch(url, dest)
        if unzip and is_archive(dest):
            LOGGER.info(f"Unpacking {dest}...")
            try:
                _unpack_into(dest, dir)
            except FileNotFoundError:
                if dest.exists():
                    raise  # else another process unpacked this archive and deleted it: its content is in place
            if delete:
                dest.unlink(missing_ok=True)

    urls = [urls] if isinstance(urls, (str, Path)) else list(urls)
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, urls))
    else:
        for u in urls:
            one(u)
