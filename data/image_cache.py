"""`--cache ram` and `--cache disk`: what the cached pixels cost, judged before the first image is decoded for the
cache, and where the disk copies lie (docs/safety.md, the budget).

- The cost is known from the images' headers (the sizes the label scan read, or `header_size`): decoded, an image
  takes h x w x 3 bytes. The cache (on disk each image whole; in memory as the dataset keeps it: resized to the
  training size for detection, whole for classification) must fit the free disk less DISK_MARGIN of each
  filesystem it writes to, or the memory this process may still take less MEMORY_MARGIN (the kernel's available
  memory, the cgroup's limit, RLIMIT_DATA / RLIMIT_AS: the least of them). Whole images may take at most CACHE_RATIO
  times the bytes of their files (at least CACHE_FLOOR): a 629-byte JPEG declaring 9000 x 9000 would otherwise write
  243 MB. A cache over the budget is refused in one line, before anything is written.
- Images are decoded a few at a time: at most MAX_DECODE_BYTES of decoded pixels at once (8 threads, fewer for
  images near the pixel limit). An image whose header no longer declares the size the budget was judged on
  (replaced since the scan) is not cached; training reads it as it reads any image, under the pixel limit.
- `--cache disk` writes x.jpg.yolo-engine.npy beside an image only where the image lies inside a folder the split
  names (the folder, a list file's folder, a glob's part before its first wildcard): a list naming an image
  elsewhere (another user's folder, /etc) does not make this project write there. That image's copy goes into the
  split's own cache folder beside its label cache, named by a hash of the image's path (`DiskCopies`).
"""

import glob
import hashlib
import math
import os
import resource
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from data.image_files import disk_cache_path, read_disk_cache, write_disk_cache
from utils.budget import CACHE_FLOOR, CACHE_RATIO, DISK_MARGIN, MAX_DECODE_BYTES, MEMORY_MARGIN
from utils.dist import get_local_world_size
from utils.errors import BadDataset
from utils.imageio import header_size
from utils.log import LOGGER

NPY_HEADER = 128  # np.save's header before a (h, w, 3) uint8 array's pixels
THREADS = 8


class CacheTooLarge(BadDataset):
    """A --cache that would take more disk or memory than the budget allows."""


class DiskCopies:
    """Where --cache disk keeps each image's copy (`copies(im_file)`): beside it inside the folders the split
    `img_path` names, else in `<label cache's stem>.yolo-engine-npy/` beside the split's label cache."""

    def __init__(self, img_path, label_cache):
        self.folders = split_folders(img_path)
        label_cache = Path(label_cache)
        self.outside = label_cache.with_name(label_cache.name.split(".")[0] + ".yolo-engine-npy")

    def __call__(self, im_file):
        f = os.path.normpath(os.path.abspath(im_file))
        if any(f.startswith(d.rstrip(os.sep) + os.sep) for d in self.folders):
            return disk_cache_path(im_file)
        return self.outside / (hashlib.sha256(os.fsencode(f)).hexdigest()[:32] + ".npy")


def split_folders(img_path):
    """The folders a split names (a folder, a list file's folder, a glob's part before its first wildcard, a single
    file's folder), each as written and resolved: where the images of the split lie."""
    folders = set()
    for e in map(str, img_path if isinstance(img_path, (list, tuple)) else [img_path]):
        if glob.has_magic(e):
            fixed = e[:min(e.index(c) for c in "*?[" if c in e)]
            folder = fixed if fixed.endswith(os.sep) else os.path.dirname(fixed)
        else:
            folder = e if os.path.isdir(e) else os.path.dirname(e)
        folders |= {os.path.normpath(os.path.abspath(folder or ".")), os.path.realpath(folder or ".")}
    return sorted(folders)


def available_memory():
    """Bytes this process may still allocate: the least of the kernel's MemAvailable, its cgroup's limit less its
    usage (v2, else v1), and RLIMIT_DATA / RLIMIT_AS less what the process holds; None where none is known."""
    found = []
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        found.append(int(info["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        pass
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         (v1 + "limit_in_bytes", v1 + "usage_in_bytes")):
        try:
            text = Path(limit).read_text().strip()
            if text != "max" and int(text) < 1 << 60:  # v1 writes 'no limit' as a huge number
                found.append(int(text) - int(Path(usage).read_text()))
                break
        except (OSError, ValueError):
            pass
    try:
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        for rlimit, held in ((resource.RLIMIT_DATA, "VmData"), (resource.RLIMIT_AS, "VmSize")):
            soft = resource.getrlimit(rlimit)[0]
            if soft != resource.RLIM_INFINITY:
                found.append(soft - int(status[held].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        pass
    return min(found) if found else None


def _gib(n):
    return f"{n / 2**30:.2f} GiB"


def decoded_bytes(shape):
    """What an image of `shape` (h, w) takes decoded: 8-bit BGR."""
    return int(shape[0]) * int(shape[1]) * 3


def resized_shape(shape, imgsz):
    """(h, w) of an image of `shape` resized so that its long side is `imgsz`, as YOLODataset.load_image does."""
    h0, w0 = int(shape[0]), int(shape[1])
    r = imgsz / max(h0, w0)
    return (h0, w0) if r == 1 else (min(math.ceil(h0 * r), imgsz), min(math.ceil(w0 * r), imgsz))


def _held(f):
    """The bytes a file holds: its size, or its disk blocks where fewer (a sparse file's holes hold nothing)."""
    st = os.stat(f)
    return min(st.st_size, st.st_blocks * 512)


def check_budget(mode, files, shapes, kept=None, copies=None, prefix=""):
    """Refuse (CacheTooLarge) a cache of `files` whose headers declare `shapes` (h, w), before anything is written.
    `kept`: the shapes the cache keeps in memory where it keeps them resized (None: whole). Whole images are judged
    against CACHE_RATIO x their files' bytes; then, for mode 'ram', the memory available, and for 'disk' the free
    space where the copies (`copies(f)`) that are not there yet go."""
    whole = [decoded_bytes(s) for s in shapes]
    if kept is None or mode == "disk":
        held = sum(_held(f) for f in files)
        allowed = max(CACHE_RATIO * held, CACHE_FLOOR)
        if sum(whole) > allowed:
            raise CacheTooLarge(f"{prefix}--cache {mode}: the headers of {len(files)} images declare "
                                f"{_gib(sum(whole))} of pixels, more than {CACHE_RATIO}x the {held} bytes of their "
                                f"files (at least {_gib(CACHE_FLOOR)}) that a cache may take (docs/safety.md); train "
                                "without --cache")
    ranks = get_local_world_size()  # this machine's ranks fill their caches at once, each its own share
    share = f" (a {ranks}th, for each of the {ranks} processes of this machine)" if ranks > 1 else ""
    if mode == "ram":
        need = sum(whole) if kept is None else sum(decoded_bytes(s) for s in kept)
        free = available_memory()
        if free is not None and need > (free - MEMORY_MARGIN) / ranks:
            raise CacheTooLarge(f"{prefix}--cache ram: {len(files)} images take {_gib(need)} cached, more than "
                                f"{_gib(max(free - MEMORY_MARGIN, 0) / ranks)}{share} of the memory this process may "
                                f"still take less {_gib(MEMORY_MARGIN)} (docs/safety.md); give --cache disk, or none")
        return
    new = {}  # device -> (a folder on it, bytes the missing copies add there)
    for f, size in zip(files, whole):
        target = copies(f)
        if not os.path.exists(target):
            folder = next(p for p in Path(target).parents if p.exists())
            dev = os.stat(folder).st_dev
            new[dev] = (new.get(dev, (folder, 0))[0], new.get(dev, (folder, 0))[1] + size + NPY_HEADER)
    for folder, need in new.values():
        free = shutil.disk_usage(folder).free
        if need > (free - DISK_MARGIN) / ranks:
            raise CacheTooLarge(f"{prefix}--cache disk: the copies take {_gib(need)} more on {folder}, which has "
                                f"{_gib(free)} free and keeps {_gib(DISK_MARGIN)} so{share} (docs/safety.md); give "
                                "--cache ram, or none")


def same_size(im_file, shape):
    """Whether the header of `im_file` still declares `shape` (h, w), either way round (EXIF may turn it)."""
    try:
        size = header_size(im_file)
    except OSError:
        return False
    return size is not None and sorted(size) == sorted(int(v) for v in shape)


def header_shape(im_file):
    """(h, w) the header of `im_file` declares; None where it says none (such an image is read as undecodable)."""
    try:
        size = header_size(im_file)
    except OSError:
        return None
    return None if size is None else (size[1], size[0])


def decoding(shapes, fn, items):
    """[fn(item)] in order, decoded on THREADS threads, fewer where that many of the largest images (`shapes`) would
    hold more than MAX_DECODE_BYTES at once."""
    largest = max((decoded_bytes(s) for s in shapes), default=1)
    with ThreadPoolExecutor(max(1, min(THREADS, MAX_DECODE_BYTES // max(largest, 1)))) as pool:
        return list(pool.map(fn, items))


def fill_disk(files, shapes, copies, decode, prefix=""):
    """Write the --cache disk copy of each of `files` that is missing or stale, judged first (check_budget); decode(k)
    gives the pixels of files[k]. Returns how many images have a copy. A copy the filesystem refuses (a read-only
    dataset, a folder of another user) is skipped: that image is read from its file each time, as without the
    cache, and one warning says how many and why; the copies that could be written are kept."""
    check_budget("disk", files, shapes, copies=copies, prefix=prefix)
    refused = []

    def one(k):
        npy = copies(files[k])
        if read_disk_cache(npy, files[k], mmap_mode="r") is not None:
            return True
        if not same_size(files[k], shapes[k]):
            return False
        try:
            npy.parent.mkdir(parents=True, exist_ok=True)
            write_disk_cache(npy, decode(k))
        except OSError as e:
            refused.append(f"{npy.parent}: {e.strerror or e}")
            return False
        return True

    n = sum(decoding(shapes, one, range(len(files))))
    if refused:
        LOGGER.warning(f"{prefix}--cache disk: {len(refused)} of {len(files)} copies could not be written "
                       f"({refused[0]}); those images are read from their files each time")
    return n


def fill_memory(files, shapes, load, kept=None, prefix=""):
    """[load(k), or None for an image replaced since the scan] for each of `files`, judged first (check_budget;
    `kept`: the shapes load keeps, where it resizes)."""
    check_budget("ram", files, shapes, kept=kept, prefix=prefix)
    return decoding(shapes, lambda k: load(k) if same_size(files[k], shapes[k]) else None, range(len(files)))
