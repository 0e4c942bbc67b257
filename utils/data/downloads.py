"""Fetching and unpacking dataset archives (the `download:` entries of dataset YAMLs)."""

import shutil
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from utils.loggers import LOGGER


def _fetch(url, dest, retries=3):
    part = dest.with_name(dest.name + ".part")
    for attempt in range(1, retries + 1):
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(part, "wb") as f:
                shutil.copyfileobj(r, f, length=1 << 20)
            part.replace(dest)
            return
        except OSError as e:
            part.unlink(missing_ok=True)
            if attempt == retries:
                raise OSError(f"download of {url} failed after {retries} attempts: {e}") from e
            LOGGER.warning(f"download of {url} failed ({e}), retrying {attempt}/{retries - 1}...")
            time.sleep(2 * attempt)


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


def download(urls, dir=".", unzip=True, delete=True, threads=1):
    """Download each URL into `dir` (skipping files already there), then unpack archives into `dir`."""
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)

    def one(url):
        dest = dir / Path(urllib.parse.urlparse(url).path).name
        if not dest.exists():
            LOGGER.info(f"Downloading {url} to {dest}...")
            _fetch(url, dest)
        if unzip and is_archive(dest):
            LOGGER.info(f"Unpacking {dest}...")
            unpack(dest, dir)
            if delete:
                dest.unlink()

    urls = [urls] if isinstance(urls, (str, Path)) else list(urls)
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, urls))
    else:
        for u in urls:
            one(u)
